"""What the control law sees of a service: the records that cross from the operator's Prometheus
round and pod index into the law, and from the fleet simulator's emulated cluster into the same law.

`ServiceSignals` is what Prometheus says about one service, `PodView` what the loop needs of one
runtime pod, and `Observation` the law's input built from both (`wok_operator.loop.observe`).
Plain frozen dataclasses: the operator and the simulator build them, neither owns them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSignals:
    """What Prometheus says about one service; None where it has no (finite) sample."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    reporting_pods: int | None = None
    p99_seconds: float | None = None  # end to end, rejected and timed-out requests included
    p99_ttft_seconds: float | None = None  # rejected and timed-out requests included
    p99_tpot_seconds: float | None = None  # of each request's mean time per output token
    p99_service_seconds: float | None = None
    # The same P99s over the SLO's budget window (the error budget: more than 1 % missed).
    budget_p99_seconds: float | None = None
    budget_p99_ttft_seconds: float | None = None
    budget_p99_tpot_seconds: float | None = None
    # The P99.5s over the budget window: within the SLOs, at least half the budget is left.
    budget_p995_seconds: float | None = None
    budget_p995_ttft_seconds: float | None = None
    budget_p995_tpot_seconds: float | None = None
    mean_prompt_tokens: float | None = None  # of a finished request (the mix the profile prices)
    mean_output_tokens: float | None = None
    mean_cached_tokens: float | None = None  # of its prompt, found in the prefix cache
    finished_per_s: float | None = None
    rejected_per_s: float | None = None
    batch_requests: float | None = None  # the batch lane's waiting + running
    batch_pending_tokens: float | None = None
    batch_tokens_per_s: float | None = None
    kv_budget_bytes: float | None = None  # the GPU pods' KV pool (the largest, if they differ)
    # Measured room ÷ budget of the GPU pod farthest from 1 (None: no GPU pod reports it).
    kv_measured_ratio: float | None = None

    @property
    def mean_sequence_tokens(self) -> float | None:
        """Prompt + output of a finished request (None: one of them has no sample)."""
        if self.mean_prompt_tokens is None or self.mean_output_tokens is None:
            return None
        return self.mean_prompt_tokens + self.mean_output_tokens


@dataclass(frozen=True)
class PodView:
    """What the loop needs of a runtime pod (kept in a Kopf index, so ticks cost no API call)."""

    name: str
    uid: str
    ip: str | None
    ready: bool
    terminating: bool
    created: float | None = None  # metadata.creationTimestamp, Unix seconds
    # Why a container cannot run ("vllm: CrashLoopBackOff: …"), None while none is stuck.
    failure: str | None = None

    @property
    def pending(self) -> bool:
        return not self.ready and not self.terminating

    def stalled(self, now: float | None, after_s: float) -> bool:
        """Pending for longer than `after_s`: not on its way (a bad node, an image that never
        pulls), so no capacity."""
        return (
            self.pending and now is not None and self.created is not None
            and now - self.created > after_s
        )  # fmt: skip


@dataclass(frozen=True)
class Observation:
    queue_per_replica: float | None  # waiting requests per reporting pod
    kv_usage: float | None  # the fullest pod's KV cache (0..1)
    ready_replicas: int
    pending_replicas: int
    running_per_replica: float | None = None
    p99_ttft_seconds: float | None = None  # rejected and timed-out requests count as misses
    p99_tpot_seconds: float | None = None
    p99_seconds: float | None = None  # end to end, misses included
    p99_service_seconds: float | None = None  # first scheduled to last token
    reporting_replicas: int | None = None  # ready pods whose metrics came in (None: all)
    finished_per_s: float | None = None  # completions over the SLO window, all pods
    rejected_per_s: float | None = None  # 429s and queue timeouts over the SLO window
    # The P99s over the SLO's budget window (misses included where the windowed ones have them).
    budget_p99_ttft_seconds: float | None = None
    budget_p99_tpot_seconds: float | None = None
    budget_p99_seconds: float | None = None
    # The P99.5s over the budget window: within the SLOs, at least half the budget is left.
    budget_p995_ttft_seconds: float | None = None
    budget_p995_tpot_seconds: float | None = None
    budget_p995_seconds: float | None = None
    stalled_replicas: int = 0  # pods pending past their pod start and a margin (not in pending)

    @property
    def reporting(self) -> int:
        """The ready pods behind the per-pod figures."""
        ready = self.ready_replicas
        return ready if self.reporting_replicas is None else min(self.reporting_replicas, ready)
