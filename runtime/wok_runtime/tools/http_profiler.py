"""`wok profile --url`: a step-time profile of any OpenAI-compatible server, measured over HTTP.

Why: `wok plan` and `wok simulate --profile` size a fleet from a step profile; the in-process
profiler (profiler.py) can only time wok's own runner. A server wok cannot look inside (vLLM) is
timed from the outside instead, by the one thing every streaming server shows: the gaps between
the tokens it streams. A decoding request emits one token per engine step, so a gap in its
stream is one step's wall time.

For each (decodes, context) of the grid, `decodes` background requests (prompts of `context`
token ids, `ignore_eos`, long outputs) stream concurrently:
  - a gap between two of their tokens, away from any injection, is a step of `decodes` decodes;
  - a request of `prefill` prompt tokens and one output token injected while they decode is
    scheduled with them (vLLM's and wok's schedulers both mix a new prompt into the running
    batch), so the background gap that ends when its token arrives is a step of `decodes`
    decodes plus a `prefill`-token chunk.
A decode step's time is the mean gap over the stretches without an injection (streams bunch
tokens, so one gap says little; a chunk carrying n tokens counts as n steps of gap / n), a
prefill step's the extra time its injection added to the background's stretch. A step's
context is what its inputs attend to, as the in-process profiler counts it. The same
non-negative fit (profiler.py) gives the four costs. What this cannot see: a step of prefill
alone (its TTFT carries the HTTP round trip). The server's own time around its steps is folded
into the costs (clients see it too).

A request also costs time outside the steps (the API server's request handling, detokenizing,
streaming), which no gap shows: lone requests, one after another, measure it as what their
end-to-end time leaves after their steps (their stream's gaps and the fitted prefill step):
`request_overhead_s`, the median over `OVERHEAD_PROBES`.

The server's size comes from its own answers where it gives them (`/v1/models`: max_model_len;
`/metrics`: vLLM's `vllm:cache_config_info`, wok's `wok_kv_cache_blocks` and
`wok_max_num_batched_tokens`), else from flags.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from wok_contracts.profile import StepProfile
from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_http import RequestResult, check_loopback, send_completion
from wok_runtime.tools.profiler import (
    Grid,
    StepFit,
    StepSample,
    fit_record,
    fit_step_costs,
    grid_flags,
)

HTTP_DECODES, HTTP_CONTEXTS, HTTP_PREFILLS = (1, 4, 16), (64, 256), (0, 32, 128)
QUICK_HTTP_DECODES, QUICK_HTTP_CONTEXTS, QUICK_HTTP_PREFILLS = (1, 4), (32,), (0, 32)
WARMUP_TOKENS = 6  # background tokens before the timing starts (their prefills, a settled batch)
JITTER_SECONDS = 0.002  # how late a streamed token may arrive on a loaded loopback
GAPS_BETWEEN_INJECTIONS = 8  # decode-only steps between two injected prompts
STEPS_PER_INJECTION = 40  # background tokens an injection takes, its round trip included
OVERHEAD_PROBES = 9  # lone requests that measure the per-request cost outside the steps
OVERHEAD_PROMPT, OVERHEAD_OUTPUT = 64, 16


@dataclass(frozen=True)
class ServerFacts:
    """What the server says about itself (None: it does not say)."""

    model: str
    max_model_len: int | None
    kv_capacity_tokens: int | None
    block_size: int | None
    max_num_batched_tokens: int | None
    engine: str  # "vllm", "wok" or "openai" (neither's metrics)


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_server_facts(model: str, max_model_len: int | None, metrics_text: str) -> ServerFacts:
    """The KV pool and step budget from a Prometheus text page, vLLM's or wok's series."""
    kv_tokens = block_size = budget = None
    engine = "openai"
    wok_blocks = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(_LABEL.findall(line))
            engine = "vllm"
            if labels.get("num_gpu_blocks", "None").isdigit() and labels.get("block_size"):
                block_size = int(labels["block_size"])
                kv_tokens = int(labels["num_gpu_blocks"]) * block_size
        elif line.startswith("wok_kv_cache_blocks{"):
            engine = "wok"
            wok_blocks += float(line.rsplit(" ", 1)[1])
        elif line.startswith("wok_max_num_batched_tokens"):
            budget = int(float(line.rsplit(" ", 1)[1]))
    if engine == "wok" and wok_blocks:
        block_size = block_size or 16  # the runtime's block size (it does not export it)
        kv_tokens = int(wok_blocks) * block_size
    return ServerFacts(model, max_model_len, kv_tokens, block_size, budget, engine)


async def read_server_facts(client: httpx.AsyncClient, url: str) -> ServerFacts:
    models = (await client.get(f"{url}/v1/models")).json()["data"]
    if not models:
        raise ValueError(f"{url}/v1/models lists no model")
    response = await client.get(f"{url}/metrics")
    text = response.text if response.status_code == 200 else ""
    return parse_server_facts(models[0]["id"], models[0].get("max_model_len"), text)


# --- from token timelines to step samples (pure) ------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """One streamed request: when (seconds, one clock for all) each chunk arrived, its tokens."""

    start: float
    chunk_times: Sequence[float]
    chunk_tokens: Sequence[int]

    @classmethod
    def from_result(cls, start: float, result: RequestResult) -> Timeline:
        times = [start + t for t in result.token_times]
        return cls(start, times, list(result.chunk_tokens) or [1] * len(times))


@dataclass(frozen=True)
class Gap:
    """A step seen in a background stream: it ended at `end`, produced the stream's token
    number `token` (0 = the prefill's), and took `seconds` (a merged chunk's share)."""

    end: float
    seconds: float
    token: int


def stream_gaps(timeline: Timeline) -> list[Gap]:
    gaps: list[Gap] = []
    tokens = timeline.chunk_tokens[0] if timeline.chunk_tokens else 0
    for i in range(1, len(timeline.chunk_times)):
        n = timeline.chunk_tokens[i]
        span = timeline.chunk_times[i] - timeline.chunk_times[i - 1]
        tokens += n
        gaps.append(Gap(timeline.chunk_times[i], span / n, tokens - 1))
    return gaps


@dataclass(frozen=True)
class Injection:
    """A prompt sent while the background decoded: its size, when it was sent and when its
    (only) token arrived."""

    prefill: int
    sent: float
    arrived: float


def shape_samples(
    background: Sequence[Timeline],
    injections: Sequence[Injection],
    *,
    context: int,
    warmup_tokens: int = WARMUP_TOKENS,
) -> list[StepSample]:
    """Step samples for a background of `len(background)` decodes at prompt length `context`.

    Streams bunch tokens (a chunk is late, the next one early), so a single gap says little and
    the median of gaps is biased; a stretch of gaps says its steps' mean. Each injection owns the
    background gaps that ended between its send and shortly after its token: one of them is the
    step that ran its prefill, the others plain decodes. So the decode-only sample is the mean
    gap outside every injection's stretch, and an injection's step is its stretch's total minus
    that many decode steps but one (the median over the injections of a prefill size)."""
    decodes = len(background)
    gaps = [g for g in stream_gaps(background[0]) if g.token >= warmup_tokens]
    if not gaps:
        raise ValueError("the background streams produced no timed steps")
    slack = 2 * statistics.fmean(g.seconds for g in gaps) + JITTER_SECONDS
    stretches: list[tuple[Injection, list[int]]] = []
    for injection in injections:
        owned = [
            i for i, g in enumerate(gaps) if injection.sent < g.end <= injection.arrived + slack
        ]
        if owned and gaps[owned[-1]].end >= injection.arrived - slack:
            stretches.append((injection, owned))  # else: the background was not running then
    touched = {i for _, owned in stretches for i in owned}
    plain = [g for i, g in enumerate(gaps) if i not in touched]
    if not plain:
        raise ValueError("no background step ran without an injected prompt")
    decode = statistics.fmean(g.seconds for g in plain)
    thirds = [plain[k::3] for k in range(3) if plain[k::3]]
    samples = [
        StepSample(
            decodes=decodes,
            prefill_tokens=0,
            context_tokens=decodes * (context + round(statistics.median(g.token for g in plain))),
            seconds=decode,
            spread=_spread([statistics.fmean(g.seconds for g in t) for t in thirds]),
            repeats=len(plain),
            context=context,
        )
    ]
    by_prefill: dict[int, list[tuple[float, int]]] = {}
    for injection, owned in stretches:
        total = sum(gaps[i].seconds for i in owned)
        step = max(decode, total - (len(owned) - 1) * decode)
        by_prefill.setdefault(injection.prefill, []).append((step, gaps[owned[-1]].token))
    for prefill, seen in sorted(by_prefill.items()):
        seconds = [s for s, _ in seen]
        token = round(statistics.median(t for _, t in seen))
        samples.append(
            StepSample(
                decodes=decodes,
                prefill_tokens=prefill,
                context_tokens=decodes * (context + token) + prefill,
                seconds=statistics.median(seconds),
                spread=_spread(seconds),
                repeats=len(seconds),
                context=context,
            )
        )
    return samples


def _spread(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def request_overhead(
    timelines: Sequence[tuple[float, RequestResult]], prefill_step_s: float
) -> float:
    """Median per-request time outside the steps of lone requests: end to end, less the
    stream's span from its first token to its last (its decode steps) and its prefill step."""
    left = [
        result.e2e_s - (result.token_times[-1] - result.token_times[0]) - prefill_step_s
        for _, result in timelines
        if result.ok and result.e2e_s is not None and result.token_times
    ]
    if not left:
        raise RuntimeError("no lone request succeeded: cannot measure the per-request cost")
    return max(0.0, statistics.median(left))


