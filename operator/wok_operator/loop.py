"""One control-loop tick without the I/O, as a pipeline of named steps that the operator and the
fleet simulator share: observe (pods and Prometheus signals → an Observation), decide (the law),
record (the decision → a status patch with its inputs and conditions). The last step, act (patch
status, scale the Deployment, push the batch to the pods), is I/O and lives in `handlers.py`; the
simulator acts on its own fleet instead.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from wok_contracts.signals import Observation, PodView, ServiceSignals
from wok_contracts.slos import Slos
from wok_operator import conditions as cond
from wok_operator.api import InferenceServiceSpec, LoopMemory
from wok_operator.backlog import Backlog, backlog_need, compose
from wok_operator.budget import MemoryBudget, gib
from wok_operator.control import Decision, LawParams, LoopState, decide
from wok_operator.plan import mix_capacity
from wok_operator.signals import KV_BUDGET_TOLERANCE

#: A container waiting for one of these will not run without a change: an image that cannot be
#: pulled, a process that keeps exiting, a container that cannot be made.
FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def container_failure(status: dict[str, Any]) -> str | None:
    """The first container (init containers first) stuck for a `FAILING_REASONS` reason, as
    "NAME: REASON: message", or None."""
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FAILING_REASONS:
            message = waiting.get("message") or ""
            return f"{container.get('name', '?')}: {reason}" + (f": {message}" if message else "")
    return None


def pod_view(name: str, meta: dict[str, Any], status: dict[str, Any]) -> PodView:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    created = meta.get("creationTimestamp")
    return PodView(
        name=name,
        uid=meta.get("uid", ""),
        ip=status.get("podIP"),
        ready=ready and status.get("phase") == "Running",
        terminating=meta.get("deletionTimestamp") is not None,
        created=None if created is None else unix_seconds(created),
        failure=container_failure(status),
    )


def unix_seconds(stamp: str) -> float | None:
    """A metav1.Time as Unix seconds (None when it is not one)."""
    try:
        return datetime.strptime(stamp, cond.ISO_SECONDS).replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return None


def observe(
    signals: ServiceSignals,
    pods: list[PodView],
    *,
    now: float | None = None,
    stalled_after_s: float = math.inf,
) -> Observation:
    ready = sum(1 for pod in pods if pod.ready)
    stalled = sum(1 for pod in pods if pod.stalled(now, stalled_after_s))
    pending = sum(1 for pod in pods if pod.pending) - stalled
    # Sums cover the pods whose scrape succeeded; per-pod figures divide by those, and the law
    # counts the silent ready ones as full.
    reporting = ready if signals.reporting_pods is None else min(signals.reporting_pods, ready)
    per_replica = None
    running = None
    if reporting and signals.waiting is not None:
        per_replica = signals.waiting / reporting
    if reporting and signals.running is not None:
        running = signals.running / reporting
    return Observation(
        queue_per_replica=per_replica,
        kv_usage=signals.kv_usage,
        ready_replicas=ready,
        pending_replicas=pending,
        running_per_replica=running,
        p99_ttft_seconds=signals.p99_ttft_seconds,
        p99_tpot_seconds=signals.p99_tpot_seconds,
        p99_seconds=signals.p99_seconds,
        p99_service_seconds=signals.p99_service_seconds,
        budget_p99_ttft_seconds=signals.budget_p99_ttft_seconds,
        budget_p99_tpot_seconds=signals.budget_p99_tpot_seconds,
        budget_p99_seconds=signals.budget_p99_seconds,
        budget_p995_ttft_seconds=signals.budget_p995_ttft_seconds,
        budget_p995_tpot_seconds=signals.budget_p995_tpot_seconds,
        budget_p995_seconds=signals.budget_p995_seconds,
        reporting_replicas=reporting if ready else None,
        finished_per_s=signals.finished_per_s,
        rejected_per_s=signals.rejected_per_s,
        stalled_replicas=stalled,
    )


Law = Callable[[LoopState, Observation, LawParams, float], Decision]


@dataclass(frozen=True)
class TickResult:
    params: LawParams
    observation: Observation
    decision: Decision
    backlog: Backlog | None = None
    signals: ServiceSignals | None = None  # what the tick observed (the record step reads it)


def batch_lane_backlog(
    spec: InferenceServiceSpec, signals: ServiceSignals, obs: Observation
) -> Backlog:
    """The batch lane's backlog from the signals, with the deadline when the spec sets one."""
    return backlog_need(
        requests=signals.batch_requests,
        pending_tokens=signals.batch_pending_tokens,
        tokens_per_s=signals.batch_tokens_per_s,
        ready_replicas=obs.reporting if obs.ready_replicas else 0,
        deadline_s=spec.batch_lane.complete_within_seconds,
    )


