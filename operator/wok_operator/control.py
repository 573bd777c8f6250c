"""The control law: the clipped sign-step rule that moves batch size and replicas.

One pure function, `decide`, with no I/O: the operator, `wok simulate` and the tests all call it.
Every `interval` seconds, for a queue Q (waiting requests per ready replica) and target Q*:

    B ← clip(B + η_B · sign(Q − Q*), B_min, min(B_max, B_mem))
    R ← clip(R + η_R · sign(·),       R_min, R_max)

with what production autoscalers learned the hard way:
- a deadband: |Q − Q*| ≤ deadband holds, so noise around the target moves nothing;
- fast up, slow down: the batch rises at once; for a short queue it falls one step per
  scale-down window (a high cap costs nothing while the queue is short: it is only an admission
  limit); a full KV cache lowers it at once;
- an SLO breach never raises the batch. It lowers it (one step per scale-up window, since P99
  lags by its window) only when the service time itself breaks the SLO; a breach made of
  queueing holds the batch and adds replicas, because shrinking the batch would only lengthen the
  queue, a death spiral that `wok simulate` shows;
  replicas rise after the scale-up window and fall only after the scale-down window;
- the cascade guard: no replica scale-up while pods are still pending (they are the scale-up);
- a scale-down must fit: replicas fall only if the rest, at the batch cap, would hold the load
  with the queue within target (else up and down would alternate forever), and never in the same
  tick as the batch;
- no data, no action: a missing or NaN queue holds everything, and nothing ever goes to zero on
  missing data; the batch is never above B_mem, whatever the input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wok_operator.api import InferenceServiceSpec


@dataclass(frozen=True)
class LawParams:
    batch_min: int
    batch_max: int
    batch_mem: int
    batch_step: int
    replicas_min: int
    replicas_max: int
    replicas_step: int
    target_queue: float
    deadband: float
    slo_p99_seconds: float
    kv_usage_ceiling: float
    scale_up_window_s: float
    scale_down_window_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.batch_min <= self.batch_max:
            raise ValueError("need 1 <= batch_min <= batch_max")
        if self.batch_mem < 0 or self.batch_step < 1 or self.replicas_step < 1:
            raise ValueError("batch_mem must be >= 0 and steps >= 1")
        if not 0 <= self.replicas_min <= self.replicas_max:
            raise ValueError("need 0 <= replicas_min <= replicas_max")

    @classmethod
    def from_spec(cls, spec: InferenceServiceSpec, *, batch_mem: int) -> LawParams:
        b, s = spec.batching, spec.scaling
        return cls(
            batch_min=b.min_batch_size,
            batch_max=b.max_batch_size,
            batch_mem=batch_mem,
            batch_step=b.step,
            replicas_min=s.min_replicas,
            replicas_max=s.max_replicas,
            replicas_step=s.step,
            target_queue=s.target_queue_per_replica,
            deadband=s.deadband,
            slo_p99_seconds=spec.slo.p99_latency_seconds,
            kv_usage_ceiling=spec.memory.kv_usage_ceiling,
            scale_up_window_s=s.scale_up_stabilization_seconds,
            scale_down_window_s=s.scale_down_stabilization_seconds,
        )

    @property
    def batch_cap(self) -> int:
        """min(B_max, B_mem): the memory budget always wins."""
        return max(1, min(self.batch_max, self.batch_mem))

    @property
    def batch_floor(self) -> int:
        return min(self.batch_min, self.batch_cap)

    def clip_batch(self, batch: int) -> int:
        return max(self.batch_floor, min(self.batch_cap, batch))

    def clip_replicas(self, replicas: int) -> int:
        return max(self.replicas_floor, min(self.replicas_max, replicas))

    @property
    def replicas_floor(self) -> int:
        # wok does not scale to zero (nothing would buffer the first request); maxReplicas 0 pauses.
        return min(max(self.replicas_min, 1), self.replicas_max)


@dataclass(frozen=True)
class Observation:
    queue_per_replica: float | None
    p99_seconds: float | None
    kv_usage: float | None
    ready_replicas: int
    pending_replicas: int
    # P99 of the time after admission (e2e minus queueing): the part the batch size controls.
    p99_service_seconds: float | None = None
    running_per_replica: float | None = None


@dataclass(frozen=True)
class LoopState:
    """What the loop remembers between ticks (kept in status, so a restart continues from it)."""

    batch: int
    replicas: int
    queue_high_since: float | None = None
    queue_low_since: float | None = None
    slo_breached_since: float | None = None
    last_batch_increase: float | None = None
    last_batch_decrease: float | None = None
    last_replica_change: float | None = None


@dataclass(frozen=True)
class Decision:
    batch_before: int
    batch: int
    replicas_before: int
    replicas: int
    reason: str
    state: LoopState
    slo_breached: bool = False
    memory_bound: bool = False
    metrics_missing: bool = False

    @property
    def changed(self) -> bool:
        return (self.batch, self.replicas) != (self.batch_before, self.replicas_before)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _since(start: float | None, now: float, condition: bool) -> float | None:
    if not condition:
        return None
    return now if start is None else start


def _fits_on(
    fewer: int, replicas: int, queue: float, running: float | None, params: LawParams
) -> bool:
    """Would `fewer` replicas, at the batch cap, keep the queue within target? (Unknown: yes.)"""
    if running is None or not math.isfinite(running):
        return True
    demand_per_replica = (queue + running) * replicas / max(fewer, 1)
    return demand_per_replica <= params.batch_cap + params.target_queue


def _quiet_since(last_change: float | None, now: float, window: float) -> bool:
    return last_change is None or now - last_change >= window


def _held_for(start: float | None, now: float, window: float) -> bool:
    return start is not None and now - start >= window


def decide(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
    """One tick of the law: the next batch size and replica count, and why."""
    cap, floor = params.batch_cap, params.batch_floor
    batch = params.clip_batch(state.batch)
    replicas = params.clip_replicas(state.replicas)
    notes: list[str] = []
    if batch != state.batch:
        notes.append(f"batch clipped to [{floor}, {cap}]")
    if replicas != state.replicas:
        notes.append(f"replicas clipped to [{params.replicas_floor}, {params.replicas_max}]")
    memory_bound = params.batch_mem < params.batch_max

    if not _known(obs.queue_per_replica) or obs.ready_replicas < 1:
        why = "no ready replicas" if obs.ready_replicas < 1 else "queue metric missing"
        held = replace(state, batch=batch, replicas=replicas)
        return Decision(
            batch_before=state.batch,
            batch=batch,
            replicas_before=state.replicas,
            replicas=replicas,
            reason="; ".join([f"holding: {why}", *notes]),
            state=held,
            metrics_missing=True,
            memory_bound=memory_bound and batch >= cap,
        )

    queue = float(obs.queue_per_replica)  # type: ignore[arg-type]
    high = queue > params.target_queue + params.deadband
    low = queue < params.target_queue - params.deadband
    slo_breached = _known(obs.p99_seconds) and obs.p99_seconds > params.slo_p99_seconds  # type: ignore[operator]
    kv_full = _known(obs.kv_usage) and obs.kv_usage > params.kv_usage_ceiling  # type: ignore[operator]
    high_since = _since(state.queue_high_since, now, high)
    low_since = _since(state.queue_low_since, now, low)
    breached_since = _since(state.slo_breached_since, now, slo_breached)
    queue_text = f"queue {queue:.1f}/replica vs target {params.target_queue:g}±{params.deadband:g}"

    # Batch: down at once for safety, up at once for load, down for a short queue only slowly.
    batch_dir, batch_why = 0, ""
    service_within_slo = (
        _known(obs.p99_service_seconds) and obs.p99_service_seconds <= params.slo_p99_seconds  # type: ignore[operator]
    )
    if slo_breached and (service_within_slo or (high and not _known(obs.p99_service_seconds))):
        # Latency from queueing, not from batching: a smaller batch would only lengthen the
        # queue (a death spiral), so the batch holds and replicas take the load.
        batch_why = f"P99 {obs.p99_seconds:.2f}s > SLO {params.slo_p99_seconds:g}s from queueing"
    elif (
        slo_breached
        and state.last_batch_decrease is not None
        and now - state.last_batch_decrease < params.scale_up_window_s
    ):
        # P99 lags the batch by its window: give the last step time to show before another.
        batch_why = f"P99 {obs.p99_seconds:.2f}s > SLO, waiting for the last step to show"
    elif slo_breached:
        batch_dir = -1
        batch_why = f"P99 {obs.p99_seconds:.2f}s > SLO {params.slo_p99_seconds:g}s"
    elif kv_full:
        batch_dir = -1
        batch_why = f"KV usage {obs.kv_usage:.0%} > ceiling {params.kv_usage_ceiling:.0%}"
    elif high:
        batch_dir, batch_why = 1, queue_text
    elif (
        low
        and _held_for(low_since, now, params.scale_down_window_s)
        and _quiet_since(state.last_batch_increase, now, params.scale_down_window_s)
        and _quiet_since(state.last_batch_decrease, now, params.scale_down_window_s)
    ):
        batch_dir = -1
        batch_why = f"{queue_text} for {params.scale_down_window_s:g}s"
    new_batch = params.clip_batch(batch + params.batch_step * batch_dir)
    if batch_dir > 0 and new_batch == batch:
        batch_why = f"{queue_text}, batch at its cap {cap}" + (" (memory)" if memory_bound else "")

    # Replicas: up when the batch is already at its cap and the queue stays long, or SLO breached.
    replicas_dir, replicas_why = 0, ""
    at_cap = batch >= cap
    wants_up = (high and at_cap and _held_for(high_since, now, params.scale_up_window_s)) or (
        _held_for(breached_since, now, params.scale_up_window_s)
    )
    settled_since_change = _quiet_since(state.last_replica_change, now, params.scale_down_window_s)
    if wants_up and obs.pending_replicas > 0:
        notes.append(f"scale-up waits for {obs.pending_replicas} pending pod(s)")
    elif wants_up and replicas < params.replicas_max:
        replicas_dir = 1
        replicas_why = "SLO breached" if slo_breached else f"batch at cap {cap} and queue long"
    elif (
        low
        and not slo_breached
        and _held_for(low_since, now, params.scale_down_window_s)
        and settled_since_change
        and replicas > params.replicas_floor
    ):
        fewer = max(params.replicas_floor, replicas - params.replicas_step)
        if _fits_on(fewer, replicas, queue, obs.running_per_replica, params):
            replicas_dir = -1
            replicas_why = f"queue short for {params.scale_down_window_s:g}s"
        else:
            notes.append(f"{fewer} replica(s) could not hold the load at batch {cap}")
    new_replicas = params.clip_replicas(replicas + params.replicas_step * replicas_dir)
    if new_replicas < replicas and new_batch < batch:
        # One knob down at a time: each step's effect must be seen before the next.
        new_batch = batch

    parts = []
    if new_batch != batch:
        parts.append(f"batch {batch}→{new_batch} ({batch_why})")
    if new_replicas != replicas:
        parts.append(f"replicas {replicas}→{new_replicas} ({replicas_why})")
        if new_batch == batch and batch_why:
            parts.append(f"batch holds at {batch} ({batch_why})")
    if not parts:
        parts.append(f"hold: {batch_why or queue_text}")
    new_state = LoopState(
        batch=new_batch,
        replicas=new_replicas,
        queue_high_since=high_since,
        queue_low_since=low_since,
        slo_breached_since=breached_since,
        last_batch_increase=now if new_batch > batch else state.last_batch_increase,
        last_batch_decrease=now if new_batch < batch else state.last_batch_decrease,
        last_replica_change=now if new_replicas != replicas else state.last_replica_change,
    )
    return Decision(
        batch_before=state.batch,
        batch=new_batch,
        replicas_before=state.replicas,
        replicas=new_replicas,
        reason="; ".join(parts + notes),
        state=new_state,
        slo_breached=slo_breached,
        memory_bound=memory_bound and new_batch >= cap,
    )
