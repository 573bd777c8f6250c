"""Signals from Prometheus: one round of PromQL serves every InferenceService at once.

Each query aggregates `by (namespace, service)`, so a tick for N services costs a constant number
of requests, not N. `SignalsHub` shares a round between the control loops of all services that
read the same Prometheus: a refresher task fetches one every interval, ahead of the ticks, which
read the newest (a tick that waited for its round took as long as the slowest query, and every
tick that came during the fetch waited too). A round's queries run a few at a time
(`QUERY_POOL`); where the chart's recording rules run (`recording_rules`), the hour-long
quantiles are read from their recorded series instead of being computed at every round. The
metric names are the runtime's (`wok_contracts.metrics`); a test checks that every one named here
is really exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from wok_contracts.signals import ServiceSignals
from wok_operator.metrics import PROMQL_REQUESTS

T = TypeVar("T")

ServiceKey = tuple[str, str]  # (namespace, service)
GROUP = "namespace, service"

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
REJECTED = "wok_rejected_requests_total"
# vLLM's own count of the requests it refused at admission (`--max-num-queued-reqs`, a 503):
# what an engine: vllm pod exports in place of wok's rejection counter (it has no queue timeout).
VLLM_REJECTED = "vllm:admission_rejections_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # prompt tokens whose prefill the cache saved
REQUEST_SUCCESS = "vllm:request_success_total"
# The batch lane's own series: offline work never shows in the vllm:* ones above.
BATCH_LANE_WAITING = "wok_batch_lane_requests_waiting"
BATCH_LANE_RUNNING = "wok_batch_lane_requests_running"
BATCH_LANE_PENDING_TOKENS = "wok_batch_lane_pending_tokens"
BATCH_LANE_GENERATION_TOKENS = "wok_batch_lane_generation_tokens_total"
# The KV pool a GPU pod was given (the budget) and the room it measured for it after loading
# (the runtime's kv_memory.py). A CPU pod's measured figure is a share of host memory, not of a
# device, so only the CUDA series are read.
KV_BUDGET_BYTES = "wok_kv_cache_budget_bytes"
KV_MEASURED_BYTES = "wok_kv_cache_measured_bytes"
KV_DEVICE_SELECTOR = '{device="cuda"}'
#: How far the measured room may be from the budget (the runtime's `KV_BUDGET_TOLERANCE`).
KV_BUDGET_TOLERANCE = 0.10


#: Queries of one round in flight at once: the round takes about its slowest query instead of
#: the sum of all, and Prometheus' query concurrency (20 by default) keeps room for others.
QUERY_POOL = 4

#: The SLO's quantile, and the one that keeps half its error budget (0.5 % of requests missed).
SLO_QUANTILE = 0.99
HALF_BUDGET_QUANTILE = 0.995


def rejected_rates(window: str) -> str:
    """Each pod's refused requests per second, from its engine's own counter: wok's runtime
    exports `REJECTED`, vLLM `VLLM_REJECTED`, never both; one round serves both engines."""
    return f"(rate({REJECTED}[{window}]) or rate({VLLM_REJECTED}[{window}]))"


def slo_buckets(histogram: str, window: str, *, misses_count: bool) -> str:
    """The bucket rates of one service's histogram, by (namespace, service, le); with
    `misses_count`, a rejected or timed-out request joins the +Inf bucket: it never gets a first
    or last token, but it is a miss, so overload reads as a breach instead of as a shorter
    histogram."""
    rates = f"rate({histogram}_bucket[{window}])"
    if misses_count:
        # A union of per-pod series, summed once: the bucket rate() is evaluated once, and a
        # service whose pods export no rejection counter keeps its plain histogram. The `miss`
        # label keeps a rejection series apart from the pod's own +Inf bucket in the union.
        misses = f'label_replace({rejected_rates(window)}, "le", "+Inf", "", "")'
        rates = f'{rates} or label_replace({misses}, "miss", "rejected", "", "")'
    return f"sum by ({GROUP}, le) ({rates})"


def _p99(histogram: str, window: str, *, misses_count: bool, q: float = SLO_QUANTILE) -> str:
    return f"histogram_quantile({q:g}, {slo_buckets(histogram, window, misses_count=misses_count)})"


#: The SLO histograms by signal-name suffix, and whether a rejected request counts as a miss.
SLO_HISTOGRAMS = {"": (E2E_LATENCY, True), "_ttft": (TTFT, True), "_tpot": (TPOT, False)}

# --- recording rules (charts/wok/files/recording_rules.yaml is `recording_rules()`) --------------
#: The windows the shipped recording rules cover, by their name in a recorded series: the
#: default budget window, whose bucket rates over an hour are the round's dearest queries.
RECORDED_WINDOWS = {3600: "1h"}
#: How often the recording rules run: a recorded quantile is at most this old.
RECORDING_INTERVAL = "30s"
#: How long the hub trusts its finding that the recorded series exist; that they do not, only
#: one rule interval: an operator that starts with its Prometheus finds no recorded series until
#: the rules' first evaluations, and would read the hour-long windows raw for minutes.
RECORDED_CHECK_S = 300.0
MISSING_RECHECK_S = 30.0


def recheck_due(
    found: tuple[bool, float] | None, now: float, *, present_s: float, missing_s: float
) -> bool:
    """Whether a yes/no finding about a dependency (recorded series in Prometheus, a CRD in the
    cluster), made at `found[1]`, is read again at `now`: a yes is trusted for `present_s`, a no
    only for `missing_s`, so a dependency installed later is seen soon."""
    if found is None:
        return True
    return now - found[1] >= (present_s if found[0] else missing_s)


def _metric_id(histogram: str) -> str:
    return histogram.replace(":", "_")


def recorded_buckets(histogram: str, window: int, *, misses_count: bool) -> str:
    """The name of a recorded `slo_buckets` series (level:metric:operations, Prometheus' rule
    naming)."""
    misses = "_with_misses" if misses_count else ""
    metric = f"{_metric_id(histogram)}_bucket{misses}"
    return f"namespace_service_le:{metric}:rate{RECORDED_WINDOWS[window]}"


def recorded_quantile(histogram: str, window: int, q: float) -> str:
    digits = f"{q:g}".removeprefix("0.")
    return f"namespace_service:{_metric_id(histogram)}:p{digits}_{RECORDED_WINDOWS[window]}"


def recording_rules() -> dict[str, Any]:
    """The recording rules the chart ships (pure): each recorded window's bucket rates, and its
    SLO quantiles from them, evaluated once per `RECORDING_INTERVAL` instead of at every round."""
    rules: list[dict[str, str]] = []
    for window in sorted(RECORDED_WINDOWS):
        for histogram, misses_count in SLO_HISTOGRAMS.values():
            buckets = recorded_buckets(histogram, window, misses_count=misses_count)
            w = f"{window}s"
            rules.append(
                {"record": buckets, "expr": slo_buckets(histogram, w, misses_count=misses_count)}
            )
            for q in (SLO_QUANTILE, HALF_BUDGET_QUANTILE):
                rules.append(
                    {
                        "record": recorded_quantile(histogram, window, q),
                        "expr": f"histogram_quantile({q:g}, {buckets})",
                    }
                )
    return {"groups": [{"name": "wok.slo-windows", "interval": RECORDING_INTERVAL, "rules": rules}]}


def recorded_probe() -> str:
    """One query whose answer is not empty when the recorded quantiles exist in Prometheus."""
    names = "|".join(
        recorded_quantile(histogram, window, SLO_QUANTILE)
        for window in sorted(RECORDED_WINDOWS)
        for histogram, _ in SLO_HISTOGRAMS.values()
    )
    return f'topk(1, {{__name__=~"{names}"}})'


def _slo_p99s(window: int, q: float = SLO_QUANTILE, *, recorded: bool = False) -> dict[str, str]:
    """The three SLO quantiles over one window (misses counted where the SLO counts them),
    named p99 for the SLO's own quantile and p995 for the half-budget one; with `recorded`, the
    recording rules' series where they cover the window."""
    w, name = f"{window}s", "p99" if q == SLO_QUANTILE else "p995"
    if recorded and window in RECORDED_WINDOWS:
        return {
            f"{name}{suffix}:{window}": recorded_quantile(histogram, window, q)
            for suffix, (histogram, _) in SLO_HISTOGRAMS.items()
        }
    return {
        f"{name}{suffix}:{window}": _p99(histogram, w, misses_count=misses_count, q=q)
        for suffix, (histogram, misses_count) in SLO_HISTOGRAMS.items()
    }


