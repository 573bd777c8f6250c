"""Status conditions in the Kubernetes shape, set by one pure helper.

`lastTransitionTime` moves only when `status` changes, as kubectl and GitOps tools expect.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SLO_BREACHED = "SLOBreached"
MEMORY_BOUND = "MemoryBound"
METRICS_UNAVAILABLE = "MetricsUnavailable"
PODS_PENDING = "PodsPending"
PODS_FAILING = "PodsFailing"
SLO_UNATTAINABLE = "SLOUnattainable"
KV_BUDGET_MATCHED = "KVBudgetMatched"
ERROR_BUDGET_SPENT = "ErrorBudgetSpent"
#: engine: vllm: whether the pods run the law's batch (their --max-num-seqs is fixed per pod).
BATCH_APPLIED = "BatchApplied"

Status = Literal["True", "False", "Unknown"]


ISO_SECONDS = "%Y-%m-%dT%H:%M:%SZ"  # metav1.Time


def now_iso() -> str:
    return datetime.now(UTC).strftime(ISO_SECONDS)


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | Status,
    reason: str,
    message: str = "",
    *,
    generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new list with `type_` set; other conditions are kept as they are."""
    value: Status = ("True" if status else "False") if isinstance(status, bool) else status
    existing = {c["type"]: c for c in conditions or []}
    previous = existing.get(type_)
    transition = (
        previous["lastTransitionTime"]
        if previous is not None and previous.get("status") == value
        else (now or now_iso())
    )
    existing[type_] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        **({"observedGeneration": generation} if generation is not None else {}),
    }
    return list(existing.values())
