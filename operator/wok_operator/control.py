"""The control law: the batch size (the fast knob) and the replica count (the slow knob).

One pure function, `decide`, with no I/O: the operator, the fleet simulator (`wok simulate`) and the
tests all call it. `decide_sign_step` keeps the plain clipped sign-step the law started from, for
comparison.

The batch keeps that clipped sign-step, on what the batch controls:

    B ← clip(B + η · sign(e), B_min, min(B_max, B_mem))

    e < 0  when the P99 time per output token (TPOT) breaks its SLO: a bigger batch makes every step
           slower, so the batch is the knob that fixes it;
    e > 0  when requests queue (Q > Q* + deadband) or the running set nears the cap, and TPOT is
           within its SLO: a bigger batch admits them before pods are added;
    e = 0  otherwise. A KV cache past its ceiling holds the batch: the pod is at its cap (it holds
           what memory allows) and the replicas take the rest. Latency that comes from output
           length (end-to-end time of long answers) never moves the batch.

η doubles while the direction repeats (1, 2, 4, … × η_B, at most the distance to the bound) and
falls back to η_B when it changes or holds, so a cold start reaches its working batch in a few ticks
and a breach is still corrected one step at a time; a decrease waits for the last one to show in
the windowed P99 (the SLO window), and so does a raise after a decrease.

The replicas follow the measured demand (Little's law on the gauges, not on a lagging P99):

    demand   L = running + waiting (requests in the pods; a pod that failed its scrape counts full)
    capacity C = the batch a pod can run: the cap the batch is heading for while TPOT has headroom,
                 the current batch when TPOT binds, fewer when the KV cache binds first
    R*       = ceil(L / (ρ · C))        with ρ = target utilization

and from throughput once a saturated pod has shown its rate μ (`_demand`, `pooled_replicas`). ρ is
the target while the error budget holds, and the breached one, with more headroom, from when a
P99 over the SLO's budget window (an hour) breaks its SLO (the traffic has outrun the fleet
within a pod start before) until every P99.5 over it is within its SLO (half the budget back).

R rises to R* at once (at most `max_step` per tick) once R* > R has held for `scale_up_window`;
pods already starting count as capacity on its way (R includes them), so a scale-up never repeats
while it is still arriving. A TTFT breach while requests queue adds one replica if demand did not
(uneven routing), but only after the last scale-up had a pod start and an SLO window to show.
R falls only when R* < R has held for `scale_down_window`, to the largest R* seen in that window,
with the SLOs met, and never below the pods that serve today's arrivals at the most a pod has
served within its SLOs. Missing metrics hold everything; nothing scales to zero on missing data; the
batch is never above B_mem.
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

    @classmethod
    def from_spec(cls, spec: InferenceServiceSpec, *, batch_mem: int) -> LawParams:
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
        )

    def utilization(self, *, budget_spent: bool) -> float:
        """ρ: the target, or the breached one's headroom while the error budget is spent."""
        if budget_spent and self.breached_utilization is not None:
            return min(self.target_utilization, self.breached_utilization)
        return self.target_utilization

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

    @property
    def reporting(self) -> int:
        """The ready pods behind the per-pod figures."""
        ready = self.ready_replicas
        return ready if self.reporting_replicas is None else min(self.reporting_replicas, ready)


@dataclass(frozen=True)
class LoopState:
    """What the loop remembers between ticks (kept in status, so a restart continues from it)."""

    batch: int
    replicas: int
    batch_direction: int = 0  # the last batch step's sign, for the doubling step
    batch_run: int = 0  # how many steps in a row went that way
    last_batch_decrease: float | None = None
    up_since: float | None = None  # since when demand has asked for more replicas
    up_target: int | None = None  # the smallest ask in that time (a spike must persist)
    down_since: float | None = None  # since when demand has asked for fewer replicas
    down_target: int | None = None  # the largest ask in that time (scale down to it)
    last_scale_up: float | None = None
    last_replica_change: float | None = None
    service_rate: float | None = None  # requests/s a saturated pod completed, last measured
    service_parallelism: float | None = None  # requests a pod served at once at that rate
    proven_rate: float | None = None  # the most requests/s a pod has served within its SLOs
    in_flight: float | None = None  # requests in the pods (running + waiting) at the last tick
    in_flight_at: float | None = None
    saturated_since: float | None = None  # since when pods queue with free batch slots
    queued_since: float | None = None  # since when requests have queued past Q* at every tick
    breached_since: float | None = None  # since when P99 TTFT has been above its SLO at every tick
    budget_spent: bool = False  # the error budget ran out, and half of it is not back yet


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


