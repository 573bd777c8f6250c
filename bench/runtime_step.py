"""Where a decode step of wok's runtime spends its time, on this CPU, in bfloat16.

Why: bench/runtime_vs_vllm.py says how far the runtime is from vLLM; this says where the time
goes. One decode step of 32 sequences at position 160 (the closed loop at 32 of 128 prompt + 64
output tokens, midway), the model runner alone (no HTTP, no scheduler):
  - side by side, interleaved, medians: 1 and 2 intra-op threads;
  - a torch profile of the step (one thread), by operator group:
    linear layers, attention over the paged KV (writes, block gathers, SDPA), and the rest.

    .venv/bin/python bench/runtime_step.py       # writes bench/results/runtime_step.{md,json}
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from wok_runtime.model_runner import ModelRunner, StepInput

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {
    "linear layers": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm"),
    "attention: KV writes": ("aten::index_copy_",),
    "attention: block gathers": ("aten::index_select",),
    "attention: SDPA": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
}


def decode_step(runner: ModelRunner, batch: int, position: int) -> list[StepInput]:
    n_blocks = -(-(position + 1) // runner.block_size)
    tables = [list(range(i * n_blocks, (i + 1) * n_blocks)) for i in range(batch)]
    return [StepInput([100 + i], position, table) for i, table in enumerate(tables)]


def side_by_side(
    runners: dict[str, ModelRunner], step: list[StepInput], threads: list[int], iters: int
) -> dict[str, float]:
    times: dict[str, list[float]] = defaultdict(list)
    for runner in runners.values():
        runner.forward(step)  # warm-up
    for _ in range(iters):
        for n in threads:
            torch.set_num_threads(n)
            for name, runner in runners.items():
                started = time.perf_counter()
                runner.forward(step)
                times[f"{name}, {n} thread{'s' * (n > 1)}"].append(time.perf_counter() - started)
    return {key: statistics.median(values) for key, values in times.items()}


def op_groups(runner: ModelRunner, step: list[StepInput], iters: int) -> dict[str, float]:
    torch.set_num_threads(1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            runner.forward(step)
    total = 0.0
    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        total += event.self_cpu_time_total
        group = next((g for g, names in GROUPS.items() if event.key in names), "the rest")
        groups[group] += event.self_cpu_time_total
    return {g: groups[g] / total for g in [*GROUPS, "the rest"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--position", type=int, default=160)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime_step"))
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/runtime_step.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "models": {},
    }
    for name in args.models:
        runner = ModelRunner.from_source(
            f"builtin:{name}", dtype="bfloat16", kv_cache_bytes=256 << 20, max_model_len=512
        )
        step = decode_step(runner, args.batch, args.position)
        medians = side_by_side({"plain": runner}, step, [1, 2], args.iters)
        shares = op_groups(runner, step, max(2, args.iters // 2))
        report["models"][name] = {"step_seconds": medians, "profile_shares": shares}
        print(f"{name}: {medians} {shares}", file=sys.stderr)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# A decode step of wok's runtime, bfloat16, on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} (torch {report['torch']}; a "
        f"2-CPU machine shared with other work). One step of {args.batch} sequences decoding "
        f"at position {args.position}; medians of {args.iters} interleaved runs.",
    ]
    for name, model in report["models"].items():
        lines += ["", f"## builtin:{name}", "", "| variant | step (ms) | tok/s |", "|---|---|---|"]
        for variant, seconds in model["step_seconds"].items():
            lines.append(f"| {variant} | {seconds * 1e3:.1f} | {args.batch / seconds:.0f} |")
        lines += ["", "Profile of the step on one thread (share of CPU time):", ""]
        lines += [f"- {group}: {share:.0%}" for group, share in model["profile_shares"].items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
