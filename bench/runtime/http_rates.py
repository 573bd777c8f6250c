"""`wok bench http` at three Poisson request rates against one live `wok runtime serve`.

Starts the server (builtin:tiny on the CPU, a small queue so the top rate meets backpressure), runs
the client at each rate, and writes the figures with the exact commands to
bench/runtime/results/http_rates.{json,md}. CPU timings on a shared machine are noisy: compare the
rates within one run, not across runs.

    .venv/bin/python bench/runtime/http_rates.py [--rates 2 8 32] [--num-requests 80]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
WOK = [sys.executable, "-m", "wok.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", type=float, nargs="+", default=[2.0, 8.0, 32.0])
    parser.add_argument("--num-requests", type=int, default=80)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", default=str(RESULTS / "http_rates"))
    args = parser.parse_args()

    port = free_port()
    serve = serve_argv(port)
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, url)
        runs = [run_rate(args, url, rate) for rate in args.rates]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)

    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}, shared, CPU only",
        "server_command": "wok " + shlex.join(serve[3:]),
        "script": "python bench/runtime/http_rates.py " + shlex.join(sys.argv[1:]),
        "runs": runs,
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(write_markdown(result))
    print(Path(args.out + ".md").read_text())
    return 0


def serve_argv(port: int) -> list[str]:
    """The server: builtin:tiny on the CPU, a small queue so that the top rate meets
    backpressure."""
    return [
        *WOK,
        "runtime",
        "serve",
        "--model",
        "builtin:tiny",
        "--port",
        str(port),
        "--kv-cache-bytes",
        "8000000",
        "--max-model-len",
        "512",
        "--max-batch-size",
        "16",
        "--max-queue",
        "16",
        "--queue-timeout",
        "10",
        "--log-level",
        "warning",
    ]


def wait_ready(server: subprocess.Popen, url: str) -> None:
    """Until the server answers /readyz, at most 300 s."""
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not become ready")
        time.sleep(0.2)


def run_rate(args: argparse.Namespace, url: str, rate: float) -> dict:
    """`wok bench http` at one Poisson rate: its report, with the rate and its command."""
    bench = [
        *WOK,
        "bench",
        "http",
        "--url",
        url,
        "--request-rate",
        str(rate),
        "--num-requests",
        str(args.num_requests),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--slo-ttft",
        "1.0",
        "--slo-e2e",
        "5.0",
        "--duration",
        "300",
        "--seed",
        "0",
        "--json",
    ]
    out = subprocess.run(bench, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    print(
        f"rate {rate:>5}: {report['requests_per_s']:.2f} req/s, "
        f"P99 E2E {report['e2e_p99_s']}, 429s {report['rejected']}",
        file=sys.stderr,
    )
    return {"request_rate": rate, "command": shlex.join(bench[3:]), **report}


def write_markdown(result: dict) -> str:
    """http_rates.md: a row per rate, then each row's command."""
    runs = result["runs"]
    lines = [
        "# wok bench http at three request rates",
        "",
        f"Produced by `{result['script']}` on {result['when']} ({result['machine']}).",
        f"Server: `{result['server_command']}`.",
        "",
        "| rate (req/s offered) | req/s done | output tok/s | P50 E2E (s) | P99 E2E (s) "
        "| P99 TTFT (s) | 429s | 503s | mean batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:

        def f(key: str, r: dict = r) -> str:
            value = r[key]
            return "-" if value is None else f"{value:.3f}"

        lines.append(
            f"| {r['request_rate']:g} | {f('requests_per_s')} | {f('output_tokens_per_s')} "
            f"| {f('e2e_p50_s')} | {f('e2e_p99_s')} | {f('ttft_p99_s')} | {r['rejected']} "
            f"| {r['unavailable']} | {f('mean_batch_size')} |"
        )
    lines += ["", "Each row's command:", ""]
    lines += [f"- `wok {r['command']}`" for r in runs]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