def round_queries(
    windows: Iterable[int], budget_windows: Iterable[int] = (), *, recorded: bool = False
) -> dict[str, str]:
    """Every PromQL query of one round, by signal name (pure): every signal over each SLO
    window, and the three SLO P99s and P99.5s over each budget window; with `recorded` (the
    chart's recording rules run in this Prometheus), the recorded series where they cover a
    window, else the raw PromQL."""
    windows = set(windows)
    queries = {
        "waiting": f"sum by ({GROUP}) ({WAITING})",
        "running": f"sum by ({GROUP}) ({RUNNING})",
        "kv_usage": f"max by ({GROUP}) ({KV_USAGE})",
        # Pods whose last scrape succeeded: a pod that fails its scrape drops out of the sums, so
        # per-replica figures divide by these, not by the ready pods.
        "reporting": f"count by ({GROUP}) ({WAITING})",
    }
    for window in sorted(set(windows)):
        w = f"{window}s"
        queries |= _slo_p99s(window, recorded=recorded)
        queries[f"p99_service:{window}"] = _p99(INFERENCE_TIME, w, misses_count=False)
        means = (
            ("mean_prompt", PROMPT_TOKENS),
            ("mean_output", GENERATION_TOKENS),
            ("mean_cached", PREFIX_CACHE_HITS),
        )
        for name, counter in means:
            queries[f"{name}:{window}"] = (
                f"sum by ({GROUP}) (rate({counter}[{w}]))"
                f" / sum by ({GROUP}) (rate({REQUEST_SUCCESS}[{w}]))"
            )
        queries[f"finished_rate:{window}"] = f"sum by ({GROUP}) (rate({REQUEST_SUCCESS}[{w}]))"
        queries[f"rejected_rate:{window}"] = f"sum by ({GROUP}) {rejected_rates(w)}"
    for window in sorted(set(budget_windows)):
        if window not in windows:
            queries |= _slo_p99s(window, recorded=recorded)
        queries |= _slo_p99s(window, HALF_BUDGET_QUANTILE, recorded=recorded)
    queries |= batch_lane_queries(windows)
    queries |= kv_budget_queries()
    return queries


