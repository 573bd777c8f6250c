"""The control law: the batch size (the fast knob) and the replica count (the slow knob).

One pure function, `decide`, with no I/O: the operator, the fleet simulator (`wok simulate`) and the
tests all call it. A tick is two rules, each a pure function (`_batch_rule`, `_replica_rule`),
on one set of facts computed once from the round and the law's memory (`_facts`: breaches,
windows, saturation, the error budget, the TPOT pod); a round with a missing series holds both
knobs.

The batch rests at its cap, min(B_max, B_mem, B_SLA), with the clipped sign-step as its guard:

    B ← min(B_max, B_mem, B_SLA)                       while TPOT is within its SLO
    B ← clip(B − η, B_min, cap)                        on a P99 TPOT breach at the cap that
                                                       pods did not fix, once per SLO window

A batch below its cap only queues what a pod could run (the ablations in docs/control-law.md
measured it: a moving batch that climbed from its initial batch lost spikes, and one that
stepped down on a TPOT breach under rising load queued it); a TPOT breach at the cap therefore
asks for a pod first, and the batch steps down only once one more pod did not lower the P99 or
the fleet is at its most. A KV cache past its ceiling holds the batch. Latency that comes from
output length (end-to-end time of long answers) or queueing (TTFT) never lowers it.

The replicas follow the measured demand (Little's law on the gauges, not on a lagging P99):

    demand   L = running + waiting (requests in the pods; a pod that failed its scrape counts full)
    capacity C = the batch a pod can run: the cap the batch is heading for while TPOT has headroom,
                 the current batch when TPOT binds, fewer when the KV cache binds first
    R*       = ceil(L / (ρ · C))        with ρ = target utilization

and from throughput once a saturated pod has shown its rate μ: R* ≥ ⌈arrivals / (ρ · μ)⌉
(`_demand`). ρ is the target while the error budget holds, and the breached one, with more
headroom, from when a P99 over the SLO's budget window (an hour) breaks its SLO (the traffic has
outrun the fleet within a pod start before) until every P99.5 over it is within its SLO (half the
budget back), or the window held no request at all.

R rises to R* at once (at most `max_step` per tick) once R* > R has held for `scale_up_window`; pods
already starting count as capacity on its way (R includes them), so a scale-up never repeats while
it is still arriving; a pod pending past its pod start and a margin is no capacity, and is asked for
again. A TTFT breach while requests queue adds one replica if demand did not (uneven routing), and
so does a TPOT breach (step time from load; at the cap, before the batch), each only after the last
scale-up had a pod start and an SLO window to show, and the last scale-down the window that shows it
(a lagging P99 never reverses a step it has not seen); a TPOT pod that did not lower the P99 ends
those (`SLOUnattainable`). R falls only when R* < R has held for `scale_down_window`, to the largest
R* seen in that window, with no breach a pod or the batch could fix, and not below the pods that
serve today's arrivals at the most a pod has served within its SLOs (while μ is observed, not
the step profile's own figure), unless that floor has held the fleet for a budget window. μ and
that rate are forgotten when the model, the GPU or the SLOs change, and give way to a lower
sample once a budget window old. Any missing series the law reads holds everything; nothing
scales to zero on missing data; the batch is never above B_mem.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace

from wok_contracts.signals import Observation
from wok_operator.api import InferenceServiceSpec

#: Rates below this (requests/s) say nothing a pod could be sized on: one request in 11 days.
MIN_RATE = 1e-6
#: How long past its pod start a pending pod still counts as capacity on its way.
STALL_MARGIN_S = 120.0


def learned_key(spec: InferenceServiceSpec) -> str:
    """A hash of what the learned rates depend on (the model, the GPU, the SLOs): a change of
    any of them starts the law's memory afresh."""
    basis = {
        "model": spec.model.model_dump(mode="json"),
        "gpu": [spec.runtime.gpus_per_pod, spec.runtime.gpu_memory],
        "slo": spec.slo.model_dump(mode="json"),
    }
    if spec.scaling.step_profile is not None:  # what the capacity ratio is relative to
        basis["profile"] = spec.scaling.step_profile.model_dump(mode="json")
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LawParams:
    batch_min: int
    batch_max: int
    batch_mem: int
    batch_step: int
    replicas_min: int
    replicas_max: int
    replicas_max_step: int
    target_queue: float
    deadband: float
    target_utilization: float
    slo_ttft_s: float
    slo_tpot_s: float
    slo_e2e_s: float | None
    kv_usage_ceiling: float
    scale_up_window_s: float
    scale_down_window_s: float
    slo_window_s: float = 60.0
    pod_start_s: float = 90.0  # how long a new pod takes to serve: its step shows after this
    breached_utilization: float | None = None  # ρ while the budget is spent (None: the same)
    budget_window_s: float = 3600.0  # the error budget's window: what the law learnt ages over it
    learned_key: str = ""  # `learned_key(spec)`: the learned rates hold for this spec only
    # Requests/s a pod serves within the SLOs for the observed mix, from the step profile (the
    # planner's QPS_max = B_opt / t_batch(B_opt)): μ until a saturated pod shows its own.
    capacity_prior: float | None = None
    # B_SLA: the largest batch whose predicted step time for the observed mix keeps TPOT within
    # its SLO (the step profile's); part of the batch cap (None: unknown, no limit).
    batch_sla: int | None = None
    # Misses while the fleet is below what the law asked for are the law's, not the traffic's:
    # they do not spend the error budget. Off by default: on the code trace at a 180 s pod start
    # it lost 0.3-1.3 points for 3-4 % fewer GPU-hours and bought nothing elsewhere
    # (docs/control-law.md); False: every miss spends it.
    forgive_own_misses: bool = False
    # The proven floor (`_floor`): a scale-down never asks a pod for more than PROBE_GROWTH × the
    # most a pod has served within the SLOs, until it has held a budget window.
    proven_floor: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.batch_min <= self.batch_max:
            raise ValueError("need 1 <= batch_min <= batch_max")
        if self.batch_mem < 0 or self.batch_step < 1 or self.replicas_max_step < 1:
            raise ValueError("batch_mem must be >= 0 and steps >= 1")
        if not 0 <= self.replicas_min <= self.replicas_max:
            raise ValueError("need 0 <= replicas_min <= replicas_max")
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if self.breached_utilization is not None and not 0 < self.breached_utilization <= 1:
            raise ValueError("breached_utilization must be in (0, 1]")
        if self.batch_sla is not None and self.batch_sla < 1:
            raise ValueError("batch_sla must be >= 1")
        if self.capacity_prior is not None and not self.capacity_prior > 0:
            raise ValueError("capacity_prior must be > 0 requests/s")

    @classmethod
    def from_spec(
        cls,
        spec: InferenceServiceSpec,
        *,
        batch_mem: int,
        capacity_prior: float | None = None,
        batch_sla: int | None = None,
    ) -> LawParams:
        b, s, slo = spec.batching, spec.scaling, spec.slo
        # An external owner (kubectl scale, an HPA, KEDA) pins the count: the law then cannot
        # move it, and moves the batch exactly as it would beside its own replicas.
        pinned = spec.replicas if s.replicas == "external" else None
        return cls(
            batch_min=b.min_batch_size,
            batch_max=b.max_batch_size,
            batch_mem=batch_mem,
            batch_step=b.step,
            replicas_min=s.min_replicas if pinned is None else pinned,
            replicas_max=s.max_replicas if pinned is None else pinned,
            replicas_max_step=s.max_step,
            target_queue=s.target_queue_per_replica,
            deadband=s.deadband,
            target_utilization=s.target_utilization,
            breached_utilization=s.breached_utilization,
            slo_ttft_s=slo.ttft_p99_seconds,
            slo_tpot_s=slo.tpot_p99_seconds,
            slo_e2e_s=slo.e2e_p99_seconds,
            kv_usage_ceiling=spec.memory.kv_usage_ceiling,
            scale_up_window_s=s.scale_up_stabilization_seconds,
            scale_down_window_s=s.scale_down_stabilization_seconds,
            slo_window_s=slo.window_seconds,
            pod_start_s=s.pod_start_seconds,
            budget_window_s=slo.budget_window_seconds,
            learned_key=learned_key(spec),
            capacity_prior=capacity_prior,
            batch_sla=batch_sla,
        )

    def utilization(self, *, budget_spent: bool) -> float:
        """ρ: the target, or the breached one's headroom while the error budget is spent."""
        if budget_spent and self.breached_utilization is not None:
            return min(self.target_utilization, self.breached_utilization)
        return self.target_utilization

    @property
    def batch_cap(self) -> int:
        """min(B_max, B_mem, B_SLA): the memory budget always wins; a batch past B_SLA breaks TPOT
        by the profile's own prediction."""
        sla = self.batch_max if self.batch_sla is None else self.batch_sla
        return max(1, min(self.batch_max, self.batch_mem, sla))

    @property
    def batch_floor(self) -> int:
        return min(self.batch_min, self.batch_cap)

    def clip_batch(self, batch: int) -> int:
        return max(self.batch_floor, min(self.batch_cap, batch))

    def clip_replicas(self, replicas: int) -> int:
        return max(self.replicas_floor, min(self.replicas_max, replicas))

    @property
    def stalled_after_s(self) -> float:
        """A pod pending longer than this is not on its way: it stops counting as capacity."""
        return self.pod_start_s + STALL_MARGIN_S

    @property
    def replicas_floor(self) -> int:
        # wok does not scale to zero (nothing would buffer the first request); maxReplicas 0 pauses.
        return min(max(self.replicas_min, 1), self.replicas_max)


