"""Whether bodies under the size limit, sent four at once, can stall the runtime's event loop.

Why: the event loop answers the readiness probe (every 2 s, 1 s timeout, unready after two
misses) and feeds every running stream. A body of hundreds of thousands of tiny JSON values
costs seconds to parse and validate, and that work held the loop. The goal: `/healthz` P99 under
100 ms while four such bodies arrive at once, and no running stream paused more than 100 ms.

This starts `wok runtime serve` (builtin:tiny on the CPU, `--max-model-len 256`) once per
interpreter given (`--python`, repeatable: a venv whose `wok` is another checkout runs that
checkout's server, so before and after run side by side, alternating by round). Per body kind
and round: one stream decodes throughout; four copies of the body are sent at once on four
threads while another thread probes `/healthz` every 10 ms. Reported per kind: the bodies'
statuses, the probes' P50 / P99 / max over the rounds, and the longest pause between two of
the stream's chunks while the bodies were in flight (and the longest with no bodies at all).

    .venv/bin/python bench/runtime/probe_stall.py [--python A --python B] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
from bad_input import start

BODIES: dict[str, Callable[[], bytes]] = {
    "230k messages": lambda: json.dumps(
        {"messages": [{"role": "user", "content": "x"}] * 230_000, "max_tokens": 2}
    ).encode(),
    "150k content parts": lambda: json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 150_000}]}
    ).encode(),
    "1.3M stop strings": lambda: json.dumps({"prompt": "x", "stop": ["a"] * 1_300_000}).encode(),
    "2.6M token ids": lambda: json.dumps({"prompt": [1] * 2_600_000}).encode(),
    # A control: as many bytes, one string (cheap to parse, refused on its length): what moving
    # 4 x 7.8 MB through the server and the machine costs the probes and the stream by itself.
    "one 7.8M-character prompt": lambda: json.dumps({"prompt": "x" * 7_800_000}).encode(),
}
PARALLEL = 4
PROBE_EVERY_S = 0.01


class Stream(threading.Thread):
    """Streams one long completion after another and records when each chunk arrived."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.arrivals: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"prompt": [5, 6, 7], "max_tokens": 240, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                with http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                    for _ in r.iter_lines():
                        self.arrivals.append(time.perf_counter())
                        if self.stop.is_set():
                            break

    def longest_pause(self, start: float, end: float) -> float:
        times = [t for t in self.arrivals if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


_BODY_CACHE: dict[str, bytes] = {}


def build_all() -> None:
    """A sender process builds every body once, before any round."""
    for name, make in BODIES.items():
        _BODY_CACHE[name] = make()


def send(url: str, name: str) -> int:
    """POSTs the body `name` and returns the status."""
    body = _BODY_CACHE[name]
    path = "/v1/chat/completions" if b'"messages"' in body[:20] else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{url}{path}", content=body, headers=headers, timeout=300).status_code


def one_round(
    url: str, name: str, stream: Stream, senders: ProcessPoolExecutor
) -> dict[str, object]:
    """Four bodies at once, from processes of their own (so that building and sending them
    takes no time from the threads that measure)."""
    probes: list[float] = []
    started = time.perf_counter()
    sent = [senders.submit(send, url, name) for _ in range(PARALLEL)]
    with httpx.Client(base_url=url, timeout=30) as http:
        while not all(f.done() for f in sent):
            t0 = time.perf_counter()
            assert http.get("/healthz").status_code == 200
            probes.append(time.perf_counter() - t0)
            time.sleep(PROBE_EVERY_S)
    ended = time.perf_counter()
    return {
        "statuses": sorted(f.result() for f in sent),
        "seconds": ended - started,
        "probes": probes,
        "stream_pause_s": stream.longest_pause(started, ended),
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", default=None, help="an interpreter")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", default=None, help="a body kind (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    sizes = {name: len(make()) for name, make in BODIES.items()}
    servers = {}
    results: dict[str, dict[str, list[dict[str, object]]]] = {p: {} for p in pythons}
    idle_pause: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i, python in enumerate(pythons):
                servers[python] = start(Path(tmp) / f"server-{i}.log", python)
            streams = {p: Stream(url) for p, (_, url) in servers.items()}
            for stream in streams.values():
                stream.start()
            senders = ProcessPoolExecutor(
                PARALLEL, mp_context=multiprocessing.get_context("spawn"), initializer=build_all
            )
            list(senders.map(time.sleep, [0.5] * PARALLEL))  # all four have built the bodies
            time.sleep(3)
            for python, stream in streams.items():
                now = time.perf_counter()
                idle_pause[python] = stream.longest_pause(now - 3, now)
            for round_ in range(args.rounds):
                for name in args.only or BODIES:
                    order = pythons if round_ % 2 == 0 else pythons[::-1]
                    for python in order:
                        url = servers[python][1]
                        out = one_round(url, name, streams[python], senders)
                        results[python].setdefault(name, []).append(out)
                        print(
                            f"{python} {name} round {round_}: {out['statuses']} "
                            f"{out['seconds']:.2f} s, probe max "
                            f"{max(out['probes']) * 1000:.0f} ms, stream pause "
                            f"{out['stream_pause_s'] * 1000:.0f} ms",
                            file=sys.stderr,
                        )
            for stream in streams.values():
                stream.stop.set()
            senders.shutdown()
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    summary = {}
    for python, kinds in results.items():
        rows = {}
        for name, runs in kinds.items():
            probes = [x for run in runs for x in run["probes"]]  # type: ignore[attr-defined]
            rows[name] = {
                "body_bytes": sizes[name],
                "statuses": sorted({s for run in runs for s in run["statuses"]}),  # type: ignore[attr-defined]
                "round_seconds_median": statistics.median(run["seconds"] for run in runs),  # type: ignore[misc]
                "probes": len(probes),
                "probe_p50_ms": 1000 * quantile(probes, 0.5),
                "probe_p99_ms": 1000 * quantile(probes, 0.99),
                "probe_max_ms": 1000 * max(probes),
                "stream_pause_max_ms": 1000 * max(run["stream_pause_s"] for run in runs),  # type: ignore[type-var]
            }
        summary[python] = {"idle_stream_pause_ms": 1000 * idle_pause[python], "bodies": rows}
    for python, data in summary.items():
        print(f"\n{python} (stream pause with no bodies: {data['idle_stream_pause_ms']:.0f} ms)")
        print("| body | bytes | status | round | probes | P50 | P99 | max | stream pause |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, row in data["bodies"].items():
            print(
                f"| {name} | {row['body_bytes']:,} | {row['statuses']} | "
                f"{row['round_seconds_median']:.2f} s | {row['probes']} | "
                f"{row['probe_p50_ms']:.1f} ms | {row['probe_p99_ms']:.1f} ms | "
                f"{row['probe_max_ms']:.1f} ms | {row['stream_pause_max_ms']:.0f} ms |"
            )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
