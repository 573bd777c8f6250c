"""One prepared check of wok's runtime on a GPU machine: minutes on one H100/H200-class GPU,
for a machine held only briefly.

For each model (SmolLM2-135M's shape, then Llama-3-8B's; random weights, bench/gpu/gpu_models.py),
with the runtime as a GPU pod runs it (FlashInfer's paged attention where it imports, decode
steps replayed from CUDA graphs):

  (a) greedy equality: wok's engine (continuous batching) against Hugging Face transformers on the
      same device in the same dtype (bfloat16 on CUDA), the same prompts, exact tokens compared;
      the first divergence if any, with HF's logits there (a bf16 near-tie, or a bug)
  (b) throughput: wok continuous against HF `generate` in static batches (and wok serial) on the
      workloads of bench/runtime/engine_vs_hf.py (its `build_scenarios` and `run_scenario`)
  (c) the KV pool: the room the runtime measured after loading and the pool it was given, as a
      pod is given it (`--kv-cache-bytes` from the operator's memory budget,
      `wok_operator.budget`, what `wok budget` prints) for this model on this GPU, and whether
      they are more than 10 % apart (the runtime's warning, the operator's KVBudgetMatched)
  (d) peak GPU memory (torch.cuda.max_memory_allocated) and load times;
then, on the 8B shape:
  (e) wok against vLLM, both serving it at once, closed loops of 1, 8 and 64 streams, 3
      alternating reps (bench/gpu/gpu_serve.py): output tok/s and TPOT P50/P99;
  (f) the step profile (`wok profile`, decode graphs on) written where `wok simulate --profile`
      reads it: gpu_profile_<model>.json next to the report.

It writes `gpu_check.md` and `gpu_check.json` (the command, the device, torch and CUDA versions)
to --out, bench/gpu/results by default. The model is a builtin, generated from a seed on first use
(no network; docs/gpu-check.md says what the GPU machine must have).

    python3 bench/gpu/gpu_check.py --setup VENV [--wheels DIR]       # on the GPU machine
    python3 bench/gpu/gpu_check.py                                   # there, in a ready Python
    .venv/bin/python bench/gpu/gpu_check.py --device cpu --quick  # the same path on a CPU, < 1 min
    .venv/bin/python bench/gpu/gpu_check.py --dry-run                # checks the script (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent
# Its parts beside it; the engine comparison it reruns on the GPU from the runtime study.
sys.path[:0] = [str(BENCH), str(BENCH.parent / "runtime")]
SOURCES = [str(ROOT / p) for p in ("runtime", "operator", "sim", "contracts", ".")]
if importlib.util.find_spec("wok_runtime") is None:  # a bare checkout (the GPU machine)
    sys.path[1:1] = SOURCES
    # The servers and `wok profile` run as subprocesses: they find the checkout the same way.
    os.environ["PYTHONPATH"] = os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])

MAX_NUM_BATCHED_TOKENS = 2048  # the runner's and the budget's (engine_vs_hf's too)
TIME_LIMIT_S = 480.0  # past this (from the start), the remaining parts are skipped
#: What the GPU machine's Python needs (`--setup` installs them, then flashinfer-cubin at the
#: FlashInfer's version): vLLM's CUDA wheel brings the PyPI torch it is built for.
REQUIREMENTS = (
    "vllm",
    "flashinfer-python",
    "transformers",
    "tokenizers",
    "safetensors",
    "tqdm",
    "httpx",
    "packaging",
    "pydantic",
    "kubernetes",
)
NEEDED_MODULES = ("torch", "transformers", "tokenizers", "safetensors", "pydantic", "kubernetes")
GRAPH_MAX_BATCH = 64  # the largest decode batch of part (e)
PROFILE_GRID = ["--decodes", "0,1,8,32,64", "--contexts", "128,512", "--prefill", "0,256,1024"]
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
FULL_8B = Sizes("llama3-8b-shape", 8, 32, 0, 0, 0)  # no HF throughput: (e) compares vLLM
QUICK = Sizes("builtin:tiny", 4, 8, 8, 8, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cuda (default when available) or cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes, builtin:tiny")
    parser.add_argument("--model", help="one model instead of the two (a builtin:NAME or dir)")
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
    parser.add_argument("--out", help="default bench/gpu/results (--quick: out/gpu_check)")
    parser.add_argument("--vllm-python", default=sys.executable, help="the Python with vLLM")
    parser.add_argument("--skip", default="", help="parts to leave out: serve,profile")
    parser.add_argument("--dry-run", action="store_true", help="check the script itself, no GPU")
    parser.add_argument("--setup", metavar="VENV", help="install REQUIREMENTS there, rerun in it")
    parser.add_argument("--wheels", help="--setup: install from this folder of wheels only")
    args = parser.parse_args(argv)
    if args.setup:
        return setup(Path(args.setup), args.wheels, [a for a in (argv or sys.argv[1:])])
    missing = [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        print(f"gpu_check: missing Python packages {', '.join(missing)} (docs/gpu-check.md)")
        return 2
    if args.dry_run:
        from gpu_check_dry import dry_run

        return dry_run(Path(args.out or ROOT / "out" / "gpu_check_dry"))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    out = Path(args.out or (ROOT / "out" / "gpu_check" if args.quick else BENCH / "results"))
    if not cuda:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.monotonic()
    command = shlex.join(
        [_shown(sys.executable), "bench/gpu/gpu_check.py", *(argv or sys.argv[1:])]
    )
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    report: dict[str, Any] = {"command": command, "dtype": dtype, "models": []}
    report["machine"] = machine(torch, device)
    skip = set(filter(None, args.skip.split(",")))
    try:
        for sizes in model_sizes(args):
            if time.monotonic() - began > TIME_LIMIT_S:
                report["models"].append({"model": sizes.model, "skipped": "past the time limit"})
                continue
            part: dict[str, Any] = {"model": sizes.model}
            report["models"].append(part)
            check(part, torch, args, sizes, dtype=dtype, device=device, began=began)
        big = report["models"][-1]
        if not cuda:
            report["serve"] = report["profile"] = {"skipped": "CUDA only"}
        else:
            path = model_path(big["model"], device) if "skipped" not in big else None
            report["serve"] = timed_part(
                "serve" in skip, began, path, lambda: serve_part(path, args.vllm_python, out)
            )
            report["profile"] = timed_part(
                "profile" in skip, began, path, lambda: profile_part(path, big["model"], out)
            )
    except Exception as error:  # the report keeps what was measured, and says why it stopped
        report["error"] = f"{type(error).__name__}: {error}"[:500]
        raise
    finally:
        report["wall_s"] = time.monotonic() - began
        report["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        write_outputs(report, out)
    print(f"gpu_check: {out / 'gpu_check.md'} ({report['wall_s']:.0f} s)", file=sys.stderr)
    return 0


def model_sizes(args: argparse.Namespace) -> list[Sizes]:
    """The models checked and how much of each: --quick's one, --model's one, or the two."""
    if args.quick:
        return [QUICK if not args.model else Sizes(args.model, *astuple(QUICK)[1:])]
    if args.model:
        return [Sizes(args.model, *astuple(FULL)[1:])]
    return [FULL, FULL_8B]


def model_path(model: str, device: str) -> Path:
    """The model's directory: a builtin's, or the 8B shape drawn on `device` (gpu_models.py)."""
    from gpu_models import LLAMA3_8B, ensure_on_device

    from wok_runtime.core.loader import resolve_source

    if model == LLAMA3_8B.name:
        return ensure_on_device(LLAMA3_8B, device)
    return resolve_source(model)


def timed_part(skipped: bool, began: float, path: Path | None, run: Any) -> dict[str, Any]:
    if skipped:
        return {"skipped": "--skip"}
    if path is None:
        return {"skipped": "its model was skipped"}
    if time.monotonic() - began > TIME_LIMIT_S:
        return {"skipped": f"past the {TIME_LIMIT_S:.0f} s time limit"}
    t0 = time.monotonic()
    try:
        result = run()
    except (Exception, SystemExit) as error:  # a server that never came up: the next part runs
        result = {"error": f"{type(error).__name__}: {error}"[-2000:]}
    return {**result, "wall_s": time.monotonic() - t0}


def serve_part(path: Path, vllm_python: str, out: Path) -> dict[str, Any]:
    """(e) wok and vLLM serving the model, side by side (gpu_serve.py)."""
    import gc

    import torch
    from gpu_serve import compare

    gc.collect()
    torch.cuda.empty_cache()  # the servers get the GPU: this process keeps only its context
    return compare(path, vllm_python, out / "gpu_check_logs")


def profile_part(path: Path, model: str, out: Path) -> dict[str, Any]:
    """(f) `wok profile` on the GPU, decode graphs on, into gpu_profile_<model>.json."""
    name = Path(model.removeprefix("builtin:")).name
    target = out / f"gpu_profile_{name}.json"
    command = profile_command(path, target)
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        return {"error": run.stderr[-2000:], "command": shlex.join(command[1:])}
    return {"path": target.name, "summary": run.stdout.strip(), "command": shlex.join(command[1:])}


def profile_command(path: Path, target: Path) -> list[str]:
    return [
        sys.executable, "-m", "wok.cli", "profile", "--model", str(path), "--device", "cuda",
        "--out", str(target), "--name", f"{path.name}-gpu", "--max-model-len", "1024",
        "--cuda-graph-max-batch", str(GRAPH_MAX_BATCH), "--repeats", "3", "--no-progress",
        *PROFILE_GRID,
    ]  # fmt: skip


def setup(venv: Path, wheels: str | None, argv: list[str]) -> int:
    """Makes `venv` with REQUIREMENTS (from PyPI, or only from `wheels`) and reruns the check
    in it, without --setup."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    source = ["--no-index", "--find-links", wheels] if wheels else []
    pip = [str(python), "-m", "pip", "install", "-q", *source]
    subprocess.run([*pip, *REQUIREMENTS], check=True)
    # FlashInfer's prebuilt kernels, at the version of the FlashInfer that vLLM's pin chose (a
    # FlashInfer without them fetches them at first use, and the GPU machine has no network).
    ask = "import importlib.metadata as m; print(m.version('flashinfer-python'))"
    found = subprocess.run([str(python), "-c", ask], capture_output=True, text=True, check=True)
    version = found.stdout.strip()
    subprocess.run([*pip, f"flashinfer-cubin=={version}"], check=True)
    rest = strip_setup(argv)
    return subprocess.run([str(python), str(Path(__file__).resolve()), *rest]).returncode