@dataclass(frozen=True)
class LoopState:
    """What the loop remembers between ticks (kept in status, so a restart continues from it)."""

    batch: int
    replicas: int
    batch_direction: int = 0  # the last batch step's sign
    batch_run: int = 0  # how many steps in a row went that way
    last_batch_decrease: float | None = None
    up_since: float | None = None  # since when demand has asked for more replicas
    up_target: int | None = None  # the smallest ask in that time (a spike must persist)
    down_since: float | None = None  # since when demand has asked for fewer replicas
    down_target: int | None = None  # the largest ask in that time (scale down to it)
    last_scale_up: float | None = None
    last_replica_change: float | None = None
    service_rate: float | None = None  # μ: requests/s a pod serves, as the law believes it
    capacity_source: str | None = None  # "profile" (the prior) or "observed" (a saturated pod)
    # What saturated pods served ÷ the step profile's capacity for the mix they served (None: no
    # profile, or none saturated yet); μ is this times the profile's capacity for today's mix.
    capacity_ratio: float | None = None
    service_rate_at: float | None = None  # when; a rate older than the budget window gives way
    proven_rate: float | None = None  # the most requests/s a pod has served within its SLOs
    proven_rate_at: float | None = None
    learned_for: str | None = None  # the `LawParams.learned_key` the rates were learnt under
    tpot_pod_p99: float | None = None  # P99 TPOT when a pod was last added for a TPOT breach
    tpot_futile: bool = False  # that pod did not lower it: more pods will not either
    floor_since: float | None = None  # since when the proven floor alone holds a scale-down
    saturated_since: float | None = None  # since when pods queue with free batch slots
    waiting_since: float | None = None  # since when requests have waited at every tick
    queued_since: float | None = None  # since when requests have queued past Q* at every tick
    breached_since: float | None = None  # since when P99 TTFT has been above its SLO at every tick
    budget_spent: bool = False  # the error budget ran out, and half of it is not back yet
    burst_at: float | None = None  # when the traffic last outran the fleet the law asked for
    outrun_at: float | None = None  # when demand last asked for more than a fleet in place
    started_at: float | None = None  # the law's first tick (a warm start is not the law's fleet)
    batch_sla: int | None = None  # B_SLA in force at the last tick (shown in status)


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
    desired_replicas: int | None = None  # R*, what demand asks for
    utilization: float | None = None  # ρ in force
    budget_spent: bool = False  # a P99 over the budget window breaks its SLO, or did and
    budget_recovering: bool = False  # half the budget is not back yet (the P99.5s break theirs)
    unattainable: str | None = None  # an SLO no batch size can meet, and why

    @property
    def changed(self) -> bool:
        return (self.batch, self.replicas) != (self.batch_before, self.replicas_before)


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _above(value: float | None, limit: float | None) -> bool:
    return limit is not None and _known(value) and value > limit  # type: ignore[operator]


