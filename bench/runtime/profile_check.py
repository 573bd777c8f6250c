"""A measured step-time profile against the engine it was measured on, on workloads it never saw.

Why: the fleet simulator is only as good as its profiles. `wok profile` fits four costs on a grid
of step shapes; here the real engine (`wok bench engine`'s driver) and the simulator's single
replica (`wok_sim.replica.run_single`) serve the same requests, and their throughput and P99
TTFT / TPOT / E2E are compared (target: within 15 %). Workloads, none of them the fitting grid:

  burst     mixed prompts and outputs, all at once: the saturated throughput
  poisson   the same mix, Poisson arrivals at `--load` × the engine's rate on the burst
  azure     the first rows of the Azure code trace, prompts scaled to max_model_len as `wok bench
            engine` does, arrivals compressed to `--load` × the engine's saturated rate for it
            (its rate on the burst × the profile's ratio between the two mixes)

The rates come from the engine's measured capacity so that both sides see a moderately loaded
stream: at a rate the engine cannot sustain, P99 TTFT grows with the length of the run and says
nothing about the profile.

When they differ, four diagnostics say why, from the engine's own steps (each forward is
recorded in the engine thread: its shape, wall and CPU time):
  - contention: Σ wall / Σ CPU time of the forwards. Other processes on a shared machine stretch
    the engine's steps in wall time by this factor; the profile (CPU time) does not know them.
    The "sim × k" column reruns the simulator with every cost multiplied by it.
  - step model: Σ profile prediction / Σ CPU time of whole engine iterations (forward, sampling,
    scheduling, bookkeeping), on the held-out steps: the profile model's own error.
  - loop overhead: the engine's CPU per iteration outside the forward (sampler and scheduler).
  - refit: the simulator with costs fitted on the engine's own steps of the same run (wall
    time). Not a result (it is fitted on the test): it isolates the simulator's semantics.

    .venv/bin/python bench/runtime/profile_check.py     # both CPU profiles; writes results/
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.traces import TraceRequest, read_azure, uniform_poisson
from wok_runtime.core.engine import EngineConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.tools.bench_engine import (
    percentile,
    prompt_token_ids,
    run_engine_bench,
    trace_workload,
)
from wok_runtime.tools.profiler import StepSample, context_tokens, device_label, fit_step_costs
from wok_sim.replica import run_single

TRACE = Path(__file__).resolve().parents[1] / "traces" / "azure_llm_2023_code.csv"
OUT = Path(__file__).resolve().parent / "results" / "profile_check.md"
TARGET = 0.15
METRICS = (
    ("out tok/s", "output_tokens_per_s", "{:.1f}"),
    ("P99 TTFT s", "ttft_p99_s", "{:.3f}"),
    ("P99 TPOT s", "tpot_p99_s", "{:.4f}"),
    ("P99 E2E s", "e2e_p99_s", "{:.2f}"),
)


@dataclass(frozen=True)
class Case:
    """A model, its committed profile, and the size of its workloads (kept to minutes here)."""

    model: str
    profile: str
    batch_cap: int
    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]


CASES = {
    "tiny": Case("builtin:tiny", "sim:tiny-cpu", 32, 160, (16, 512), (16, 256)),
    "smollm2-135m": Case(
        "builtin:smollm2-135m", "sim:smollm2-135m-cpu", 16, 48, (16, 256), (8, 96)
    ),
}


@dataclass(frozen=True)
class StepRecord:
    """One engine step as the profile sees it, and what it took in the engine thread."""

    decodes: int
    prefill_tokens: int
    context_tokens: int
    wall_s: float  # the forward's wall time
    cpu_s: float  # the forward's CPU time (the engine thread's)
    cpu_at_start: float  # the engine thread's CPU clock when the forward began


class ForwardRecorder:
    """Wraps `runner.forward` (an instance attribute, so the engine calls the wrapper) and records
    every step's shape and times; it runs in the engine thread, so `thread_time` is its clock."""

    def __init__(self, runner: ModelRunner) -> None:
        self.steps: list[StepRecord] = []
        self._runner = runner
        self._forward: Callable[[list[StepInput]], torch.Tensor] = runner.forward
        runner.forward = self._timed  # type: ignore[method-assign]

    def close(self) -> None:
        del self._runner.forward  # the class's method again

    def _timed(self, inputs: list[StepInput]) -> torch.Tensor:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        out = self._forward(inputs)
        cpu1, wall1 = time.thread_time(), time.perf_counter()
        decodes = sum(1 for x in inputs if len(x.token_ids) == 1)
        self.steps.append(
            StepRecord(
                decodes=decodes,
                prefill_tokens=sum(len(x.token_ids) for x in inputs) - decodes,
                context_tokens=context_tokens(inputs),
                wall_s=wall1 - wall0,
                cpu_s=cpu1 - cpu0,
                cpu_at_start=cpu0,
            )
        )
        return out


