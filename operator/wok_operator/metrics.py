"""The operator's own Prometheus metrics: what it decided, how long a tick took, what failed."""

from __future__ import annotations

import math

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "wok_operator_decisions",
    "Control-law steps applied, by knob and direction",
    ["knob", "direction"],
)
RECONCILE_ERRORS = Counter(
    "wok_operator_reconcile_errors", "Reconciles or control ticks that failed"
)
CONTROL_LOOP_SECONDS = Histogram(
    "wok_operator_control_loop_seconds",
    "Duration of one control-loop tick",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
PROMQL_REQUESTS = Counter(
    "wok_operator_promql_requests", "PromQL queries sent (one round serves every service)"
)
LEADER = Gauge("wok_operator_leader", "1 on the replica that acts (holds the Lease); 0 on standbys")

# Per InferenceService, for the SLO alerts. Not `namespace`/`service`: Prometheus' pod relabelling
# sets those to the operator pod's own.
SERVICE_LABELS = ("inferenceservice_namespace", "inferenceservice")
SLO_P99_SECONDS = Gauge(
    "wok_operator_slo_p99_seconds", "The P99 end-to-end latency target (spec.slo)", SERVICE_LABELS
)
OBSERVED_P99_SECONDS = Gauge(
    "wok_operator_observed_p99_seconds",
    "The P99 end-to-end latency the control loop last read (absent while unknown)",
    SERVICE_LABELS,
)
BATCH_SIZE = Gauge("wok_operator_batch_size", "The batch size the loop decided", SERVICE_LABELS)
REPLICAS = Gauge("wok_operator_replicas", "The replica count the loop decided", SERVICE_LABELS)


def export_service(
    key: tuple[str, str], *, slo_p99: float, p99: float | None, batch: int, replicas: int
) -> None:
    """One tick's numbers for the service `key` (namespace, name)."""
    SLO_P99_SECONDS.labels(*key).set(slo_p99)
    BATCH_SIZE.labels(*key).set(batch)
    REPLICAS.labels(*key).set(replicas)
    if p99 is not None and math.isfinite(p99):
        OBSERVED_P99_SECONDS.labels(*key).set(p99)
    else:
        # Unknown is no data, not NaN: a NaN would poison every sum or average over services.
        OBSERVED_P99_SECONDS.remove(*key)


def forget_service(key: tuple[str, str]) -> None:
    for gauge in (SLO_P99_SECONDS, OBSERVED_P99_SECONDS, BATCH_SIZE, REPLICAS):
        gauge.remove(*key)
