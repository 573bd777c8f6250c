"""An emulated Prometheus: what the operator's PromQL round would return about the simulated fleet.

Policies must see what they would see in a cluster, not the simulator's ground truth: gauges as of
the last scrape (every `scrape_interval_s`, the PodMonitor's interval), counters through `rate()`
over a window, latency percentiles through `histogram_quantile` over the runtime's own buckets
(imported from `wok_contracts.metrics`, the metric contract), with rejected and timed-out requests
added to the +Inf bucket of TTFT and E2E as the operator's query does. A pod whose scrape fails has
no sample that round (Prometheus marks its series stale), so it drops out of the sums and of
`reporting`.

The result is the operator's own `Round` (vectors keyed by `signals.round_queries` names), so
`Round.signals` builds the ServiceSignals exactly as in the operator. `rate()` is Prometheus' own
(`extrapolated_rate`: per series, extrapolated towards the window's edges, divided by the window),
so a pod that left mid-window weighs what it served, not its rate while it lived. Simplifications,
said once: a request's metrics count from the first scrape after its last step (a step may end a
few ms after a scrape that already sees it); dropped requests (work left when a drain ends) are
counted nowhere, as the runtime aborts them at exit.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from wok_contracts.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from wok_contracts.signals import ServiceSignals
from wok_operator.signals import HALF_BUDGET_QUANTILE, SLO_QUANTILE, Round, ServiceKey
from wok_sim.replica import RequestRecord, SimReplica

SERVICE: ServiceKey = ("sim", "llm")

# The histograms the operator reads, with the runtime's bucket bounds (+Inf implied).
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "ttft": TTFT_BUCKETS,
    "e2e": REQUEST_LATENCY_BUCKETS,
    "inference": REQUEST_LATENCY_BUCKETS,
    "tpot": ITL_BUCKETS,
}
COUNTERS = ("success", "rejected", "prompt_tokens", "generation_tokens", "prefix_cache_hits")
# A simulated pod has no device to disagree with its KV budget: it measures exactly what it was
# given (ratio 1). The profiles count KV tokens, not bytes, so the budget is a unit.
SIMULATED_KV_BUDGET_BYTES = 1.0


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """Prometheus' `histogram_quantile` over cumulative bucket counts (the last one is +Inf):
    linear within a bucket, the lowest bucket starting at 0, a rank in +Inf returning the last
    finite bound; NaN without observations."""
    if len(cumulative) != len(bounds) + 1:
        raise ValueError("need one cumulative count per bound plus +Inf")
    total = cumulative[-1]
    if not total > 0 or math.isnan(q):
        return math.nan
    rank = q * total
    b = bisect.bisect_left(cumulative, rank)
    if b >= len(bounds):
        return bounds[-1]
    start = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else cumulative[b - 1]
    count = cumulative[b] - below
    if count <= 0:
        return bounds[b]
    return start + (bounds[b] - start) * (rank - below) / count


def extrapolated_rate(
    first: float,
    last: float,
    t_first: float,
    t_last: float,
    samples: int,
    *,
    start: float,
    end: float,
) -> float:
    """Prometheus' `rate()` of one counter series over the range (start, end], from its first and
    last samples there (`extrapolatedRate` in promql/functions.go; no resets: a simulated pod's
    counters only grow). The increase is extrapolated towards each edge by the gap to it, or by
    half a sample interval where the gap exceeds 1.1 intervals (the series began or ended inside
    the range), never below zero at the start, and divided by the whole range."""
    sampled = t_last - t_first
    increase = last - first
    if samples < 2 or sampled <= 0 or increase == 0:
        return 0.0
    average = sampled / (samples - 1)
    threshold = 1.1 * average
    half = average / 2
    to_start = t_first - start
    if increase > 0 and first >= 0:
        to_start = min(to_start, sampled * first / increase)  # the counter's zero bounds it
    to_end = end - t_last
    interval = sampled + (to_start if to_start < threshold else half)
    interval += to_end if to_end < threshold else half
    return increase * interval / sampled / (end - start)


def extrapolated_rates(
    first: Sequence[float],
    last: Sequence[float],
    t_first: float,
    t_last: float,
    samples: int,
    *,
    start: float,
    end: float,
) -> list[float]:
    """`extrapolated_rate` of every series of one pod (they share their sample times)."""
    values = _extrapolated_rates(
        np.asarray(first, dtype=float),
        np.asarray(last, dtype=float),
        t_first,
        t_last,
        samples,
        start=start,
        end=end,
    )
    return values.tolist()


def _extrapolated_rates(
    first: np.ndarray,
    last: np.ndarray,
    t_first: float,
    t_last: float,
    samples: int,
    *,
    start: float,
    end: float,
) -> np.ndarray:
    """`extrapolated_rate` over arrays, with the same floating-point operations in the same order
    (IEEE operations elementwise), so each value is bit-identical: a round reads ~90 series per
    pod, most of them histogram buckets that no request reached."""
    sampled = t_last - t_first
    if samples < 2 or sampled <= 0:
        return np.zeros(len(first))
    average = sampled / (samples - 1)
    threshold = 1.1 * average
    half = average / 2
    to_end = end - t_last
    end_part = to_end if to_end < threshold else half
    increase = last - first
    moved = increase != 0
    bounded = (increase > 0) & (first >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_zero = np.where(bounded, sampled * first / increase, np.inf)
    to_start = np.minimum(t_first - start, by_zero)  # the counter's zero bounds it
    interval = sampled + np.where(to_start < threshold, to_start, half)
    interval += end_part
    rates = increase * interval / sampled / (end - start)
    return np.where(moved, rates, 0.0)


class _PodCounters:
    """One pod's cumulative series (histogram buckets non-cumulative here; summed at a scrape)."""

    def __init__(self) -> None:
        self.buckets = {name: [0] * (len(b) + 1) for name, b in HISTOGRAMS.items()}
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.cursor = 0  # records of the replica already counted

    def count(self, record: RequestRecord) -> None:
        if record.outcome in ("rejected", "timeout"):
            self.counters["rejected"] += 1
            return
        if record.outcome != "ok":
            return
        self.counters["success"] += 1
        self.counters["prompt_tokens"] += record.prompt_tokens
        self.counters["generation_tokens"] += record.output_tokens
        self.counters["prefix_cache_hits"] += record.cached_tokens
        inference = record.finish_s - (record.first_scheduled_s or record.arrival_s)
        for name, value in (
            ("ttft", record.ttft_s),
            ("e2e", record.e2e_s),
            ("inference", inference),
            ("tpot", record.tpot_s),
        ):
            if value is not None:
                # `le` buckets: a value equal to a bound falls in that bound's bucket.
                self.buckets[name][bisect.bisect_left(HISTOGRAMS[name], value)] += 1

    def snapshot(self) -> tuple[float, ...]:
        flat: list[float] = []
        for name in HISTOGRAMS:
            running = 0
            for count in self.buckets[name]:
                running += count
                flat.append(running)
        flat.extend(self.counters[name] for name in COUNTERS)
        return tuple(flat)


