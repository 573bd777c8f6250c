"""`wok bench http`: load-tests running wok servers the way clients see them, over HTTP.

Why beside `wok bench engine`: the engine benchmark measures the scheduler and the model; this
one adds the HTTP, the queue's backpressure (429s) and the client's view of latency, and its JSON
has the same keys so the two can be compared. Arrivals are Poisson at `--request-rate`, bounded by
`--max-concurrency`, or replayed from an Azure LLM trace (`--trace`). Every request streams, so
TTFT and inter-token latency are measured on the client. `--shared-prefix-len N` puts the same N
tokens (a system prompt) before every prompt, as vLLM's `--random-prefix-len`: the load that
prefix caching is for. Prompts are token ids (exact lengths)
and `ignore_eos` makes every output exactly as long as asked. Bounded in count and time, and
loopback only: it is a benchmark, not a load weapon.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import itertools
import json
import math
import random
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from wok_contracts.quantiles import nearest_rank
from wok_contracts.traces import TraceRequest, read_azure, uniform_poisson

PROMPT_TOKEN_RANGE = (10, 250)  # ids every vocabulary has (byte-level BPE: the 256 byte tokens)
BATCH_SIZE_METRIC = "wok_batch_size"


@dataclass
class RequestResult:
    status: int = 0  # 0: no answer (connection error or cut off by the time bound)
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    expected_tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # per streamed chunk, from the start
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each chunk (a lagging
    # server may merge several steps' tokens into one chunk)
    error: str | None = None
    body: str | None = None  # the start of a non-200 answer's body (its error code)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def check_loopback(url: str) -> str:
    """The URL without a trailing slash; refuses anything that is not a loopback address."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--url must be http(s)://HOST:PORT, got {url!r}")
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 80)
    except socket.gaierror as error:
        raise ValueError(f"cannot resolve {parsed.hostname!r}: {error}") from error
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise ValueError(f"{url}: wok bench http only targets loopback addresses")
    return url.rstrip("/")


def trace_specs(
    path: str,
    *,
    n: int,
    speedup: float,
    max_input_len: int | None,
    max_output_len: int | None,
) -> list[TraceRequest]:
    """The first `n` requests of an Azure LLM trace (TIMESTAMP, ContextTokens, GeneratedTokens),
    times relative to the first, divided by `speedup`; lengths clipped to the given maxima."""
    if speedup <= 0:
        raise ValueError(f"--trace-speedup must be > 0, got {speedup}")
    specs: list[TraceRequest] = []
    for row in read_azure(Path(path), n):
        prompt = max(1, row.prompt_tokens)
        output = max(1, row.output_tokens)
        if max_input_len:
            prompt = min(prompt, max_input_len)
        if max_output_len:
            output = min(output, max_output_len)
        specs.append(TraceRequest(row.arrival_s / speedup, prompt, output))
    return specs


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """A server-sent event stream's lines. Only CR/LF end a line there: httpx's `aiter_lines`
    (str.splitlines) also splits at U+2028 and the like, which a detokenized chunk may hold."""
    buffer = b""
    async for chunk in chunks:
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode(errors="replace")
    if buffer:
        yield buffer.rstrip(b"\r").decode(errors="replace")


