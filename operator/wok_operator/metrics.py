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
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTROL_LOOP_SECONDS = Histogram(
    "wok_operator_control_loop_seconds",
    "Duration of one control-loop tick: observe and decide (its writes are the writer's)",
    buckets=TICK_BUCKETS,
)
KUBE_CALL_SECONDS = Histogram(
    "wok_operator_kube_call_seconds",
    "Duration of a control loop's Kubernetes API call, by call (patch_status, ...)",
    ["call"],
    buckets=TICK_BUCKETS,
)
WRITE_LAG_SECONDS = Histogram(
    "wok_operator_write_lag_seconds",
    "From the tick that decided a write to the write landing, by kind (status, batch, replicas, "
    "pods): how far the apiserver is behind the control loops",
    ["kind"],
    buckets=(*TICK_BUCKETS, 30.0, 60.0),
)
WRITE_ERRORS = Counter(
    "wok_operator_write_errors",
    "Control-loop writes that failed (retried with backoff) or were refused for good, by kind",
    ["kind"],
)
PROMQL_REQUESTS = Counter(
    "wok_operator_promql_requests", "PromQL queries sent (one round serves every service)"
)
TICKS_WITHOUT_SIGNALS = Counter(
    "wok_operator_ticks_without_signals",
    "Control ticks that held for want of a fresh Prometheus round (none has answered yet, or the "
    "newest that did is older than 3 intervals, or it did not read the service's window)",
)
STATUS_WRITES = Counter(
    "wok_operator_status_writes",
    "InferenceService status patches (a checkpoint: on a change of decision or condition, or the "
    "heartbeat), by cause (first, decision, heartbeat, or the field that changed: readyReplicas, "
    "condition:Ready, ...)",
    ["cause"],
)
LEADER = Gauge("wok_operator_leader", "1 on the replica that acts (holds the Lease); 0 on standbys")

# Per InferenceService, for the SLO alerts. Not `namespace`/`service`: Prometheus' pod relabelling
# sets those to the operator pod's own.
SERVICE_LABELS = ("inferenceservice_namespace", "inferenceservice")
SLO_LABELS = (*SERVICE_LABELS, "slo")  # slo: ttft | tpot | e2e
SLO_P99_SECONDS = Gauge(
    "wok_operator_slo_p99_seconds", "The P99 latency targets of spec.slo, by SLO", SLO_LABELS
)
OBSERVED_P99_SECONDS = Gauge(
    "wok_operator_observed_p99_seconds",
    "The P99 latencies the control loop last read, by SLO (absent while unknown)",
    SLO_LABELS,
)
BUDGET_WINDOW_P99_SECONDS = Gauge(
    "wok_operator_budget_window_p99_seconds",
    "The P99 latencies over spec.slo.budgetWindowSeconds the control loop last read, by SLO "
    "(above the SLO: over 1 % of the window's requests missed, the error budget is spent)",
    SLO_LABELS,
)
BATCH_SIZE = Gauge("wok_operator_batch_size", "The batch size the loop decided", SERVICE_LABELS)
REPLICAS = Gauge("wok_operator_replicas", "The replica count the loop decided", SERVICE_LABELS)


def export_service(
    key: tuple[str, str],
    *,
    slos: dict[str, tuple[float | None, float | None, float | None]],
    batch: int,
    replicas: int,
) -> None:
    """One tick's numbers for the service `key` (namespace, name); `slos` maps an SLO name to
    (target, observed P99, P99 over the budget window), each None when unset or unknown."""
    BATCH_SIZE.labels(*key).set(batch)
    REPLICAS.labels(*key).set(replicas)
    gauges = (SLO_P99_SECONDS, OBSERVED_P99_SECONDS, BUDGET_WINDOW_P99_SECONDS)
    for slo, values in slos.items():
        for gauge, value in zip(gauges, values, strict=True):
            if value is not None and math.isfinite(value):
                gauge.labels(*key, slo).set(value)
            else:
                # Unknown is no data, not NaN: a NaN would poison every sum over services.
                gauge.remove(*key, slo)


def forget_service(key: tuple[str, str]) -> None:
    for gauge in (BATCH_SIZE, REPLICAS):
        gauge.remove(*key)
    for gauge in (SLO_P99_SECONDS, OBSERVED_P99_SECONDS, BUDGET_WINDOW_P99_SECONDS):
        for slo in ("ttft", "tpot", "e2e"):
            gauge.remove(*key, slo)
