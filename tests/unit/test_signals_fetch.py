"""A round against a Prometheus that is down or silent fails fast: the law then holds. The hub
fetches rounds ahead of the ticks, so a tick reads the last round instead of waiting on PromQL."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from wok_operator.signals import (
    IDLE_INTERVALS,
    MISSING_RECHECK_S,
    QUERY_POOL,
    RECORDED_CHECK_S,
    SignalsHub,
    fetch_round,
    round_queries,
)


def test_a_prometheus_that_accepts_but_never_answers_fails_the_round_within_its_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes handshakes; nothing ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = fetch_round(url, round_queries({60}), timeout_s=0.5)
        elapsed = time.monotonic() - started
    assert result.error is not None and "Timeout" in result.error, result.error
    assert result.vectors == {}
    assert elapsed < 10, f"a silent Prometheus held the round for {elapsed:.1f} s"


def test_a_refused_connection_fails_the_round_without_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        result = fetch_round(f"http://127.0.0.1:{port}", round_queries({60}))
    assert result.error is not None and "ConnectionError" in result.error, result.error


class _CountingPrometheus(ThreadingHTTPServer):
    """A local HTTP server that answers every instant query with one sample, slowly, and
    counts how many it holds at once; while `gate` is clear, it holds every query."""

    def __init__(self) -> None:
        self.in_flight = self.most_in_flight = self.answered = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with server.lock:
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                time.sleep(0.05)
                server.gate.wait(timeout=30)
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {
                            "resultType": "vector",
                            "result": [
                                {"metric": {"namespace": "ns", "service": "s"}, "value": [0, "2"]}
                            ],
                        },
                    }
                ).encode()
                with server.lock:
                    server.in_flight -= 1
                    server.answered += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def counting_prometheus() -> Iterator[tuple[_CountingPrometheus, str]]:
    server = _CountingPrometheus()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.gate.set()
        server.shutdown()
        server.server_close()


def test_a_round_runs_its_queries_concurrently_within_the_pool(counting_prometheus):
    server, url = counting_prometheus
    queries = round_queries({60}, {3600})
    result = fetch_round(url, queries)
    assert result.error is None, result.error
    assert set(result.vectors) == set(queries)
    assert all(vector == {("ns", "s"): 2.0} for vector in result.vectors.values())
    assert server.answered == len(queries)
    assert server.most_in_flight == QUERY_POOL


async def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(0.01)


async def test_a_tick_reads_the_last_round_while_the_next_one_is_fetched(counting_prometheus):
    server, url = counting_prometheus
    key = ("ns", "s")
    hub = SignalsHub()
    first = await hub.get(url, key, window=60, max_age_s=0.2)  # nothing yet: it waits
    assert first.error is None and first.vectors["waiting"] == {key: 2.0}
    server.gate.clear()  # the next round's queries hang
    await _wait_for(lambda: server.in_flight > 0, "round in flight")
    # The round in flight is held, and the last one is past its interval: a tick reads it.
    held = await asyncio.wait_for(hub.get(url, key, window=60, max_age_s=0.2), 0.1)
    assert held is first
    server.gate.set()
    await _wait_for(lambda: hub.rounds[url] is not first, "next round")
    assert hub.rounds[url].fetched_at > first.fetched_at
    await hub.close()


async def test_a_new_window_waits_for_a_round_that_reads_it_and_idle_rounds_stop(
    counting_prometheus,
):
    server, url = counting_prometheus
    key = ("ns", "s")
    hub = SignalsHub()
    await hub.get(url, key, window=60, max_age_s=0.1)
    wider = await hub.get(url, key, window=120, budget_window=3600, max_age_s=0.1)
    assert {"p99:120", "p995:3600"} <= set(wider.vectors)
    # Nobody asks any more: the refresher stops within its idle intervals and a round.
    task = hub._refreshers[url].task
    await asyncio.wait_for(asyncio.shield(task), IDLE_INTERVALS * 0.1 + 5.0)
    answered = server.answered
    await asyncio.sleep(0.3)
    assert server.answered == answered


async def test_a_prometheus_whose_recorded_series_were_missing_is_probed_again_soon(
    counting_prometheus,
):
    _, url = counting_prometheus
    # A minute ago its rules had not evaluated yet (the operator started with it); now they have.
    hub = SignalsHub(recorded={url: (False, time.monotonic() - MISSING_RECHECK_S - 1.0)})
    rnd = await hub.get(url, ("ns", "s"), window=60, budget_window=3600, max_age_s=5.0)
    await hub.close()
    assert hub.recorded[url][0] is True and rnd.error is None
    assert hub.recorded[url][1] > time.monotonic() - RECORDED_CHECK_S  # trusted for longer


async def test_a_round_is_fetched_while_the_loops_threads_wait_on_the_apiserver(
    counting_prometheus,
):
    # The control loops' Kubernetes writes fill the event loop's default executor (its every
    # thread waits on a slow apiserver): the round must not queue behind them.
    _, url = counting_prometheus
    apiserver = threading.Event()
    loop = asyncio.get_running_loop()
    writes = [loop.run_in_executor(None, apiserver.wait, 30) for _ in range(64)]
    hub = SignalsHub()
    try:
        first = await asyncio.wait_for(hub.get(url, ("ns", "s"), window=60, max_age_s=1.0), 5.0)
        assert first.error is None and first.vectors["waiting"] == {("ns", "s"): 2.0}
    finally:
        apiserver.set()
        await asyncio.gather(*writes)
        await hub.close()
