"""The operator's own Prometheus metrics: what it decided, how long a tick took, what failed."""

from __future__ import annotations

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
