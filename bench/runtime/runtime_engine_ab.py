"""Variants of the runtime's model side by side, through the engine (no HTTP), on this CPU.

Why: bench/vllm/runtime_vs_vllm.py compares whole servers, with HTTP and a noisy machine in the way;
this says whether one change to the model's kernels makes the engine faster, before it goes in.
One runner per model (bfloat16, one intra-op thread, as the server runs beside vLLM), each
variant switched on in turn on the same runner, alternating, `--reps` times; medians. The load is
the closed loops' (128 prompt and 64 output tokens per request, every request at once, at most
`--batch` running), so steps mix prefill chunks and decode batches as a server's do.

Variants:
  bf16 GEMM        every linear on its plain bf16 weights (F.linear, oneDNN)
  prepacked        every linear on its weights prepacked for oneDNN (what `from_source` sets up
                   for bfloat16 on a CPU with AMX; `Linear.pack`) — on CPUs with AMX
  fp32 GEMM ≥ N    linears of N rows or more on fp32 copies of the weights (what `from_source`
                   sets up for bfloat16 on a CPU without AMX; N = model.FP32_GEMM_MIN_ROWS) —
                   on CPUs without AMX
  …, decode kernel decode attention over the paged blocks in place (paged_decode.py)
  …, compiled      and the whole step one compiled graph (step_graph.py, inductor), warmed
                   up before the timed runs; a compiled step's linears never take the fp32
                   copies (its rows are unknown to the graph)
  brgemm, …        every linear on torch's AMX micro-kernel, its weight in brgemm's blocked
                   layout (brgemm_linear.py) — on CPUs with AMX; with the decode kernel and
                   compiled, what `--compile` sets up there

    .venv/bin/python bench/runtime/runtime_engine_ab.py   # writes results/runtime_engine_ab.*
"""

from __future__ import annotations

import argparse
import math
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
from cpu_kernels import write_report

from wok_contracts.traces import TraceRequest, uniform_poisson
from wok_runtime.core.engine import EngineConfig
from wok_runtime.core.loader import load_model, resolve_source
from wok_runtime.core.model import FP32_GEMM_MIN_ROWS
from wok_runtime.core.model_runner import ModelRunner
from wok_runtime.core.step_graph import StepGraph
from wok_runtime.kernels import brgemm_linear, paged_decode
from wok_runtime.tools.bench_engine import prompt_token_ids, run_engine_bench

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
METRICS = ("output_tokens_per_s", "tpot_p50_s", "ttft_p50_s")


def gemm_variants(runner: ModelRunner) -> dict[str, Callable[[], None]]:
    linears = runner.model.linears()
    # `from_source` prepared the linears for this CPU; the plain weights come back from the
    # checkpoint so that every variant runs on the same runner.
    path = resolve_source(runner.source)
    plain = load_model(path, dtype=torch.bfloat16, device=torch.device("cpu"))
    for mine, theirs in zip(linears, plain.linears(), strict=True):
        mine.weight = theirs.weight
    packed = [m.packed for m in linears]
    brgemm_built = brgemm_linear.load()
    blocked = [
        brgemm_linear.pack(m.weight.detach())
        if brgemm_built and brgemm_linear.fits(m.out_features, m.in_features)
        else None
        for m in linears
    ]

    def bf16() -> None:
        for m in linears:
            m.packed = m.brgemm_packed = m.weight32 = m.bias32 = None

    def prepacked() -> None:
        bf16()
        for m, p in zip(linears, packed, strict=True):
            m.packed = p

    def brgemm() -> None:
        bf16()
        for m, b in zip(linears, blocked, strict=True):
            m.brgemm_packed = b
            m.bias32 = None if m.bias is None else m.bias.float()

    def fp32() -> None:
        bf16()
        for m in linears:
            m.keep_fp32_copy()

    # One step graph: the warm-up compiles it once per linear variant (a guard on the layout).
    graph = StepGraph(runner.model)

    def compiled(enabled: bool) -> None:
        runner.step_graph = graph if enabled else None

    kernel = paged_decode.load()

    def attention(in_place: bool) -> None:
        runner.decode_kernel = kernel if in_place else None

    if torch.cpu._is_amx_tile_supported():
        return {
            "bf16 GEMM": lambda: (compiled(False), attention(False), bf16()),
            "prepacked": lambda: (compiled(False), attention(False), prepacked()),
            "prepacked, decode kernel": lambda: (compiled(False), attention(True), prepacked()),
            "prepacked, decode kernel, compiled": lambda: (
                compiled(True),
                attention(True),
                prepacked(),
            ),
            "brgemm, decode kernel, compiled": lambda: (compiled(True), attention(True), brgemm()),
        }
    return {
        "bf16 GEMM": lambda: (compiled(False), attention(False), bf16()),
        f"fp32 GEMM ≥ {FP32_GEMM_MIN_ROWS}": lambda: (compiled(False), attention(False), fp32()),
        f"fp32 GEMM ≥ {FP32_GEMM_MIN_ROWS}, decode kernel": lambda: (
            compiled(False),
            attention(True),
            fp32(),
        ),
        "bf16 GEMM, decode kernel, compiled": lambda: (compiled(True), attention(True), bf16()),
    }


