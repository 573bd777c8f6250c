"""What the operator reads while a real runtime drains an offline backlog: a real
`wok runtime serve` (builtin:tiny on the CPU) scraped by a real Prometheus, queried with the
operator's own round of PromQL. The online series the law scales on stay at zero while the batch
lane's show the backlog and its drain rate; the tick then adds no replica without the deadline
opt-in, and does with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from promql_harness import running_prometheus
from runtime_harness import RuntimeServer, start_server

from wok_contracts.signals import PodView, ServiceSignals
from wok_operator.api import InferenceServiceSpec
from wok_operator.control import LawParams
from wok_operator.loop import control_tick, state_from_status
from wok_operator.signals import fetch_round, round_queries

pytestmark = [pytest.mark.integration, pytest.mark.slow(minutes=1)]  # started first

KEY = ("it", "llm")
WINDOW = 10  # the SLO window the rates are taken over
BACKLOG = 40  # batch requests of 200 tokens each, two at a time: some 30 s of work


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    srv = start_server(
        tmp_path_factory.mktemp("backlog"), "--max-batch-size", "2",
        "--batch-lane-max-batch-size", "2", "--drain-seconds", "5",
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, server: RuntimeServer) -> Iterator[str]:
    run_dir: Path = tmp_path_factory.mktemp("prometheus")
    target = server.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "runtime",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [
                    {"targets": [target], "labels": {"namespace": KEY[0], "service": KEY[1]}}
                ],
            }
        ],
    }
    with running_prometheus(run_dir, config) as url:
        yield url


def signals_until(url: str, ready: object, *, timeout: float = 60.0) -> ServiceSignals:
    """The operator's signals of the service, polled until `ready(signals)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        rnd = fetch_round(url, round_queries({WINDOW}))
        assert rnd.error is None, rnd.error
        signals = rnd.signals(KEY, WINDOW)
        if ready(signals):  # type: ignore[operator]
            return signals
        assert time.monotonic() < deadline, f"signals never got there: {signals}"
        time.sleep(0.5)


def spec(deadline_s: float | None) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "scaling": {"maxReplicas": 4, "podStartSeconds": 5},
            "slo": {"windowSeconds": WINDOW},
            "batchLane": {"completeWithinSeconds": deadline_s},
        }
    )


def test_an_offline_backlog_shows_only_in_the_batch_lane_and_scales_only_on_a_deadline(
    server: RuntimeServer, prometheus: str
):
    body = {"prompt": [20 + i for i in range(8)], "max_tokens": 200, "ignore_eos": True}
    answers: list[int] = []
    signals_until(prometheus, lambda s: s.reporting_pods == 1)  # scraped before the backlog

    def post() -> None:
        r = httpx.post(
            f"{server.url}/v1/completions", json={**body, "priority": "batch"}, timeout=180
        )
        answers.append(r.status_code)

    threads = [threading.Thread(target=post) for _ in range(BACKLOG)]
    for thread in threads:
        thread.start()
    try:
        signals = signals_until(
            prometheus,
            lambda s: (s.batch_requests or 0) >= 4 and (s.batch_tokens_per_s or 0) > 0,
        )
        # The series the law scales on describe the online lane only: no online work, no load.
        assert (signals.waiting, signals.running, signals.reporting_pods) == (0.0, 0.0, 1)
        assert signals.finished_per_s == 0.0 and signals.rejected_per_s == 0.0
        assert signals.p99_ttft_seconds is None and signals.p99_seconds is None
        assert signals.batch_pending_tokens is not None and signals.batch_pending_tokens >= 4 * 150

        pods = [PodView("runtime-0", "u0", "127.0.0.1", True, False)]
        for deadline_s, more in ((None, False), (0.5, True)):
            s = spec(deadline_s)
            params = LawParams.from_spec(s, batch_mem=64)
            state = state_from_status({"replicas": 1, "batchSize": 2}, s, params)
            result = control_tick(s, state, signals, pods, batch_mem=64, now=1000.0)
            d = result.decision
            assert not d.slo_breached and not d.metrics_missing, d.reason
            assert result.backlog is not None and result.backlog.seconds is not None
            assert (d.replicas > 1) is more, d.reason
            if more:
                assert "for the batch lane" in d.reason
    finally:
        for thread in threads:
            thread.join(180)
    assert answers == [200] * BACKLOG
    # The backlog's tokens drain to zero with its requests (signals_until fails if they never
    # do). Polled for both at once: the round's queries are evaluated one after another, so one
    # may see the scrape before the last request finished and the other the scrape after it.
    signals_until(prometheus, lambda s: s.batch_requests == 0 and s.batch_pending_tokens == 0)