def strip_setup(argv: list[str]) -> list[str]:
    """`argv` without --setup and --wheels (and their values)."""
    rest: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif arg in ("--setup", "--wheels"):
            skip_next = True
        elif not arg.startswith(("--setup=", "--wheels=")):
            rest.append(arg)
    return rest


def check(
    report: dict[str, Any],
    torch: Any,
    args: argparse.Namespace,
    sizes: Sizes,
    *,
    dtype: str,
    device: str,
    began: float,
) -> None:
    """Parts (a)-(d) for one model, filling `report` part by part, so a failure still leaves
    what was measured."""
    from engine_vs_hf import MAX_MODEL_LEN, warm_up
    from hf_reference import load_hf_model

    from wok_runtime.core.model_runner import ModelRunner

    cuda = device.startswith("cuda")
    t0 = time.monotonic()
    path = model_path(sizes.model, device)  # generated here on first use
    report["prepare_s"] = time.monotonic() - t0
    gpu_memory = device_memory_bytes(torch, args, device)
    plan, budget_command = operator_budget(path, dtype=dtype, gpu_memory_bytes=gpu_memory)
    # As a pod runs: FlashInfer's attention where it imports, decode graphs on CUDA.
    options = {
        "dtype": dtype,
        "device": device,
        "gpu_memory_utilization": plan["utilization"],
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_model_len": MAX_MODEL_LEN,
        "cuda_graph_max_batch": GRAPH_MAX_BATCH if cuda else 0,
    }

    # (d) the runtime's load, as a pod loads: the pool from the operator's budget.
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.monotonic()
    runner = ModelRunner.from_source(str(path), kv_cache_bytes=plan["kv_budget_bytes"], **options)
    memory: dict[str, Any] = {"wok_load_s": time.monotonic() - t0}
    if cuda:
        torch.cuda.synchronize(device)
        memory["wok_allocated_after_load_bytes"] = torch.cuda.memory_allocated(device)
        memory["wok_peak_after_load_bytes"] = torch.cuda.max_memory_allocated(device)
    report["memory"] = memory
    report["runner"] = runner_shape(runner)

    # (c) the pool the runtime was given, the room it measured, the operator's budget.
    report["kv_pool"] = kv_pool(runner, plan, budget_command)
    if cuda:  # the whole GPU's pool leaves no room for HF's copy: a small pool from here on
        del runner
        torch.cuda.empty_cache()
        runner = ModelRunner.from_source(str(path), kv_cache_bytes=4 << 30, **options)

    t0 = time.monotonic()
    hf = load_hf_model(str(path), dtype=dtype, device=device)
    memory["hf_load_s"] = time.monotonic() - t0
    if cuda:
        memory["hf_weights_bytes"] = sum(p.numel() * p.element_size() for p in hf.parameters())
    warm_up(runner, hf)

    # (a) exact greedy tokens, against HF one prompt at a time (no padding in the reference).
    report["equality"] = greedy_equality(runner, hf, sizes, seed=args.seed)

    # (b) throughput on engine_vs_hf's workloads.
    report["throughput"] = throughput(runner, hf, args, sizes, began)
    if cuda:
        memory["peak_whole_run_bytes"] = torch.cuda.max_memory_allocated(device)
        del runner, hf
        torch.cuda.empty_cache()