def _since(start: float | None, now: float) -> float:
    """When a condition that holds now began: its recorded start, else now (0 is a time too)."""
    return now if start is None else start


def _quiet_since(last: float | None, now: float, window: float) -> bool:
    return last is None or now - last >= window


def _holding(
    state: LoopState, batch: int, replicas: int, why: str, *, memory_bound: bool
) -> Decision:
    held = replace(state, batch=batch, replicas=replicas, batch_direction=0, batch_run=0)
    return Decision(
        batch_before=state.batch,
        batch=batch,
        replicas_before=state.replicas,
        replicas=replicas,
        reason=f"holding: {why}",
        state=held,
        metrics_missing=True,
        memory_bound=memory_bound,
    )


def _hold_reason(obs: Observation) -> str | None:
    """Why this round cannot be acted on, or None: no ready pod, no pod reporting, or any series
    the law reads missing (a partial round is a missing one: a missing completion counter would
    silently drop the throughput term and the floor)."""
    if obs.ready_replicas < 1:
        return "no ready replicas"
    if obs.reporting_replicas == 0:
        return "no pod reports its metrics"
    series = {
        "waiting": obs.queue_per_replica,
        "running": obs.running_per_replica,
        "KV usage": obs.kv_usage,
        "completions": obs.finished_per_s,
        "rejections": obs.rejected_per_s,
    }
    missing = [name for name, value in series.items() if not _known(value)]
    return f"metrics missing: {', '.join(missing)}" if missing else None


#: A pod added for a TPOT breach that lowers the P99 by less than this share of it
#: shows that more pods will not meet the SLO.
TPOT_GAIN = 0.1


@dataclass(frozen=True)
class _Facts:
    """Every predicate the two rules read, computed once a tick from the round and the memory."""

    batch: int  # the batch and the replicas, clipped to their bounds
    replicas: int
    queue: float  # waiting requests per reporting pod
    queue_long: bool  # past Q* + deadband
    cap_binds: bool  # the batch cap limits the running set (else lowering it changes nothing)
    ttft_breached: bool
    tpot_breached: bool
    slo_breached: bool  # any P99 over its SLO, E2E included
    kv_full: bool
    # The windows: each lagging signal is read only once the step it would judge could show.
    recently_lowered: bool  # a TPOT-driven decrease has not shown in the windowed P99 yet
    settled: bool  # the last scale-up could show in the windowed P99
    reversal_shown: bool  # the last replica change could show in the windowed P99
    tpot_bound: bool  # TPOT binds the batch: breached now, or lowered within the window
    queued_since: float | None  # requests have queued past Q* at every tick since
    queue_lasts: bool  # for the scale-up window
    breached_since: float | None  # P99 TTFT has been above its SLO at every tick since
    saturated_since: float | None  # pods have queued behind a cap that cannot rise since
    saturated: bool  # long enough that the completions are what a pod can do
    waiting_since: float | None  # requests have waited (any queue) at every tick since
    teaches: bool  # the window's completions may teach μ (`_facts`)
    # The error budget, and the utilization it sets.
    budget_spent: bool
    budget_recovering: bool
    burst_at: float | None  # the traffic last outran the fleet the law had asked for
    in_place: bool  # every pod the law asked for serves, and has for a pod start and a window
    utilization: float
    # The TPOT pod: whether one more pod may still lower a TPOT breach.
    pods_left: bool  # none found futile yet, and the fleet below its most
    tpot_pod_p99: float | None  # P99 TPOT when the last TPOT pod was added
    tpot_futile: bool  # that pod did not lower it
    at_floor: bool  # a TPOT breach at the smallest batch, its last decrease shown

    @property
    def queueing(self) -> bool:
        return self.queue > 0

    @property
    def tpot_unattainable(self) -> bool:
        return self.tpot_futile or self.at_floor


def _showing_s(p: LawParams) -> float:
    """How long a step of either knob takes to show in the windowed P99."""
    return max(p.scale_up_window_s, p.slo_window_s)


