"""The runtime's Prometheus metrics: the names are a contract, defined once, here.

The operator's control loop, the alert rules and the dashboard all query these series, so the
names live here as plain strings that import nothing (no prometheus_client, no torch): any part
may import them. The runtime's collector (`wok_runtime.http.metrics`, which does import
prometheus_client) registers exactly these.

The vLLM-compatible names (`vllm:…`) keep existing vLLM dashboards and autoscaler queries working
against wok; the `wok_…` names are what only wok has (the live batch cap and step token budget, the
per-step batch size).

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
from typing import Literal

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
# The live step token budget (chunked prefill: prompt and decode tokens per engine step).
MAX_NUM_BATCHED_TOKENS = "wok_max_num_batched_tokens"
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
        MAX_NUM_BATCHED_TOKENS,
        "gauge",
        "The live step token budget: prompt and decode tokens per engine step (admin API).",
    ),
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


# --- vLLM's own server (engine: vllm) -------------------------------------------------------------

#: vLLM's count of the requests it refused at admission (`--max-num-queued-reqs`, answered 503),
#: by `reason`: what a vLLM pod exports in place of `wok_rejected_requests`.
VLLM_ADMISSION_REJECTIONS = "vllm:admission_rejections"

#: The series of vLLM 0.32's /metrics (vllm/v1/metrics/loggers.py) that wok reads, as Prometheus
#: stores them: an `engine: vllm` pod exports these and none of the `wok_…` ones (no live batch
#: cap, no queue length, no batch lane, no KV budget).
VLLM_SERIES = frozenset(
    {
        NUM_REQUESTS_WAITING,
        NUM_REQUESTS_RUNNING,
        KV_CACHE_USAGE_PERC,
        *(
            f"{histogram}_{suffix}"
            for histogram in (
                TIME_TO_FIRST_TOKEN_SECONDS,
                INTER_TOKEN_LATENCY_SECONDS,
                REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
                E2E_REQUEST_LATENCY_SECONDS,
                REQUEST_QUEUE_TIME_SECONDS,
                REQUEST_INFERENCE_TIME_SECONDS,
            )
            for suffix in ("bucket", "sum", "count")
        ),
        *(
            f"{counter}_total"
            for counter in (
                NUM_PREEMPTIONS,
                PROMPT_TOKENS,
                GENERATION_TOKENS,
                REQUEST_SUCCESS,
                PREFIX_CACHE_QUERIES,
                PREFIX_CACHE_HITS,
                VLLM_ADMISSION_REJECTIONS,
            )
        ),
    }
)