def device_memory_bytes(torch: Any, args: argparse.Namespace, device: str) -> int:
    """The memory the operator's budget plans for: --gpu-memory, else the GPU's own, else
    (on the CPU) 768 MiB; in whole KiB, as `wok budget` takes a quantity with a unit."""
    from wok_operator.api import quantity_bytes

    if args.gpu_memory:
        gpu_memory = quantity_bytes(args.gpu_memory)
    elif device.startswith("cuda"):
        gpu_memory = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        gpu_memory = quantity_bytes("768Mi")
    return gpu_memory - gpu_memory % 1024


def kv_pool(runner: Any, plan: dict[str, Any], budget_command: str) -> dict[str, Any]:
    """The pool the runtime was given and the room it measured, against the operator's budget."""
    kv = runner.kv_memory
    assert kv is not None  # a torch device always measures
    pool = runner.num_blocks * runner.block_size * runner.kv_bytes_per_token
    return {
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


def throughput(
    runner: Any, hf: Any, args: argparse.Namespace, sizes: Sizes, began: float
) -> dict[str, Any]:
    """engine_vs_hf's workloads, each wok against HF, by scenario; those past the time limit
    (from `began`), or without their trace, skipped and said so."""
    from engine_vs_hf import build_scenarios, run_scenario

    trace = Path(args.trace)
    names = set(args.scenarios.split(",")) if sizes.num_requests else set()
    results: dict[str, Any] = {}
    if "c" in names and not trace.is_file():
        names.discard("c")
        results["c_azure_code_trace"] = {"skipped": f"no trace at {trace}"}
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
            results[scenario.key] = {"skipped": f"past the {TIME_LIMIT_S:.0f} s time limit"}
            continue
        result, _ = run_scenario(runner, hf, scenario)
        results[scenario.key] = result
    return results


def runner_shape(runner: Any) -> dict[str, Any]:
    """What ran: the paged attention kernel and the decode batch sizes replayed from graphs."""
    graphs = runner.decode_graphs
    return {
        "paged_kernel": type(runner.paged_kernel).__name__ if runner.paged_kernel else None,
        "cpu_decode_kernel": runner.decode_kernel is not None,
        "decode_graph_sizes": list(graphs.captured) if graphs else [],
    }


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

    from wok_contracts.traces import uniform_poisson
    from wok_runtime.tools.bench_engine import prompt_token_ids

    output_len = sizes.equality_output_len
    reqs = uniform_poisson(
        sizes.equality_prompts,
        rate=math.inf,
        prompt_tokens=(16, 64),
        output_tokens=(output_len, output_len),
        seed=seed + 2,
    )
    prompts = prompt_token_ids(reqs, vocab_size=runner.config.vocab_size, seed=seed + 2)
    wants = [r.output_tokens for r in reqs]
    wok_tokens: dict[int, list[int]] = {}
    wok_run(runner, reqs, prompts, mode="continuous", batch=len(reqs), tokens=wok_tokens)
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# gpu_check: wok's runtime on {m['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Device: {m['device']} ({m['name']}); torch {m['torch']}, CUDA {m['cuda']}; "
        f"{report['dtype']}; whole run {report['wall_s']:.0f} s.",
        "",
    ]
    if "error" in report:
        lines += [f"**Stopped by an error:** `{report['error']}`", ""]
    for part in report["models"]:
        lines += [f"## `{part['model']}`", ""]
        if "skipped" in part:
            lines += [f"Skipped: {part['skipped']}.", ""]
            continue
        lines += model_markdown(part)
    lines += serve_markdown(report.get("serve"))
    profile = report.get("profile")
    if profile:
        lines += ["## (f) The step profile", ""]
        if "path" in profile:
            lines += [
                f"`{profile['path']}` (for `wok simulate --profile`), from `{profile['command']}`:",
                "",
                "```",
                profile["summary"],
                "```",
                "",
            ]
        else:
            lines += [f"Not made: {profile.get('skipped') or profile.get('error')}", ""]
    return "\n".join(lines)