def _offsets() -> dict[str, int]:
    offsets, at = {}, 0
    for name, bounds in HISTOGRAMS.items():
        offsets[name] = at
        at += len(bounds) + 1
    for name in COUNTERS:
        offsets[name] = at
        at += 1
    return offsets


OFFSETS = _offsets()
WIDTH = sum(len(b) + 1 for b in HISTOGRAMS.values()) + len(COUNTERS)


@dataclass(frozen=True)
class Gauges:
    waiting: float
    running: float
    kv_usage: float


class EmulatedPrometheus:
    def __init__(
        self,
        *,
        windows: Iterable[int] = (60,),
        budget_windows: Iterable[int] = (),
        scrape_failure_prob: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= scrape_failure_prob < 1.0:
            raise ValueError(
                f"scrape failure probability must be in [0, 1), got {scrape_failure_prob}"
            )
        self.windows = sorted(set(windows))
        self.budget_windows = sorted(set(budget_windows))
        self.failure_prob = scrape_failure_prob
        self._rng = random.Random(seed)
        self._pods: dict[int, _PodCounters] = {}
        # Per pod, its sample times and the series at each (parallel lists, in time order).
        self._history: dict[int, tuple[list[float], list[np.ndarray]]] = {}
        self.latest: dict[int, Gauges] = {}  # pods whose last scrape succeeded

    def scrape(
        self, now: float, replicas: Iterable[SimReplica], *, failed: Collection[int] = ()
    ) -> None:
        """One scrape round of every pod that exists now (the caller advanced them to `now`);
        the pods in `failed`, and each pod with the failure probability, give no sample."""
        seen: dict[int, Gauges] = {}
        for replica in replicas:
            pod = self._pods.setdefault(replica.pod, _PodCounters())
            for record in replica.records[pod.cursor :]:
                pod.count(record)
            pod.cursor = len(replica.records)
            unlucky = self.failure_prob and self._rng.random() < self.failure_prob
            if unlucky or replica.pod in failed:
                continue  # no sample this round: its series go stale
            seen[replica.pod] = Gauges(
                waiting=replica.num_waiting, running=replica.num_running, kv_usage=replica.kv_usage
            )
            snapshot = np.array(pod.snapshot())
            times, values = self._history.setdefault(replica.pod, ([], []))
            times.append(now)
            values.append(snapshot)
        self.latest = seen
        horizon = now - max(self.windows + self.budget_windows) - 1.0
        for times, values in self._history.values():
            # Every sample at or before the horizon goes but the last of them.
            old = bisect.bisect_right(times, horizon) - 1
            if old > 0:
                del times[:old], values[:old]

    def _rates(self, now: float, window: float) -> list[float] | None:
        """Σ over pods of rate(series[window]) for every series; None when no pod has two
        samples in the window."""
        total = np.zeros(WIDTH)
        any_pod = False
        start = now - window
        for times, values in self._history.values():
            # The window's samples: after `start`, at most `now`.
            last = bisect.bisect_right(times, now)
            first = bisect.bisect_right(times, start, 0, last)
            if last - first < 2:
                continue
            total = total + _extrapolated_rates(
                values[first],
                values[last - 1],
                times[first],
                times[last - 1],
                last - first,
                start=start,
                end=now,
            )
            any_pod = True
        return total.tolist() if any_pod else None

    def round(self, now: float) -> Round:
        """What the operator's round of `round_queries(windows)` would return now."""
        vectors: dict[str, dict[ServiceKey, float]] = {}

        def put(name: str, value: float | None) -> None:
            # The operator drops NaN and ±Inf samples (`parse_vector`); so does this.
            if value is not None and math.isfinite(value):
                vectors.setdefault(name, {})[SERVICE] = float(value)

        if self.latest:
            put("waiting", sum(g.waiting for g in self.latest.values()))
            put("running", sum(g.running for g in self.latest.values()))
            put("kv_usage", max(g.kv_usage for g in self.latest.values()))
            put("reporting", len(self.latest))
            # The simulated fleet serves online traffic only: its batch lane is always empty.
            put("batch_requests", 0.0)
            put("batch_pending_tokens", 0.0)
            put("kv_budget_bytes", SIMULATED_KV_BUDGET_BYTES)
            put("kv_measured_ratio_min", 1.0)
            put("kv_measured_ratio_max", 1.0)
        # The SLO quantiles over each budget window (`signals._slo_p99s`), every signal over each
        # SLO window.
        for window in sorted(set(self.windows + self.budget_windows)):
            rates = self._rates(now, window)
            if rates is None:
                continue
            misses = rates[OFFSETS["rejected"]]
            quantiles = [("p99", SLO_QUANTILE)]
            if window in self.budget_windows:
                quantiles.append(("p995", HALF_BUDGET_QUANTILE))
            for name, q in quantiles:
                put(f"{name}:{window}", self._quantile(rates, "e2e", misses, q))
                put(f"{name}_ttft:{window}", self._quantile(rates, "ttft", misses, q))
                put(f"{name}_tpot:{window}", self._quantile(rates, "tpot", 0.0, q))
            if window not in self.windows:
                continue
            put(f"p99_service:{window}", self._quantile(rates, "inference", 0.0))
            success = rates[OFFSETS["success"]]
            for name, counter in (
                ("mean_prompt", "prompt_tokens"),
                ("mean_output", "generation_tokens"),
                ("mean_cached", "prefix_cache_hits"),
            ):
                put(
                    f"{name}:{window}",
                    rates[OFFSETS[counter]] / success if success > 0 else math.nan,
                )
            put(f"finished_rate:{window}", success)
            put(f"rejected_rate:{window}", misses)
            put(f"batch_token_rate:{window}", 0.0)
        return Round(fetched_at=now, vectors=vectors)

    @staticmethod
    def _quantile(rates: list[float], name: str, misses: float, q: float = SLO_QUANTILE) -> float:
        bounds = HISTOGRAMS[name]
        start = OFFSETS[name]
        cumulative = rates[start : start + len(bounds) + 1]
        cumulative[-1] += misses  # rejected and timed-out requests join +Inf
        return histogram_quantile(q, bounds, cumulative)

    def signals(self, now: float, window: int, budget_window: int | None = None) -> ServiceSignals:
        return self.round(now).signals(SERVICE, window, budget_window)