def kv_budget_queries() -> dict[str, str]:
    """The GPU pods' KV budget and measured room ÷ budget at both ends of the service's pods
    (the worst is whichever is farther from 1), by signal name (pure)."""
    budget = f"{KV_BUDGET_BYTES}{KV_DEVICE_SELECTOR}"
    ratio = f"{KV_MEASURED_BYTES}{KV_DEVICE_SELECTOR} / {budget}"
    return {
        "kv_budget_bytes": f"max by ({GROUP}) ({budget})",
        "kv_measured_ratio_min": f"min by ({GROUP}) ({ratio})",
        "kv_measured_ratio_max": f"max by ({GROUP}) ({ratio})",
    }


def batch_lane_queries(windows: Iterable[int]) -> dict[str, str]:
    """The batch lane's backlog and its drain rate (`backlog.py`), by signal name (pure)."""
    queries = {
        "batch_requests": f"sum by ({GROUP}) ({BATCH_LANE_WAITING})"
        f" + sum by ({GROUP}) ({BATCH_LANE_RUNNING})",
        "batch_pending_tokens": f"sum by ({GROUP}) ({BATCH_LANE_PENDING_TOKENS})",
    }
    for window in sorted(set(windows)):
        queries[f"batch_token_rate:{window}"] = (
            f"sum by ({GROUP}) (rate({BATCH_LANE_GENERATION_TOKENS}[{window}s]))"
        )
    return queries


def parse_vector(result: list[dict[str, Any]]) -> dict[ServiceKey, float]:
    """An instant vector, keyed by (namespace, service); NaN and ±Inf samples are dropped."""
    values: dict[ServiceKey, float] = {}
    for sample in result:
        labels = sample.get("metric", {})
        key = (labels.get("namespace", ""), labels.get("service", ""))
        value = float(sample["value"][1])
        if key[1] and math.isfinite(value):
            values[key] = value
    return values