def model_markdown(part: dict[str, Any]) -> list[str]:
    from wok_runtime.tools.bench_engine import format_table

    lines: list[str] = []
    shape = part.get("runner")
    if shape:
        lines += [
            f"Runner: paged attention kernel {shape['paged_kernel'] or 'none (gathers + SDPA)'}; "
            f"decode graphs for batch sizes {shape['decode_graph_sizes'] or 'none'}.",
            "",
        ]
    eq = part.get("equality")
    if eq:
        lines += [
            "### (a) Greedy equality with transformers",
            "",
            f"{eq['identical']} of {eq['prompts']} prompts identical over "
            f"{eq['output_tokens_each']} tokens each ({eq['wok']}; reference: {eq['reference']}).",
            "",
        ]
        if "first_divergence" in eq:
            lines += [f"First divergence: `{json.dumps(eq['first_divergence'])}`", ""]
    for name, scenario in part.get("throughput", {}).items():
        lines += [f"### (b) {name}", ""]
        if "skipped" in scenario:
            lines += [f"Skipped: {scenario['skipped']}.", ""]
            continue
        lines += [scenario["workload"], "", format_table(scenario["rows"]), ""]
        for key, value in scenario.items():
            if key not in ("rows", "workload"):
                lines.append(f"- {key}: {f'{value:.2f}' if isinstance(value, float) else value}")
        lines.append("")
    kv = part.get("kv_pool")
    if kv:
        lines += [
            "### (c) The KV pool against the operator's budget",
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
    memory = part.get("memory")
    if memory:
        lines += ["### (d) Load time and memory", ""]
        lines.append(
            f"- prepare_s (the model's files; a builtin's generation): {part['prepare_s']:.2f}"
        )
        for key, value in memory.items():
            shown = (
                f"{value:.2f}" if isinstance(value, float) else f"{value} ({value / 2**30:.3f} GiB)"
            )
            lines.append(f"- {key}: {shown}")
        lines.append("")
    return lines


def serve_markdown(serve: dict[str, Any] | None) -> list[str]:
    if not serve:
        return []
    lines = ["## (e) wok against vLLM on this GPU", ""]
    if "rows" not in serve:
        return [*lines, f"Not run: {serve.get('skipped') or serve.get('error')}", ""]
    lines += [
        f"wok: `{serve['wok_command']}`  ",
        f"vLLM: `{serve['vllm_command']}`  ",
        f"{serve['reps']} alternating runs per server and load; medians; ratios wok / vLLM.",
        "",
        "| load | wok tok/s | vLLM tok/s | ratio | TPOT P50 wok / vLLM (ms) "
        "| TPOT P99 wok / vLLM (ms) | TPOT P99 ratio |",
        "|---|---:|---:|---:|---|---|---:|",
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}"

    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}×"

    for row in serve["rows"]:
        w, v = row["wok"], row["vllm"]
        lines.append(
            f"| {row['load']} ({row['requests']} req) | {w['output_tokens_per_s']:.0f} "
            f"| {v['output_tokens_per_s']:.0f} | {x(row['tok_s_ratio'])} "
            f"| {ms(w['tpot_p50_s'])} / {ms(v['tpot_p50_s'])} "
            f"| {ms(w['tpot_p99_s'])} / {ms(v['tpot_p99_s'])} | {x(row['tpot_p99_ratio'])} |"
        )
    return [*lines, ""]


if __name__ == "__main__":
    sys.exit(main())