def control_tick(
    spec: InferenceServiceSpec,
    state: LoopState,
    signals: ServiceSignals,
    pods: list[PodView],
    *,
    batch_mem: int,
    now: float,
    law: Law = decide,
    batch_sla: int | None = None,
) -> TickResult:
    """observe → decide: the pure middle of every tick, in the operator and in the simulator.
    The law sees the online lane only; a batch-lane deadline (opt-in) may add replicas beside it
    (`backlog.compose`). With a step profile in the spec, μ's prior is its capacity for the mix
    the service finished over the SLO window."""
    capacity_prior = capacity_of_mix(spec, signals)
    params = LawParams.from_spec(
        spec, batch_mem=batch_mem, capacity_prior=capacity_prior, batch_sla=batch_sla
    )
    obs = observe(signals, pods, now=now, stalled_after_s=params.stalled_after_s)
    decision = law(state, obs, params, now)
    backlog = batch_lane_backlog(spec, signals, obs)
    decision = compose(decision, backlog, before=state, obs=obs, params=params, now=now)
    return TickResult(params, obs, decision, backlog, signals)


def held_tick(
    last: TickResult,
    state: LoopState,
    pods: list[PodView],
    *,
    params: LawParams,
    now: float,
    why: str,
) -> TickResult:
    """A tick without a fresh round, only a late one (`signals.only_late`): the knobs hold, and
    so does all the last tick read from its round (its verdicts on the SLOs, the error budget and
    memory, the batch lane's backlog, the KV budget), so neither the pods nor status hear of a
    round that is merely late. The pods are this tick's own: a pod that became ready is news.
    The law does not run: it would step again on a round it has already acted on."""
    signals = last.signals or ServiceSignals()
    obs = observe(signals, pods, now=now, stalled_after_s=params.stalled_after_s)
    batch, replicas = params.clip_batch(state.batch), params.clip_replicas(state.replicas)
    decision = replace(
        last.decision,
        batch_before=state.batch,
        batch=batch,
        replicas_before=state.replicas,
        replicas=replicas,
        state=replace(state, batch=batch, replicas=replicas),
        reason=f"holding: {why}",
    )
    return replace(last, params=params, observation=obs, decision=decision)


def capacity_of_mix(spec: InferenceServiceSpec, signals: ServiceSignals) -> float | None:
    """The requests/s a pod serves within the SLOs by `spec.scaling.stepProfile`, for the mean
    prompt and output the service finished (None: no profile, or no mix seen). The prompt is
    priced less what the prefix cache held of it: those tokens skip their prefill."""
    profile = spec.scaling.step_profile
    if profile is None:
        return None
    prompt, cached = signals.mean_prompt_tokens, signals.mean_cached_tokens
    if prompt is not None and cached is not None and math.isfinite(cached):
        prompt = max(1.0, prompt - cached)
    slo = spec.slo
    slos = Slos(slo.ttft_p99_seconds, slo.tpot_p99_seconds, slo.e2e_p99_seconds)
    return mix_capacity(
        profile,
        spec.memory.max_model_len,
        slos,
        prompt,
        signals.mean_output_tokens,
    )


def initial_state(spec: InferenceServiceSpec, params: LawParams) -> LoopState:
    return LoopState(
        batch=params.clip_batch(spec.batching.initial_batch_size), replicas=params.replicas_floor
    )


