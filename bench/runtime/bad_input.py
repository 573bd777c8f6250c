"""How long the runtime's probes take while it refuses huge prompts, and how long the refusal.

Why: the kubelet's liveness probe has a timeout (1 s by default); a server whose event loop
parses, validates and tokenizes a 10 MB prompt before refusing it misses probes meanwhile and is
restarted. This starts `wok runtime serve` (builtin:tiny on the CPU, `--max-model-len 256`),
sends each huge body `--repeats` times in turn from one thread while another probes `/healthz`
every 20 ms, and reports per body: its status, the refusal's median time, and the probes'
P50 / P99 / max latency.

Bodies: a 10 MB text prompt (over the default 8 MiB body limit: 413 before it is read, or,
without a limit, refused only after tokenizing), a 4 MB text prompt (under the limit: refused
on its characters before tokenizing), and 1.2 M token ids (refused on their count).

    .venv/bin/python bench/runtime/bad_input.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

BODIES = {
    "10 MB text": lambda: json.dumps({"prompt": "x" * 10_000_000}).encode(),
    "4 MB text": lambda: json.dumps({"prompt": "word " * 800_000}).encode(),
    "1.2 M token ids": lambda: json.dumps({"prompt": [7] * 1_200_000}).encode(),
}


def start(log: Path, python: str = sys.executable) -> tuple[subprocess.Popen[bytes], str]:
    """`wok runtime serve` (builtin:tiny, small pool) from `python`'s checkout, once ready."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [python, "-m", "wok.cli", "runtime", "serve", "--model", "builtin:tiny",
            "--port", str(port), "--max-model-len", "256", "--kv-cache-bytes", "4000000",
            "--log-level", "warning", "--unready-seconds", "0"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()}")


def measure(url: str, body: bytes, repeats: int) -> dict[str, object]:
    statuses: list[int] = []
    refusals: list[float] = []

    def send() -> None:
        with httpx.Client(timeout=120) as http:
            for _ in range(repeats):
                started = time.perf_counter()
                r = http.post(f"{url}/v1/completions", content=body,
                              headers={"Content-Type": "application/json"})  # fmt: skip
                refusals.append(time.perf_counter() - started)
                statuses.append(r.status_code)

    probes: list[float] = []
    sender = threading.Thread(target=send)
    with httpx.Client(timeout=120) as http:
        sender.start()
        while sender.is_alive():
            started = time.perf_counter()
            http.get(f"{url}/healthz")
            probes.append(time.perf_counter() - started)
            time.sleep(0.02)
    sender.join()
    probes.sort()
    return {
        "statuses": sorted(set(statuses)),
        "refusal_s_median": round(statistics.median(refusals), 3),
        "probe_ms_p50": round(1000 * probes[len(probes) // 2], 1),
        "probe_ms_p99": round(1000 * probes[min(len(probes) - 1, int(0.99 * len(probes)))], 1),
        "probe_ms_max": round(1000 * probes[-1], 1),
        "probes": len(probes),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, url = start(log)
    try:
        results = {name: measure(url, make(), args.repeats) for name, make in BODIES.items()}
    finally:
        proc.terminate()
        proc.wait(60)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'body':<16} {'status':>8} {'refused in':>11} {'probe P50':>10} {'P99':>8} {'max':>8}")
    for name, r in results.items():
        probes = f"{r['probe_ms_p50']:>7} ms {r['probe_ms_p99']:>5} ms {r['probe_ms_max']:>5} ms"
        print(f"{name:<16} {r['statuses']!s:>8} {r['refusal_s_median']:>9} s {probes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