@dataclass(frozen=True)
class _BatchStep:
    batch: int
    direction: int
    run: int
    why: str


def _showing_s(p: LawParams) -> float:
    """How long a batch step takes to show in the windowed P99."""
    return max(p.scale_up_window_s, p.slo_window_s)


def _cap_binds(batch: int, obs: Observation) -> bool:
    """The batch cap is what limits the running set (else lowering it changes nothing)."""
    running = obs.running_per_replica
    return _known(running) and running >= 0.8 * batch  # type: ignore[operator]


def _batch_step(
    state: LoopState, batch: int, obs: Observation, p: LawParams, now: float
) -> _BatchStep:
    """The sign-step on the batch, with the step doubling while its direction repeats."""
    queue = float(obs.queue_per_replica)  # type: ignore[arg-type]
    tpot_breached = _above(obs.p99_tpot_seconds, p.slo_tpot_s)
    kv_full = _above(obs.kv_usage, p.kv_usage_ceiling)
    # After a TPOT-driven decrease the windowed P99 still holds the old batch: no raise until the
    # window has seen the new one, or the batch would climb straight back into the breach.
    recently_lowered = not _quiet_since(state.last_batch_decrease, now, _showing_s(p))
    direction, why = 0, ""
    if tpot_breached and _cap_binds(batch, obs):
        if _quiet_since(state.last_batch_decrease, now, _showing_s(p)):
            direction = -1
            why = f"P99 TPOT {obs.p99_tpot_seconds:.3f}s > SLO {p.slo_tpot_s:g}s at the cap"
        else:
            why = "P99 TPOT above SLO, waiting for the last step to show"
    elif tpot_breached:
        why = "P99 TPOT above SLO below the cap: step time comes from load, not from the batch"
    elif kv_full:
        why = f"KV usage {obs.kv_usage:.0%} > ceiling {p.kv_usage_ceiling:.0%}: pods at their cap"
    elif (queue > p.target_queue + p.deadband or _cap_binds(batch, obs)) and not recently_lowered:
        # Raise before the cap queues anyone: the batch is the fast knob, pods the slow one.
        direction = 1
        why = (
            f"queue {queue:.1f}/replica > {p.target_queue:g}±{p.deadband:g}"
            if queue > p.target_queue + p.deadband
            else f"running {obs.running_per_replica:.0f}/replica near the cap {batch}"
        )
    elif queue > p.target_queue + p.deadband or _cap_binds(batch, obs):
        why = "the cap binds, but the batch was lowered for TPOT within the window"
    if direction == 0:
        return _BatchStep(batch, 0, 0, why)
    run = state.batch_run + 1 if direction == state.batch_direction else 1
    # Down steps stay η: each waits for the windowed P99 anyway. Up steps double while they repeat.
    step = p.batch_step if direction < 0 else p.batch_step * 2 ** min(run - 1, 10)
    new_batch = p.clip_batch(batch + direction * step)
    if new_batch == batch:
        bound = "cap" if direction > 0 else "floor"
        return _BatchStep(batch, 0, 0, f"{why}; batch at its {bound} {batch}")
    return _BatchStep(new_batch, direction, run, why)


def _capacity_per_replica(batch: int, obs: Observation, p: LawParams) -> float:
    """Sequences one pod can run: the batch, or fewer when the KV cache binds first."""
    capacity = float(batch)
    if (
        _known(obs.kv_usage)
        and obs.kv_usage > 0.05  # type: ignore[operator]
        and _known(obs.running_per_replica)
        and obs.running_per_replica > 0  # type: ignore[operator]
    ):
        # A pod holds what memory allows (judged by the fullest pod's usage).
        by_memory = obs.running_per_replica * p.kv_usage_ceiling / obs.kv_usage  # type: ignore[operator]
        capacity = min(capacity, by_memory)
    return max(capacity, 1.0)


def _in_flight(obs: Observation) -> float | None:
    """Requests in the reporting pods (running + waiting), or None when either is unknown."""
    if not _known(obs.running_per_replica) or not _known(obs.queue_per_replica):
        return None
    return (obs.running_per_replica + obs.queue_per_replica) * obs.reporting  # type: ignore[operator]