def run_model(model: str, *, batch: int, requests: int, reps: int) -> dict[str, Any]:
    runner = ModelRunner.from_source(
        f"builtin:{model}", dtype="bfloat16", device="cpu", kv_cache_bytes=1 << 30
    )
    config = EngineConfig(
        max_batch_size=batch, max_queue=requests, queue_timeout_s=1e9, max_model_len=512
    )

    def load(count: int, output: int) -> tuple[list[TraceRequest], list[list[int]]]:
        """`count` requests of 128 prompt and `output` output tokens, all at once, and their
        prompts."""
        work = uniform_poisson(
            count, rate=math.inf, prompt_tokens=(128, 128), output_tokens=(output, output)
        )
        return work, prompt_token_ids(work, vocab_size=runner.config.vocab_size)

    work, work_prompts = load(requests, 64)
    warm, warm_prompts = load(batch, 3)  # the step shapes of the timed runs, compiled and warm
    variants = gemm_variants(runner)
    for name, switch in variants.items():
        switch()
        started = time.perf_counter()
        run_engine_bench(runner, config, warm, warm_prompts, progress=False)
        print(f"{model} batch {batch} {name}: warm-up {time.perf_counter() - started:.1f} s")
    figures: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rep in range(reps):
        names = list(variants) if rep % 2 == 0 else list(variants)[::-1]  # who goes first
        for name in names:
            variants[name]()
            result = run_engine_bench(runner, config, work, work_prompts, progress=False)
            for key in METRICS:
                figures[name][key].append(result[key])
            print(f"{model} batch {batch} rep {rep} {name}: {result[METRICS[0]]:.1f} tok/s")
    medians = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figures.items()}
    return {"model": model, "batch": batch, "requests": requests, "variants": medians}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Model variants side by side through the engine, bfloat16, on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} (torch {report['torch']}, one "
        f"intra-op thread, a 2-CPU machine shared with other work); {report['reps']} alternating "
        "runs per variant, medians. Requests of 128 prompt and 64 output tokens, all at once. "
        "tok/s ratio: the variant over the first one.",
        "",
        "| model | batch | variant | out tok/s | ratio | TPOT P50 ms | TTFT P50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        first = next(iter(row["variants"].values()))["output_tokens_per_s"]
        for name, v in row["variants"].items():
            tok = v["output_tokens_per_s"]
            lines.append(
                f"| {row['model']} | {row['batch']} | {name} | {tok:.0f} | {tok / first:.2f}× | "
                f"{v['tpot_p50_s'] * 1e3:.1f} | {v['ttft_p50_s'] * 1e3:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 16], help="per model")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "runtime_engine_ab"))
    args = parser.parse_args(argv)
    if len(args.requests) != len(args.models):
        parser.error("--requests takes one count per model")
    torch.set_num_threads(1)
    rows = [
        run_model(model, batch=batch, requests=max(n, batch), reps=args.reps)
        for model, n in zip(args.models, args.requests, strict=True)
        for batch in args.batches
    ]
    report = {
        "command": shlex.join(["python", "bench/runtime/runtime_engine_ab.py", *sys.argv[1:]]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "reps": args.reps,
        "rows": rows,
    }
    write_report(Path(args.out), report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