def diagnostics(steps: list[StepRecord], profile: StepProfile) -> dict[str, Any]:
    """Contention, the step model's error and the loop overhead, from the engine's own steps.
    An iteration's CPU is the engine thread's CPU clock from one forward to the next (waiting
    for work costs none), so the last step, which has no next, is left out."""
    pairs = list(itertools.pairwise(steps))
    loop_cpu = sum(b.cpu_at_start - a.cpu_at_start for a, b in pairs)
    forward_cpu = sum(a.cpu_s for a, _ in pairs)
    predicted = sum(
        profile.step_seconds(a.decodes, a.prefill_tokens, a.context_tokens) for a, _ in pairs
    )
    half = len(steps) // 2
    return {
        "steps": len(steps),
        "contention": contention(steps),
        # A load that changes during the run: the first and the second half of its steps.
        "contention_halves": (contention(steps[:half]), contention(steps[half:])),
        "step_model_ratio": predicted / loop_cpu,
        "forward_model_ratio": predicted / forward_cpu,
        "loop_overhead_ms": 1e3 * (loop_cpu - forward_cpu) / max(1, len(pairs)),
    }


def contention(steps: list[StepRecord]) -> float:
    return sum(s.wall_s for s in steps) / sum(s.cpu_s for s in steps) if steps else math.nan


def refit_on_engine(steps: list[StepRecord], profile: StepProfile) -> StepProfile:
    """A diagnostic, not a result: `profile` with costs fitted on the engine's own steps of this
    run (each iteration's CPU time × its forward's wall/CPU ratio). The simulator with it isolates
    the simulator's semantics from the profile's measurement."""
    samples = [
        StepSample(
            a.decodes,
            a.prefill_tokens,
            a.context_tokens,
            seconds=(b.cpu_at_start - a.cpu_at_start) * a.wall_s / a.cpu_s,
        )
        for a, b in itertools.pairwise(steps)
        if a.cpu_s > 0
    ]
    fit = fit_step_costs(samples)
    return dataclasses.replace(
        profile,
        a_s=fit.a_s,
        b_s_per_seq=fit.b_s_per_seq,
        c_s_per_prefill_token=fit.c_s_per_prefill_token,
        d_s_per_context_token=fit.d_s_per_context_token,
    )


def sim_figures(profile: StepProfile, requests: list[TraceRequest], cap: int) -> dict[str, Any]:
    """The simulator's single replica on `requests`, in `run_engine_bench`'s figures."""
    records = run_single(
        profile, requests, batch_cap=cap, max_queue=len(requests), queue_timeout_s=1e9
    )
    bad = [r for r in records if r.outcome != "ok"]
    if bad:
        raise RuntimeError(f"the simulator did not finish {len(bad)} requests ({bad[0].outcome})")
    duration = max(r.finish_s for r in records) - min(r.arrival_s for r in records)
    ttft = [r.ttft_s for r in records if r.ttft_s is not None]
    tpot = [r.tpot_s for r in records if r.tpot_s is not None]
    e2e = [r.e2e_s for r in records]
    return {
        "output_tokens_per_s": sum(r.output_tokens for r in records) / duration,
        "requests_per_s": len(records) / duration,
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p99_s": percentile(tpot, 99),
        "e2e_p99_s": percentile(e2e, 99),
    }


def saturated_rate(profile: StepProfile, requests: list[TraceRequest], cap: int) -> float:
    """Requests per second the profile says the engine serves with every request waiting."""
    burst = [dataclasses.replace(r, arrival_s=0.0) for r in requests]
    return sim_figures(profile, burst, cap)["requests_per_s"]