def state_from_status(
    status: dict[str, Any] | None, spec: InferenceServiceSpec, params: LawParams
) -> LoopState:
    """The law's memory as the last operator left it in status (a restart continues from it)."""
    fresh = initial_state(spec, params)
    status = status or {}
    memory = LoopMemory.model_validate(status.get("controller") or {})
    replicas = int(status.get("replicas") or fresh.replicas)
    if spec.scaling.replicas == "external":
        replicas = params.replicas_floor  # what kubectl scale, the HPA or KEDA last wrote
    return LoopState(
        batch=int(status.get("batchSize") or fresh.batch),
        replicas=replicas,
        **memory.model_dump(),
    )


def resume_state(
    held: LoopState | None,
    status: dict[str, Any] | None,
    spec: InferenceServiceSpec,
    params: LawParams,
) -> LoopState:
    """The law's state for this tick: the one the operator holds in memory, or, on start (a new
    process, which is also how a new leader begins: `leader.py`), the last checkpoint in status.
    Status is never read back while memory holds the state, so a watch that lags behind the last
    write cannot hand the law an older state."""
    if held is None:
        return state_from_status(status, spec, params)
    if spec.scaling.replicas == "external":
        return replace(held, replicas=params.replicas_floor)  # the owner's latest count
    return held


#: Status is a checkpoint: written when a decision or a condition changes, else at this period.
STATUS_HEARTBEAT_S = 60.0


def status_digest(patch: dict[str, Any]) -> tuple[Any, ...]:
    """What a change of must reach status at once: the knobs, the ready count, the memory plan,
    each condition's status and reason, and whether the batch lane has a backlog and an estimate.
    Not the figures that move every tick (the decision's inputs, condition messages, the batch
    lane's estimate and the replicas its deadline needs): the heartbeat carries those, and a
    need that moves the replicas is a decision, written at once."""
    conditions = sorted(
        (c["type"], c["status"], c["reason"], c.get("observedGeneration"))
        for c in patch.get("conditions") or []
    )
    memory = sorted((patch.get("memory") or {}).items())
    knobs = (patch.get("batchSize"), patch.get("replicas"), patch.get("readyReplicas"))
    lane = patch.get("batchLane") or {}
    # A backlog that appears or drains, or its first estimate; not the estimate as it moves.
    backlog = (bool(lane.get("requests")), lane.get("estimatedSeconds") is not None)
    return (*knobs, backlog, tuple(memory), tuple(conditions))


#: The parts of `status_digest`, by name, in its order (the conditions come last).
DIGEST_PARTS = ("batchSize", "replicas", "readyReplicas", "batchLane", "memory")


