"""`bench/gpu/gpu_check.py --dry-run`: the GPU check checked without a GPU, in seconds, so that the
day a GPU is lent the script does not fail on its own mistakes.

It imports every part's code; draws the 8B generator's model at a small size on the CPU and
loads it with wok's loader; computes the operator's budget for both models on an 80 GiB GPU;
builds the wok and vLLM server commands and `wok profile`'s, and parses wok's with wok's own
parser; renders the report from a made-up result with every part. What it cannot check is named
in docs/gpu-check.md: the kernels, the capture, vLLM's flags.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any


def dry_run(out: Path) -> int:
    import gpu_check
    import gpu_serve
    import torch
    from gpu_models import LLAMA3_8B, SMALL_8B_LAYOUT, ensure_on_device

    from wok.cli import build_parser
    from wok_runtime.core.decode_graphs import CudaGraphCapture, capture_sizes
    from wok_runtime.core.loader import load_model, resolve_source
    from wok_runtime.core.paged_attention import FlashInferKernel
    from wok_runtime.core.parallel import backend_for

    checks: dict[str, Any] = {}
    assert callable(CudaGraphCapture) and FlashInferKernel.for_graph
    assert backend_for(torch.device("cpu")) == "gloo"
    checks["graph_sizes"] = list(capture_sizes(gpu_check.GRAPH_MAX_BATCH))
    assert checks["graph_sizes"][-1] == gpu_check.GRAPH_MAX_BATCH

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small = ensure_on_device(SMALL_8B_LAYOUT, "cpu", root)
        model = load_model(small, dtype=torch.bfloat16, device=torch.device("cpu"))
        assert model.config.num_key_value_heads == SMALL_8B_LAYOUT.config.num_key_value_heads
        checks["generated"] = sorted(p.name for p in small.iterdir())

        # The operator's budget for both models on an H100's 80 GiB.
        big = root / "8b"
        big.mkdir()
        (big / "config.json").write_text(json.dumps(LLAMA3_8B.config.to_hf_dict()))
        budgets = {}
        for name, path in (("smollm2-135m", resolve_source("builtin:smollm2-135m")), ("8b", big)):
            plan, command = gpu_check.operator_budget(
                path, dtype="bfloat16", gpu_memory_bytes=80 << 30
            )
            assert plan["kv_budget_bytes"] > 0, (name, plan)
            budgets[name] = {"kv_budget_bytes": plan["kv_budget_bytes"], "command": command}
        checks["budgets_80gi"] = budgets

        # The commands the GPU run starts, parsed by the parsers that will read them.
        logs = root / "logs"
        wok, vllm = gpu_serve.servers(big, "python", logs, gpu_serve.FULL)
        args = build_parser().parse_args(wok.command[3:])
        assert args.cuda_graphs and args.attention == "auto" and args.device == "cuda"
        assert args.max_batch_size == max(gpu_serve.FULL.requests)
        assert "--kv-cache-memory-bytes" in vllm.command
        profile = gpu_check.profile_command(big, root / "p.json")
        args = build_parser().parse_args(profile[3:])
        assert args.cuda_graph_max_batch == gpu_check.GRAPH_MAX_BATCH
        checks["commands"] = {
            "wok": shlex.join(wok.command[3:]),
            "vllm": shlex.join(vllm.command[1:]),
            "profile": shlex.join(profile[3:]),
        }
    assert gpu_check.strip_setup(["--setup", "v", "--wheels=w", "--skip", "serve"]) == [
        "--skip",
        "serve",
    ]
    assert [load.concurrency for load in gpu_serve.loads(gpu_serve.FULL)] == [1, 8, 64]

    text = gpu_check.markdown(made_up_report())
    for heading in ("(a) Greedy", "(c) The KV pool", "(d) Load", "(e) wok against vLLM", "(f)"):
        assert heading in text, heading
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check_dry.json").write_text(json.dumps(checks, indent=2) + "\n")
    (out / "gpu_check_dry.md").write_text(text)
    print(f"gpu_check --dry-run: ok ({out})")
    return 0


def made_up_report() -> dict[str, Any]:
    """A result of every part's shape (numbers invented: only the rendering is checked)."""
    median = {"output_tokens_per_s": 100.0, "tpot_p50_s": 0.01, "tpot_p99_s": 0.02}
    return {
        "command": "python3 bench/gpu/gpu_check.py",
        "dtype": "bfloat16",
        "wall_s": 1.0,
        "machine": {"device": "cuda", "name": "made up", "torch": "x", "cuda": "y"},
        "models": [
            {
                "model": "llama3-8b-shape",
                "prepare_s": 1.0,
                "runner": {"paged_kernel": "FlashInferKernel", "decode_graph_sizes": [1, 2]},
                "equality": {
                    "prompts": 2,
                    "identical": 2,
                    "output_tokens_each": 4,
                    "wok": "w",
                    "reference": "r",
                },
                "kv_pool": {
                    "operator_budget_bytes": 2,
                    "runtime_measured_bytes": 2,
                    "runtime_pool_bytes": 2,
                    "measured_over_budget": 1.0,
                    "differ_by_more_than_10_percent": False,
                    "note": "n",
                    "wok_budget_command": "wok budget",
                },
                "memory": {"wok_load_s": 1.0, "wok_peak_after_load_bytes": 3},
                "throughput": {},
            }
        ],
        "serve": {
            "wok_command": "w",
            "vllm_command": "v",
            "reps": 3,
            "rows": [
                {
                    "load": "closed-1",
                    "requests": 8,
                    "wok": median,
                    "vllm": median,
                    "tok_s_ratio": 1.0,
                    "tpot_p99_ratio": 1.0,
                }
            ],
        },
        "profile": {"path": "p.json", "command": "c", "summary": "s"},
    }
