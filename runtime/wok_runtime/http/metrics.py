"""The runtime's Prometheus collector: it registers exactly the metrics of the contract
(`wok_contracts.metrics`, the names every part queries) for one served model.

How a name appears on /metrics depends on its kind (Prometheus' conventions, see
`wok_contracts.metrics.series_names`): a counter `X` is exposed as `X_total`; a histogram `X` as
`X_bucket`, `X_sum`, `X_count`.

`vllm_series_only` (`wok runtime serve --as-vllm`) exposes what a vLLM 0.32 server would: only
`wok_contracts.metrics.VLLM_SERIES`, with the queue-full rejections counted as vLLM counts its
`--max-num-queued-reqs` refusals, and none of wok's own series (live batch cap, queue length,
batch lane, rejections by wok's reasons).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wok_contracts.metrics import (
    ADMIN_AUTH_FAILURES,
    AUTH_INVALID,
    AUTH_MISSING,
    BATCH_LANE_E2E_REQUEST_LATENCY_SECONDS,
    BATCH_LANE_GENERATION_TOKENS,
    BATCH_LANE_KV_CACHE_BLOCKS,
    BATCH_LANE_PENDING_TOKENS,
    BATCH_LANE_PREEMPTIONS,
    BATCH_LANE_REJECTED_REQUESTS,
    BATCH_LANE_REQUEST_SUCCESS,
    BATCH_LANE_REQUESTS_RUNNING,
    BATCH_LANE_REQUESTS_WAITING,
    BATCH_SIZE,
    E2E_REQUEST_LATENCY_SECONDS,
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY_SECONDS,
    KV_CACHE_BLOCKS,
    KV_CACHE_BUDGET_BYTES,
    KV_CACHE_MEASURED_BYTES,
    KV_CACHE_USAGE_PERC,
    MAX_BATCH_SIZE,
    MAX_NUM_BATCHED_TOKENS,
    METRICS,
    MODEL_LABEL,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    QUEUE_LENGTH,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
    REJECTED_REQUESTS,
    REQUEST_INFERENCE_TIME_SECONDS,
    REQUEST_QUEUE_TIME_SECONDS,
    REQUEST_SUCCESS,
    REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    VLLM_ADMISSION_REJECTIONS,
    VLLM_SERIES,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class RuntimeMetrics:
    """Owns a dedicated CollectorRegistry with every metric of the contract for one served model.

    Histograms and counters are updated as requests progress (thread-safe: `observe_step` runs on
    the engine thread); gauges are read from `stats_fn()` (the engine's `stats()`) at scrape time,
    so a scrape always sees the engine's present state, never a stale copy.
    """

    def __init__(
        self,
        model_name: str,
        stats_fn: Callable[[], Any],
        *,
        priorities: tuple[int, ...] = (),
        kv_memory: Any = None,
        vllm_series_only: bool = False,
    ) -> None:
        """`kv_memory`: the runner's `KvMemory` (kv_memory.py); None (the simulated
        accelerator: no bytes) leaves the two KV byte gauges out."""
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.model_name = model_name
        self.kv_memory = kv_memory
        self.registry = CollectorRegistry(auto_describe=True)
        self._stats_fn = stats_fn
        # Every configured class is always exposed (0 when empty): absent series break rate().
        self.priorities = priorities

        def histogram(name: str) -> Any:
            spec = METRICS[name]
            return Histogram(name, spec.help, [MODEL_LABEL], registry=self.registry,
                             buckets=spec.buckets).labels(model_name)  # fmt: skip

        def counter(name: str) -> Any:
            spec = METRICS[name]
            return Counter(name, spec.help, [MODEL_LABEL, *spec.labels], registry=self.registry)

        self.ttft = histogram(TIME_TO_FIRST_TOKEN_SECONDS)
        self.itl = histogram(INTER_TOKEN_LATENCY_SECONDS)
        self.tpot = histogram(REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS)
        self.e2e = histogram(E2E_REQUEST_LATENCY_SECONDS)
        self.queue_time = histogram(REQUEST_QUEUE_TIME_SECONDS)
        self.inference_time = histogram(REQUEST_INFERENCE_TIME_SECONDS)
        self.batch_size = histogram(BATCH_SIZE)
        self.prompt_tokens = counter(PROMPT_TOKENS).labels(model_name)
        self.generation_tokens = counter(GENERATION_TOKENS).labels(model_name)
        self.batch_e2e = histogram(BATCH_LANE_E2E_REQUEST_LATENCY_SECONDS)
        self.batch_generation_tokens = counter(BATCH_LANE_GENERATION_TOKENS).labels(model_name)
        self._success = {"online": counter(REQUEST_SUCCESS)}
        self._success["batch"] = counter(BATCH_LANE_REQUEST_SUCCESS)
        self._rejected = {"online": counter(REJECTED_REQUESTS)}
        self._rejected["batch"] = counter(BATCH_LANE_REJECTED_REQUESTS)
        for lane in ("online", "batch"):
            for reason in ("stop", "length", "abort"):
                self._success[lane].labels(model_name, reason)
            for reason in (REJECT_QUEUE_FULL, REJECT_QUEUE_TIMEOUT, REJECT_DRAINING):
                self._rejected[lane].labels(model_name, reason)
        self._auth_failures = counter(ADMIN_AUTH_FAILURES)
        for reason in (AUTH_MISSING, AUTH_INVALID):
            self._auth_failures.labels(model_name, reason)
        self.registry.register(_EngineGauges(self))
        self._exposed: Any = self.registry
        self._admission_rejections: Any = None
        if vllm_series_only:
            # vLLM's reason for a request over --max-num-queued-reqs (vllm/v1/metrics/loggers.py)
            self._admission_rejections = Counter(
                VLLM_ADMISSION_REJECTIONS,
                "Number of admission attempts rejected by a queue limit, by reason.",
                [MODEL_LABEL, "reason"],
                registry=self.registry,
            ).labels(model_name, "max_num_queued_reqs")
            self._exposed = _Restricted(self.registry, VLLM_SERIES)

    def observe_step(self, step: Any) -> None:
        """The engine's on_step hook: one sample of the running batch size per step."""
        if step.batch_size > 0:
            self.batch_size.observe(step.batch_size)

    def observe_finished(self, *, finish_reason: str, metrics: Any, lane: str = "online") -> None:
        """One finished request (any reason that produced a response)."""
        m = metrics
        if lane == "batch":
            if m.finished_time is not None:
                self.batch_e2e.observe(max(0.0, m.finished_time - m.arrival_time))
            self._success["batch"].labels(self.model_name, finish_reason).inc()
            return
        self.prompt_tokens.inc(m.num_prompt_tokens)
        if m.first_token_time is not None:
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
            # vLLM's definition. The last token, not the finish: an abort (a stop string, a
            # client that left) may come later, and that wait is not decoding.
            if m.last_token_time is not None and m.num_output_tokens >= 2:
                decode_s = m.last_token_time - m.first_token_time
                self.tpot.observe(max(0.0, decode_s / (m.num_output_tokens - 1)))
        if m.first_scheduled_time is not None:
            self.queue_time.observe(max(0.0, m.first_scheduled_time - m.arrival_time))
            if m.finished_time is not None:
                self.inference_time.observe(max(0.0, m.finished_time - m.first_scheduled_time))
        if m.finished_time is not None:
            self.e2e.observe(max(0.0, m.finished_time - m.arrival_time))
        self._success["online"].labels(self.model_name, finish_reason).inc()

    def observe_tokens(self, count: int, interval_s: float | None, lane: str = "online") -> None:
        """`count` new tokens; `interval_s` since the previous token (None: the first)."""
        if lane == "batch":
            self.batch_generation_tokens.inc(count)  # throughput work: no latency samples
            return
        self.generation_tokens.inc(count)
        if interval_s is not None and count > 0:
            for _ in range(count):
                self.itl.observe(max(0.0, interval_s / count))

    def reject(self, reason: str, lane: str = "online") -> None:
        self._rejected[lane].labels(self.model_name, reason).inc()
        if reason == REJECT_QUEUE_FULL and self._admission_rejections is not None:
            self._admission_rejections.inc()

    def auth_failed(self, reason: str) -> None:
        self._auth_failures.labels(self.model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        """The /metrics body and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self._exposed), CONTENT_TYPE_LATEST


class _Restricted:
    """The samples of `registry` named in `names` (prometheus_client's own restricted registry
    skips a collector that cannot describe itself, as `_EngineGauges`)."""

    def __init__(self, registry: Any, names: frozenset[str]) -> None:
        self._registry = registry
        self._names = names

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        for metric in self._registry.collect():
            samples = [s for s in metric.samples if s.name in self._names]
            if samples:
                kept = Metric(metric.name, metric.documentation, metric.type)
                kept.samples = samples
                yield kept


class _EngineGauges:
    """A custom collector: the engine's gauges (and its preemption counter) at scrape time."""

    def __init__(self, owner: RuntimeMetrics) -> None:
        self._owner = owner

    def describe(self) -> list[Any]:
        return []  # an unchecked collector: its families are known only at collect time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        model = self._owner.model_name
        s = self._owner._stats_fn()

        def gauge(name: str, value: float) -> Any:
            family = GaugeMetricFamily(name, METRICS[name].help, labels=[MODEL_LABEL])
            family.add_metric([model], value)
            return family

        def counter(name: str, value: float) -> Any:
            family = CounterMetricFamily(name, METRICS[name].help, labels=[MODEL_LABEL])
            family.add_metric([model], value)
            return family

        yield gauge(NUM_REQUESTS_WAITING, s.num_waiting)
        yield gauge(NUM_REQUESTS_RUNNING, s.num_running)
        yield gauge(KV_CACHE_USAGE_PERC, s.kv_usage)
        yield gauge(MAX_BATCH_SIZE, s.max_batch_size)
        yield gauge(MAX_NUM_BATCHED_TOKENS, s.max_num_batched_tokens)
        yield counter(NUM_PREEMPTIONS, s.num_preemptions_total)
        yield counter(PREFIX_CACHE_QUERIES, s.prefix_cache_queries)
        yield counter(PREFIX_CACHE_HITS, s.prefix_cache_hits)
        queue = GaugeMetricFamily(
            QUEUE_LENGTH, METRICS[QUEUE_LENGTH].help, labels=[MODEL_LABEL, "priority"]
        )
        waiting = {p: 0 for p in self._owner.priorities} | dict(s.waiting_by_priority)
        for priority, count in sorted(waiting.items()):
            queue.add_metric([model, str(priority)], count)
        yield queue
        blocks = GaugeMetricFamily(
            KV_CACHE_BLOCKS, METRICS[KV_CACHE_BLOCKS].help, labels=[MODEL_LABEL, "state"]
        )
        blocks.add_metric([model, "free"], s.kv_blocks_free)
        blocks.add_metric([model, "used"], s.kv_blocks_used)
        yield blocks
        kv = self._owner.kv_memory
        if kv is not None:
            for name, value in (
                (KV_CACHE_BUDGET_BYTES, kv.budget_bytes),
                (KV_CACHE_MEASURED_BYTES, kv.measured_bytes),
            ):
                family = GaugeMetricFamily(name, METRICS[name].help, labels=[MODEL_LABEL, "device"])
                family.add_metric([model, kv.device], value)
                yield family
        yield gauge(BATCH_LANE_REQUESTS_WAITING, s.batch_waiting)
        yield gauge(BATCH_LANE_REQUESTS_RUNNING, s.batch_running)
        yield gauge(BATCH_LANE_PENDING_TOKENS, s.batch_pending_tokens)
        yield gauge(BATCH_LANE_KV_CACHE_BLOCKS, s.batch_kv_blocks)
        yield counter(BATCH_LANE_PREEMPTIONS, s.batch_preemptions_total)
