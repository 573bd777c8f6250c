"""The emulated Prometheus: histogram_quantile, misses in +Inf, stale pods, the operator's round."""

from __future__ import annotations

import math
import random

import pytest

from wok_contracts.metrics import TTFT_BUCKETS
from wok_contracts.profile import load_profile
from wok_contracts.traces import TraceRequest
from wok_operator.signals import round_queries
from wok_sim.prometheus import (
    EmulatedPrometheus,
    extrapolated_rate,
    extrapolated_rates,
    histogram_quantile,
)
from wok_sim.replica import RequestRecord, SimReplica

PROFILE = load_profile("sim:llama-3-8b-80g")


def test_histogram_quantile_by_hand():
    bounds = (1.0, 2.0, 4.0)
    cumulative = (10.0, 20.0, 30.0, 40.0)  # 10 per bucket, the last 10 above 4 s
    assert histogram_quantile(0.1, bounds, cumulative) == pytest.approx(0.4)  # from 0
    assert histogram_quantile(0.5, bounds, cumulative) == pytest.approx(2.0)
    assert histogram_quantile(0.6, bounds, cumulative) == pytest.approx(2.0 + 2.0 * 4 / 10)
    # A rank in +Inf returns the last finite bound, as Prometheus does.
    assert histogram_quantile(0.99, bounds, cumulative) == 4.0
    assert math.isnan(histogram_quantile(0.99, bounds, (0.0, 0.0, 0.0, 0.0)))


def ok(rid: int, ttft: float, e2e: float, tokens: int = 11) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        pod=0,
        arrival_s=0.0,
        prompt_tokens=5,
        output_tokens=tokens,
        first_token_s=ttft,
        finish_s=e2e,
        outcome="ok",
        first_scheduled_s=0.1,
    )


def missed(rid: int, outcome: str) -> RequestRecord:
    return RequestRecord(rid, 0, 0.0, 5, 0, None, 1.0, outcome)  # type: ignore[arg-type]


def test_rejected_and_timed_out_requests_join_the_inf_bucket():
    pod = SimReplica(PROFILE, pod=0, batch_cap=8)
    prom = EmulatedPrometheus(windows=(60,))
    prom.scrape(0.0, [pod])
    pod.records.extend(ok(i, ttft=0.3, e2e=1.2) for i in range(99))
    pod.records.append(missed(99, "rejected"))
    prom.scrape(5.0, [pod])
    s = prom.signals(5.0, 60)
    # 100 requests, 99 with TTFT in (0.25, 0.5]: the 99th is the bucket's upper end.
    assert s.p99_ttft_seconds == pytest.approx(0.5)
    assert s.p99_seconds == pytest.approx(1.5)  # E2E (1.0, 1.5]
    # rate() divides by the whole 60 s range; the counters began at 0, so nothing is
    # extrapolated before the first sample.
    assert s.finished_per_s == pytest.approx(99 / 60)
    assert s.rejected_per_s == pytest.approx(1 / 60)
    assert s.mean_sequence_tokens == pytest.approx(16.0)
    # TPOT (1.2 - 0.3) / 10 = 0.09 in (0.075, 0.1]; no misses there: rank 98.01 of 99.
    assert s.p99_tpot_seconds == pytest.approx(0.075 + 0.025 * 0.99)
    # One more miss (a queue timeout) puts rank 99 in +Inf: the last finite bound.
    pod.records.append(missed(100, "timeout"))
    prom.scrape(10.0, [pod])
    s = prom.signals(10.0, 60)
    assert s.p99_ttft_seconds == TTFT_BUCKETS[-1]
    assert s.rejected_per_s == pytest.approx(2 / 60)


def test_a_pod_whose_scrape_fails_drops_out_of_the_sums():
    pods = [SimReplica(PROFILE, pod=i, batch_cap=1) for i in range(2)]
    for i, pod in enumerate(pods):
        for j in range(3 + 2 * i):  # 3 and 5 waiting (the pods never step)
            pod.add(10 * i + j, TraceRequest(0.0, 4, 4))
    prom = EmulatedPrometheus()
    prom.scrape(0.0, pods)
    both = prom.signals(0.0, 60)
    assert (both.waiting, both.reporting_pods) == (8.0, 2)
    prom.scrape(5.0, pods, failed={1})
    one = prom.signals(5.0, 60)
    assert (one.waiting, one.reporting_pods) == (3.0, 1)
    assert set(prom.latest) == {0}
    prom.scrape(10.0, pods)
    assert prom.signals(10.0, 60).reporting_pods == 2


def test_no_data_is_none_not_zero():
    prom = EmulatedPrometheus()
    s = prom.signals(0.0, 60)
    assert (s.waiting, s.reporting_pods, s.p99_seconds, s.p99_ttft_seconds) == (None,) * 4
    pod = SimReplica(PROFILE, pod=0, batch_cap=8)
    prom.scrape(0.0, [pod])
    prom.scrape(5.0, [pod])
    s = prom.signals(5.0, 60)
    assert s.waiting == 0.0
    assert s.p99_ttft_seconds is None  # nothing finished: NaN, dropped as the operator does
    assert s.finished_per_s == 0.0