@dataclass
class Round:
    fetched_at: float  # time.monotonic() when the round started
    vectors: dict[str, dict[ServiceKey, float]]
    error: str | None = None
    evaluated_at: float | None = None  # the Unix time every query of the round was evaluated at
    late: bool = False  # with an error: a round answered recently, it is only late (`only_late`)

    def reads(self, window: int, budget_window: int | None = None) -> bool:
        """Whether this round read the signals over `window` (and `budget_window`)."""
        names = [f"p99:{window}"] + ([] if budget_window is None else [f"p995:{budget_window}"])
        return all(name in self.vectors for name in names)

    def signals(
        self, key: ServiceKey, window: int, budget_window: int | None = None
    ) -> ServiceSignals:
        def get(name: str) -> float | None:
            return self.vectors.get(name, {}).get(key)

        def budget(name: str) -> float | None:
            return None if budget_window is None else get(f"{name}:{budget_window}")

        reporting = get("reporting")
        return ServiceSignals(
            waiting=get("waiting"),
            running=get("running"),
            kv_usage=get("kv_usage"),
            reporting_pods=None if reporting is None else int(reporting),
            p99_seconds=get(f"p99:{window}"),
            p99_ttft_seconds=get(f"p99_ttft:{window}"),
            p99_tpot_seconds=get(f"p99_tpot:{window}"),
            p99_service_seconds=get(f"p99_service:{window}"),
            budget_p99_seconds=budget("p99"),
            budget_p99_ttft_seconds=budget("p99_ttft"),
            budget_p99_tpot_seconds=budget("p99_tpot"),
            budget_p995_seconds=budget("p995"),
            budget_p995_ttft_seconds=budget("p995_ttft"),
            budget_p995_tpot_seconds=budget("p995_tpot"),
            mean_prompt_tokens=get(f"mean_prompt:{window}"),
            mean_output_tokens=get(f"mean_output:{window}"),
            mean_cached_tokens=get(f"mean_cached:{window}"),
            finished_per_s=get(f"finished_rate:{window}"),
            rejected_per_s=get(f"rejected_rate:{window}"),
            batch_requests=get("batch_requests"),
            batch_pending_tokens=get("batch_pending_tokens"),
            batch_tokens_per_s=get(f"batch_token_rate:{window}"),
            kv_budget_bytes=get("kv_budget_bytes"),
            kv_measured_ratio=farthest_from_one(
                get("kv_measured_ratio_min"), get("kv_measured_ratio_max")
            ),
        )


def farthest_from_one(*ratios: float | None) -> float | None:
    """The ratio that is farthest from 1 (the worst pod's), None when there is none."""
    known = [r for r in ratios if r is not None]
    return max(known, key=lambda r: abs(r - 1.0)) if known else None


def fetch_round(
    url: str,
    queries: dict[str, str],
    timeout_s: float = 5.0,
    *,
    concurrency: int = QUERY_POOL,
    at: float | None = None,
) -> Round:
    """One round of `round_queries` against `url`, at most `concurrency` queries in flight
    (blocking: run it in a thread). Every query is evaluated at one instant, `at` (Unix seconds;
    now by default): queries read a scrape apart disagree (a backlog's requests drained while its
    tokens were still pending). The first failure fails the round; queries not yet sent are
    dropped."""
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    # No retries and a client timeout: the next tick is the retry, and a Prometheus that accepts
    # connections but never answers must not hold every control loop (they share this round).
    client = PrometheusConnect(
        url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_s + 1.0
    )

    started = time.monotonic()
    at = round(time.time() if at is None else at, 3)  # as PromQL reads it: milliseconds
    params = {"timeout": f"{timeout_s:g}s", "time": f"{at:.3f}"}

    def query(text: str) -> dict[ServiceKey, float]:
        return parse_vector(client.custom_query(text, params=params))

    pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(queries))))
    try:
        vectors = dict(zip(queries, pool.map(query, queries.values()), strict=True))
    except Exception as error:  # any failure means "no data": the law then holds
        error_text = f"{type(error).__name__}: {error}"
        return Round(fetched_at=started, vectors={}, error=error_text, evaluated_at=at)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return Round(fetched_at=started, vectors=vectors, evaluated_at=at)


def fetch_recorded(url: str, timeout_s: float = 5.0) -> bool:
    """Whether the chart's recording rules run in the Prometheus at `url` (blocking): their
    quantiles exist. Unknown (an error) reads as no: the raw PromQL answers either way."""
    rnd = fetch_round(url, {"recorded": recorded_probe()}, timeout_s)
    return rnd.error is None and bool(rnd.vectors["recorded"])