def _facts(state: LoopState, obs: Observation, p: LawParams, now: float) -> _Facts:
    batch, replicas = p.clip_batch(state.batch), p.clip_replicas(state.replicas)
    queue = float(obs.queue_per_replica)  # type: ignore[arg-type]
    running = float(obs.running_per_replica)  # type: ignore[arg-type]
    queue_long = queue > p.target_queue + p.deadband
    cap_binds = running >= 0.8 * batch
    ttft_breached = _above(obs.p99_ttft_seconds, p.slo_ttft_s)
    tpot_breached = _above(obs.p99_tpot_seconds, p.slo_tpot_s)
    recently_lowered = not _quiet_since(state.last_batch_decrease, now, _showing_s(p))
    settled = _quiet_since(state.last_scale_up, now, p.pod_start_s + p.slo_window_s)
    tpot_bound = tpot_breached or recently_lowered
    queued_since = _since(state.queued_since, now) if queue_long else None
    breached_since = _since(state.breached_since, now) if ttft_breached else None
    # Saturated: requests have queued for a while although the pods have free batch slots
    # (prefill, the step's token budget or KV hold them back), or behind a cap that can rise no
    # further (the memory cap, or TPOT binds it). A passing queue is noise: the completions then
    # are the arrivals, not what a pod can do. A queue behind a cap that can still rise is the
    # batch's to fix, and a rate measured there says nothing of a larger batch.
    final_cap = batch >= p.batch_cap or tpot_bound
    saturated_since = None
    if queue_long and (final_cap or not cap_binds):
        saturated_since = _since(state.saturated_since, now)
    # A TTFT breach that outlasts a window's memory of one spike, while requests still wait behind
    # free batch slots, is a pod at what it can serve within the SLO: long prompts wait for their
    # prefill, few but heavy, and never make the queue long. Its completions teach μ too.
    slo_bound = (
        breached_since is not None
        and now - breached_since >= p.slo_window_s + p.scale_up_window_s
        and queue > 0
        and not cap_binds
    )
    saturated = slo_bound or (
        saturated_since is not None and now - saturated_since >= p.scale_up_window_s
    )
    waiting_since = _since(state.waiting_since, now) if queue > 0 else None
    slo_breached = ttft_breached or tpot_breached or _above(obs.p99_seconds, p.slo_e2e_s)
    in_place = _fleet_in_place(state, obs, p, now)
    burst_at = _burst_at(state, p, slo_breached=slo_breached, in_place=in_place, now=now)
    burst = burst_at is not None and now - burst_at < p.budget_window_s
    budget_spent, budget_recovering = _error_budget(state.budget_spent, obs, p, burst=burst)
    # A TPOT breach comes from load: one more pod may fix it. If that pod, once it could show,
    # did not lower the P99, no pod will (the breach is reported, not chased).
    tpot_pod_p99, tpot_futile = (
        (state.tpot_pod_p99, state.tpot_futile) if tpot_breached else (None, False)
    )
    if tpot_breached and settled and tpot_pod_p99 is not None:
        tpot = float(obs.p99_tpot_seconds)  # type: ignore[arg-type]
        tpot_futile = tpot_futile or tpot > (1 - TPOT_GAIN) * tpot_pod_p99
    return _Facts(
        batch=batch,
        replicas=replicas,
        queue=queue,
        queue_long=queue_long,
        cap_binds=cap_binds,
        ttft_breached=ttft_breached,
        tpot_breached=tpot_breached,
        slo_breached=slo_breached,
        kv_full=_above(obs.kv_usage, p.kv_usage_ceiling),
        recently_lowered=recently_lowered,
        settled=settled,
        reversal_shown=_quiet_since(state.last_replica_change, now, _showing_s(p)),
        tpot_bound=tpot_bound,
        queued_since=queued_since,
        queue_lasts=queued_since is not None and now - queued_since >= p.scale_up_window_s,
        breached_since=breached_since,
        saturated_since=saturated_since,
        saturated=saturated,
        waiting_since=waiting_since,
        teaches=saturated
        and _teaches(state, waiting_since, obs, p, now, ttft_breached=ttft_breached),
        budget_spent=budget_spent,
        budget_recovering=budget_recovering,
        burst_at=burst_at,
        in_place=in_place,
        utilization=p.utilization(budget_spent=budget_spent),
        pods_left=not state.tpot_futile and state.replicas < p.replicas_max,
        tpot_pod_p99=tpot_pod_p99,
        tpot_futile=tpot_futile,
        at_floor=tpot_breached and batch <= p.batch_floor and not recently_lowered,
    )


def _teaches(
    state: LoopState,
    waiting_since: float | None,
    obs: Observation,
    p: LawParams,
    now: float,
    *,
    ttft_breached: bool,
) -> bool:
    """Whether a saturated window's completions may teach μ. Never within the law's first SLO
    window: the pods' counters of a new service, or of the fleet the law found, cover only part
    of it, and the rate over the window reads what they served over the whole of it. Then,
    without a profile, always. Against one, when requests waited at every tick of the SLO window
    the rates cover (the pods were busy all of it, and served what they can), or when the window
    broke a TTFT or E2E SLO and the misses have spent the error budget (pods cannot keep up
    within the SLOs at this rate). A breach the budget absorbs is what the budget is for: its
    window reads the arrivals, served within the SLOs for the rest of the hour, below what a pod
    can do."""
    if state.started_at is None or now - state.started_at < p.slo_window_s:
        return False
    waited_throughout = waiting_since is not None and now - waiting_since >= p.slo_window_s
    overloaded = ttft_breached or _above(obs.p99_seconds, p.slo_e2e_s)
    return (
        p.capacity_prior is None
        or waited_throughout
        or (overloaded and _budget_broken_by_waits(obs, p))
    )


def _budget_broken_by_waits(obs: Observation, p: LawParams) -> bool:
    """A P99 of TTFT or E2E over the budget window breaks its SLO: over 1 % of the window's
    requests waited or ran too long (what a fleet too small costs; TPOT is the batch's)."""
    return _above(obs.budget_p99_ttft_seconds, p.slo_ttft_s) or _above(
        obs.budget_p99_seconds, p.slo_e2e_s
    )


@dataclass(frozen=True)
class _BatchStep:
    batch: int
    direction: int
    run: int
    why: str


def _batch_rule(state: LoopState, f: _Facts, obs: Observation, p: LawParams) -> _BatchStep:
    """The batch rests at its cap, min(B_max, B_mem): below it a pod queues what it could run.
    A TPOT breach at the cap asks for a pod first (the replica rule); only once pods cannot fix
    it (one more did not lower the P99, or the fleet is at its most) does the guard step the
    batch down, η per window: the windowed P99 still holds the old batch until then, or the
    batch would climb straight back into the breach. Back at the cap once TPOT is within its
    SLO and the window has seen the last decrease."""
    batch, direction, why = f.batch, 0, ""
    if f.tpot_breached and f.cap_binds and f.pods_left:
        why = "P99 TPOT above SLO at the cap: a pod first"
    elif f.tpot_breached and f.cap_binds and not f.recently_lowered:
        direction = -1
        why = (
            f"P99 TPOT {obs.p99_tpot_seconds:.3f}s > SLO {p.slo_tpot_s:g}s at the cap, and pods "
            "did not fix it"
        )
    elif f.tpot_breached and f.cap_binds:
        why = "P99 TPOT above SLO, waiting for the last step to show"
    elif f.tpot_breached:
        why = "P99 TPOT above SLO below the cap: step time comes from load, not from the batch"
    elif f.kv_full:
        why = f"KV usage {obs.kv_usage:.0%} > ceiling {p.kv_usage_ceiling:.0%}: pods at their cap"
    elif f.recently_lowered:
        why = "the batch was lowered for TPOT within the window"
    elif batch < p.batch_cap:
        direction = 1
        why = "TPOT within its SLO: the batch rests at its cap"
    if direction == 0:
        return _BatchStep(batch, 0, 0, why)
    run = state.batch_run + 1 if direction == state.batch_direction else 1
    new_batch = p.clip_batch(batch - p.batch_step if direction < 0 else p.batch_cap)
    if new_batch == batch:
        return _BatchStep(batch, 0, 0, f"{why}; batch at its floor {batch}")
    return _BatchStep(new_batch, direction, run, why)