def test_every_query_of_the_operators_round_is_answered():
    pod = SimReplica(PROFILE, pod=0, batch_cap=8)
    prom = EmulatedPrometheus(windows=(60, 120), budget_windows=(3600,))
    prom.scrape(0.0, [pod])
    pod.records.extend(ok(i, ttft=0.3, e2e=1.2) for i in range(5))
    pod.records.append(missed(5, "rejected"))
    prom.scrape(5.0, [pod])
    assert set(prom.round(5.0).vectors) == set(round_queries([60, 120], [3600]))


def test_the_budget_windows_half_budget_quantile():
    # 1000 requests, 7 (0.7 %) with TTFT 3 s: the P99 is within a 2 s SLO, the P99.5 is not.
    pod = SimReplica(PROFILE, pod=0, batch_cap=8)
    prom = EmulatedPrometheus(windows=(60,), budget_windows=(3600,))
    prom.scrape(0.0, [pod])
    pod.records.extend(ok(i, ttft=0.3, e2e=1.2) for i in range(993))
    pod.records.extend(ok(993 + i, ttft=3.0, e2e=4.0) for i in range(7))
    prom.scrape(5.0, [pod])
    s = prom.signals(5.0, 60, 3600)
    assert s.budget_p99_ttft_seconds is not None and s.budget_p99_ttft_seconds < 2.0
    assert s.budget_p995_ttft_seconds is not None and s.budget_p995_ttft_seconds > 2.0


def test_samples_leave_the_rate_window():
    pod = SimReplica(PROFILE, pod=0, batch_cap=8)
    prom = EmulatedPrometheus(windows=(60,))
    prom.scrape(0.0, [pod])
    pod.records.extend(ok(i, ttft=0.3, e2e=1.2) for i in range(10))
    prom.scrape(5.0, [pod])
    for t in range(10, 100, 5):
        prom.scrape(float(t), [pod])
    assert prom.signals(95.0, 60).finished_per_s == 0.0  # the completions are > 60 s old


class _SteadyPod:
    """A pod that has finished `rate × t` requests at each scrape (no engine behind it)."""

    def __init__(self, pod: int) -> None:
        self.pod = pod
        self.records: list[RequestRecord] = []
        self.num_waiting = self.num_running = 0
        self.kv_usage = 0.0

    def finish_until(self, count: float) -> None:
        while len(self.records) < round(count):
            self.records.append(ok(len(self.records), ttft=0.3, e2e=1.2))


def test_a_pod_gone_mid_window_weighs_what_it_served_not_its_rate_while_it_lived():
    # A steady 20 req/s: 10 pods at 2 each until 5 of them leave at t = 600 (last scraped at
    # 595), then the other 5 at 4 each. Dividing each pod's increase by its own span read up
    # to 29 req/s here.
    pods = [_SteadyPod(i) for i in range(10)]
    prom = EmulatedPrometheus(windows=(60,))
    served = []
    for t in range(0, 721, 5):
        live = pods if t < 600 else pods[:5]
        for pod in live:
            pod.finish_until(2.0 * t if t < 600 else 1200.0 + 4.0 * (t - 600))
        prom.scrape(float(t), live)  # type: ignore[arg-type]
        if t >= 60:
            served.append(prom.signals(float(t), 60).finished_per_s)
    assert all(18.0 < rate < 22.0 for rate in served), served


def test_a_pods_series_are_rated_each_as_prometheus_rates_one():
    # Samples every 5 s from 3 s to 58 s of a 60 s window: 2 s to the end is extrapolated, the
    # 3 s to the start only where the counter's zero does not bound it first.
    first, last = (5.0, 0.0, 100.0), (5.0, 110.0, 210.0)
    rates = extrapolated_rates(first, last, 3.0, 58.0, 12, start=0.0, end=60.0)
    assert rates == pytest.approx([0.0, 110 * 57 / 55 / 60, 110 * 60 / 55 / 60])
    for f, la, rate in zip(first, last, rates, strict=True):
        assert extrapolated_rate(f, la, 3.0, 58.0, 12, start=0.0, end=60.0) == rate
    assert extrapolated_rates(first, last, 3.0, 3.0, 1, start=0.0, end=60.0) == [0.0] * 3


def test_the_rates_over_arrays_are_bit_identical_to_one_series_at_a_time():
    rng = random.Random(5)
    first = [float(rng.choice((0, 0, 3, rng.randrange(1000)))) for _ in range(200)]
    last = [f + rng.choice((0.0, 1.0, rng.randrange(5000))) for f in first]
    for t_first, t_last, samples in ((0.5, 59.5, 13), (3.0, 58.0, 12), (40.0, 55.0, 4)):
        rates = extrapolated_rates(first, last, t_first, t_last, samples, start=0.0, end=60.0)
        one_by_one = [
            extrapolated_rate(f, la, t_first, t_last, samples, start=0.0, end=60.0)
            for f, la in zip(first, last, strict=True)
        ]
        assert rates == one_by_one  # to the last bit: a faster round must not move a decision
