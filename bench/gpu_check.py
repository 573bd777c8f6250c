"""One prepared check of wok's runtime on a GPU machine: under 8 minutes on one
H100/H200-class GPU, for a session that holds such a machine only briefly.

  (a) greedy equality: wok's engine (continuous batching) against Hugging Face transformers on the
      same device in the same dtype (bfloat16 on CUDA), the same prompts, exact tokens compared;
      the first divergence if any, with HF's logits there (a bf16 near-tie, or a bug)
  (b) throughput: wok continuous against HF `generate` in static batches (and wok serial) on the
      workloads of bench/engine_vs_hf.py (its `build_scenarios` and `run_scenario`)
  (c) the KV pool: the room the runtime measured after loading and the pool it was given, as a
      pod is given it (`--kv-cache-bytes` from the operator's memory budget,
      `wok_operator.budget`, what `wok budget` prints) for this model on this GPU, and whether
      they are more than 10 % apart (the runtime's warning, the operator's KVBudgetMatched)
  (d) peak GPU memory (torch.cuda.max_memory_allocated) and load times.

It writes `gpu_check.md` and `gpu_check.json` (the command, the device, torch and CUDA versions)
to --out, bench/results by default. The model is a builtin, generated from a seed on first use
(no network; docs/gpu-check.md says what the GPU machine must have).

    python3 bench/gpu_check.py                                   # on the GPU machine
    .venv/bin/python bench/gpu_check.py --device cpu --quick     # the same path on a CPU, < 1 min
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import resource
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
if importlib.util.find_spec("wok_runtime") is None:  # a bare checkout (the GPU machine)
    sys.path[1:1] = [str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT / "sim")]

MAX_NUM_BATCHED_TOKENS = 2048  # the runner's and the budget's (engine_vs_hf's too)
TIME_LIMIT_S = 420.0  # past this (from the start), the remaining throughput workloads are skipped
TRACE = ROOT / "bench" / "traces" / "azure_llm_2023_code.csv"


@dataclass(frozen=True)
class Sizes:
    """How much each part runs: the full check, or --quick (the same code path, small)."""

    model: str
    equality_prompts: int
    equality_output_len: int
    num_requests: int  # (b): engine_vs_hf's scenario a
    equal_output_len: int  # scenario b
    trace_requests: int  # scenario c


FULL = Sizes("builtin:smollm2-135m", 16, 32, 64, 32, 32)
QUICK = Sizes("builtin:tiny", 4, 8, 8, 8, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cuda (default when available) or cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes, builtin:tiny")
    parser.add_argument("--model", help="default builtin:smollm2-135m (--quick: builtin:tiny)")
    parser.add_argument("--dtype", help="default bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument(
        "--gpu-memory",
        help="the budget's GPU memory (a quantity, e.g. 80Gi); default the device's total on "
        "CUDA, 768Mi on the CPU (the pool is really allocated: keep it small there)",
    )
    parser.add_argument("--scenarios", default="a,b,c", help="engine_vs_hf's workloads to run")
    parser.add_argument("--trace", default=str(TRACE), help="scenario c's Azure trace")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="default bench/results (--quick: out/gpu_check)")
    args = parser.parse_args(argv)
    missing = [
        name
        for name in ("torch", "transformers", "tokenizers", "safetensors", "pydantic", "kubernetes")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        print(f"gpu_check: missing Python packages {', '.join(missing)} (docs/gpu-check.md)")
        return 2
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    sizes = QUICK if args.quick else FULL
    model = args.model or sizes.model
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    out = Path(args.out or (ROOT / "out" / "gpu_check" if args.quick else BENCH / "results"))
    if not cuda:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.monotonic()
    command = shlex.join([_shown(sys.executable), "bench/gpu_check.py", *(argv or sys.argv[1:])])
    report: dict[str, Any] = {"command": command, "model": model, "dtype": dtype}
    report["machine"] = machine(torch, device)
    try:
        check(report, torch, args, sizes, model=model, dtype=dtype, device=device)
    except Exception as error:  # the report keeps what was measured, and says why it stopped
        report["error"] = f"{type(error).__name__}: {error}"[:500]
        raise
    finally:
        report["wall_s"] = time.monotonic() - began
        report["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        write_outputs(report, out)
    print(f"gpu_check: {out / 'gpu_check.md'} ({report['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def check(
    report: dict[str, Any],
    torch: Any,
    args: argparse.Namespace,
    sizes: Sizes,
    *,
    model: str,
    dtype: str,
    device: str,
) -> None:
    """Fills `report` part by part, so a failure still leaves what was measured."""
    from engine_vs_hf import MAX_MODEL_LEN, build_scenarios, run_scenario, warm_up
    from hf_reference import load_hf_model

    from wok_operator.api import quantity_bytes
    from wok_runtime.loader import resolve_source
    from wok_runtime.model_runner import ModelRunner

    cuda = device.startswith("cuda")
    began = t0 = time.monotonic()
    path = resolve_source(model)  # a builtin is generated here on first use
    report["prepare_s"] = time.monotonic() - t0
    if args.gpu_memory:
        gpu_memory = quantity_bytes(args.gpu_memory)
    elif cuda:
        gpu_memory = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        gpu_memory = quantity_bytes("768Mi")
    gpu_memory -= gpu_memory % 1024  # whole KiB: `wok budget` takes a quantity with a unit
    plan, budget_command = operator_budget(path, dtype=dtype, gpu_memory_bytes=gpu_memory)

    # (d) the runtime's load, as a pod loads: the pool from the operator's budget.
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.monotonic()
    runner = ModelRunner.from_source(
        model,
        dtype=dtype,
        device=device,
        kv_cache_bytes=plan["kv_budget_bytes"],
        gpu_memory_utilization=plan["utilization"],
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_model_len=MAX_MODEL_LEN,
    )
    memory: dict[str, Any] = {"wok_load_s": time.monotonic() - t0}
    if cuda:
        torch.cuda.synchronize(device)
        memory["wok_allocated_after_load_bytes"] = torch.cuda.memory_allocated(device)
        memory["wok_peak_after_load_bytes"] = torch.cuda.max_memory_allocated(device)
    report["memory"] = memory

    # (c) the pool the runtime was given, the room it measured, the operator's budget.
    kv = runner.kv_memory
    assert kv is not None  # a torch device always measures
    pool = runner.num_blocks * runner.block_size * runner.kv_bytes_per_token
    report["kv_pool"] = {
        "operator_budget_bytes": plan["kv_budget_bytes"],
        "operator_budget": plan,
        "wok_budget_command": budget_command,
        "runtime_measured_bytes": kv.measured_bytes,
        "runtime_pool_bytes": pool,
        "runtime_pool_blocks": runner.num_blocks,
        "measured_over_budget": kv.measured_bytes / plan["kv_budget_bytes"],
        "differ_by_more_than_10_percent": kv.differs(),
        "note": "the measured room is the device's on CUDA; on the CPU it is the runtime's "
        "default share of host memory, so only a CUDA run compares like with like",
    }

    t0 = time.monotonic()
    hf = load_hf_model(model, dtype=dtype, device=device)
    memory["hf_load_s"] = time.monotonic() - t0
    if cuda:
        memory["hf_weights_bytes"] = sum(p.numel() * p.element_size() for p in hf.parameters())
    warm_up(runner, hf)

    # (a) exact greedy tokens, against HF one prompt at a time (no padding in the reference).
    report["equality"] = greedy_equality(runner, hf, sizes, seed=args.seed)

    # (b) throughput on engine_vs_hf's workloads.
    trace = Path(args.trace)
    names = set(args.scenarios.split(","))
    throughput: dict[str, Any] = {}
    if "c" in names and not trace.is_file():
        names.discard("c")
        throughput["c_azure_code_trace"] = {"skipped": f"no trace at {trace}"}
    scenarios = build_scenarios(
        names,
        vocab=runner.config.vocab_size,
        seed=args.seed,
        num_requests=sizes.num_requests,
        trace_requests=sizes.trace_requests,
        equal_output_len=sizes.equal_output_len,
        trace=trace,
    )
    for scenario in scenarios:
        if time.monotonic() - began > TIME_LIMIT_S:
            throughput[scenario.key] = {"skipped": f"past the {TIME_LIMIT_S:.0f} s time limit"}
            continue
        result, _ = run_scenario(runner, hf, scenario)
        throughput[scenario.key] = result
    report["throughput"] = throughput
    if cuda:
        memory["peak_whole_run_bytes"] = torch.cuda.max_memory_allocated(device)


def operator_budget(path: Path, *, dtype: str, gpu_memory_bytes: int) -> tuple[dict, str]:
    """The operator's memory budget for the model at `path` on this GPU, with the spec's defaults
    (utilization, reserve), and the `wok budget` command that prints the same."""
    from engine_vs_hf import MAX_MODEL_LEN

    from wok_operator.api import MemorySpec, quantity_bytes
    from wok_operator.budget import architecture_from_hf_config, plan_memory

    defaults = MemorySpec()
    config = path / "config.json"
    plan = plan_memory(
        architecture_from_hf_config(config),
        gpu_memory_bytes=gpu_memory_bytes,
        utilization=defaults.gpu_memory_utilization,
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        reserve_bytes=quantity_bytes(defaults.reserve),
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    command = shlex.join(
        [
            "wok",
            "budget",
            "--config",
            str(config),
            "--gpu-memory",
            f"{gpu_memory_bytes // 1024}Ki",
            "--dtype",
            dtype,
            "--utilization",
            f"{defaults.gpu_memory_utilization:g}",
            "--reserve",
            defaults.reserve,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-batched-tokens",
            str(MAX_NUM_BATCHED_TOKENS),
        ]
    )
    budget = {
        **asdict(plan),
        "gpu_memory_bytes": gpu_memory_bytes,
        "utilization": defaults.gpu_memory_utilization,
    }
    return budget, command


def greedy_equality(runner: Any, hf: Any, sizes: Sizes, *, seed: int) -> dict:
    """wok's greedy tokens (continuous batching, every prompt at once) against HF `generate` one
    prompt at a time, exactly; the first divergence with HF's logits at that position."""
    from engine_vs_hf import wok_run
    from hf_reference import hf_static_generate

    from wok_runtime.bench_engine import synthetic_workload

    reqs = synthetic_workload(
        num_requests=sizes.equality_prompts,
        input_len=(16, 64),
        output_len=(sizes.equality_output_len, sizes.equality_output_len),
        request_rate=math.inf,
        vocab_size=runner.config.vocab_size,
        seed=seed + 2,
    )
    prompts, wants = [r.prompt_token_ids for r in reqs], [r.max_tokens for r in reqs]
    wok_tokens: dict[int, list[int]] = {}
    wok_run(runner, reqs, mode="continuous", batch=len(reqs), tokens=wok_tokens)
    reference = hf_static_generate(hf, prompts, wants, batch_size=1)
    divergences = []
    for i, expected in enumerate(reference.outputs):
        got = wok_tokens.get(i, [])
        pairs = enumerate(zip(got, expected, strict=False))  # a short output differs at its end
        at = next((j for j, (a, b) in pairs if a != b), None)
        if at is None and len(got) != len(expected):
            at = min(len(got), len(expected))
        if at is not None:
            divergences.append((at, i, got, expected))
    result: dict[str, Any] = {
        "prompts": len(reqs),
        "output_tokens_each": sizes.equality_output_len,
        "identical": len(reqs) - len(divergences),
        "reference": "HF generate, greedy, one prompt at a time (no padding)",
        "wok": f"continuous batching, all {len(reqs)} prompts at once",
    }
    if divergences:
        at, i, got, expected = min(divergences)
        first = {"request": i, "position": at, "wok_tokens": got[: at + 1]}
        first["hf_tokens"] = expected[: at + 1]
        if at < len(got) and at < len(expected):
            first |= hf_logits_at(hf, prompts[i] + expected[:at], got[at], expected[at])
        result["first_divergence"] = first
        result["diverging_requests"] = sorted(i for _, i, _, _ in divergences)
    return result


