"""Eager against compiled, step by step, by the rows a step packs, on this CPU in bfloat16.

Why: a compiled block half is one call into an inductor graph, whose guards and wrapper cost more
than the kernels it fuses save on small steps. This finds the rows from which compiling pays,
the threshold `model.COMPILED_MIN_ROWS`: decode steps of 1 to 64 sequences at position 160 and
single prefills of 64 to 512 tokens, each on an eager runner and on one compiled for every step
(the threshold set to one row), interleaved, medians; one intra-op thread, as the server runs.

    .venv/bin/python bench/compile_rows.py   # writes bench/results/compile_rows.{md,json}
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from cpu_kernels import write_report
from runtime_step import decode_step

from wok_runtime import model
from wok_runtime.model_runner import ModelRunner, StepInput

ROOT = Path(__file__).resolve().parents[1]


def steps(runner: ModelRunner, batches: list[int], prefills: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {f"decode {b}": decode_step(runner, b, 160) for b in batches}
    for n in prefills:
        out[f"prefill {n}"] = [StepInput([7] * n, 0, list(range(-(-n // runner.block_size))))]
    return out


def run_model(name: str, batches: list[int], prefills: list[int], iters: int) -> dict[str, Any]:
    def runner(compile: bool) -> ModelRunner:
        return ModelRunner.from_source(
            f"builtin:{name}",
            dtype="bfloat16",
            kv_cache_bytes=256 << 20,
            max_model_len=512,
            compile=compile,
        )

    model.COMPILED_MIN_ROWS = 1  # every step on the compiled graphs
    runners = {"eager": runner(False), "compiled": runner(True)}
    rows = {}
    for label, step in steps(runners["eager"], batches, prefills).items():
        times: dict[str, list[float]] = {mode: [] for mode in runners}
        for r in runners.values():
            r.forward(step)  # warm-up (and any recompile for this shape)
        for _ in range(iters):
            for mode, r in runners.items():
                started = time.perf_counter()
                r.forward(step)
                times[mode].append(time.perf_counter() - started)
        medians = {mode: statistics.median(t) for mode, t in times.items()}
        rows[label] = medians
        print(f"{name} {label}: {medians}", file=sys.stderr)
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Eager against compiled, by the rows of a step, bfloat16, on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} (torch {report['torch']}, one "
        f"intra-op thread, a 2-CPU machine shared with other work); {report['iters']} "
        "interleaved runs of each step on each runner, medians. Decode steps at position 160. "
        "speed-up = eager ms / compiled ms (> 1: compiling pays).",
        "",
        "| model | step | eager ms | compiled ms | speed-up |",
        "|---|---|---|---|---|",
    ]
    for name, rows in report["models"].items():
        for label, t in rows.items():
            lines.append(
                f"| {name} | {label} | {t['eager'] * 1e3:.2f} | {t['compiled'] * 1e3:.2f} | "
                f"{t['eager'] / t['compiled']:.2f}× |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--prefills", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "compile_rows"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {
        "command": shlex.join(["python", "bench/compile_rows.py", *sys.argv[1:]]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "iters": args.iters,
        "models": {
            name: run_model(name, args.batches, args.prefills, args.iters) for name in args.models
        },
    }
    write_report(Path(args.out), report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
