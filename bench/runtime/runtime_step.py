"""Where a decode step of wok's runtime spends its time, on this CPU, in bfloat16.

Why: bench/vllm/runtime_vs_vllm.py says how far the runtime is from vLLM; this says where the time
goes. Decode steps of 1, 8 and 32 sequences at position 160 (the closed loops of 128 prompt + 64
output tokens, midway), the model runner and the sampler alone (no HTTP, no scheduler):
  - side by side, interleaved, medians: 1 and 2 intra-op threads (at the largest batch);
  - a torch profile of each step (one thread), by operator group: linear layers, attention over
    the paged KV (writes, block gathers, SDPA), norms, the rest of the operators, and the time
    outside any operator (Python and dispatch: the step's wall time less its operators' time);
  - the step without its GEMMs: every linear's output computed once, then replayed, so that what
    is left (attention, norms, RoPE, Python) is timed without the profiler's own overhead.

    .venv/bin/python bench/runtime/runtime_step.py       # writes results/runtime_step.{md,json}
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from wok_runtime.core.model import Linear
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.core.sampler import Sampler
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.kernels import brgemm_linear, paged_decode

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = {
    "linear layers": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "wok::brgemm_linear"),
    "attention: KV writes": ("aten::index_copy_", "wok::write_kv"),
    "attention: block gathers": ("aten::index_select",),
    "attention: SDPA": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "attention: decode kernel": ("wok::paged_decode",),
    # RMSNorm's reduction (its casts and products count among the other operators).
    "norms: pow, mean, rsqrt": ("aten::pow", "aten::mean", "aten::sum", "aten::rsqrt"),
}
OUTSIDE = "outside operators (Python, dispatch)"


def decode_step(runner: ModelRunner, batch: int, position: int) -> list[StepInput]:
    n_blocks = -(-(position + 1) // runner.block_size)
    tables = [list(range(i * n_blocks, (i + 1) * n_blocks)) for i in range(batch)]
    return [StepInput([100 + i], position, table) for i, table in enumerate(tables)]


def mixed_step(runner: ModelRunner, batch: int, position: int, prompt: int) -> list[StepInput]:
    """`batch` decodes and one prefill of `prompt` tokens in its own blocks after theirs."""
    step = decode_step(runner, batch + 1, position)
    first = step[-1].block_table[0]
    table = list(range(first, first + -(-prompt // runner.block_size)))
    return [*step[:batch], StepInput([7] * prompt, 0, table)]


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


def without_gemms(runner: ModelRunner, step: list[StepInput], iters: int) -> float:
    """The step's median seconds with every linear's output replayed from a first real run:
    eager through `Linear.forward`, in the compiled step through brgemm's op, which calls
    `brgemm_linear.linear` (keyed by its packed weight)."""
    real_forward, real_brgemm = Linear.forward, brgemm_linear.linear
    outputs: dict[tuple[int, int], torch.Tensor] = {}

    def replay(key: tuple[int, int], compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in outputs:
            outputs[key] = compute()
        return outputs[key]

    def forward(linear: Linear, x: torch.Tensor) -> torch.Tensor:
        return replay((id(linear), x.shape[0]), lambda: real_forward(linear, x))

    def brgemm(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return replay((id(packed), x.shape[0]), lambda: real_brgemm(x, packed, bias))

    Linear.forward = forward  # type: ignore[method-assign]
    brgemm_linear.linear = brgemm
    try:
        return side_by_side({"replayed": runner}, step, [1], iters)["replayed, 1 thread"]
    finally:
        Linear.forward = real_forward  # type: ignore[method-assign]
        brgemm_linear.linear = real_brgemm


def op_groups(runner: ModelRunner, step: list[StepInput], iters: int) -> dict[str, float]:
    """Shares of the step's wall time (one thread), the sampler's greedy pick included."""
    torch.set_num_threads(1)
    sampler, params = Sampler(), SamplingParams(temperature=0.0)
    requests = [(str(i), params) for i in range(len(step))]
    # The kernels are plain C++ calls that the profiler does not see: named here.
    unnamed_linear, unnamed_decode = brgemm_linear.linear, runner.decode_kernel

    def named(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with record_function(name):
                return kernel(*args)

        return run

    brgemm_linear.linear = named("wok::brgemm_linear", unnamed_linear)
    if unnamed_decode is not None:
        runner.decode_kernel = paged_decode.Kernel(
            named("wok::paged_decode", unnamed_decode.attend),
            named("wok::write_kv", unnamed_decode.write_kv),
        )
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            for _ in range(iters):
                sampler.sample(runner.forward(step), requests)
            wall = (time.perf_counter() - started) * 1e6
    finally:
        brgemm_linear.linear, runner.decode_kernel = unnamed_linear, unnamed_decode
    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        group = next((g for g, names in GROUPS.items() if event.key in names), "other operators")
        groups[group] += event.self_cpu_time_total
    groups[OUTSIDE] = max(0.0, wall - sum(groups.values()))
    return {g: groups[g] / wall for g in [*GROUPS, "other operators", OUTSIDE]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--position", type=int, default=160)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--mixed", type=int, default=256, help="a mixed step's prefill tokens")
    parser.add_argument("--compile", action="store_true", help="the model compiled (--compile)")
    parser.add_argument("--out", default=str(RESULTS / "runtime_step"))
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/runtime/runtime_step.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "models": {},
    }
    for name in args.models:
        runner = ModelRunner.from_source(
            f"builtin:{name}",
            dtype="bfloat16",
            kv_cache_bytes=256 << 20,
            max_model_len=512,
            compile=args.compile,
        )
        largest = decode_step(runner, max(args.batches), args.position)
        medians = side_by_side({"plain": runner}, largest, [1, 2], args.iters)
        shares, seconds, rest = {}, {}, {}
        steps = {f"batch {b}": decode_step(runner, b, args.position) for b in args.batches}
        mixed = min(args.batches[-1], 8)
        key = f"{mixed} + {args.mixed}-token prefill"
        steps[key] = mixed_step(runner, mixed, args.position, args.mixed)
        for label, step in steps.items():
            seconds[label] = side_by_side({"1 thread": runner}, step, [1], args.iters)
            rest[label] = without_gemms(runner, step, args.iters)
            shares[label] = op_groups(runner, step, max(2, args.iters // 2))
            print(f"{name} {label}: {seconds[label]} {shares[label]}", file=sys.stderr)
        report["models"][name] = {
            "threads_at_largest_batch": medians,
            "step_seconds_by_batch": {b: next(iter(t.values())) for b, t in seconds.items()},
            "step_seconds_without_gemms_by_batch": rest,
            "profile_shares_by_batch": shares,
        }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# A step of wok's runtime, bfloat16, on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} (torch {report['torch']}; a "
        f"2-CPU machine shared with other work). Decode steps at position {args.position}, and "
        "a mixed step (decodes and one prefill from position 0); "
        f"medians of {args.iters} interleaved runs. The profile shares are of the step's wall "
        "time on one thread, the sampler's greedy pick included; with `--compile`, the fused "
        "kernels and the Python of the attention op (`wok::attention`) count among the other "
        "operators.",
    ]
    for name, model in report["models"].items():
        lines += ["", f"## builtin:{name}", "", "| threads, batch of "
                  f"{max(args.batches)} | step (ms) | tok/s |", "|---|---|---|"]  # fmt: skip
        for variant, seconds in model["threads_at_largest_batch"].items():
            tok_s = max(args.batches) / seconds
            lines.append(
                f"| {variant.removeprefix('plain, ')} | {seconds * 1e3:.1f} | {tok_s:.0f} |"
            )
        by_batch = model["profile_shares_by_batch"]
        lines += ["", "| share of a step | " + " | ".join(by_batch) + " |"]
        lines += ["|---|" + "---|" * len(by_batch)]
        step_ms = [f"{s * 1e3:.1f} ms" for s in model["step_seconds_by_batch"].values()]
        lines += ["| step, 1 thread | " + " | ".join(step_ms) + " |"]
        rest = model["step_seconds_without_gemms_by_batch"].values()
        rest_ms = [f"{s * 1e3:.1f} ms" for s in rest]
        lines += ["| step without its GEMMs (outputs replayed) | " + " | ".join(rest_ms) + " |"]
        for group in next(iter(by_batch.values())):
            cells = " | ".join(f"{shares[group]:.0%}" for shares in by_batch.values())
            lines.append(f"| {group} | {cells} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