def hf_logits_at(hf: Any, ids: list[int], wok_token: int, hf_token: int) -> dict[str, Any]:
    """HF's logits for the next token after `ids`: how close wok's pick was to HF's."""
    import torch

    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor([ids], device=hf.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return {
        "hf_top2_logit_gap": float(top[0] - top[1]),
        "hf_logit_gap_hf_vs_wok_token": float(logits[hf_token] - logits[wok_token]),
        "wok_token_rank_in_hf": int((logits > logits[wok_token]).sum()),
    }


def machine(torch: Any, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}",
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info |= {
            "name": props.name,
            "total_memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        }
    else:
        info["name"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def _shown(executable: str) -> str:
    try:
        return str(Path(executable).relative_to(ROOT))
    except ValueError:
        return Path(executable).name


def write_outputs(report: dict[str, Any], out: Path) -> None:
    from wok_runtime.bench_engine import format_table

    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    m = report["machine"]
    lines = [
        f"# gpu_check: wok's runtime on {m['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Device: {m['device']} ({m['name']}); torch {m['torch']}, CUDA {m['cuda']}; "
        f"model `{report['model']}` in {report['dtype']}; whole run {report['wall_s']:.0f} s.",
        "",
    ]
    if "error" in report:
        lines += [f"**Stopped by an error:** `{report['error']}`", ""]
    eq = report.get("equality")
    if eq:
        lines += [
            "## (a) Greedy equality with transformers",
            "",
            f"{eq['identical']} of {eq['prompts']} prompts identical over "
            f"{eq['output_tokens_each']} tokens each ({eq['wok']}; reference: {eq['reference']}).",
            "",
        ]
        if "first_divergence" in eq:
            lines += [f"First divergence: `{json.dumps(eq['first_divergence'])}`", ""]
    for name, scenario in report.get("throughput", {}).items():
        lines += [f"## (b) {name}", ""]
        if "skipped" in scenario:
            lines += [f"Skipped: {scenario['skipped']}.", ""]
            continue
        lines += [scenario["workload"], "", format_table(scenario["rows"]), ""]
        for key, value in scenario.items():
            if key not in ("rows", "workload"):
                lines.append(f"- {key}: {f'{value:.2f}' if isinstance(value, float) else value}")
        lines.append("")
    kv = report.get("kv_pool")
    if kv:
        lines += [
            "## (c) The KV pool against the operator's budget",
            "",
            "| figure | bytes | GiB |",
            "|---|---:|---:|",
        ]
        for label, key in (
            ("operator's budget (the pod's --kv-cache-bytes)", "operator_budget_bytes"),
            ("room the runtime measured after loading", "runtime_measured_bytes"),
            ("pool allocated (whole blocks)", "runtime_pool_bytes"),
        ):
            lines.append(f"| {label} | {kv[key]} | {kv[key] / 2**30:.3f} |")
        lines += [
            "",
            f"Measured ÷ budget: {kv['measured_over_budget']:.3f}; more than 10 % apart: "
            f"{kv['differ_by_more_than_10_percent']} ({kv['note']}). Same budget: "
            f"`{kv['wok_budget_command']}`.",
            "",
        ]
    memory = report.get("memory")
    if memory:
        lines += ["## (d) Load time and memory", ""]
        lines.append(
            f"- prepare_s (the model's files; a builtin's generation): {report['prepare_s']:.2f}"
        )
        for key, value in memory.items():
            shown = (
                f"{value:.2f}" if isinstance(value, float) else f"{value} ({value / 2**30:.3f} GiB)"
            )
            lines.append(f"- {key}: {shown}")
        lines += [f"- host_peak_rss_bytes: {report['host_peak_rss_bytes']}", ""]
    (out / "gpu_check.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