def _capacity_per_replica(batch: int, obs: Observation, p: LawParams) -> float:
    """Sequences one pod can run: the batch, or fewer when the KV cache binds first."""
    capacity = float(batch)
    kv, running = float(obs.kv_usage), float(obs.running_per_replica)  # type: ignore[arg-type]
    if kv > 0.05 and running > 0:
        # A pod holds what memory allows (judged by the fullest pod's usage).
        capacity = min(capacity, running * p.kv_usage_ceiling / kv)
    return max(capacity, 1.0)


def _pods(load: float, p: LawParams) -> int:
    """⌈load⌉ pods; a load past the fleet's maximum is the maximum (a rate near zero would ask
    for more pods than a float holds)."""
    return math.ceil(min(load, p.replicas_max + 1.0) - 1e-9)


@dataclass(frozen=True)
class _Belief:
    """μ as the law believes it this tick (`_believed_rate`)."""

    rate: float | None  # requests/s one pod serves
    at: float | None  # when what it rests on was learnt (None: the profile as it is)
    source: str | None  # "profile" or "observed"
    ratio: float | None  # observed ÷ the profile's capacity (None: no profile, or not learnt)


@dataclass(frozen=True)
class _Demand:
    replicas: int  # R*
    text: str
    belief: _Belief


def _fresher(rate: float | None, at: float | None, sample: float, p: LawParams, now: float) -> bool:
    """Whether `sample` replaces a learnt rate: it is higher, or the rate is a budget window old
    (what a pod could do an hour ago gives way to what it does now)."""
    return rate is None or sample > rate or at is None or now - at >= p.budget_window_s


def _believed_rate(state: LoopState, p: LawParams, sample: float | None, now: float) -> _Belief:
    """μ, what it rests on, and when that was learnt.

    A rate in requests/s belongs to the mix it was measured on: by the profile a pod serves 16
    requests/s of the ServeGen day's night-time prompts and 23 of its shorter midday ones. So
    with the step profile's capacity for this tick's mix (`capacity_prior`), μ is that
    capacity times a ratio: what a saturated pod served ÷ the profile's capacity for the mix it
    served, higher ratios replacing lower ones until one is a budget window old. A ratio no pod
    has shown for a budget window gives way to the profile again (a fleet sized by a low ratio
    never saturates to correct it). Until a pod saturates, μ is the profile's figure, or what
    pods served within the SLOs when that is more.

    Without a profile (none given), μ is the best rate a saturated pod has shown, in
    requests/s, until it is a budget window old. A state from before the profile (a rate
    without a source) was observed."""
    prior = p.capacity_prior
    if prior is None:
        rate, at = state.service_rate, state.service_rate_at
        if state.capacity_source == "profile":
            rate, at = None, None  # the profile's figure, for a mix no longer known
        if sample is not None and _fresher(rate, at, sample, p, now):
            rate, at = sample, now
        # A ratio learnt against the profile waits, unused, for a tick that knows the mix.
        return _Belief(rate, at, None if rate is None else "observed", state.capacity_ratio)
    ratio, at = state.capacity_ratio, state.service_rate_at
    if sample is not None and _fresher(ratio, at, sample / prior, p, now):
        ratio, at = sample / prior, now
    elif at is not None and now - at >= p.budget_window_s:
        ratio, at = None, None  # no pod has shown it for a budget window: the profile again
    if ratio is None and _known(state.proven_rate) and state.proven_rate > prior:  # type: ignore[operator]
        # Pods have served more within the SLOs than the model says they can: a pod that
        # never saturates would otherwise never correct a prior that reads low.
        ratio, at = state.proven_rate / prior, state.proven_rate_at  # type: ignore[operator]
    if ratio is None:
        return _Belief(prior, None, "profile", None)
    return _Belief(ratio * prior, at, "observed", ratio)


def _demand(
    capacity: float,
    obs: Observation,
    p: LawParams,
    state: LoopState,
    *,
    utilization: float,
    saturated: bool,
    teaches: bool,
    now: float,
) -> _Demand:
    """R* from two limits of a pod, whichever needs more pods:
    - slots (Little's law on the gauges): running + waiting over ρ · capacity;
    - throughput: arrivals (completions + refusals, plus a backlog drained within one SLO
      window) over ρ · μ, with μ the requests/s a pod serves: the profile's prior, then what a
      compute-saturated pod (a queue with free batch slots) has shown, measured then and
      remembered (`_believed_rate`).
      Prefill-heavy mixes saturate a pod's compute long before its batch slots fill; only this
      term sees them, and it keeps a scale-down from undoing what a burst taught."""
    ready, reporting = obs.ready_replicas, obs.reporting
    running, queue = float(obs.running_per_replica), float(obs.queue_per_replica)  # type: ignore[arg-type]
    # A ready pod whose scrape failed is counted as full: the queue must not look short exactly
    # when a pod is overloaded.
    sequences = (running + queue) * reporting + (ready - reporting) * capacity
    by_slots = _pods(sequences / (utilization * capacity), p)
    text = f"demand {sequences:.0f} seqs, {capacity:.0f}/pod at ρ {utilization:g}"
    finished = float(obs.finished_per_s)  # type: ignore[arg-type]
    # The windowed rate of a pod that saturated partway through the window reads low: keep the
    # best rate a saturated pod has shown (a mix that got slower saturates pods sooner, and the
    # TTFT rule adds pods for it) until it is a budget window old.
    sample = finished / ready if teaches and finished > 0 else None
    belief = _believed_rate(state, p, sample, now)
    rate = belief.rate
    if finished <= 0 or rate is None or rate < MIN_RATE:
        return _Demand(by_slots, text, belief)
    backlog = queue * reporting / p.slo_window_s if saturated else 0.0
    arrivals = finished + float(obs.rejected_per_s) + backlog  # type: ignore[arg-type]
    by_rate = _pods(arrivals / (utilization * rate), p)
    if by_rate <= by_slots:
        return _Demand(by_slots, text, belief)
    text = f"{arrivals:.1f} req/s to serve, {rate:.2f}/pod ({belief.source}), ρ {utilization:g}"
    return _Demand(by_rate, text, belief)