# --- measurement (HTTP) -------------------------------------------------------------------------


async def measure_background(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    *,
    decodes: int,
    context: int,
    prefills: Sequence[int],
    injections_per_prefill: int,
    max_model_len: int,
    seed: int,
) -> list[StepSample]:
    """One background of `decodes` streams at `context`, with the prefills injected in turn."""
    rng = random.Random(seed)
    plan = [p for p in prefills if p > 0 for _ in range(injections_per_prefill)]
    rng.shuffle(plan)
    # An injection waits its gaps, then its own round trip, which on a fast model is tens of
    # steps: the background's length is sized for that, and injecting stops when it ends.
    output = WARMUP_TOKENS + (len(plan) + 2) * STEPS_PER_INJECTION
    output = max(WARMUP_TOKENS + 4, min(output, max_model_len - context))
    spec = TraceRequest(0.0, context, output)
    starts: list[float] = []
    results: list[RequestResult] = []

    async def one() -> None:
        starts.append(time.perf_counter())
        results.append(await send_completion(client, url, model, spec, rng))

    tasks = [asyncio.create_task(one()) for _ in range(decodes)]
    step = await _wait_warmup(client, url, model, rng)
    injected: list[Injection] = []
    for prefill in plan:
        if all(t.done() for t in tasks):
            break
        await asyncio.sleep(GAPS_BETWEEN_INJECTIONS * step)
        sent = time.perf_counter()
        probe = await send_completion(client, url, model, TraceRequest(0.0, prefill, 1), rng)
        if probe.ok and probe.ttft_s is not None:
            injected.append(Injection(prefill, sent, sent + probe.ttft_s))
    await asyncio.gather(*tasks)
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"a background request failed: {failed[0].status} {failed[0].error}")
    lines = [Timeline.from_result(s, r) for s, r in zip(starts, results, strict=True)]
    return shape_samples(lines, injected, context=context)


