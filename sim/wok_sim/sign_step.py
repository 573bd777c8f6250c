"""The plain clipped sign-step rule the law started from, kept as a baseline (`wok simulate
--policy sign-step`): the simulator is its only user, so it lives here, on the law's own types.

    B ← clip(B + η_B·sign(Q − Q*)), down when P99 breaks the SLO
    R ± 1 on the same sign once the batch is at its cap (down at the floor), one pod at a time,
    none while pods are pending
"""

from __future__ import annotations

import math
from dataclasses import replace

from wok_contracts.signals import Observation
from wok_operator.control import Decision, LawParams, LoopState


def _above(value: float | None, limit: float | None) -> bool:
    return limit is not None and value is not None and math.isfinite(value) and value > limit


def _quiet_since(last: float | None, now: float, window: float) -> bool:
    return last is None or now - last >= window


def decide_sign_step(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
    p = params
    batch, replicas = p.clip_batch(state.batch), p.clip_replicas(state.replicas)
    queue = obs.queue_per_replica
    if queue is None or not math.isfinite(queue) or obs.ready_replicas < 1:
        held = replace(state, batch=batch, replicas=replicas, batch_direction=0, batch_run=0)
        return Decision(
            batch_before=state.batch,
            batch=batch,
            replicas_before=state.replicas,
            replicas=replicas,
            reason="holding: no data",
            state=held,
            metrics_missing=True,
            memory_bound=False,
        )
    error = queue - p.target_queue
    sign = 0 if abs(error) <= p.deadband else (1 if error > 0 else -1)
    breached = _above(obs.p99_seconds, p.slo_e2e_s) or _above(obs.p99_ttft_seconds, p.slo_ttft_s)
    new_batch = p.clip_batch(batch + p.batch_step * (-1 if breached else sign))
    new_replicas = replicas
    if obs.pending_replicas == 0 and _quiet_since(
        state.last_replica_change, now, p.scale_up_window_s
    ):
        if sign > 0 and batch >= p.batch_cap:
            new_replicas = p.clip_replicas(replicas + 1)
        elif (
            sign < 0
            and batch <= p.batch_floor
            and _quiet_since(state.last_replica_change, now, p.scale_down_window_s)
        ):
            new_replicas = p.clip_replicas(replicas - 1)
    new_state = replace(
        state,
        batch=new_batch,
        replicas=new_replicas,
        last_replica_change=now if new_replicas != replicas else state.last_replica_change,
    )
    return Decision(
        batch_before=state.batch,
        batch=new_batch,
        replicas_before=state.replicas,
        replicas=new_replicas,
        reason=f"seed: Q {queue:.1f} vs {p.target_queue:g}, breached {breached}",
        state=new_state,
        slo_breached=breached,
    )
