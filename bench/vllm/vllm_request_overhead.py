"""Where a vLLM request's time goes: the engine's steps vs the rest (API server, HTTP, client).

Why: the HTTP step profile of vLLM (gaps between streamed tokens) predicts its closed-loop
throughput far too high (http_profile_check.md). vLLM's own histograms split each request's time
inside the engine core (`vllm:request_queue_time_seconds`, `..._prefill_time_seconds`,
`..._decode_time_seconds`); the client times the whole request. Their difference, per request,
is the time spent outside the engine's steps: the API server's request handling, detokenizing
and streaming, and the HTTP client. Run against a server already up:

    .venv/bin/python bench/vllm/vllm_request_overhead.py --url http://127.0.0.1:8000 --out FILE.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path

import httpx

from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_http import run_bench

ENGINE_SUMS = (
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
)


def metric_sums(text: str) -> dict[str, float]:
    """The named series summed over their label sets."""
    sums = dict.fromkeys(ENGINE_SUMS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums


async def scrape(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as client:
        return metric_sums((await client.get(f"{url}/metrics")).text)


def one_load(url: str, concurrency: int, requests: int, prompt: int, output: int) -> dict:
    before = asyncio.run(scrape(url))
    specs = [TraceRequest(0.0, prompt, output) for _ in range(requests)]
    results, elapsed, _ = asyncio.run(
        run_bench([url], specs, max_concurrency=concurrency, duration_s=600, seed=3)
    )
    after = asyncio.run(scrape(url))
    delta = {k: after[k] - before[k] for k in ENGINE_SUMS}
    n = delta["vllm:e2e_request_latency_seconds_count"]
    ok = [r for r in results if r.e2e_s is not None and r.error is None]
    client_e2e = statistics.fmean(r.e2e_s for r in ok)  # type: ignore[misc]
    engine = sum(delta[k] for k in ENGINE_SUMS[:3]) / n
    return {
        "concurrency": concurrency,
        "requests": len(ok),
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / elapsed,
        "client_e2e_mean_s": client_e2e,
        "server_e2e_mean_s": delta["vllm:e2e_request_latency_seconds_sum"] / n,
        "engine_queue_prefill_decode_mean_s": engine,
        "outside_engine_mean_s": client_e2e - engine,
        "client_ttft_mean_s": statistics.fmean(r.ttft_s for r in ok),  # type: ignore[misc]
        "load_average_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--loads", default="1:16,4:48,16:128", help="concurrency:requests,...")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = []
    for item in args.loads.split(","):
        concurrency, requests = (int(x) for x in item.split(":"))
        row = one_load(args.url, concurrency, requests, args.prompt, args.output)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps({"url": args.url, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