@dataclass(frozen=True)
class _Demand:
    replicas: int  # R*
    text: str
    service_rate: float | None  # requests/s one pod completes when saturated, last measured
    service_parallelism: float | None  # the requests a pod served at once when μ was measured


def pooled_replicas(load: float, utilization: float, parallelism: float | None) -> float:
    """Pods for `load` pods' worth of work (λ/μ), with the headroom queueing needs.
    `utilization` is the target for a pod that serves one request's bottleneck at a time (a
    prefill pipeline): headroom load·(1/ρ − 1). A pod that serves N requests at once (N batch
    slots bind) is N servers, and a pool of N servers needs 1/√N of that headroom for the same
    chance of queueing (the square-root staffing rule), so a decode-bound pod runs near full."""
    servers = max(1.0, parallelism or 1.0)
    return load + load * (1.0 / utilization - 1.0) / math.sqrt(servers)


def _demand(
    capacity: float,
    obs: Observation,
    p: LawParams,
    *,
    utilization: float,
    saturated: bool,
    cap_binds: bool,
    service_rate: float | None,
    service_parallelism: float | None,
    growth: float,
) -> _Demand:
    """R* from two limits of a pod, whichever needs more pods:
    - slots (Little's law on the gauges): running + waiting over ρ · capacity;
    - throughput: arrivals (completions + refusals + the growth of the requests in flight since
      the last tick, plus a backlog drained within one SLO window) over ρ · μ, with μ the
      requests/s a pod completes when compute-saturated (a queue with free batch slots),
      measured then and remembered.
      Prefill-heavy mixes saturate a pod's compute long before its batch slots fill; only this
      term sees them, and it keeps a scale-down from undoing what a burst taught. Its headroom
      follows how many requests a pod served at once when μ was measured (`pooled_replicas`)."""
    ready, reporting = obs.ready_replicas, obs.reporting
    running = obs.running_per_replica if _known(obs.running_per_replica) else 0.0
    queue = float(obs.queue_per_replica)  # type: ignore[arg-type]
    # A ready pod whose scrape failed is counted as full: the queue must not look short exactly
    # when a pod is overloaded.
    sequences = (running + queue) * reporting + (ready - reporting) * capacity  # type: ignore[operator]
    by_slots = math.ceil(sequences / (utilization * capacity) - 1e-9)
    text = f"demand {sequences:.0f} seqs, {capacity:.0f}/pod at ρ {utilization:g}"
    finished = obs.finished_per_s
    if not _known(finished) or finished <= 0:  # type: ignore[operator]
        return _Demand(by_slots, text, service_rate, service_parallelism)

    if saturated:
        # The windowed rate of a pod that saturated partway through the window reads low: keep
        # the best rate a saturated pod has shown (a mix that got slower saturates pods sooner,
        # and the TTFT rule adds pods for it).
        sample = finished / ready  # type: ignore[operator]
        if service_rate is None or sample > service_rate:
            service_rate = sample
            # Batch slots that bind make the running set the pod's servers; free slots mean a
            # serial bottleneck (prefill, the step's token budget) held it: one server.
            service_parallelism = running if cap_binds else 1.0
    if service_rate is None or service_rate <= 0:
        return _Demand(by_slots, text, service_rate, service_parallelism)
    rejected = obs.rejected_per_s if _known(obs.rejected_per_s) else 0.0
    backlog = queue * reporting / p.slo_window_s if saturated else 0.0
    # Completions and refusals are rates over the SLO window and lag a burst; the growth of the
    # requests in flight is the tick's own view of the arrivals they have not caught up with.
    arrivals = finished + rejected + backlog + growth  # type: ignore[operator]
    pods = pooled_replicas(arrivals / service_rate, utilization, service_parallelism)
    by_rate = math.ceil(pods - 1e-9)
    if by_rate <= by_slots:
        return _Demand(by_slots, text, service_rate, service_parallelism)
    return _Demand(
        by_rate,
        f"{arrivals:.1f} req/s to serve, {service_rate:.2f}/pod when saturated serving "
        f"{service_parallelism or 1:.0f} at once, ρ {utilization:g}",
        service_rate,
        service_parallelism,
    )


#: How much more than the most a pod has served well a scale-down may ask of each pod: a fleet
#: that never ran hot shrinks a step at a time, each step showing what the next may ask.
PROBE_GROWTH = 1.25


