"""Automatic prefix caching on a shared-prefix load: TTFT with caching on and off, side by side.

Starts two `wok runtime serve` processes on the same model and flags, one with
`--no-prefix-caching`, and runs the same `wok bench http --shared-prefix-len` load against each,
alternating which goes first from round to round (a shared machine drifts; alternation spreads
the drift over both). Each round has its own seed, so its own shared prefix: the first requests of
a round find nothing cached and pay the full prefill, as a new system prompt would. Reports
per-round figures, their medians and the off / on ratios, with the exact commands, in
bench/runtime/results/prefix_caching.{json,md}. Only one server is loaded at a time;
the other's engine sleeps on its condition variable.

    .venv/bin/python bench/runtime/prefix_caching.py [--rounds 5] [--num-requests 48]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
WOK = [sys.executable, "-m", "wok.cli"]
FIGURES = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "output_tokens_per_s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(serve: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([*serve, "--port", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("a server did not become ready")
        time.sleep(0.2)


def prefix_counters(url: str) -> tuple[float, float]:
    """(hits, queries) of the prefix cache, in tokens, from the server's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = []
    for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], values[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--shared-prefix-len", type=int, default=448)
    parser.add_argument("--input-len", type=int, default=64, help="each prompt's own tokens")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--out", default=str(RESULTS / "prefix_caching"))
    args = parser.parse_args()

    serve = [
        *WOK, "runtime", "serve", "--model", args.model, "--kv-cache-bytes", "64000000",
        "--max-model-len", "1024", "--max-batch-size", "16", "--log-level", "warning",
    ]  # fmt: skip
    variants = {"on": serve, "off": [*serve, "--no-prefix-caching"]}
    bench = [
        *WOK, "bench", "http", "--num-requests", str(args.num_requests),
        "--max-concurrency", str(args.max_concurrency),
        "--shared-prefix-len", str(args.shared_prefix_len), "--input-len", str(args.input_len),
        "--output-len", str(args.output_len), "--duration", "300", "--json", "--no-progress",
    ]  # fmt: skip
    servers = {name: start(command) for name, command in variants.items()}
    runs: list[dict] = []
    try:
        for _, url in servers.values():  # warm-up, not counted (another prefix: another seed)
            warm = [*bench, "--url", url, "--seed", "1000", "--num-requests", "4"]
            subprocess.run(warm, check=True, capture_output=True)
        for round_ in range(args.rounds):
            order = ["on", "off"] if round_ % 2 == 0 else ["off", "on"]
            for name in order:
                url = servers[name][1]
                before = prefix_counters(url)
                command = [*bench, "--url", url, "--seed", str(round_)]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                report = json.loads(out)
                after = prefix_counters(url)
                hits, queries = after[0] - before[0], after[1] - before[1]
                hit_rate = hits / queries if queries else 0.0
                runs.append({"round": round_, "caching": name, "hit_rate": hit_rate, **report})
                print(
                    f"round {round_} caching {name}: TTFT P50 {report['ttft_p50_s']:.3f} s, "
                    f"P99 {report['ttft_p99_s']:.3f} s, hit rate {hit_rate:.1%}",
                    file=sys.stderr,
                )
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            proc.wait(60)

    medians = {
        name: {
            key: statistics.median(r[key] for r in runs if r["caching"] == name)
            for key in (*FIGURES, "hit_rate")
        }
        for name in variants
    }
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}, shared, CPU only",
        "script": "python bench/runtime/prefix_caching.py " + shlex.join(sys.argv[1:]),
        "server_command": "wok " + shlex.join(serve[3:]) + " [--no-prefix-caching] --port PORT",
        "bench_command": "wok " + shlex.join(bench[3:]) + " --url URL --seed ROUND",
        "medians": medians,
        "runs": runs,
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(report_md(result))
    print(Path(args.out + ".md").read_text())
    return 0


def report_md(result: dict) -> str:
    on, off = result["medians"]["on"], result["medians"]["off"]
    lines = [
        "# Automatic prefix caching: TTFT on a shared-prefix load",
        "",
        f"Produced by `{result['script']}` on {result['when']} ({result['machine']}).",
        f"Servers: `{result['server_command']}`.",
        f"Load, alternating between the two servers each round: `{result['bench_command']}`.",
        "",
        "Every request of a round starts with the same `--shared-prefix-len` tokens (a system "
        "prompt; each round",
        "has its own), then `--input-len` tokens of its own; greedy, `ignore_eos`. With caching, "
        "a request that",
        "finds the prefix cached prefills only its own tokens (and the prefix's partial last "
        "block, if any): TTFT",
        "loses the prefix's prefill; decodes also wait less behind long prefill chunks (TPOT). The "
        "same load runs",
        "against any OpenAI-compatible server (vLLM with `--enable-prefix-caching` included): "
        "`wok bench http",
        "--url URL --shared-prefix-len P --input-len I --output-len O`.",
        "",
        "Medians over the rounds (per-round figures in prefix_caching.json):",
        "",
        "| figure | caching on | caching off | off / on |",
        "|---|---|---|---|",
    ]
    for key in (*FIGURES, "hit_rate"):
        ratio = off[key] / on[key] if on[key] else float("nan")
        lines.append(f"| {key} | {on[key]:.4f} | {off[key]:.4f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