#: How much more than the most a pod has served well a scale-down may ask of each pod: a fleet
#: that never ran hot shrinks a step at a time, each step showing what the next may ask.
PROBE_GROWTH = 1.25


def _proven(
    state: LoopState, obs: Observation, p: LawParams, *, breached: bool, now: float
) -> tuple[float | None, float | None, int]:
    """The most requests/s a pod has served with TTFT and TPOT within their SLOs (until it is a
    budget window old), when it was learnt, and the fewest pods that serve the current arrivals
    at `PROBE_GROWTH` times that rate. A scale-down goes below it only once it has held the
    fleet for a budget window (`_floor`): fewer pods would each serve more than any pod has been
    seen to serve well (the slots alone say a pod holds its whole batch cap, which a
    compute-bound pod never reaches)."""
    rate, at = state.proven_rate, state.proven_rate_at
    finished = float(obs.finished_per_s)  # type: ignore[arg-type]
    if finished <= 0:
        return rate, at, 0
    if not breached and _fresher(rate, at, finished / obs.ready_replicas, p, now):
        rate, at = finished / obs.ready_replicas, now
    if rate is None or rate < MIN_RATE:
        return rate, at, 0
    arrivals = finished + float(obs.rejected_per_s)  # type: ignore[arg-type]
    return rate, at, _pods(arrivals / (PROBE_GROWTH * rate), p)


def _fleet_in_place(state: LoopState, obs: Observation, p: LawParams, now: float) -> bool:
    """Every pod the law asked for is ready, none starting, and the law has had a pod start and
    an SLO window since its first tick and its last replica change: misses before that (pods
    still starting, a warm start too small, the law's own scale-down, which a pod start would
    undo) are the law's, and say nothing of the traffic."""
    settled_for = p.pod_start_s + p.slo_window_s
    return (
        obs.ready_replicas >= p.clip_replicas(state.replicas)
        and not obs.pending_replicas
        and not obs.stalled_replicas
        and state.started_at is not None
        and now - state.started_at >= settled_for
        and _quiet_since(state.last_replica_change, now, settled_for)
    )


def _burst_at(
    state: LoopState, p: LawParams, *, slo_breached: bool, in_place: bool, now: float
) -> float | None:
    """When the traffic last outran the fleet the law had asked for: a windowed P99 above its SLO
    with that fleet in place, or within a pod start (and the windows that show it) of demand
    outgrowing it. Without `forgive_own_misses` every breach counts."""
    outran = state.outrun_at is not None and now - state.outrun_at < (
        p.pod_start_s + p.slo_window_s + p.scale_up_window_s
    )
    if slo_breached and (in_place or outran or not p.forgive_own_misses):
        return now
    return state.burst_at


def _error_budget(
    was_spent: bool, obs: Observation, p: LawParams, *, burst: bool
) -> tuple[bool, bool]:
    """Whether the error budget is spent, and whether only because half of it is not back yet.
    Spent once a P99 over the budget window breaks its SLO (over 1 % of requests missed) and the
    traffic has outrun the fleet the law asked for within that window (`burst`: the misses are
    the traffic's, and will come again); a budget the law's own shortfall broke is not spent.
    Hysteresis: kept again only once every P99.5 is within its SLO (half the budget left), or
    once the last burst is a budget window old (the headroom decays with its evidence). Without
    the margin ρ flips back to the target with no budget left for the next burst, and a burst
    caught at that ρ spends it many times over. A budget window without a request (no P99.5 at
    all) missed nothing: an idle service gets its budget back."""
    if not burst:
        return False, False
    if _budget_broken_by_waits(obs, p) or _above(obs.budget_p99_tpot_seconds, p.slo_tpot_s):
        return True, False
    slos = (p.slo_ttft_s, p.slo_tpot_s, p.slo_e2e_s)
    p995s = (obs.budget_p995_ttft_seconds, obs.budget_p995_tpot_seconds, obs.budget_p995_seconds)
    budget_window = (obs.budget_p99_ttft_seconds, obs.budget_p99_tpot_seconds, *p995s)
    empty = not any(_known(value) for value in budget_window)
    within = not any(_above(value, slo) for value, slo in zip(p995s, slos, strict=True))
    half_back = empty or (_known(obs.budget_p995_ttft_seconds) and within)
    recovering = was_spent and not half_back
    return recovering, recovering


def _fresh_memory(state: LoopState, p: LawParams) -> tuple[LoopState, list[str]]:
    """The state with what it learnt forgotten when the model, the GPU or the SLOs changed (a
    state that predates the key adopts it)."""
    if state.learned_for in (None, p.learned_key):
        return replace(state, learned_for=p.learned_key), []
    forgotten = replace(
        state,
        service_rate=None,
        service_rate_at=None,
        capacity_source=None,
        capacity_ratio=None,
        proven_rate=None,
        proven_rate_at=None,
        budget_spent=False,
        burst_at=None,
        outrun_at=None,
        tpot_pod_p99=None,
        tpot_futile=False,
        floor_since=None,
        learned_for=p.learned_key,
    )
    return forgotten, ["the model, GPU or SLOs changed: the learnt rates start afresh"]


