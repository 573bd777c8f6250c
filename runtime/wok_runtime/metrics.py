"""The runtime's Prometheus metrics: the names are a contract, defined once, here.

The operator's control loop, the alert rules and the dashboard all query these series, so the
names live at the top of this module as plain strings that import nothing (no prometheus_client,
no torch): `from wok_runtime.metrics import METRICS, E2E_REQUEST_LATENCY_SECONDS` is safe in the
operator. The collector below (which does import prometheus_client) registers exactly these.

The vLLM-compatible names (`vllm:…`) keep existing vLLM dashboards and autoscaler queries working
against wok; the `wok_…` names are what only wok has (the live batch cap, the per-step batch size).

Two lanes (scheduler.py): every `vllm:…` series and `wok_rejected_requests`, `wok_queue_length`
describe the online lane only, so the operator's autoscaling and the SLO alerts never see an
offline backlog; `vllm:kv_cache_usage_perc` counts the online lane's blocks (the batch lane's
are the online lane's to take back). The batch lane has its own `wok_batch_lane_…` series. Only
`wok_kv_cache_blocks` and `wok_batch_size` describe the whole engine (the pool, the forward).

How a name appears on /metrics depends on its kind (Prometheus' conventions, see `series_names`):
a counter `X` is exposed as `X_total`; a histogram `X` as `X_bucket`, `X_sum`, `X_count`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# --- the names (the contract) ---------------------------------------------------------------------

NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
TIME_TO_FIRST_TOKEN_SECONDS = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = "vllm:inter_token_latency_seconds"
# One sample per finished request: its mean time per output token after the first (what a TPOT
# SLO is about; the inter-token histogram weighs long requests by their length instead).
REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY_SECONDS = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "vllm:request_queue_time_seconds"
# First scheduled to finished: the part of E2E the batch size controls (the operator's law
# tells a queueing SLO breach from a service-time one by it).
REQUEST_INFERENCE_TIME_SECONDS = "vllm:request_inference_time_seconds"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
# Automatic prefix caching, in tokens as vLLM counts them: the hit rate is hits / queries.
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
MAX_BATCH_SIZE = "wok_max_batch_size"
BATCH_SIZE = "wok_batch_size"
REJECTED_REQUESTS = "wok_rejected_requests"
QUEUE_LENGTH = "wok_queue_length"
KV_CACHE_BLOCKS = "wok_kv_cache_blocks"
# The KV pool's size (on a pod, the operator's budget) and the room the runtime measured for it
# after loading (kv_memory.py): apart by more than 10 %, the budget is wrong for the node.
KV_CACHE_BUDGET_BYTES = "wok_kv_cache_budget_bytes"
KV_CACHE_MEASURED_BYTES = "wok_kv_cache_measured_bytes"
# The batch lane: offline work that only uses what the online lane leaves free.
BATCH_LANE_REQUESTS_WAITING = "wok_batch_lane_requests_waiting"
BATCH_LANE_REQUESTS_RUNNING = "wok_batch_lane_requests_running"
# Output tokens the batch lane still owes at most (max_tokens less those generated, waiting and
# running): with the token rate, a backlog's time to finish.
BATCH_LANE_PENDING_TOKENS = "wok_batch_lane_pending_tokens"
BATCH_LANE_KV_CACHE_BLOCKS = "wok_batch_lane_kv_cache_blocks"
BATCH_LANE_GENERATION_TOKENS = "wok_batch_lane_generation_tokens"
BATCH_LANE_REQUEST_SUCCESS = "wok_batch_lane_request_success"
BATCH_LANE_E2E_REQUEST_LATENCY_SECONDS = "wok_batch_lane_e2e_request_latency_seconds"
BATCH_LANE_REJECTED_REQUESTS = "wok_batch_lane_rejected_requests"
BATCH_LANE_PREEMPTIONS = "wok_batch_lane_preemptions"
# Admin calls refused for a missing or wrong bearer token: a guessing attack, or an operator
# with a stale token (its batch changes then never land).
ADMIN_AUTH_FAILURES = "wok_admin_auth_failures"

#: Every series carries this label, set to the served model name.
MODEL_LABEL = "model_name"

#: Values of `wok_rejected_requests_total{reason}`.
REJECT_QUEUE_FULL = "queue_full"
REJECT_QUEUE_TIMEOUT = "queue_timeout"
REJECT_DRAINING = "draining"

#: Values of `wok_admin_auth_failures_total{reason}`.
AUTH_MISSING = "missing"  # no bearer token
AUTH_INVALID = "invalid"  # a token that is not the configured one

# Buckets shaped like vLLM's: LLM latencies span milliseconds (a decode step) to minutes (a long
# generation behind a full queue), so the buckets are roughly logarithmic over that range.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its name, kind, labels (besides model_name) and help."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        assert (self.kind == "histogram") == bool(self.buckets), self.name


def series_names(spec: MetricSpec) -> tuple[str, ...]:
    """The sample names Prometheus stores for `spec` (what a PromQL query must name)."""
    if spec.kind == "counter":
        return (spec.name + "_total",)
    if spec.kind == "histogram":
        return (spec.name + "_bucket", spec.name + "_sum", spec.name + "_count")
    return (spec.name,)


_SPECS = (
    MetricSpec(NUM_REQUESTS_WAITING, "gauge", "Requests waiting in the queue."),
    MetricSpec(NUM_REQUESTS_RUNNING, "gauge", "Requests in the running batch."),
    MetricSpec(KV_CACHE_USAGE_PERC, "gauge", "Fraction of KV-cache blocks in use (0..1)."),
    MetricSpec(
        TIME_TO_FIRST_TOKEN_SECONDS, "histogram", "Arrival to first token.", buckets=TTFT_BUCKETS
    ),
    MetricSpec(
        INTER_TOKEN_LATENCY_SECONDS, "histogram", "Time between output tokens.", buckets=ITL_BUCKETS
    ),
    MetricSpec(
        REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
        "histogram",
        "Per request: (last token - first token) / (output tokens - 1).",
        buckets=ITL_BUCKETS,
    ),
    MetricSpec(
        E2E_REQUEST_LATENCY_SECONDS,
        "histogram",
        "Arrival to last token.",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    MetricSpec(
        REQUEST_QUEUE_TIME_SECONDS,
        "histogram",
        "Arrival to first scheduled.",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    MetricSpec(
        REQUEST_INFERENCE_TIME_SECONDS,
        "histogram",
        "First scheduled to last token.",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    MetricSpec(NUM_PREEMPTIONS, "counter", "Sequences preempted (KV blocks reclaimed)."),
    MetricSpec(PROMPT_TOKENS, "counter", "Prompt tokens of finished requests."),
    MetricSpec(GENERATION_TOKENS, "counter", "Generated tokens."),
    MetricSpec(
        REQUEST_SUCCESS,
        "counter",
        "Finished requests by finish reason.",
        labels=("finished_reason",),
    ),
    MetricSpec(
        PREFIX_CACHE_QUERIES,
        "counter",
        "Prefix cache queries, in prompt tokens looked up (at a request's first admission).",
    ),
    MetricSpec(
        PREFIX_CACHE_HITS,
        "counter",
        "Prefix cache hits, in prompt tokens found cached (their prefill skipped).",
    ),
    MetricSpec(MAX_BATCH_SIZE, "gauge", "The live cap on running sequences (admin API)."),
    MetricSpec(
        BATCH_SIZE, "histogram", "Running sequences per engine step.", buckets=BATCH_SIZE_BUCKETS
    ),
    MetricSpec(
        REJECTED_REQUESTS, "counter", "Requests refused (429/503) by reason.", labels=("reason",)
    ),
    MetricSpec(QUEUE_LENGTH, "gauge", "Requests waiting, by priority.", labels=("priority",)),
    MetricSpec(
        KV_CACHE_BLOCKS, "gauge", "KV-cache blocks by state (free/used).", labels=("state",)
    ),
    MetricSpec(
        KV_CACHE_BUDGET_BYTES,
        "gauge",
        "The KV pool's size in bytes: --kv-cache-bytes (the operator's budget) or the default.",
        labels=("device",),
    ),
    MetricSpec(
        KV_CACHE_MEASURED_BYTES,
        "gauge",
        "Bytes the runtime measured free for the KV pool after loading (CUDA: total x "
        "utilization - in use - activation peak; CPU: its default share of available memory).",
        labels=("device",),
    ),
    MetricSpec(BATCH_LANE_REQUESTS_WAITING, "gauge", "Batch-lane requests waiting."),
    MetricSpec(BATCH_LANE_REQUESTS_RUNNING, "gauge", "Batch-lane requests running."),
    MetricSpec(
        BATCH_LANE_PENDING_TOKENS,
        "gauge",
        "Output tokens the batch lane still owes at most (waiting and running requests).",
    ),
    MetricSpec(BATCH_LANE_KV_CACHE_BLOCKS, "gauge", "KV-cache blocks held by the batch lane."),
    MetricSpec(BATCH_LANE_GENERATION_TOKENS, "counter", "Tokens generated by the batch lane."),
    MetricSpec(
        BATCH_LANE_REQUEST_SUCCESS,
        "counter",
        "Finished batch-lane requests by finish reason.",
        labels=("finished_reason",),
    ),
    MetricSpec(
        BATCH_LANE_E2E_REQUEST_LATENCY_SECONDS,
        "histogram",
        "Batch lane: arrival to last token.",
        buckets=REQUEST_LATENCY_BUCKETS,
    ),
    MetricSpec(
        BATCH_LANE_REJECTED_REQUESTS,
        "counter",
        "Batch-lane requests refused (429/503) by reason.",
        labels=("reason",),
    ),
    MetricSpec(
        BATCH_LANE_PREEMPTIONS, "counter", "Batch-lane sequences preempted (for either lane)."
    ),
    MetricSpec(
        ADMIN_AUTH_FAILURES,
        "counter",
        "Admin API calls refused with 401, by reason (missing, invalid token).",
        labels=("reason",),
    ),
)

#: name -> spec, for every metric the runtime exports.
METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}

#: name -> kind, the short form.
METRIC_NAMES: dict[str, Kind] = {spec.name: spec.kind for spec in _SPECS}


# --- the collector ---------------------------------------------------------------------------


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

    def auth_failed(self, reason: str) -> None:
        self._auth_failures.labels(self.model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        """The /metrics body and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


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