def scaled(profile: StepProfile, factor: float) -> StepProfile:
    return dataclasses.replace(
        profile,
        a_s=profile.a_s * factor,
        b_s_per_seq=profile.b_s_per_seq * factor,
        c_s_per_prefill_token=profile.c_s_per_prefill_token * factor,
        d_s_per_context_token=profile.d_s_per_context_token * factor,
    )


def mixed(case: Case, rate: float, seed: int) -> list[TraceRequest]:
    return uniform_poisson(
        case.num_requests,
        rate=rate,
        prompt_tokens=case.input_len,
        output_tokens=case.output_len,
        seed=seed,
    )


def azure(case: Case, profile: StepProfile, rate: float) -> list[TraceRequest]:
    """The trace slice with its arrivals compressed to `rate` requests/s on average (inf: all
    at once)."""
    span = read_azure(TRACE, case.num_requests)[-1].arrival_s
    return trace_workload(
        TRACE,
        num_requests=case.num_requests,
        max_model_len=profile.max_model_len,
        speedup=span * rate / (case.num_requests - 1) if math.isfinite(rate) else math.inf,
    )


def check_case(name: str, case: Case, *, load: float, seed: int) -> dict[str, Any]:
    profile = load_profile(case.profile)
    threads = int(profile.fit.get("torch_threads", torch.get_num_threads()))
    torch.set_num_threads(threads)
    dtype = str(profile.fit.get("dtype", "float32"))
    runner = ModelRunner.from_source(
        case.model,
        dtype=dtype,
        device="cpu",
        block_size=profile.block_size,
        kv_cache_bytes=profile.kv_blocks * profile.block_size * kv_bytes_per_token(case, dtype),
        max_num_batched_tokens=profile.step_token_budget,
        max_model_len=profile.max_model_len,
    )
    assert runner.num_blocks * runner.block_size == profile.kv_capacity_tokens
    vocab = runner.config.vocab_size
    rows: dict[str, Any] = {}

    def both(label: str, requests: list[TraceRequest]) -> dict[str, Any]:
        print(f"{name} / {label}: {len(requests)} requests", file=sys.stderr)
        prompts = prompt_token_ids(requests, vocab_size=vocab, seed=seed)
        recorder = ForwardRecorder(runner)
        config = EngineConfig(
            max_batch_size=case.batch_cap,
            max_num_batched_tokens=profile.step_token_budget,
            max_queue=len(requests),
            queue_timeout_s=1e9,  # as `wok bench engine`: nobody expires
            max_model_len=profile.max_model_len,
        )
        load_before = os.getloadavg()[0]
        try:
            engine = run_engine_bench(runner, config, requests, prompts, progress=False)
        finally:
            recorder.close()
        diag = diagnostics(recorder.steps, profile)
        rows[label] = {
            "requests": len(requests),
            "offered_rate": offered_rate(requests),
            "engine": engine,
            "sim": sim_figures(profile, requests, case.batch_cap),
            "sim_k": sim_figures(scaled(profile, diag["contention"]), requests, case.batch_cap),
            "sim_refit": sim_figures(
                refit_on_engine(recorder.steps, profile), requests, case.batch_cap
            ),
            "diag": diag,
            "load_average": [load_before, os.getloadavg()[0]],
        }
        return rows[label]

    burst = mixed(case, math.inf, seed)
    capacity = both("burst", burst)["engine"]["requests_per_s"]
    both("poisson", mixed(case, load * capacity, seed))
    # The trace's mix is another one: its capacity is the engine's on the burst, times the
    # profile's ratio between the two mixes.
    ratio = saturated_rate(profile, azure(case, profile, math.inf), case.batch_cap)
    ratio /= saturated_rate(profile, burst, case.batch_cap)
    both("azure", azure(case, profile, load * capacity * ratio))
    return {"case": case, "profile": profile, "threads": threads, "workloads": rows}


def kv_bytes_per_token(case: Case, dtype: str) -> int:
    from wok_runtime.core.loader import parse_dtype, resolve_source
    from wok_runtime.core.model_config import ModelConfig

    config = ModelConfig.from_file(resolve_source(case.model) / "config.json")
    return config.kv_bytes_per_token(parse_dtype(dtype).itemsize)