@dataclass(frozen=True)
class _ReplicaStep:
    replicas: int
    desired: int  # R*, what demand asks for
    why: str  # why the replicas change; empty when they hold
    demand: _Demand
    notes: list[str]
    memory: LoopState  # the state with the replica rule's memory brought up to this tick


def _windows(
    state: LoopState, desired: int, floor: int, replicas: int, now: float
) -> tuple[float | None, int | None, float | None, int | None]:
    """(up_since, up_target, down_since, down_target): the smallest ask while demand keeps asking
    for more (a spike must persist), the largest while it keeps asking for fewer (the stabilized
    scale-down), never below what pods have served well; a new episode starts afresh."""
    if desired > replicas:
        target = desired if state.up_since is None else min(desired, state.up_target or desired)
        return _since(state.up_since, now), max(target, replicas + 1), None, None
    ask = max(desired, floor)
    if ask < replicas:
        target = ask if state.down_since is None else max(ask, state.down_target or ask)
        return None, None, _since(state.down_since, now), min(target, replicas - 1)
    return None, None, None, None


def _floor(
    state: LoopState,
    f: _Facts,
    obs: Observation,
    p: LawParams,
    desired: int,
    belief: _Belief,
    now: float,
) -> tuple[float | None, float | None, int, float | None]:
    """The proven rate, when it was learnt, the fewest pods that serve today's arrivals at it
    (`_proven`), and since when that floor alone has held a scale-down: once it has held the
    fleet for a budget window it yields a pod. It stays beside a μ observed on saturated pods
    (the throughput term's): without it the law served 3.7 points less on the code trace at
    tight SLOs (docs/control-law.md), where the rate pods serve within the SLOs is below the
    rate they serve saturated. While μ is the step profile's own figure (no saturated pod has
    read it otherwise) the profile already prices what a pod serves within the SLOs for today's
    mix, and the floor stands aside: a proven rate renewed an hour on is the arrivals split
    over the pods in place, and at four pods or fewer that rate × 1.25 forbids every
    scale-down, so the floor would hold the fleet it was learnt on (the ServeGen day's nights:
    two pods for hours where one served)."""
    rate, at, floor = _proven(state, obs, p, breached=f.ttft_breached or f.tpot_breached, now=now)
    if not p.proven_floor or belief.source == "profile":
        floor = 0
    since = _since(state.floor_since, now) if desired < f.replicas <= floor else None
    if since is not None and now - since >= p.budget_window_s:
        floor = f.replicas - 1
    return rate, at, floor, since


def _replica_rule(
    state: LoopState, f: _Facts, step: _BatchStep, obs: Observation, p: LawParams, now: float
) -> _ReplicaStep:
    """R* from demand at the batch the pods are heading for (the cap, unless TPOT has bound
    it): up once R* > R has held the scale-up window, one pod for a breach demand does not
    explain, down to the window's largest ask once R* < R has held the scale-down window."""
    replicas = f.replicas
    capacity = _capacity_per_replica(step.batch if f.tpot_bound else p.batch_cap, obs, p)
    demand = _demand(
        capacity,
        obs,
        p,
        state,
        utilization=f.utilization,
        saturated=f.saturated,
        teaches=f.teaches,
        now=now,
    )
    # A pod pending past its pod start is not on its way: it is no capacity, and its place in
    # the Deployment's count is asked for again.
    desired = p.clip_replicas(demand.replicas + obs.stalled_replicas)
    proven_rate, proven_at, floor, floor_since = _floor(
        state, f, obs, p, desired, demand.belief, now
    )
    tpot_pod = f.tpot_breached and not f.tpot_unattainable
    # Breaches more pods or a smaller batch may fix block a scale-down: TTFT while requests
    # queue (without a queue it comes from prefill, not from the fleet's size); TPOT while the
    # batch steps down at the cap, or below it while a pod may be tried or the one tried helped.
    tried = f.tpot_pod_p99 is not None or desired >= replicas
    fixable_breach = (f.ttft_breached and f.queueing) or (tpot_pod and (f.cap_binds or tried))
    up_since, up_target, down_since, down_target = _windows(state, desired, floor, replicas, now)

    new_replicas, why, tpot_pod_p99 = replicas, "", f.tpot_pod_p99
    if up_since is not None and up_target is not None and now - up_since >= p.scale_up_window_s:
        new_replicas = min(up_target, replicas + p.replicas_max_step)
        why = f"R* {desired} > {replicas} ({demand.text})"
    elif (
        ((f.ttft_breached and f.queue_lasts) or tpot_pod)
        and desired >= replicas
        and f.settled  # a lagging signal (windowed P99) asks again once the last step could show
        and f.reversal_shown  # nor reverses a scale-down before the window could see its fleet
        and not obs.pending_replicas  # pods on their way are the answer already
        and replicas < p.replicas_max
    ):
        new_replicas = replicas + 1
        if f.ttft_breached and f.queue_lasts:
            why = (
                f"P99 TTFT {obs.p99_ttft_seconds:.2f}s > SLO {p.slo_ttft_s:g}s with a lasting queue"
            )
        else:
            tpot_pod_p99 = obs.p99_tpot_seconds
            why = f"P99 TPOT {tpot_pod_p99:.3f}s > SLO {p.slo_tpot_s:g}s: one more pod"
    elif (
        down_since is not None
        and down_target is not None
        and now - down_since >= p.scale_down_window_s
        and not fixable_breach
        and step.direction == 0
    ):
        # Straight to the largest ask of the window: it already is the stabilized answer.
        new_replicas = down_target
        why = f"R* ≤ {down_target} < {replicas} for {p.scale_down_window_s:g}s ({demand.text})"
    new_replicas = p.clip_replicas(new_replicas)
    notes = _replica_notes(obs, p, desired, replicas, new_replicas, floor, proven_rate)
    memory = _replica_memory(
        state,
        f,
        demand,
        now,
        new_replicas,
        windows=(up_since, up_target, down_since, down_target),
        proven=(proven_rate, proven_at, floor_since),
        tpot_pod_p99=tpot_pod_p99,
    )
    return _ReplicaStep(new_replicas, desired, why, demand, notes, memory)