def status_due(
    digest: tuple[Any, ...],
    last_digest: tuple[Any, ...] | None,
    *,
    decided_change: bool,
    since_write_s: float | None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> bool:
    """Whether this tick writes status: a changed decision or digest, the heartbeat, or the first
    tick of this process (`since_write_s` None: nothing written yet)."""
    cause = status_write_cause(
        digest,
        last_digest,
        decided_change=decided_change,
        since_write_s=since_write_s,
        heartbeat_s=heartbeat_s,
    )
    return cause is not None


def status_write_cause(
    digest: tuple[Any, ...],
    last_digest: tuple[Any, ...] | None,
    *,
    decided_change: bool,
    since_write_s: float | None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> str | None:
    """Why this tick writes status (None: it does not): `first` (nothing written by this
    process yet), `decision` (a knob moved), the part of the digest that changed (`readyReplicas`,
    `condition:Ready`, ...), or `heartbeat`. `wok_operator_status_writes{cause}` counts them."""
    if since_write_s is None or last_digest is None:
        return "first"
    if decided_change:
        return "decision"
    if digest != last_digest:
        return digest_change(digest, last_digest)
    return "heartbeat" if heartbeat_due(since_write_s, heartbeat_s) else None


def digest_change(digest: tuple[Any, ...], last_digest: tuple[Any, ...]) -> str:
    """The first part of `status_digest` that differs between the two (by name)."""
    for name, now, before in zip(DIGEST_PARTS, digest, last_digest, strict=False):
        if now != before:
            return name
    now_conditions, last_conditions = set(digest[-1]), set(last_digest[-1])
    changed = sorted({c[0] for c in now_conditions ^ last_conditions})
    return f"condition:{changed[0]}" if changed else "conditions"


def heartbeat_due(since_write_s: float | None, heartbeat_s: float = STATUS_HEARTBEAT_S) -> bool:
    return since_write_s is None or since_write_s >= heartbeat_s


def phase(key: tuple[str, str], period_s: float) -> float:
    """The service's own offset in [0, period_s), the same in every process: every daemon starts
    at once, so without it a thousand services tick in the same instant and write their
    heartbeats in the same second, and the last of each burst waits on all the others."""
    return zlib.crc32("/".join(key).encode()) / 2**32 * period_s


def memory_status(plan: MemoryBudget) -> dict[str, int]:
    return {
        "weightsBytes": plan.weights_bytes,
        "activationBytes": plan.activation_bytes,
        "kvCacheBytes": plan.kv_budget_bytes,
        "reserveBytes": plan.reserve_bytes,
        "kvBytesPerToken": plan.kv_bytes_per_token,
        "maxBatchByMemory": plan.max_batch_size,
        "sequenceLength": plan.sequence_length,
    }


def _p99_text(label: str, ttft: float | None, tpot: float | None, e2e: float | None) -> str:
    parts = [
        f"{name} {value:.3f}s"
        for name, value in (("TTFT", ttft), ("TPOT", tpot), ("E2E", e2e))
        if value is not None and math.isfinite(value)
    ]
    return f"{label} " + ", ".join(parts) if parts else f"no {label} yet"


def _rounded(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 4)


#: One condition a tick sets: its type, status, reason and message.
TickCondition = tuple[str, bool, str, str]


def _pod_conditions(decision: Decision, obs: Observation) -> list[TickCondition]:
    """Ready, PodsPending and Progressing: how far the pods are from the decided replicas."""
    ready_all = obs.ready_replicas >= max(decision.replicas, 1)
    if obs.ready_replicas == 0:
        ready = (cond.READY, False, "NoReadyReplicas", "no runtime pod is ready yet")
    elif ready_all:
        ready = (cond.READY, True, "ReplicasReady", f"{obs.ready_replicas} replica(s) ready")
    else:
        ready = (
            cond.READY,
            True,
            "PartiallyReady",
            f"{obs.ready_replicas} of {decision.replicas} replica(s) ready",
        )
    if obs.stalled_replicas:
        pending = (
            cond.PODS_PENDING,
            True,
            "PendingPastPodStart",
            f"{obs.stalled_replicas} pod(s) pending past the pod start and a margin: not counted "
            "as capacity",
        )
    elif obs.pending_replicas:
        pending = (
            cond.PODS_PENDING,
            True,
            "PodsStarting",
            f"{obs.pending_replicas} pod(s) not ready yet",
        )
    else:
        pending = (cond.PODS_PENDING, False, "NoPendingPods", "")
    # Progressing follows the pods, not the decision: a batch step lands in one tick, and a
    # condition that was True for the tick of a decision and False at the next wrote status
    # twice per step (0.5 writes per service per minute of a 100-service ramp).
    progressing = (
        cond.PROGRESSING,
        not ready_all,
        "Stable" if ready_all else "Rollout",
        decision.reason,
    )
    return [ready, pending, progressing]


def _budget_condition(decision: Decision, obs: Observation) -> TickCondition:
    """ErrorBudgetSpent, with the budget window's P99s and P99.5s in its message."""
    budget_p99 = (obs.budget_p99_ttft_seconds, obs.budget_p99_tpot_seconds, obs.budget_p99_seconds)
    budget_p995 = (
        obs.budget_p995_ttft_seconds,
        obs.budget_p995_tpot_seconds,
        obs.budget_p995_seconds,
    )
    if not decision.budget_spent:
        budget_reason = "BudgetWindowP99WithinTarget"
    elif decision.budget_recovering:
        budget_reason = "HalfTheBudgetNotBack"  # the P99s are within, a P99.5 is not yet
    else:
        budget_reason = "BudgetWindowP99AboveTarget"
    return (
        cond.ERROR_BUDGET_SPENT,
        decision.budget_spent,
        budget_reason,
        _p99_text("budget-window P99", *budget_p99)
        + "; "
        + _p99_text("P99.5", *budget_p995)
        + (
            ""
            if decision.utilization is None
            else f"; replicas sized at utilization {decision.utilization:g}"
        ),
    )


def _law_conditions(
    decision: Decision, obs: Observation, metrics_error: str | None
) -> list[TickCondition]:
    """MetricsUnavailable, SLOBreached, ErrorBudgetSpent, SLOUnattainable and MemoryBound."""
    if decision.metrics_missing:
        metrics = (cond.METRICS_UNAVAILABLE, True, "NoData", metrics_error or decision.reason)
    else:
        metrics = (cond.METRICS_UNAVAILABLE, False, "MetricsFlowing", "")
    slo = (
        cond.SLO_BREACHED,
        decision.slo_breached,
        "P99AboveTarget" if decision.slo_breached else "P99WithinTarget",
        _p99_text("P99", obs.p99_ttft_seconds, obs.p99_tpot_seconds, obs.p99_seconds),
    )
    unattainable = (
        cond.SLO_UNATTAINABLE,
        decision.unattainable is not None,
        "NoBatchMeetsSLO" if decision.unattainable else "SLOAttainable",
        decision.unattainable or "",
    )
    memory = (
        cond.MEMORY_BOUND,
        decision.memory_bound,
        "BatchAtMemoryCap" if decision.memory_bound else "BatchBelowMemoryCap",
        "",
    )
    return [metrics, slo, _budget_condition(decision, obs), unattainable, memory]


def _decision_inputs(decision: Decision, obs: Observation) -> dict[str, Any]:
    """What the law saw this tick, rounded for the status."""
    return {
        "queuePerReplica": _rounded(obs.queue_per_replica),
        "runningPerReplica": _rounded(obs.running_per_replica),
        "p99TtftSeconds": _rounded(obs.p99_ttft_seconds),
        "p99TpotSeconds": _rounded(obs.p99_tpot_seconds),
        "p99Seconds": _rounded(obs.p99_seconds),
        "kvUsage": _rounded(obs.kv_usage),
        "readyReplicas": obs.ready_replicas,
        "pendingReplicas": obs.pending_replicas,
        "reportingReplicas": obs.reporting_replicas,
        "desiredReplicas": decision.desired_replicas,
        "utilization": decision.utilization,
        "budgetP99TtftSeconds": _rounded(obs.budget_p99_ttft_seconds),
        "budgetP99TpotSeconds": _rounded(obs.budget_p99_tpot_seconds),
        "budgetP99Seconds": _rounded(obs.budget_p99_seconds),
        "budgetP995TtftSeconds": _rounded(obs.budget_p995_ttft_seconds),
        "budgetP995TpotSeconds": _rounded(obs.budget_p995_tpot_seconds),
        "budgetP995Seconds": _rounded(obs.budget_p995_seconds),
    }


def decision_status(
    decision: Decision,
    obs: Observation,
    *,
    previous_conditions: list[dict[str, Any]] | None,
    generation: int | None,
    now: str,
    metrics_error: str | None = None,
) -> dict[str, Any]:
    """The status patch of one tick: the decision with its inputs, and the conditions."""
    conditions = previous_conditions
    for type_, status, reason, message in (
        *_pod_conditions(decision, obs),
        *_law_conditions(decision, obs, metrics_error),
    ):
        conditions = cond.set_condition(
            conditions, type_, status, reason, message, generation=generation, now=now
        )
    return {
        "batchSize": decision.batch,
        "replicas": decision.replicas,
        "readyReplicas": obs.ready_replicas,
        "lastDecision": {
            "time": now,
            "inputs": _decision_inputs(decision, obs),
            "batch": {"from": decision.batch_before, "to": decision.batch},
            "replicas": {"from": decision.replicas_before, "to": decision.replicas},
            "reason": decision.reason,
        },
        "controller": LoopMemory.model_validate(
            {k: v for k, v in asdict(decision.state).items() if k not in ("batch", "replicas")}
        ).model_dump(by_alias=True),
        "conditions": conditions,
    }


def with_pod_failures(
    patch: dict[str, Any], pods: list[PodView], *, generation: int | None, now: str
) -> dict[str, Any]:
    """The tick's status patch with the `PodsFailing` condition: True, with the first pod's
    reason, while any pod has a container that cannot run (an image that cannot be pulled, a
    server that keeps crashing), which pending or unready pods alone do not tell apart from a
    slow start."""
    failing = [(pod.name, pod.failure) for pod in pods if pod.failure is not None]
    if failing:
        name, failure = failing[0]
        reason = failure.partition(": ")[2].partition(": ")[0]  # "container: Reason: message"
        more = f" (and {len(failing) - 1} more pod(s))" if len(failing) > 1 else ""
        status, message = True, f"pod {name}: {failure}{more}"
    else:
        status, reason, message = False, "NoFailingPods", ""
    patch["conditions"] = cond.set_condition(
        patch.get("conditions"),
        cond.PODS_FAILING,
        status,
        reason,
        message,
        generation=generation,
        now=now,
    )
    return patch


def with_kv_budget(
    patch: dict[str, Any], signals: ServiceSignals, *, generation: int | None, now: str
) -> dict[str, Any]:
    """The tick's status patch (`decision_status`) with the `KVBudgetMatched` condition: False
    when a GPU pod measured a room for its KV pool more than `KV_BUDGET_TOLERANCE` away from the
    budget it was given (the budget's inputs are wrong for the node), Unknown while no GPU pod
    reports both figures (CPU and `sim:` pods measure no device)."""
    ratio, budget = signals.kv_measured_ratio, signals.kv_budget_bytes
    if ratio is None or budget is None:
        status: bool | cond.Status = "Unknown"
        reason, message = "NotMeasured", "no GPU pod reports its measured KV room yet"
    else:
        # In whole bytes, as the runtime compares them (a ratio of 1.1 is not "more than 10 %").
        measured, given = round(ratio * budget), round(budget)
        status = abs(measured - given) <= KV_BUDGET_TOLERANCE * given
        reason = "MeasuredRoomMatches" if status else "MeasuredRoomDiffers"
        apart = "within" if status else "more than"
        message = (
            f"a pod measured {gib(measured)} ({measured} bytes) free for its KV pool after "
            f"loading, against the budget's {gib(given)} ({given} bytes): "
            f"{ratio:.2f}x, {apart} {100 * KV_BUDGET_TOLERANCE:.0f} %"
        )
        if not status:
            message += (
                "; the pool keeps the budget: check spec.runtime.gpuMemory, memory.reserve and "
                "the model's architecture against this node"
            )
    patch["conditions"] = cond.set_condition(
        patch.get("conditions"),
        cond.KV_BUDGET_MATCHED,
        status,
        reason,
        message,
        generation=generation,
        now=now,
    )
    return patch


def with_batch_lane(patch: dict[str, Any], backlog: Backlog, *, now: str) -> dict[str, Any]:
    """The tick's status patch (`decision_status`) with the batch lane's backlog: in
    lastDecision's inputs, and as status.batchLane with its estimated completion."""
    patch["lastDecision"]["inputs"].update(
        batchLaneRequests=backlog.requests,
        batchLanePendingTokens=backlog.pending_tokens,
        batchLaneReplicas=backlog.replicas,
    )
    patch["batchLane"] = batch_lane_status(backlog, now=now)
    return patch


def batch_lane_status(backlog: Backlog, *, now: str) -> dict[str, Any]:
    """status.batchLane: the backlog, and when it would finish at the current capacity."""
    done_at = None
    if backlog.seconds is not None:
        try:
            start = datetime.strptime(now, cond.ISO_SECONDS).replace(tzinfo=UTC)
            done_at = (start + timedelta(seconds=backlog.seconds)).strftime(cond.ISO_SECONDS)
        except (ValueError, OverflowError):  # not a metav1.Time, or past the year 9999
            done_at = None
    return {
        "requests": backlog.requests,
        "pendingTokens": backlog.pending_tokens,
        "tokensPerSecond": _rounded(backlog.tokens_per_s),
        "estimatedSeconds": None if backlog.seconds is None else round(backlog.seconds, 1),
        "estimatedCompletionTime": done_at,
        "completeWithinSeconds": backlog.deadline_s,
        "neededReplicas": backlog.replicas,
    }