#: A round older than this many intervals is not served: the tick holds, with the round named
#: as stale (Prometheus answers slower than the interval, or has failed since).
STALE_INTERVALS = 3.0
#: Within this many intervals of the newest round that answered, a round that is not fresh is
#: only late (Prometheus answers slower than the interval on a loaded machine, a query timed
#: out): the tick holds as the last fresh tick left things (`loop.held_tick`) and says nothing
#: new. Past it, the signals are unavailable (`MetricsUnavailable`): Prometheus is down, or so
#: slow that no round lands within a heartbeat at the default interval.
UNAVAILABLE_INTERVALS = 12.0
#: A refresher stops after this many intervals without a tick asking for its rounds.
IDLE_INTERVALS = 3.0


def stale_reason(
    good: Round | None,
    last: Round | None,
    now: float,
    *,
    max_age_s: float,
    window: int,
    budget_window: int | None = None,
) -> str | None:
    """Why the newest round that answered, `good`, cannot serve a tick at `now` (None: it can),
    naming the last round's error when the last round failed (pure)."""
    failed = "" if last is None or last.error is None else f"; the last round failed: {last.error}"
    if good is None:
        return f"no Prometheus round has answered yet{failed}"
    age = now - good.fetched_at
    if age > STALE_INTERVALS * max_age_s:
        return (
            f"stale: the newest Prometheus round that answered started {age:.1f} s ago, over "
            f"{STALE_INTERVALS:g} intervals of {max_age_s:g} s{failed}"
        )
    if not good.reads(window, budget_window):
        return f"no Prometheus round has read the {window} s window yet"
    return None


def only_late(
    good: Round | None,
    now: float,
    *,
    max_age_s: float,
    window: int,
    budget_window: int | None = None,
) -> bool:
    """Whether a tick at `now` that `stale_reason` refused has a round that is only late: one
    that answered, read the tick's windows, and started within `UNAVAILABLE_INTERVALS` (pure).
    At 1,000 services on a loaded machine most ticks came between two such rounds, and a tick
    that treated each as missing metrics flipped MetricsUnavailable, the batch lane's estimate
    and the memory plan, and wrote status 3.4 times per service per minute."""
    if good is None or not good.reads(window, budget_window):
        return False
    return now - good.fetched_at <= UNAVAILABLE_INTERVALS * max_age_s


#: A service's signals with the start of the round that read them (`Round.fetched_at`).
HeldSignals = tuple[ServiceSignals, float]


def carry_over(
    fresh: ServiceSignals, fresh_at: float, held: HeldSignals | None, *, max_age_s: float
) -> tuple[ServiceSignals, HeldSignals | None]:
    """The service's signals from the round that started at `fresh_at`, and what to hold for
    the next tick (pure). A round with none of the service's series (one failed scrape marks a
    pod's series stale at once: with 1,000 pods on a loaded machine, a service went missing for
    a round several times a minute, and its MetricsUnavailable condition and status flapped)
    gives the last signals it had, while they are no older than `STALE_INTERVALS` intervals."""
    if fresh.reporting_pods is not None:
        return fresh, (fresh, fresh_at)
    if held is not None and fresh_at - held[1] <= STALE_INTERVALS * max_age_s:
        return held[0], held
    return fresh, None


@dataclass
class _Refresher:
    """The task that fetches one Prometheus' rounds. Made anew with its task, so it always
    belongs to the running event loop."""

    task: asyncio.Task[None]
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # fetch now, not at the interval


