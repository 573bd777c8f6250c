"""The batch lane's backlog against its deadline: the replicas that finish it in time.

Offline work rides in what the online lane leaves free, and the control law never sees it: the
runtime keeps every `vllm:*` series online-only, so a backlog neither adds replicas nor breaches
an SLO. A service that gives its batch work a deadline (`spec.batchLane.completeWithinSeconds`)
opts in to one more reason to scale. By Little's law, the time a backlog takes to drain is what
it holds over the rate it drains at; the rate is per pod, so the replicas scale it:

    T = pending tokens / batch-lane tokens/s            (at the R ready pods of now)
    R_backlog = ceil(R · T / D)                         (D: the deadline)

The pending tokens are each request's max_tokens less what it generated (an upper bound: a
request that stops early finishes sooner), so the estimate errs towards finishing in time. No
measured rate (a backlog that just arrived, or that online traffic leaves no room for) is no
data, and no data holds. `compose` puts the answer next to the law's: the larger count wins,
within the law's bounds and max step, and a windowed rate may ask again only once the last
scale-up could show in it. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wok_contracts.signals import Observation
from wok_operator.control import Decision, LawParams, LoopState


@dataclass(frozen=True)
class Backlog:
    """The batch lane of one service, summed over its pods, and what its deadline needs."""

    requests: int | None  # waiting or running in the batch lane
    pending_tokens: int | None  # output tokens they still owe at most
    tokens_per_s: float | None  # the batch lane's measured output tokens/s
    seconds: float | None  # T: the time to drain it at the current capacity
    deadline_s: float | None
    replicas: int | None  # what the deadline needs; None: no opinion (no opt-in, no data)
    reason: str


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def backlog_need(
    *,
    requests: float | None,
    pending_tokens: float | None,
    tokens_per_s: float | None,
    ready_replicas: int,
    deadline_s: float | None,
) -> Backlog:
    """The backlog's time to drain at the current capacity, and with a deadline the replicas
    that drain it in time (pure)."""
    if not _known(requests) and not _known(pending_tokens):
        return Backlog(None, None, None, None, deadline_s, None, "batch lane: no metrics")
    count = round(requests) if _known(requests) else None  # type: ignore[arg-type]
    tokens = round(pending_tokens) if _known(pending_tokens) else None  # type: ignore[arg-type]
    rate = tokens_per_s if _known(tokens_per_s) else None
    empty_need = None if deadline_s is None else 0
    if count == 0 or tokens == 0:
        return Backlog(count, tokens, rate, 0.0, deadline_s, empty_need, "batch lane empty")
    held = f"batch lane: {count} request(s), {tokens} token(s) pending"
    if tokens is None or rate is None or rate <= 0:
        return Backlog(
            count, tokens, rate, None, deadline_s, None, f"{held}, no throughput measured yet"
        )
    seconds = tokens / rate
    held = f"{held} ≈ {seconds:.0f}s at {rate:.1f} tokens/s"
    if deadline_s is None:
        return Backlog(count, tokens, rate, seconds, None, None, f"{held} (no deadline)")
    if ready_replicas < 1:
        return Backlog(count, tokens, rate, seconds, deadline_s, None, f"{held}, no ready pod")
    need = math.ceil(ready_replicas * seconds / deadline_s - 1e-9)
    verdict = (
        f"within the {deadline_s:g}s deadline"
        if need <= ready_replicas
        else f"on {ready_replicas} pod(s) > the {deadline_s:g}s deadline: needs {need}"
    )
    return Backlog(count, tokens, rate, seconds, deadline_s, need, f"{held} {verdict}")


def compose(
    decision: Decision,
    backlog: Backlog,
    *,
    before: LoopState,
    obs: Observation,
    params: LawParams,
    now: float,
) -> Decision:
    """The law's decision with the backlog's need beside it: replicas = max(law's, backlog's),
    clipped by the law's bounds and max step; a scale-down the backlog still needs is held.
    Without a need (no opt-in, no data, or the law holding on missing metrics) the law's
    decision stands unchanged."""
    if backlog.replicas is None or decision.metrics_missing:
        return decision
    law = decision.replicas
    current = params.clip_replicas(before.replicas)
    need = params.clip_replicas(backlog.replicas)
    if need <= law:
        if backlog.requests:
            return replace(decision, reason=f"{decision.reason}; {backlog.reason}")
        return decision
    target = max(law, min(need, current))  # what is there stays while the backlog needs it
    # The rate is windowed: it shows a new pod only once it started and a window went by.
    last_up = before.last_scale_up
    settled = last_up is None or now - last_up >= params.pod_start_s + params.slo_window_s
    if settled and not obs.pending_replicas:
        target = max(target, min(need, current + params.replicas_max_step))
    if target == law:
        waiting = "pods starting" if obs.pending_replicas else "the last scale-up to show"
        reason = f"{decision.reason}; {backlog.reason} (waiting for {waiting})"
        return replace(decision, reason=reason)
    if target > current:
        state = replace(
            decision.state,
            replicas=target,
            up_since=None,
            up_target=None,
            down_since=None,
            down_target=None,
            last_scale_up=now,
            last_replica_change=now,
        )
    else:  # the law's scale-down, held: its window keeps running for when the backlog is gone
        state = replace(
            decision.state,
            replicas=target,
            down_since=before.down_since,
            down_target=before.down_target,
            last_scale_up=before.last_scale_up,
            last_replica_change=before.last_replica_change,
        )
    moved = f"replicas {current}→{target}" if target > current else f"replicas held at {target}"
    reason = f"{decision.reason}; {moved} for the batch lane ({backlog.reason})"
    return replace(decision, replicas=target, state=state, reason=reason)
