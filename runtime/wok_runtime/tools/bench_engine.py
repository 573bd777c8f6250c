"""`wok bench engine`: an offline benchmark of the engine (no HTTP), by batching mode.

Why offline: it measures what batching itself buys (continuous vs static vs serial) on one model,
without network and JSON costs in the way. Workloads: `synthetic` (uniform prompt and output
lengths, all at once or Poisson arrivals) or `trace:PATH` (an Azure LLM trace CSV: prompt lengths
scaled so the longest prompt of the slice fills `max_model_len`, output lengths kept and clipped to
fit, arrivals kept, compressed by `--speedup`, or all at once). Every request ignores EOS so it
produces exactly its output length in every mode.

Reported: output tok/s, request/s, TTFT / TPOT / E2E percentiles, mean batch size, KV usage and
the useful-slot fraction, Σ_steps(sequences that produced a token) ÷ Σ_steps(admission cap). For a
static batch of K requests of output lengths l_i that is the classic Σ l_i / (K · l_max); for
continuous batching it is the share of the cap's slots doing useful work.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wok_contracts.traces import TraceRequest, clip_to_model, read_azure, uniform_poisson

if TYPE_CHECKING:  # torch stays out of `wok --help`
    from wok_runtime.core.engine import EngineConfig, RequestOutput, StepStats
    from wok_runtime.core.model_runner import ModelRunner

TRACE_PREFIX = "trace:"


def parse_range(text: str) -> tuple[int, int]:
    """`32` or `16:64` (inclusive)."""
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError as error:
        raise ValueError(f"expected N or LOW:HIGH, got {text!r}") from error
    if not 1 <= low <= high:
        raise ValueError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return low, high


def prompt_token_ids(
    requests: list[TraceRequest], *, vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """Each request's prompt: `prompt_tokens` seeded random ids, in the requests' order."""
    rng = random.Random(seed)
    # Token 0 is EOS/BOS in the builtin models; plain random ids above it are fine for timing.
    return [[rng.randrange(1, vocab_size) for _ in range(r.prompt_tokens)] for r in requests]


def trace_workload(
    path: Path,
    *,
    num_requests: int,
    max_model_len: int,
    speedup: float,
    max_output_len: int | None = None,
) -> list[TraceRequest]:
    """The first `num_requests` rows of an Azure trace (TIMESTAMP, ContextTokens,
    GeneratedTokens). Prompts are scaled by one factor so the longest one of the slice takes half
    of `max_model_len` (the trace's contexts reach 8k; the mix of short and long is what matters);
    outputs keep their length, clipped to what fits (and to `max_output_len`). `speedup` divides
    the inter-arrival times (inf: all at once)."""
    rows = read_azure(path, num_requests)
    scale = (max_model_len // 2) / max(max(row.prompt_tokens for row in rows), 1)
    scaled = [
        TraceRequest(
            row.arrival_s / speedup if math.isfinite(speedup) else 0.0,
            round(row.prompt_tokens * scale),
            row.output_tokens if max_output_len is None else min(row.output_tokens, max_output_len),
        )
        for row in rows
    ]
    return clip_to_model(scaled, max_model_len)[0]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_engine_bench(
    runner: ModelRunner,
    config: EngineConfig,
    requests: list[TraceRequest],
    prompts: list[list[int]],
    *,
    progress: bool = True,
    timeout_s: float = 3600.0,
    tokens: dict[int, list[int]] | None = None,
) -> dict[str, Any]:
    """Replays `requests` with their `prompts` (`prompt_token_ids`) on a fresh engine over
    `runner`; returns the figures as a dict. With `tokens`, also fills it with each request's
    output tokens (by workload index)."""
    finals, steps = replay(
        runner, config, requests, prompts, progress=progress, timeout_s=timeout_s, tokens=tokens
    )
    failed = [o for o in finals if o.finish_reason not in ("length", "stop")]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0].error}")
    return figures(config, finals, steps)


def replay(
    runner: ModelRunner,
    config: EngineConfig,
    requests: list[TraceRequest],
    prompts: list[list[int]],
    *,
    progress: bool,
    timeout_s: float,
    tokens: dict[int, list[int]] | None,
) -> tuple[list[RequestOutput], list[StepStats]]:
    """Each request added at its arrival on a fresh engine, until every one has finished:
    their final outputs, and the engine's steps. Each asks for exactly its `output_tokens`."""
    if [len(p) for p in prompts] != [r.prompt_tokens for r in requests]:
        raise ValueError("each request needs a prompt of its prompt_tokens ids")
    from tqdm import tqdm

    from wok_runtime.core.engine import LLMEngine, SamplingParams

    steps: list[StepStats] = []
    finals: dict[str, RequestOutput] = {}
    lock = threading.Lock()
    all_done = threading.Event()
    bar = tqdm(
        total=len(requests), desc=config.mode, unit="req", file=sys.stderr, disable=not progress
    )

    def on_output(out: RequestOutput) -> None:
        if tokens is not None:
            tokens.setdefault(int(out.request_id), []).extend(out.new_token_ids)
        if out.finished:
            with lock:
                finals[out.request_id] = out
                bar.update(1)
                if len(finals) == len(requests):
                    all_done.set()

    engine = LLMEngine(runner, config, on_step=steps.append)
    engine.start()
    start = time.monotonic()
    try:
        for i, req in sorted(enumerate(requests), key=lambda item: item[1].arrival_s):
            delay = start + req.arrival_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            params = SamplingParams(max_tokens=req.output_tokens, ignore_eos=True)
            engine.add_request(prompts[i], params, on_output=on_output, request_id=str(i))
        if not all_done.wait(timeout_s):
            raise RuntimeError(f"the benchmark did not finish within {timeout_s} s")
    finally:
        engine.shutdown(drain_timeout_s=0)
        bar.close()
    return list(finals.values()), steps


def figures(
    config: EngineConfig, finals: list[RequestOutput], steps: list[StepStats]
) -> dict[str, Any]:
    """The run's figures from its requests' final outputs and the engine's steps."""
    metrics = [o.metrics for o in finals]
    first_arrival = min(m.arrival_time for m in metrics)
    last_finish = max(m.finished_time or 0.0 for m in metrics)
    duration = last_finish - first_arrival
    output_tokens = sum(m.num_output_tokens for m in metrics)
    ttft = [m.first_token_time - m.arrival_time for m in metrics if m.first_token_time]
    e2e = [m.finished_time - m.arrival_time for m in metrics if m.finished_time]
    tpot = [
        (m.last_token_time - m.first_token_time) / (m.num_output_tokens - 1)
        for m in metrics
        if m.num_output_tokens > 1 and m.last_token_time and m.first_token_time
    ]
    busy = [s for s in steps if s.batch_size > 0]
    result: dict[str, Any] = {
        "mode": config.mode,
        "num_requests": len(finals),
        "duration_s": duration,
        "output_tokens": output_tokens,
        "prompt_tokens": sum(m.num_prompt_tokens for m in metrics),
        "output_tokens_per_s": output_tokens / duration,
        "requests_per_s": len(metrics) / duration,
        "mean_batch_size": statistics.fmean(s.batch_size for s in busy) if busy else 0.0,
        "mean_decode_batch_size": statistics.fmean(s.num_sampled for s in busy) if busy else 0.0,
        "kv_usage_mean": statistics.fmean(s.kv_usage for s in busy) if busy else 0.0,
        "kv_usage_max": max((s.kv_usage for s in busy), default=0.0),
        "useful_slot_fraction": (
            sum(s.num_sampled for s in busy) / sum(s.max_batch_size for s in busy) if busy else 0.0
        ),
        "num_steps": len(busy),
        "num_preemptions": sum(s.num_preempted for s in steps),
        "max_batch_size": config.max_batch_size if config.mode != "serial" else 1,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for q in (50, 90, 99):
            result[f"{name}_p{q}_s"] = percentile(values, q)
    return result


def default_kv_cache_bytes(
    source: str, *, dtype: str, max_batch_size: int, max_model_len: int
) -> int:
    """Enough KV for `max_batch_size` full-length sequences (no preemption at the cap)."""
    from wok_runtime.core.loader import parse_dtype, resolve_source
    from wok_runtime.core.model_config import ModelConfig

    config = ModelConfig.from_file(resolve_source(source) / "config.json")
    per_token = config.kv_bytes_per_token(parse_dtype(dtype).itemsize)
    return per_token * max_model_len * max(1, max_batch_size)


def run_from_args(args: argparse.Namespace) -> int:
    from wok_runtime.core.engine import EngineConfig
    from wok_runtime.core.model_runner import ModelRunner

    args = normalise_args(args)
    input_len, output_len = parse_range(args.input_len), parse_range(args.output_len)
    if args.max_model_len < 2:
        raise ValueError("--max-model-len must be >= 2")
    if not args.workload.startswith(TRACE_PREFIX) and args.workload != "synthetic":
        raise ValueError(f"--workload must be synthetic or trace:PATH, got {args.workload!r}")
    if args.workload == "synthetic" and input_len[1] + output_len[1] > args.max_model_len:
        raise ValueError(
            f"--input-len + --output-len can reach {input_len[1] + output_len[1]} tokens, more "
            f"than --max-model-len {args.max_model_len}"
        )
    kv_bytes = args.kv_cache_bytes or default_kv_cache_bytes(
        args.model,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        max_model_len=args.max_model_len,
    )
    runner = ModelRunner.from_source(
        args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        kv_cache_bytes=kv_bytes,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
    )
    if args.workload == "synthetic":
        workload = uniform_poisson(
            args.num_requests,
            rate=args.request_rate,
            prompt_tokens=input_len,
            output_tokens=output_len,
            seed=args.seed,
        )
    else:
        workload = trace_workload(
            Path(args.workload.removeprefix(TRACE_PREFIX)),
            num_requests=args.num_requests,
            max_model_len=args.max_model_len,
            speedup=args.speedup,
            max_output_len=output_len[1] if args.output_len_given else None,
        )
    prompts = prompt_token_ids(workload, vocab_size=runner.config.vocab_size, seed=args.seed)
    config = EngineConfig(
        mode=args.mode,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_queue=max(len(workload), 1),
        queue_timeout_s=1e9,  # a benchmark measures waiting; it never expires anyone
        max_model_len=args.max_model_len,
    )
    result = run_engine_bench(runner, config, workload, prompts, progress=not args.no_progress)
    result.update(model=args.model, workload=args.workload, seed=args.seed)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_table([result]))
    return 0


def format_table(results: list[dict[str, Any]]) -> str:
    """A short markdown table, one row per run."""
    cols = [
        ("mode", "mode", "{}"),
        ("out tok/s", "output_tokens_per_s", "{:.1f}"),
        ("req/s", "requests_per_s", "{:.2f}"),
        ("TTFT p50/p99 s", ("ttft_p50_s", "ttft_p99_s"), "{:.3f}/{:.3f}"),
        ("TPOT p50 s", "tpot_p50_s", "{:.4f}"),
        ("E2E p50/p99 s", ("e2e_p50_s", "e2e_p99_s"), "{:.2f}/{:.2f}"),
        ("mean batch", "mean_batch_size", "{:.1f}"),
        ("KV max", "kv_usage_max", "{:.0%}"),
        ("useful slots", "useful_slot_fraction", "{:.0%}"),
    ]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        cells = []
        for _, key, fmt in cols:
            values = [r[k] for k in key] if isinstance(key, tuple) else [r[key]]
            cells.append(fmt.format(*values))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def register_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="builtin:tiny", help="model source (builtin:NAME or a dir)")
    p.add_argument("--mode", choices=("continuous", "static", "serial"), default="continuous")
    p.add_argument(
        "--workload", default="synthetic", help="synthetic | trace:PATH (Azure LLM trace CSV)"
    )
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", default="16:64", help="prompt tokens, N or LOW:HIGH")
    p.add_argument(
        "--output-len",
        default=None,
        help="output tokens, N or LOW:HIGH (default 8:128; for a trace: a clip on its lengths)",
    )
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="Poisson arrivals/s (default: all)"
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=math.inf,
        help="trace: divide inter-arrival times by this (1 = real time; default inf = all at once)",
    )
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-wait-ms", type=int, default=50, help="static mode: batch formation wait")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="default: cap × max_model_len")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")


def normalise_args(args: argparse.Namespace) -> argparse.Namespace:
    args.output_len_given = args.output_len is not None
    if args.output_len is None:
        args.output_len = "8:128"
    if args.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    if not args.speedup > 0 or not args.request_rate > 0:
        raise ValueError("--speedup and --request-rate must be > 0")
    return args