def _proven(rate: float | None, obs: Observation, *, breached: bool) -> tuple[float | None, int]:
    """The most requests/s a pod has served with TTFT and TPOT within their SLOs, and the fewest
    pods that serve the current arrivals at `PROBE_GROWTH` times that rate. A scale-down never
    goes below it: fewer pods would each serve more than any pod has been seen to serve well (the
    slots alone say a pod holds its whole batch cap, which a compute-bound pod never reaches)."""
    finished = obs.finished_per_s
    if not _known(finished) or finished <= 0:  # type: ignore[operator]
        return rate, 0
    if not breached:
        sample = finished / obs.ready_replicas  # type: ignore[operator]
        rate = sample if rate is None else max(rate, sample)
    if rate is None or rate <= 0:
        return rate, 0
    rejected = obs.rejected_per_s if _known(obs.rejected_per_s) else 0.0
    return rate, math.ceil((finished + rejected) / (PROBE_GROWTH * rate) - 1e-9)  # type: ignore[operator]


def _error_budget(was_spent: bool, obs: Observation, p: LawParams) -> tuple[bool, bool]:
    """Whether the error budget is spent, and whether only because half of it is not back yet.
    Hysteresis: spent once a P99 over the budget window breaks its SLO (over 1 % of requests
    missed), kept again only once every P99.5 is within its SLO (half the budget left). Without
    the margin ρ flips back to the target with no budget left for the next burst, and a burst
    caught at that ρ spends it many times over."""
    if (
        _above(obs.budget_p99_ttft_seconds, p.slo_ttft_s)
        or _above(obs.budget_p99_tpot_seconds, p.slo_tpot_s)
        or _above(obs.budget_p99_seconds, p.slo_e2e_s)
    ):
        return True, False
    half_back = (
        _known(obs.budget_p995_ttft_seconds)
        and obs.budget_p995_ttft_seconds <= p.slo_ttft_s  # type: ignore[operator]
        and not _above(obs.budget_p995_tpot_seconds, p.slo_tpot_s)
        and not _above(obs.budget_p995_seconds, p.slo_e2e_s)
    )
    recovering = was_spent and not half_back
    return recovering, recovering