def _replica_notes(
    obs: Observation,
    p: LawParams,
    desired: int,
    replicas: int,
    new_replicas: int,
    floor: int,
    proven_rate: float | None,
) -> list[str]:
    """What the replica rule's reason adds: the floor that holds a scale-down, the pods still
    starting that a scale-up counts, the stalled pods that count as none."""
    notes = []
    if desired < replicas <= floor:
        notes.append(
            f"{floor} pod(s) floor: fewer would each serve over {PROBE_GROWTH:g} × the "
            f"{proven_rate:.2f} req/s a pod has served within the SLOs"
        )
    if obs.pending_replicas and new_replicas > replicas:
        notes.append(f"{obs.pending_replicas} pod(s) still starting count as capacity")
    if obs.stalled_replicas:
        notes.append(
            f"{obs.stalled_replicas} pod(s) pending past the pod start {p.pod_start_s:g}s + "
            f"{STALL_MARGIN_S:g}s count as no capacity"
        )
    return notes


def _replica_memory(
    state: LoopState,
    f: _Facts,
    demand: _Demand,
    now: float,
    new_replicas: int,
    *,
    windows: tuple[float | None, int | None, float | None, int | None],
    proven: tuple[float | None, float | None, float | None],
    tpot_pod_p99: float | None,
) -> LoopState:
    """The state with the replica rule's memory brought up to this tick: `windows` is
    (up_since, up_target, down_since, down_target), `proven` (rate, learnt at, floor since);
    a replica step starts every window, and the floor's hold, afresh."""
    replicas = f.replicas
    up_since, up_target, down_since, down_target = windows
    proven_rate, proven_at, floor_since = proven
    if new_replicas != replicas:
        up_since = up_target = down_since = down_target = floor_since = None
    return replace(
        state,
        replicas=new_replicas,
        up_since=up_since,
        up_target=up_target,
        down_since=down_since,
        down_target=down_target,
        last_scale_up=now if new_replicas > replicas else state.last_scale_up,
        last_replica_change=now if new_replicas != replicas else state.last_replica_change,
        service_rate=demand.belief.rate,
        service_rate_at=demand.belief.at,
        capacity_source=demand.belief.source,
        capacity_ratio=demand.belief.ratio,
        proven_rate=proven_rate,
        proven_rate_at=proven_at,
        saturated_since=f.saturated_since,
        waiting_since=f.waiting_since,
        queued_since=f.queued_since,
        breached_since=f.breached_since,
        budget_spent=f.budget_spent,
        burst_at=f.burst_at,
        outrun_at=now if new_replicas > replicas and f.in_place else state.outrun_at,
        started_at=_since(state.started_at, now),
        tpot_pod_p99=tpot_pod_p99,
        tpot_futile=f.tpot_futile,
        floor_since=floor_since,
    )


def _unattainable(f: _Facts, obs: Observation, p: LawParams) -> str | None:
    """An SLO no batch size or fleet size meets, and why (reported, not chased)."""
    tpot = obs.p99_tpot_seconds
    if f.at_floor:
        return (
            f"P99 TPOT {tpot:.3f}s > SLO {p.slo_tpot_s:g}s at the smallest "
            f"batch {p.batch_floor}: no batch size meets it"
        )
    if f.tpot_futile:
        return (
            f"P99 TPOT {tpot:.3f}s > SLO {p.slo_tpot_s:g}s, and one more pod did "
            "not lower it: no fleet size meets it"
        )
    if p.slo_e2e_s is not None and _above(obs.p99_service_seconds, p.slo_e2e_s) and not f.queueing:
        return (
            f"P99 service time {obs.p99_service_seconds:.2f}s > E2E SLO {p.slo_e2e_s:g}s without "
            "queueing: output lengths, not the batch, set it"
        )
    return None


def decide(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
    """One tick of the law: the batch rule, then the replica rule, both on one tick's facts."""
    p = params
    batch, replicas = p.clip_batch(state.batch), p.clip_replicas(state.replicas)
    memory_bound = p.batch_mem < p.batch_max
    notes: list[str] = []
    if batch != state.batch:
        notes.append(f"batch clipped to [{p.batch_floor}, {p.batch_cap}]")
    if replicas != state.replicas:
        notes.append(f"replicas clipped to [{p.replicas_floor}, {p.replicas_max}]")
    hold = _hold_reason(obs)
    if hold is not None:
        bound = memory_bound and batch >= p.batch_cap
        return _holding(state, batch, replicas, "; ".join([hold, *notes]), memory_bound=bound)
    state, forgotten = _fresh_memory(state, p)
    f = _facts(state, obs, p, now)
    step = _batch_rule(state, f, obs, p)
    fleet = _replica_rule(state, f, step, obs, p, now)

    parts = []
    if step.batch != batch:
        parts.append(f"batch {batch}→{step.batch} ({step.why})")
    if fleet.replicas != replicas:
        parts.append(f"replicas {replicas}→{fleet.replicas} ({fleet.why})")
    if not parts:
        parts.append(f"hold: {step.why or fleet.demand.text}")
    new_state = replace(
        fleet.memory,
        batch=step.batch,
        batch_direction=step.direction,
        batch_run=step.run,
        last_batch_decrease=now if step.batch < batch else state.last_batch_decrease,
        batch_sla=p.batch_sla,
    )
    return Decision(
        batch_before=state.batch,
        batch=step.batch,
        replicas_before=state.replicas,
        replicas=fleet.replicas,
        reason="; ".join(parts + notes + forgotten + fleet.notes),
        state=new_state,
        slo_breached=f.slo_breached,
        memory_bound=(memory_bound and step.batch >= p.batch_cap) or f.kv_full,
        desired_replicas=fleet.desired,
        unattainable=_unattainable(f, obs, p),
        utilization=f.utilization,
        budget_spent=f.budget_spent,
        budget_recovering=f.budget_recovering,
    )
