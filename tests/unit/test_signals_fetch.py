"""A round against a Prometheus that is down or silent fails fast: the law then holds. The hub
fetches rounds ahead of the ticks, so a tick reads the last round that answered and never waits
on PromQL; a round older than `STALE_INTERVALS` intervals is named stale and the law holds. A
round's queries are evaluated at one instant."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from wok_contracts.signals import ServiceSignals
from wok_operator.signals import (
    IDLE_INTERVALS,
    MISSING_RECHECK_S,
    QUERY_POOL,
    RECORDED_CHECK_S,
    STALE_INTERVALS,
    UNAVAILABLE_INTERVALS,
    Round,
    SignalsHub,
    carry_over,
    fetch_round,
    only_late,
    round_queries,
    stale_reason,
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
        self.times: list[str] = []  # each query's evaluation time (PromQL `time=`), as sent
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = self.rfile.read(length).decode() if length else ""
                params = parse_qs(urlsplit(self.path).query) | parse_qs(form)
                with server.lock:
                    server.times.extend(params.get("time", ["<none>"]))
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


async def served(hub: SignalsHub, url: str, key=("ns", "s"), **asked) -> Round:
    """The hub's first round that answers: a tick never waits for one, it asks again."""
    deadline = time.monotonic() + 10.0
    while (rnd := await hub.get(url, key, **asked)).error is not None:
        assert time.monotonic() < deadline, rnd.error
        await asyncio.sleep(0.01)
    return rnd


def test_every_query_of_a_round_is_evaluated_at_one_instant(counting_prometheus):
    server, url = counting_prometheus
    queries = round_queries({60}, {3600})
    before = time.time()
    result = fetch_round(url, queries)
    assert result.error is None, result.error
    assert len(server.times) == len(queries) and len(set(server.times)) == 1, server.times
    assert result.evaluated_at == float(server.times[0])
    assert before - 0.001 <= result.evaluated_at <= time.time()  # to the millisecond


async def test_a_tick_never_waits_on_a_round(counting_prometheus):
    server, url = counting_prometheus
    key = ("ns", "s")
    hub = SignalsHub()
    server.gate.clear()  # the first round's queries hang
    first = await asyncio.wait_for(hub.get(url, key, window=60, max_age_s=0.2), 0.1)
    assert first.error is not None and "no Prometheus round has answered yet" in first.error
    assert first.vectors == {}
    server.gate.set()
    good = await served(hub, url, key, window=60, max_age_s=0.2)
    assert good.vectors["waiting"] == {key: 2.0}
    server.gate.clear()  # the next round is held: the tick reads the last one meanwhile
    await _wait_for(lambda: server.in_flight > 0, "round in flight")
    held = await asyncio.wait_for(hub.get(url, key, window=60, max_age_s=0.2), 0.1)
    assert held is good
    # Past 3 intervals the round is not served: the tick holds, told why.
    await asyncio.sleep(STALE_INTERVALS * 0.2 - (time.monotonic() - good.fetched_at) + 0.05)
    stale = await asyncio.wait_for(hub.get(url, key, window=60, max_age_s=0.2), 0.1)
    assert stale.error is not None and stale.error.startswith("stale: "), stale.error
    assert stale.late  # a round answered 3 intervals ago: late, not unavailable
    server.gate.set()
    await _wait_for(lambda: hub.answered[url] is not good, "next round")
    assert hub.answered[url].fetched_at > good.fetched_at
    await hub.close()


def test_a_failed_round_does_not_replace_a_fresh_one():
    good = Round(fetched_at=100.0, vectors={"p99:60": {}})
    failed = Round(fetched_at=104.0, vectors={}, error="Timeout: read timed out")
    assert stale_reason(good, failed, 105.0, max_age_s=5.0, window=60) is None
    late = stale_reason(good, failed, 116.0, max_age_s=5.0, window=60)
    assert late is not None and late.startswith("stale: ")
    assert late.endswith("the last round failed: Timeout: read timed out")
    assert "the 120 s window" in (stale_reason(good, None, 101.0, max_age_s=5.0, window=120) or "")


def test_a_round_is_only_late_until_none_has_answered_for_twelve_intervals():
    good = Round(fetched_at=100.0, vectors={"p99:60": {}})
    assert only_late(good, 116.0, max_age_s=5.0, window=60)
    assert only_late(good, 100.0 + UNAVAILABLE_INTERVALS * 5.0, max_age_s=5.0, window=60)
    assert not only_late(good, 100.1 + UNAVAILABLE_INTERVALS * 5.0, max_age_s=5.0, window=60)
    assert not only_late(None, 101.0, max_age_s=5.0, window=60)  # none has answered yet
    assert not only_late(good, 101.0, max_age_s=5.0, window=120)  # none read this window


async def test_a_new_window_is_read_by_the_next_round_and_idle_rounds_stop(
    counting_prometheus,
):
    server, url = counting_prometheus
    key = ("ns", "s")
    hub = SignalsHub()
    await served(hub, url, key, window=60, max_age_s=0.5)
    wider = await served(hub, url, key, window=120, budget_window=3600, max_age_s=0.5)
    assert {"p99:120", "p995:3600"} <= set(wider.vectors)
    # Nobody asks any more: the refresher stops within its idle intervals and a round.
    task = hub._refreshers[url].task
    await asyncio.wait_for(asyncio.shield(task), IDLE_INTERVALS * 0.5 + 5.0)
    answered = server.answered
    await asyncio.sleep(0.3)
    assert server.answered == answered


async def test_a_prometheus_whose_recorded_series_were_missing_is_probed_again_soon(
    counting_prometheus,
):
    _, url = counting_prometheus
    # A minute ago its rules had not evaluated yet (the operator started with it); now they have.
    hub = SignalsHub(recorded={url: (False, time.monotonic() - MISSING_RECHECK_S - 1.0)})
    rnd = await served(hub, url, window=60, budget_window=3600, max_age_s=5.0)
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
        first = await served(hub, url, window=60, max_age_s=1.0)
        assert first.error is None and first.vectors["waiting"] == {("ns", "s"): 2.0}
    finally:
        apiserver.set()
        await asyncio.gather(*writes)
        await hub.close()


def test_a_service_missing_from_one_round_keeps_its_last_signals_for_three_intervals():
    seen = ServiceSignals(waiting=1.0, running=4.0, reporting_pods=1)
    missing = ServiceSignals()  # one failed scrape: none of the service's series in the round
    signals, held = carry_over(seen, 100.0, None, max_age_s=5.0)
    assert signals is seen and held == (seen, 100.0)
    signals, held = carry_over(missing, 105.0, held, max_age_s=5.0)
    assert signals is seen and held == (seen, 100.0)
    signals, held = carry_over(missing, 100.0 + STALE_INTERVALS * 5.0 + 0.1, held, max_age_s=5.0)
    assert signals is missing and held is None  # gone for longer: the law holds
