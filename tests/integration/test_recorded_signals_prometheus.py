"""The operator's round against a real Prometheus, before and after the chart's recording rules
are loaded: without them the hub reads the raw PromQL, with them it finds the recorded quantiles
(one probe query), reads those over the budget window, and they agree with the raw ones."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from promql_harness import running_prometheus

from wok_operator.signals import (
    E2E_LATENCY,
    REJECTED,
    TPOT,
    TTFT,
    SignalsHub,
    fetch_recorded,
    fetch_round,
    recording_rules,
    round_queries,
)

pytestmark = pytest.mark.integration

KEY = ("ns", "llm")
WINDOWS = {60}, {3600}
# Per second: 1000 requests, of which these shares finish within each bucket; 50 rejected.
SHARES = {"0.1": 0.5, "0.5": 0.9, "1": 0.985, "2.5": 0.998, "+Inf": 1.0}
BUDGET = [f"{name}:3600" for name in ("p99", "p99_ttft", "p99_tpot", "p995", "p995_ttft")]


class GrowingHistograms(ThreadingHTTPServer):
    """One pod's SLO histograms, growing at a steady rate with a fixed shape."""

    def __init__(self) -> None:
        started = time.monotonic()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests = int(1000 * (time.monotonic() - started))
                lines = [f'{REJECTED}{{reason="queue_full"}} {requests // 20}']
                for histogram in (E2E_LATENCY, TTFT, TPOT):
                    lines += [
                        f'{histogram}_bucket{{le="{le}"}} {int(requests * share)}'
                        for le, share in SHARES.items()
                    ]
                    lines.append(f"{histogram}_count {requests}")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    exporter = GrowingHistograms()
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    run_dir: Path = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(run_dir / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "pods",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{exporter.server_address[1]}"],
                        "labels": {"namespace": KEY[0], "service": KEY[1], "pod": "llm-0"},
                    }
                ],
            }
        ],
    }
    (run_dir / "rules.yaml").write_text("groups: []\n")
    try:
        with running_prometheus(run_dir, config, "--web.enable-lifecycle") as url:
            yield url, run_dir
    finally:
        exporter.shutdown()
        exporter.server_close()


def wait(probe, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if found := probe():
                return found
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def hub_round(url: str):
    """The hub's first round that answers (a tick never waits for one: it asks again)."""
    hub = SignalsHub(windows=set(WINDOWS[0]), budget_windows=set(WINDOWS[1]))

    async def first_answer():
        deadline = time.monotonic() + 30.0
        try:
            while (
                rnd := await hub.get(url, KEY, window=60, budget_window=3600, max_age_s=5.0)
            ).error:
                assert time.monotonic() < deadline, rnd.error
                await asyncio.sleep(0.05)
            return rnd
        finally:
            await hub.close()

    return hub, asyncio.run(first_answer())


def test_the_hub_reads_raw_promql_without_the_rules_and_the_recorded_series_with_them(
    prometheus: tuple[str, Path],
) -> None:
    url, run_dir = prometheus
    raw_queries = round_queries(*WINDOWS)

    def raw_budget():
        rnd = fetch_round(url, raw_queries)
        values = {name: rnd.vectors.get(name, {}).get(KEY) for name in BUDGET}
        return values if all(v is not None for v in values.values()) else None

    wait(raw_budget, "the raw budget-window quantiles")
    assert not fetch_recorded(url)
    hub, rnd = hub_round(url)
    assert hub.recorded[url][0] is False
    assert all(rnd.vectors[name].get(KEY) is not None for name in BUDGET)

    # The rules as the chart ships them, evaluated every second instead of every 30 s.
    rules = recording_rules()
    for group in rules["groups"]:
        group["interval"] = "1s"
    (run_dir / "rules.yaml").write_text(yaml.safe_dump(rules))
    httpx.post(f"{url}/-/reload", timeout=10).raise_for_status()
    wait(lambda: fetch_recorded(url), "the recorded quantiles")

    hub, rnd = hub_round(url)
    assert hub.recorded[url][0] is True
    recorded = round_queries(*WINDOWS, recorded=True)
    assert recorded["p99_ttft:3600"] == "namespace_service:vllm_time_to_first_token_seconds:p99_1h"
    raw = raw_budget()
    assert raw is not None
    for name in BUDGET:
        assert rnd.vectors[name][KEY] == pytest.approx(raw[name], rel=0.05), name
    # Misses count: 1 rejected in 21 puts the P99s of TTFT and E2E in the +Inf bucket (read as
    # the highest finite bound, 2.5 s); TPOT counts no misses and reads under it.
    assert rnd.vectors["p99_ttft:3600"][KEY] > rnd.vectors["p99_tpot:3600"][KEY]