def offered_rate(requests: list[TraceRequest]) -> float:
    span = max(r.arrival_s for r in requests)
    return math.inf if span == 0 else (len(requests) - 1) / span


def delta(sim: float, engine: float) -> str:
    diff = sim / engine - 1
    mark = "" if abs(diff) <= TARGET else " ✗"
    return f"{diff:+.0%}{mark}"


def report(results: list[dict[str, Any]], *, command: str, seconds: float) -> str:
    lines = [
        "# Step-time profiles against the engine (CPU)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {device_label('cpu')}, {os.cpu_count()} CPUs, shared with other engineers; "
        f"torch {torch.__version__}; whole run {seconds:.0f} s.",
        "",
        "Each workload runs on the real engine, then on the simulator's single replica "
        "(`wok_sim.replica.run_single`) with the committed profile, on the same requests. "
        "Δ = sim / engine − 1 (target ±15 %, ✗ beyond). `sim × k` reruns the simulator with "
        "every cost multiplied by k, the contention measured during the engine's run (Σ wall / "
        "Σ CPU time of its forwards); `step model` is Σ profile prediction / Σ CPU time of the "
        "engine's iterations on the same steps; `loop` is the engine's CPU per iteration outside "
        "the forward (sampler, scheduler); `k, 1st/2nd half` is k over each half of the run's "
        "steps (a load that changed during the run). `sim, refit` is a diagnostic, not a result: "
        "the simulator with costs refitted on the engine's own steps of that run (wall time), "
        "which isolates the simulator's semantics from the profile's measurement.",
    ]
    for result in results:
        case, profile = result["case"], result["profile"]
        lines += [
            "",
            f"## {case.model} with `{case.profile}`",
            "",
            f"Profile: a {profile.a_s * 1e3:.2f} ms, b {profile.b_s_per_seq * 1e3:.3f} ms/seq, "
            f"c {profile.c_s_per_prefill_token * 1e3:.4f} ms/prefill token, d "
            f"{profile.d_s_per_context_token * 1e6:.4f} µs/context token (R² "
            f"{profile.fit.get('r2', float('nan')):.3f}); KV {profile.kv_capacity_tokens} tokens, "
            f"budget {profile.step_token_budget}, max_model_len {profile.max_model_len}. Batch "
            f"cap {case.batch_cap}, {result['threads']} torch thread(s). Mix: prompts "
            f"{case.input_len[0]}–{case.input_len[1]}, outputs {case.output_len[0]}–"
            f"{case.output_len[1]} tokens.",
            "",
            "| workload | metric | engine | sim | Δ | sim × k | Δ | sim, refit | Δ |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, row in result["workloads"].items():
            for title, key, fmt in METRICS:
                e, s, k = row["engine"][key], row["sim"][key], row["sim_k"][key]
                r = row["sim_refit"][key]
                lines.append(
                    f"| {label} | {title} | {fmt.format(e)} | {fmt.format(s)} | {delta(s, e)} | "
                    f"{fmt.format(k)} | {delta(k, e)} | {fmt.format(r)} | {delta(r, e)} |"
                )
        lines += [
            "",
            "| workload | requests | offered req/s | steps | k | step model | "
            "forward model | loop ms | load avg | k, 1st/2nd half |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, row in result["workloads"].items():
            d = row["diag"]
            lines.append(
                f"| {label} | {row['requests']} | {row['offered_rate']:.2f} | {d['steps']} | "
                f"{d['contention']:.2f} | {d['step_model_ratio']:.2f} | "
                f"{d['forward_model_ratio']:.2f} | {d['loop_overhead_ms']:.2f} | "
                f"{row['load_average'][0]:.1f}→{row['load_average'][1]:.1f} | "
                f"{d['contention_halves'][0]:.2f} / {d['contention_halves'][1]:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--load", type=float, default=0.6, help="offered / saturated rate")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (not the grid's)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    started = time.monotonic()
    results = [check_case(n, CASES[n], load=args.load, seed=args.seed) for n in names]
    command = "python bench/runtime/profile_check.py " + shlex.join(argv or sys.argv[1:])
    text = report(results, command=command.strip(), seconds=time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