def decide(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
    """One tick of the law: the next batch size and replica count, and why."""
    p = params
    batch = p.clip_batch(state.batch)
    replicas = p.clip_replicas(state.replicas)
    memory_bound = p.batch_mem < p.batch_max
    notes: list[str] = []
    if batch != state.batch:
        notes.append(f"batch clipped to [{p.batch_floor}, {p.batch_cap}]")
    if replicas != state.replicas:
        notes.append(f"replicas clipped to [{p.replicas_floor}, {p.replicas_max}]")
    if not _known(obs.queue_per_replica) or obs.ready_replicas < 1 or obs.reporting_replicas == 0:
        why = "no ready replicas" if obs.ready_replicas < 1 else "queue metric missing"
        return _holding(
            state,
            batch,
            replicas,
            "; ".join([why, *notes]),
            memory_bound=memory_bound and batch >= p.batch_cap,
        )

    step = _batch_step(state, batch, obs, p, now)
    # The batch is the fast knob: size the fleet for the batch it can reach within its TPOT SLO,
    # the cap, unless TPOT has bound it (now, or within the window since it was lowered).
    tpot_bound = _above(obs.p99_tpot_seconds, p.slo_tpot_s) or not _quiet_since(
        state.last_batch_decrease, now, _showing_s(p)
    )
    heading = step.batch if tpot_bound else p.batch_cap
    in_flight = _in_flight(obs)
    growth = 0.0
    last, last_at = state.in_flight, state.in_flight_at
    if in_flight is not None and last is not None and last_at is not None and now > last_at:
        growth = max(0.0, in_flight - last) / (now - last_at)
    capacity = _capacity_per_replica(heading, obs, p)
    # Saturated: requests have queued for a while although the pods have free batch slots
    # (prefill, the step's token budget or KV hold them back), or behind a cap that can rise no
    # further (the memory cap, or TPOT binds it). A passing queue is noise: the completions then
    # are the arrivals, not what a pod can do. A queue behind a cap that can still rise is the
    # batch's to fix, and a rate measured there says nothing of a larger batch.
    queue_long = obs.queue_per_replica > p.target_queue + p.deadband  # type: ignore[operator]
    final_cap = batch >= p.batch_cap or tpot_bound
    saturated_since = None
    if queue_long and (final_cap or not _cap_binds(batch, obs)):
        saturated_since = _since(state.saturated_since, now)
    ttft_breached = _above(obs.p99_ttft_seconds, p.slo_ttft_s)
    queueing = obs.queue_per_replica > 0  # type: ignore[operator]
    breached_since = _since(state.breached_since, now) if ttft_breached else None
    # A TTFT breach that outlasts a window's memory of one spike, while requests still wait behind
    # free batch slots, is a pod at what it can serve within the SLO: long prompts wait for their
    # prefill, few but heavy, and never make the queue long. Its completions teach μ too.
    slo_bound = (
        breached_since is not None
        and now - breached_since >= p.slo_window_s + p.scale_up_window_s
        and queueing
        and not _cap_binds(batch, obs)
    )
    saturated = slo_bound or (
        saturated_since is not None and now - saturated_since >= p.scale_up_window_s
    )
    budget_spent, budget_recovering = _error_budget(state.budget_spent, obs, p)
    utilization = p.utilization(budget_spent=budget_spent)
    demand = _demand(
        capacity,
        obs,
        p,
        utilization=utilization,
        saturated=saturated,
        cap_binds=_cap_binds(batch, obs),
        service_rate=state.service_rate,
        service_parallelism=state.service_parallelism,
        growth=growth,
    )
    desired = p.clip_replicas(demand.replicas)
    tpot_breached = _above(obs.p99_tpot_seconds, p.slo_tpot_s)
    proven_rate, proven_floor = _proven(
        state.proven_rate, obs, breached=ttft_breached or tpot_breached
    )
    # The windowed P99 remembers a spike for a window after its queue drained: only a queue past
    # Q* that lasts says the fleet is short now (a pod added for a spike gone arrives idle).
    queued_since = _since(state.queued_since, now) if queue_long else None
    queue_lasts = queued_since is not None and now - queued_since >= p.scale_up_window_s
    # Latency breaches that no batch step can fix: queueing (TTFT) or step time from load (TPOT
    # below the cap). One more pod, once the last one could show in the windowed P99.
    lagging_breach = (ttft_breached and queue_lasts) or (
        tpot_breached and not _cap_binds(batch, obs)
    )

    # The smallest ask while demand keeps asking for more (a spike must persist), the largest
    # while it keeps asking for fewer (the stabilized scale-down); a new episode starts afresh.
    up_since = up_target = down_since = down_target = None
    if desired > replicas:
        up_since = _since(state.up_since, now)
        up_target = desired if state.up_since is None else min(desired, state.up_target or desired)
        up_target = max(up_target, replicas + 1)
    elif max(desired, proven_floor) < replicas:
        down_ask = max(desired, proven_floor)  # never below what pods have served well
        down_since = _since(state.down_since, now)
        down_target = (
            down_ask if state.down_since is None else max(down_ask, state.down_target or down_ask)
        )
        down_target = min(down_target, replicas - 1)

    new_replicas, replicas_why = replicas, ""
    # A lagging signal (windowed P99) may ask again only once the last step could show in it.
    settled = _quiet_since(state.last_scale_up, now, p.pod_start_s + p.slo_window_s)
    if up_since is not None and up_target is not None and now - up_since >= p.scale_up_window_s:
        new_replicas = min(up_target, replicas + p.replicas_max_step)
        replicas_why = f"R* {desired} > {replicas} ({demand.text})"
    elif (
        lagging_breach
        and settled
        and not obs.pending_replicas  # pods on their way are the answer already
        and replicas < p.replicas_max
        and desired >= replicas
    ):
        new_replicas = replicas + 1
        replicas_why = (
            f"P99 TTFT {obs.p99_ttft_seconds:.2f}s > SLO {p.slo_ttft_s:g}s with a lasting queue"
            if ttft_breached and queue_lasts
            else f"P99 TPOT {obs.p99_tpot_seconds:.3f}s > SLO {p.slo_tpot_s:g}s below the cap"
        )
    elif (
        down_since is not None
        and down_target is not None
        and now - down_since >= p.scale_down_window_s
        and not (ttft_breached or tpot_breached)
        and step.direction == 0
    ):
        # Straight to the largest ask of the window: it already is the stabilized answer.
        new_replicas = down_target
        replicas_why = (
            f"R* ≤ {down_target} < {replicas} for {p.scale_down_window_s:g}s ({demand.text})"
        )
    new_replicas = p.clip_replicas(new_replicas)
    if desired < replicas <= proven_floor:
        notes.append(
            f"{proven_floor} pod(s) floor: fewer would each serve over {PROBE_GROWTH:g} × the "
            f"{proven_rate:.2f} req/s a pod has served within the SLOs"
        )
    if new_replicas != replicas:
        up_since = up_target = down_since = down_target = None
    if obs.pending_replicas and new_replicas > replicas:
        notes.append(f"{obs.pending_replicas} pod(s) still starting count as capacity")

    unattainable = None
    if (
        tpot_breached
        and batch <= p.batch_floor
        and _quiet_since(state.last_batch_decrease, now, _showing_s(p))
    ):
        unattainable = (
            f"P99 TPOT {obs.p99_tpot_seconds:.3f}s > SLO {p.slo_tpot_s:g}s at the smallest "
            f"batch {p.batch_floor}: no batch size meets it"
        )
    elif p.slo_e2e_s is not None and _above(obs.p99_service_seconds, p.slo_e2e_s) and not queueing:
        unattainable = (
            f"P99 service time {obs.p99_service_seconds:.2f}s > E2E SLO {p.slo_e2e_s:g}s without "
            "queueing: output lengths, not the batch, set it"
        )

    parts = []
    if step.batch != batch:
        parts.append(f"batch {batch}→{step.batch} ({step.why})")
    if new_replicas != replicas:
        parts.append(f"replicas {replicas}→{new_replicas} ({replicas_why})")
    if not parts:
        parts.append(f"hold: {step.why or demand.text}")
    slo_breached = ttft_breached or tpot_breached or _above(obs.p99_seconds, p.slo_e2e_s)
    new_state = LoopState(
        batch=step.batch,
        replicas=new_replicas,
        batch_direction=step.direction,
        batch_run=step.run,
        last_batch_decrease=now if step.batch < batch else state.last_batch_decrease,
        up_since=up_since,
        up_target=up_target,
        down_since=down_since,
        down_target=down_target,
        last_scale_up=now if new_replicas > replicas else state.last_scale_up,
        last_replica_change=now if new_replicas != replicas else state.last_replica_change,
        service_rate=demand.service_rate,
        service_parallelism=demand.service_parallelism,
        proven_rate=proven_rate,
        in_flight=in_flight,
        in_flight_at=now if in_flight is not None else None,
        saturated_since=saturated_since,
        queued_since=queued_since,
        breached_since=breached_since,
        budget_spent=budget_spent,
    )
    kv_full = _above(obs.kv_usage, p.kv_usage_ceiling)
    return Decision(
        batch_before=state.batch,
        batch=step.batch,
        replicas_before=state.replicas,
        replicas=new_replicas,
        reason="; ".join(parts + notes),
        state=new_state,
        slo_breached=slo_breached,
        memory_bound=(memory_bound and step.batch >= p.batch_cap) or kv_full,
        desired_replicas=desired,
        unattainable=unattainable,
        utilization=utilization,
        budget_spent=budget_spent,
        budget_recovering=budget_recovering,
    )


def decide_sign_step(state: LoopState, obs: Observation, params: LawParams, now: float) -> Decision:
    """The plain clipped sign-step the law started from, kept for comparison (`wok simulate
    --policy sign-step`):
    B ← clip(B + η_B·sign(Q − Q*)), down when P99 breaks the SLO; R ± 1 on the same sign once the
    batch is at its cap (down at the floor), one pod at a time, none while pods are pending."""
    p = params
    batch, replicas = p.clip_batch(state.batch), p.clip_replicas(state.replicas)
    if not _known(obs.queue_per_replica) or obs.ready_replicas < 1:
        return _holding(state, batch, replicas, "no data", memory_bound=False)
    queue = float(obs.queue_per_replica)  # type: ignore[arg-type]
    error = queue - p.target_queue
    sign = 0 if abs(error) <= p.deadband else (1 if error > 0 else -1)
    breached = _above(obs.p99_seconds, p.slo_e2e_s) or _above(obs.p99_ttft_seconds, p.slo_ttft_s)
    direction = -1 if breached else sign
    new_batch = p.clip_batch(batch + p.batch_step * direction)
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