@dataclass
class SignalsHub:
    """Shares rounds between control loops: one round per Prometheus per interval, for all.

    A refresher task per Prometheus fetches a round every interval (the shortest any service
    asks for), ahead of the ticks. A tick never waits on PromQL: it reads the newest round that
    answered, or, when there is none younger than `STALE_INTERVALS` intervals (the first round
    has not landed, Prometheus has failed since, or answers slower than the interval), it gets
    a round whose error names why, and the law holds. A failed round does not replace the last
    good one while that one is fresh: one slow query does not flap every service's
    MetricsUnavailable condition (and write every status)."""

    windows: set[int] = field(default_factory=lambda: {60})
    budget_windows: set[int] = field(default_factory=set)
    rounds: dict[str, Round] = field(default_factory=dict)  # the latest round, failed or not
    answered: dict[str, Round] = field(default_factory=dict)  # the latest round without error
    # Per Prometheus: whether the recording rules run there, and when that was last checked.
    recorded: dict[str, tuple[bool, float]] = field(default_factory=dict)
    # Per Prometheus, per service: the interval it asked for, and when it last asked.
    asked: dict[str, dict[ServiceKey, tuple[float, float]]] = field(default_factory=dict)
    _refreshers: dict[str, _Refresher] = field(default_factory=dict)
    # The rounds' own thread: in the loop's default executor a round queued behind the control
    # loops' Kubernetes writes (8 s at P50 with 300 services), went stale, and ticks waited on it.
    _thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="promql-rounds")
    )

    async def get(
        self,
        url: str,
        key: ServiceKey,
        *,
        window: int,
        max_age_s: float,
        budget_window: int | None = None,
    ) -> Round:
        """The newest round that answered and read `window`, at once; else a round with the
        error that says why there is none, marked `late` when one answered recently (the caller
        holds)."""
        now = time.monotonic()
        self.asked.setdefault(url, {})[key] = (max_age_s, now)
        new_window = window not in self.windows or (
            budget_window is not None and budget_window not in self.budget_windows
        )
        self.windows.add(window)
        if budget_window is not None:
            self.budget_windows.add(budget_window)
        refresher = self._refresher(url)
        good = self.answered.get(url)
        error = stale_reason(
            good,
            self.rounds.get(url),
            now,
            max_age_s=max_age_s,
            window=window,
            budget_window=budget_window,
        )
        if new_window:
            refresher.wake.set()  # a round that reads it now, not at the next interval
        if error is None and good is not None:
            return good
        late = only_late(good, now, max_age_s=max_age_s, window=window, budget_window=budget_window)
        return Round(fetched_at=now, vectors={}, error=error, late=late)

    def interval(self, url: str, now: float) -> float | None:
        """The shortest interval a service asked for at `url` while it kept asking; None once
        every service has been idle for `IDLE_INTERVALS` of its own."""
        live = [
            max_age
            for max_age, at in self.asked.get(url, {}).values()
            if now - at <= IDLE_INTERVALS * max_age
        ]
        return min(live, default=None)

    def _refresher(self, url: str) -> _Refresher:
        refresher = self._refreshers.get(url)
        if refresher is None or refresher.task.done():
            refresher = _Refresher(task=asyncio.create_task(self._refresh(url)))
            self._refreshers[url] = refresher
        return refresher

    async def _refresh(self, url: str) -> None:
        """Rounds at `url`, each an interval after the last one started (or as soon as a tick
        wakes it), until no tick asks. The caller stores this task's `_Refresher` before the task
        first runs."""
        refresher = self._refreshers[url]
        while (interval := self.interval(url, time.monotonic())) is not None:
            current = self.rounds.get(url)
            due = 0.0 if current is None else current.fetched_at + interval - time.monotonic()
            if due > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(refresher.wake.wait(), due)
            refresher.wake.clear()
            rnd = self.rounds[url] = await self._fetch(url)
            if rnd.error is None:
                self.answered[url] = rnd

    async def _fetch(self, url: str) -> Round:
        started = time.monotonic()
        try:
            recorded = await self._recorded(url)
            queries = round_queries(self.windows, self.budget_windows, recorded=recorded)
            PROMQL_REQUESTS.inc(len(queries))
            return await self._in_thread(fetch_round, url, queries)
        except Exception as error:  # the waiters must wake: no data, the law holds
            return Round(fetched_at=started, vectors={}, error=f"{type(error).__name__}: {error}")

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, call, *args)

    async def close(self) -> None:
        """Stops every refresher (the operator's cleanup)."""
        for refresher in self._refreshers.values():
            refresher.task.cancel()
        await asyncio.gather(*(r.task for r in self._refreshers.values()), return_exceptions=True)
        self._refreshers.clear()

    async def _recorded(self, url: str) -> bool:
        """Whether the rounds at `url` read the recorded series: checked every
        `RECORDED_CHECK_S` (`MISSING_RECHECK_S` while they are missing), so rules installed (or
        removed) later are picked up."""
        found = self.recorded.get(url)
        due = recheck_due(
            found, time.monotonic(), present_s=RECORDED_CHECK_S, missing_s=MISSING_RECHECK_S
        )
        if found is None or due:
            found = (await self._in_thread(fetch_recorded, url), time.monotonic())
            PROMQL_REQUESTS.inc()
            self.recorded[url] = found
        return found[0]