async def _wait_warmup(
    client: httpx.AsyncClient, url: str, model: str, rng: random.Random
) -> float:
    """Waits out the background's prefill and warm-up; returns a step's rough seconds. A short
    probe request rides along with the background (whose streams are read only when they end):
    it is scheduled after their prompts, and its token gaps are steps of the same batch."""
    probe = await send_completion(client, url, model, TraceRequest(0.0, 1, 4), rng)
    if not probe.ok or probe.ttft_s is None:
        raise RuntimeError(f"the server did not answer a probe: {probe.status} {probe.error}")
    times = probe.token_times
    step = (
        statistics.median(b - a for a, b in itertools.pairwise(times)) if len(times) > 1 else 0.05
    )
    await asyncio.sleep(WARMUP_TOKENS * step)
    return step


async def measure_server(
    url: str,
    *,
    decodes: Sequence[int],
    contexts: Sequence[int],
    prefills: Sequence[int],
    injections: int,
    seed: int,
) -> tuple[ServerFacts, list[StepSample], list[tuple[float, RequestResult]]]:
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=200)) as c:
        facts = await read_server_facts(c, url)
        max_len = facts.max_model_len or 2048
        samples: list[StepSample] = []
        rng = random.Random(seed)
        lone_spec = TraceRequest(0.0, min(OVERHEAD_PROMPT, max_len // 2), OVERHEAD_OUTPUT)
        for d in decodes:
            for ctx in contexts:
                if ctx + WARMUP_TOKENS + 4 > max_len:
                    continue
                samples += await measure_background(
                    c,
                    url,
                    facts.model,
                    decodes=d,
                    context=ctx,
                    prefills=[p for p in prefills if p + 1 <= max_len],
                    injections_per_prefill=injections,
                    max_model_len=max_len,
                    seed=seed + d * 7919 + ctx,
                )
        lone = [
            (time.perf_counter(), await send_completion(c, url, facts.model, lone_spec, rng))
            for _ in range(OVERHEAD_PROBES)
        ]
    return facts, samples, lone


def http_grid(args: argparse.Namespace) -> tuple[Grid, Grid, Grid]:
    """(decodes, contexts, prefills) to time over HTTP: each flag's, else the (--quick) grid's.
    Every shape decodes: a step is seen only in a decoding stream."""
    decodes, contexts, prefills = grid_flags(args)
    quick = args.quick
    decodes = decodes or (QUICK_HTTP_DECODES if quick else HTTP_DECODES)
    contexts = contexts or (QUICK_HTTP_CONTEXTS if quick else HTTP_CONTEXTS)
    prefills = prefills or (QUICK_HTTP_PREFILLS if quick else HTTP_PREFILLS)
    if min(decodes) < 1:
        raise ValueError("--decodes over HTTP must be >= 1: a step is seen in a decoding stream")
    return decodes, contexts, prefills


def server_limits(args: argparse.Namespace, facts: ServerFacts, url: str) -> tuple[int, int, int]:
    """(step token budget, KV capacity in tokens, max_model_len): the flags', else the server's;
    a ValueError names the flags to pass for what the server does not say."""
    budget = args.max_num_batched_tokens_http or facts.max_num_batched_tokens
    kv_tokens = args.kv_capacity_tokens or facts.kv_capacity_tokens
    max_model_len = args.max_model_len or facts.max_model_len
    missing = [
        flag
        for flag, value in (
            ("--max-num-batched-tokens", budget),
            ("--kv-capacity-tokens", kv_tokens),
            ("--max-model-len", max_model_len),
        )
        if not value
    ]
    if missing:
        raise ValueError(
            f"the server at {url} does not say its {', '.join(missing)}; pass them as flags"
        )
    assert budget and kv_tokens and max_model_len
    return budget, kv_tokens, max_model_len


def http_notes(command: str, facts: ServerFacts, overhead: float, fit: StepFit) -> str:
    """The profile's notes: what a step's time over HTTP holds, and how well the fit explains it."""
    return (
        f"Measured by `{command}` ({facts.engine} serving {facts.model}): each step's wall "
        "time is a gap between the tokens a decoding stream received, so the server's own "
        "time between its steps is in the costs; request_overhead_s is a lone request's "
        f"end-to-end time less its steps ({overhead * 1e3:.1f} ms). Fit: "
        f"R² {fit.r2:.4f}, median |relative error| {fit.median_abs_rel_error:.1%}, max "
        f"{fit.max_abs_rel_error:.1%}. load_seconds is the flag's, not measured."
    )


def profile_over_http(args: argparse.Namespace) -> StepProfile:
    url = check_loopback(args.url)
    decodes, contexts, prefills = http_grid(args)
    injections = 2 if args.quick else max(1, args.repeats)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    facts, samples, lone = asyncio.run(
        measure_server(
            url,
            decodes=decodes,
            contexts=contexts,
            prefills=prefills,
            injections=injections,
            seed=args.seed,
        )
    )
    fit = fit_step_costs(samples)
    prompt = min(OVERHEAD_PROMPT, (facts.max_model_len or 2048) // 2)
    overhead = request_overhead(lone, fit.step_seconds(0, prompt, prompt))
    budget, kv_tokens, max_model_len = server_limits(args, facts, url)
    command = "wok profile --url " + url
    record = fit_record(
        samples,
        fit,
        skipped=[],
        warmup=0,
        repeats=injections,
        measure_seconds=time.monotonic() - started,
        settings={
            "clock": "wall: gaps between the tokens the server streams (HTTP)",
            "server": url,
            "engine": facts.engine,
            "served_model": facts.model,
            "load_average_1m": [load_before, os.getloadavg()[0]],
            "command": command,
        },
    )
    return StepProfile(
        name=args.name or f"{facts.model.rstrip('/').rsplit('/', 1)[-1]}-{facts.engine}-http",
        kind="measured",
        device=args.device_label or f"{facts.engine} server at {url}",
        a_s=fit.a_s,
        b_s_per_seq=fit.b_s_per_seq,
        c_s_per_prefill_token=fit.c_s_per_prefill_token,
        d_s_per_context_token=fit.d_s_per_context_token,
        step_token_budget=budget,
        kv_capacity_tokens=kv_tokens,
        block_size=facts.block_size or 16,
        max_model_len=max_model_len,
        load_seconds=args.load_seconds,
        request_overhead_s=overhead,
        notes=http_notes(command, facts, overhead, fit),
        fit=record,
    )
