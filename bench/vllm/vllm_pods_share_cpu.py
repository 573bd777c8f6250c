"""Does a second vLLM CPU pod add capacity on this machine? One server, then two, under the
same closed loops.

Why: a scale-up is worth something only if a new pod serves more tokens. On the emulated
cluster, wok's runtime pods step a simulated accelerator (timed sleeps), so each pod adds its own
capacity; a vLLM pod there is a real vLLM CPU process (wok_cluster/vllm_process.py, the same
environment as here: one OpenMP thread, vLLM's own core binding), and every pod shares the
machine's cores. This measures the aggregate output tokens per second of `--clients` closed-loop
clients per server against one server, then against two at once (the second started beside the
first), alternating, `--rounds` times.

    .venv/bin/python bench/vllm/vllm_pods_share_cpu.py \
        --out bench/vllm/results/vllm_pods_share_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from runtime_vs_vllm import log, vllm_server

from wok_cluster.vllm_venv import ensure_vllm
from wok_contracts.traces import TraceRequest
from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.tools.bench_http import run_bench

PROMPT, OUTPUT = 128, 64
DEFAULT_ENV = {"OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}


async def closed_loops(urls: list[str], clients: int, requests: int) -> float:
    """Aggregate output tok/s of `clients` loops per server, all servers at once."""

    async def one(url: str) -> tuple[int, float]:
        specs = [TraceRequest(0.0, PROMPT, OUTPUT) for _ in range(requests)]
        results, elapsed, _ = await run_bench(
            [url], specs, max_concurrency=clients, duration_s=300, seed=5
        )
        return sum(r.output_tokens for r in results if r.ok), elapsed

    done = await asyncio.gather(*(one(u) for u in urls))
    return sum(tokens for tokens, _ in done) / max(elapsed for _, elapsed in done)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=96, help="per server and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    model_dir, python = ensure_builtin("tiny"), ensure_vllm()
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="wok-vllm-pods-") as tmp:
        servers = []
        for i in range(2):
            logs = Path(tmp) / str(i)
            logs.mkdir()
            server = vllm_server(python, model_dir, logs)
            server.command += ["--max-num-seqs=32"]
            server.env |= DEFAULT_ENV
            servers.append(server)
        try:
            for server in servers:
                server.start(timeout_s=600)
            urls = [s.url for s in servers]
            for _ in range(args.rounds):
                one = asyncio.run(closed_loops(urls[:1], args.clients, args.requests))
                two = asyncio.run(closed_loops(urls, args.clients, args.requests))
                row = {"one_pod_tok_s": one, "two_pods_tok_s": two, "load": os.getloadavg()[0]}
                log(json.dumps(row))
                rows.append(row)
        finally:
            for server in servers:
                server.stop()
    report = {
        "command": "python bench/vllm/vllm_pods_share_cpu.py " + " ".join(argv or []),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work",
        "clients_per_server": args.clients,
        "rows": rows,
        "median_two_over_one": statistics.median(
            r["two_pods_tok_s"] / r["one_pod_tok_s"] for r in rows
        ),
    }
    log(f"median two pods / one pod: {report['median_two_over_one']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
