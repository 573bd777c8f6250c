"""Eager against compiled, step by step, by the rows a step packs, on this CPU in bfloat16.

Why: `--compile` runs every step as one inductor graph (step_graph.py), the linears on brgemm
and decode attention on its kernel. This says what the graph adds to the kernels at each step
size, and what `--compile` as a whole adds to the eager runtime: decode steps of 1 to 64
sequences at position 160 and single prefills of 64 to 512 tokens, on an eager runner and on a
compiled one run with and without its step graph, interleaved, medians; one intra-op thread, as
the server runs.

    .venv/bin/python bench/runtime/compile_rows.py   # writes results/compile_rows.{md,json}
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

from wok_runtime.core.model_runner import ModelRunner, StepInput

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
#: eager: the runtime without --compile; kernels: --compile's kernels, steps eager; graph: all of
#: --compile, every step one graph.
MODES = ("eager", "kernels", "graph")


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

    eager, compiled = runner(False), runner(True)
    graph = compiled.step_graph
    assert graph is not None, "the model did not compile"

    def run(mode: str, step: list[StepInput]) -> None:
        if mode == "eager":
            eager.forward(step)
            return
        compiled.step_graph = graph if mode == "graph" else None
        compiled.forward(step)

    rows = {}
    for label, step in steps(eager, batches, prefills).items():
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for mode in MODES:
            run(mode, step)  # warm-up
        for _ in range(iters):
            for mode in MODES:
                started = time.perf_counter()
                run(mode, step)
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
        "interleaved runs of each step in each mode, medians. Decode steps at position 160. "
        "Modes: eager, the runtime without `--compile` (oneDNN's prepacked linears, SDPA); "
        "kernels, `--compile`'s linears on brgemm and decode attention kernel with the step run "
        "op by op; graph, all of `--compile`, the step one compiled graph. Speed-ups are the "
        "ratios of the medians (> 1: the second is faster).",
        "",
        "| model | step | eager ms | kernels ms | graph ms | graph / kernels | graph / eager |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in report["models"].items():
        for label, t in rows.items():
            lines.append(
                f"| {name} | {label} | {t['eager'] * 1e3:.2f} | {t['kernels'] * 1e3:.2f} | "
                f"{t['graph'] * 1e3:.2f} | {t['kernels'] / t['graph']:.2f}× | "
                f"{t['eager'] / t['graph']:.2f}× |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--prefills", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--out", default=str(RESULTS / "compile_rows"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {
        "command": shlex.join(["python", "bench/runtime/compile_rows.py", *sys.argv[1:]]),
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