async def send_completion(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    spec: TraceRequest,
    rng: random.Random,
    prefix: list[int] | None = None,
) -> RequestResult:
    """One streamed completion: `prefix` (if any), then `spec.prompt_tokens` random tokens."""
    result = RequestResult(expected_tokens=spec.output_tokens)
    own = [rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(spec.prompt_tokens)]
    body = {
        "model": model,
        "prompt": (prefix or []) + own,
        "max_tokens": spec.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    started = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.body = (await response.aread())[:500].decode(errors="replace")
                return result
            done = False
            async for line in sse_lines(response.aiter_bytes()):
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                choices = chunk.get("choices") or []
                ids = choices[0].get("token_ids") or [] if choices else []
                if ids:
                    now = time.perf_counter() - started
                    result.ttft_s = result.ttft_s if result.ttft_s is not None else now
                    result.token_times.append(now)
                    result.chunk_tokens.append(len(ids))
                    result.output_tokens += len(ids)
            result.e2e_s = time.perf_counter() - started
            if not done:
                result.error = "the stream ended without [DONE]"
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def _scrape_batch_size(client: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    """(sum, count) of the wok_batch_size histogram over all servers; (nan, nan) if unreadable."""
    total_sum = total_count = 0.0
    for url in urls:
        try:
            text = (await client.get(f"{url}/metrics")).text
        except httpx.HTTPError:
            return math.nan, math.nan
        found = 0
        for line in text.splitlines():
            if line.startswith(BATCH_SIZE_METRIC + "_sum"):
                total_sum += float(line.rsplit(" ", 1)[1])
                found += 1
            elif line.startswith(BATCH_SIZE_METRIC + "_count"):
                total_count += float(line.rsplit(" ", 1)[1])
                found += 1
        if found < 2:
            return math.nan, math.nan
    return total_sum, total_count


async def run_bench(
    urls: list[str],
    specs: list[TraceRequest],
    *,
    model: str | None = None,
    max_concurrency: int | None = None,
    duration_s: float = 600.0,
    seed: int = 0,
    progress: bool = False,
    shared_prefix_len: int = 0,
) -> tuple[list[RequestResult], float, float | None]:
    """Runs the requests; returns (results, wall seconds, mean batch size or None)."""
    limits = httpx.Limits(max_connections=max_concurrency or 1000, max_keepalive_connections=100)
    timeout = httpx.Timeout(duration_s + 10.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if model is None:
            model = (await client.get(f"{urls[0]}/v1/models")).json()["data"][0]["id"]
        before = await _scrape_batch_size(client, urls)
        semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        rng = random.Random(seed)
        prefix = [rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(shared_prefix_len)]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(specs), desc="requests", unit="req", file=sys.stderr)
        round_robin = itertools.cycle(urls)
        results = [RequestResult(expected_tokens=s.output_tokens) for s in specs]
        start = time.perf_counter()

        async def send(i: int, spec: TraceRequest, url: str) -> None:
            await asyncio.sleep(max(0.0, spec.arrival_s - (time.perf_counter() - start)))
            if semaphore is not None:
                async with semaphore:
                    results[i] = await send_completion(client, url, model, spec, rng, prefix)
            else:
                results[i] = await send_completion(client, url, model, spec, rng, prefix)
            if bar is not None:
                bar.update(1)

        tasks = [
            asyncio.create_task(send(i, spec, next(round_robin))) for i, spec in enumerate(specs)
        ]
        _, pending = await asyncio.wait(tasks, timeout=duration_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - start
        if bar is not None:
            bar.close()
        after = await _scrape_batch_size(client, urls)
    count = after[1] - before[1]
    mean_batch = (after[0] - before[0]) / count if count > 0 else None
    return results, elapsed, mean_batch


def _pct(values: list[float], q: float) -> float | None:
    return nearest_rank(values, q) if values else None


def summarize(
    results: list[RequestResult],
    elapsed_s: float,
    *,
    mean_batch_size: float | None,
    slo_ttft_s: float | None = None,
    slo_e2e_s: float | None = None,
) -> dict[str, Any]:
    """The report; the keys shared with `wok bench engine` come first."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    itl = [b - a for r in ok for a, b in itertools.pairwise(r.token_times)]

    def good(r: RequestResult) -> bool:
        return (slo_ttft_s is None or (r.ttft_s is not None and r.ttft_s <= slo_ttft_s)) and (
            slo_e2e_s is None or (r.e2e_s is not None and r.e2e_s <= slo_e2e_s)
        )

    elapsed = max(elapsed_s, 1e-9)

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    return {
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / elapsed,
        "requests_per_s": len(ok) / elapsed,
        "ttft_p50_s": _pct(ttft, 0.50),
        "ttft_p99_s": _pct(ttft, 0.99),
        "tpot_p50_s": _pct(tpot, 0.50),
        "tpot_p99_s": _pct(tpot, 0.99),
        "e2e_p50_s": _pct(e2e, 0.50),
        "e2e_p99_s": _pct(e2e, 0.99),
        "mean_batch_size": mean_batch_size,
        "useful_slot_fraction": None,  # needs the engine's per-step view; see wok bench engine
        "rejected": sum(1 for r in results if r.status == 429),
        "goodput_per_s": sum(1 for r in ok if good(r)) / elapsed,
        "num_requests": len(results),
        "completed": len(ok),
        "unavailable": sum(1 for r in results if r.status == 503),
        "failed": sum(1 for r in results if not r.ok and r.status not in (429, 503)),
        "incomplete_outputs": sum(1 for r in ok if r.output_tokens != r.expected_tokens),
        "duration_s": elapsed_s,
        "ttft_mean_s": mean(ttft),
        "tpot_mean_s": mean(tpot),
        "itl_mean_s": mean(itl),
        "itl_p50_s": _pct(itl, 0.50),
        "itl_p99_s": _pct(itl, 0.99),
        "e2e_mean_s": mean(e2e),
        "slo_ttft_s": slo_ttft_s,
        "slo_e2e_s": slo_e2e_s,
    }


def _format(report: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        value = report[key]
        return "-" if value is None else f"{value * 1000:.1f} ms"

    rows = [
        (
            "requests",
            f"{report['completed']}/{report['num_requests']} completed, "
            f"{report['rejected']} rejected (429), {report['unavailable']} 503, "
            f"{report['failed']} failed",
        ),
        (
            "throughput",
            f"{report['requests_per_s']:.2f} req/s, "
            f"{report['output_tokens_per_s']:.1f} output tok/s",
        ),
        ("goodput", f"{report['goodput_per_s']:.2f} req/s within the SLO"),
        ("TTFT", f"mean {ms('ttft_mean_s')}, P50 {ms('ttft_p50_s')}, P99 {ms('ttft_p99_s')}"),
        ("TPOT", f"mean {ms('tpot_mean_s')}, P50 {ms('tpot_p50_s')}, P99 {ms('tpot_p99_s')}"),
        ("ITL", f"mean {ms('itl_mean_s')}, P50 {ms('itl_p50_s')}, P99 {ms('itl_p99_s')}"),
        ("E2E", f"mean {ms('e2e_mean_s')}, P50 {ms('e2e_p50_s')}, P99 {ms('e2e_p99_s')}"),
        (
            "batch",
            "-"
            if report["mean_batch_size"] is None
            else f"mean {report['mean_batch_size']:.2f} sequences per step",
        ),
    ]
    return "\n".join(f"{name:>10}  {value}" for name, value in rows)


def run_from_args(args: argparse.Namespace) -> int:
    urls = [check_loopback(u) for u in (args.url or ["http://127.0.0.1:8000"])]
    if args.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    if args.request_rate is not None and not args.request_rate > 0:
        raise ValueError("--request-rate must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if not 0 < args.duration <= 3600:
        raise ValueError("--duration must be in (0, 3600] seconds")
    if args.shared_prefix_len < 0:
        raise ValueError("--shared-prefix-len must be >= 0")
    if args.trace:
        specs = trace_specs(
            args.trace,
            n=args.num_requests,
            speedup=args.trace_speedup,
            max_input_len=args.max_input_len,
            max_output_len=args.max_output_len,
        )
    else:
        if args.input_len < 1 or args.output_len < 1:
            raise ValueError("--input-len and --output-len must be >= 1")
        specs = uniform_poisson(
            args.num_requests,
            rate=math.inf if args.request_rate is None else args.request_rate,
            prompt_tokens=(args.input_len, args.input_len),
            output_tokens=(args.output_len, args.output_len),
            seed=args.seed,
        )
    results, elapsed, mean_batch = asyncio.run(
        run_bench(
            urls,
            specs,
            model=args.model,
            max_concurrency=args.max_concurrency,
            duration_s=args.duration,
            seed=args.seed,
            progress=not args.no_progress and not args.json,
            shared_prefix_len=args.shared_prefix_len,
        )
    )
    report = summarize(
        results,
        elapsed,
        mean_batch_size=mean_batch,
        slo_ttft_s=args.slo_ttft,
        slo_e2e_s=args.slo_e2e,
    )
    print(json.dumps(report, indent=2) if args.json else _format(report))
    return 0
