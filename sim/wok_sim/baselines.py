"""The baselines wok must beat, as teams run them today: static fleets, and the upstream HPA or
KEDA on vLLM's queue metrics (as the vLLM production stack and llm-d recommend).

- `hpa-waiting`: an autoscaling/v2 HPA on the Pods metric `vllm:num_requests_waiting`, target
  average 5 per pod (KEDA's threshold below, so the two differ only in the path the metric
  takes), synced every 15 s with the default behaviour (`wok_sim.hpa`).
- `keda-waiting`: KEDA's Prometheus scaler on `sum(vllm:num_requests_waiting)`, threshold 5,
  feeding the HPA an External metric with an AverageValue target, in KEDA's default
  configuration: no metrics cache (`useCachedMetrics` false), so each 15 s HPA sync queries the
  scaler, which queries Prometheus (`pollingInterval` only drives activation from zero). KEDA
  reads an empty result as 0 (`ignoreNullValues`, default true). minReplicaCount is 1: scaling to
  zero would refuse every request for a cold start.
- `hpa-concurrency-16/32/48`: the HPA on each pod's running + waiting requests.
- `hpa-concurrency-swept`, `keda-waiting-swept` (not in `all`): the same two swept over their
  own targets (concurrency 2…48 per pod, waiting thresholds 1…20) as well as over B, every
  variant named with its target, for `wok evaluate`: a baseline tuned in hindsight to the load.
- `ceiling`: not a way to run a fleet but a bound: every pod (`--max-replicas`) asked for at the
  first tick, from the same start as the autoscalers. Until they have started, the start's pods
  serve alone, as they do for every policy; no autoscaler can serve more requests within the SLOs,
  so a goal above its attainment is out of every policy's reach (its GPU-hours mean nothing).
- `static-peak`: the smallest fixed fleet that reaches 99 % attainment of every SLO, by a search
  over replica counts (each one a simulation: every count is a variant, the pick is the fewest
  GPU-hours among those at 99 %, else the best attainment); `static-mean`: the fleet the trace's
  mean rate needs at the planner's per-replica capacity (`wok_operator.plan`).

Every one runs a fixed batch, swept over B ∈ {16, 32, 64, 128, 256} ≤ B_mem (`PolicyContext`);
the report shows the best in hindsight with its B. The autoscalers start from the run's
`start_replicas`, as the wok policy does, so no policy gets a head start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wok_contracts.slos import Slos
from wok_operator.plan import (
    TARGET_ATTAINMENT,
    LengthMix,
    arrival_rate,
    peak_rate,
    replica_capacity,
)
from wok_sim import hpa
from wok_sim.policies import PolicyContext, PolicyEntry, Scored, register
from wok_sim.policy import Action, FleetView, PodSample, Policy

WAITING_TARGET = 5.0  # per pod (HPA) and KEDA's threshold: the production-stack examples' figure
CONCURRENCY_TARGETS = (16, 32, 48)
SWEPT_CONCURRENCY_TARGETS = (2, 4, 8, 16, 32, 48)
SWEPT_WAITING_THRESHOLDS = (1, 2, 5, 10, 20)
PEAK_WINDOW_S = 60.0  # the busiest window the peak search is bracketed from
PEAK_HEADROOM = 3.0  # the search's largest fleet, in multiples of what that window needs


def running_since_before(replicas: int) -> hpa.HpaState:
    """The HPA's memory at t = 0: it ran before the trace began, recommending the fleet there
    was (a fresh controller would drop the fleet on its first quiet sync)."""
    return hpa.HpaState(recommendations=((0.0, replicas),))


class StaticPolicy:
    """A fixed fleet at a fixed batch: it never changes anything."""

    interval_s = 60.0

    def __init__(self, name: str, *, batch: int, replicas: int) -> None:
        self.name = name
        self.fixed_batch: int | None = batch
        self.action = Action(batch=batch, replicas=replicas, reason=f"static: {replicas} replicas")

    def start(self) -> Action:
        return self.action

    def decide(self, view: FleetView) -> Action:
        return self.action


class CeilingPolicy:
    """Every pod at once from the first tick: the most any autoscaler could have serving."""

    interval_s = 15.0

    def __init__(self, *, batch: int, ctx: PolicyContext) -> None:
        self.name = "ceiling"
        self.fixed_batch: int | None = batch
        self.start_replicas = ctx.start_replicas
        self.max_replicas = ctx.max_replicas

    def start(self) -> Action:
        return Action(batch=self.fixed_batch or 1, replicas=self.start_replicas, reason="start")

    def decide(self, view: FleetView) -> Action:
        return Action(
            batch=self.fixed_batch or 1, replicas=self.max_replicas, reason="every pod at once"
        )


PodMetric = Callable[[PodSample], float | None]


def waiting_metric(sample: PodSample) -> float | None:
    return sample.waiting


def concurrency_metric(sample: PodSample) -> float | None:
    if sample.waiting is None or sample.running is None:
        return None
    return sample.waiting + sample.running


def hpa_pods(view: FleetView, metric: PodMetric) -> list[hpa.HpaPod]:
    """The pods as the HPA's replica calculator sees them. A starting pod is Pending to it (image
    pull, weight load; vLLM serves /metrics once loaded): unready, ignored on a scale-down and
    counted as idle on a scale-up. A ready pod whose scrape failed has no sample (missing)."""
    return [
        hpa.HpaPod(
            value=None if s.pod.pending else metric(s),
            pending=s.pod.pending,
            deleting=s.pod.terminating,
        )
        for s in view.pods
    ]


class HpaPolicy:
    """An HPA on a per-pod metric with an AverageValue target (a Pods metric)."""

    interval_s = hpa.SYNC_PERIOD_S

    def __init__(
        self, name: str, *, metric: PodMetric, target: float, batch: int, ctx: PolicyContext
    ) -> None:
        self.name = name
        self.batch = batch
        self.fixed_batch: int | None = batch
        self.metric = metric
        self.target = target
        self.spec = hpa.HpaSpec(min_replicas=1, max_replicas=ctx.max_replicas)
        self.initial = ctx.start_replicas
        self.state = running_since_before(self.initial)

    def start(self) -> Action:
        return Action(batch=self.batch, replicas=self.initial, reason="initial")

    def decide(self, view: FleetView) -> Action:
        proposal = hpa.pods_metric_replicas(view.replicas, self.target, hpa_pods(view, self.metric))
        replicas, self.state = hpa.reconcile(
            self.spec, self.state, now=view.now, current=view.replicas, proposal=proposal
        )
        reason = "no pod metric: hold" if proposal is None else f"recommend {proposal}"
        return Action(batch=self.batch, replicas=replicas, reason=reason)


class KedaPolicy:
    """KEDA's Prometheus scaler on the service's summed queue, through the HPA's External
    AverageValue path."""

    interval_s = hpa.SYNC_PERIOD_S

    def __init__(
        self, name: str, *, batch: int, ctx: PolicyContext, threshold: float = WAITING_TARGET
    ) -> None:
        self.name = name
        self.batch = batch
        self.fixed_batch: int | None = batch
        self.threshold = threshold
        self.spec = hpa.HpaSpec(min_replicas=1, max_replicas=ctx.max_replicas)
        self.initial = ctx.start_replicas
        self.state = running_since_before(self.initial)

    def start(self) -> Action:
        return Action(batch=self.batch, replicas=self.initial, reason="initial")

    def decide(self, view: FleetView) -> Action:
        waiting = view.signals.waiting
        waiting = 0.0 if waiting is None else waiting  # ignoreNullValues: empty is 0
        # The Deployment's status.replicas: every pod not being deleted, ready or not.
        existing = sum(1 for s in view.pods if not s.pod.terminating)
        proposal = hpa.external_average_replicas(existing, waiting, self.threshold)
        replicas, self.state = hpa.reconcile(
            self.spec, self.state, now=view.now, current=view.replicas, proposal=proposal
        )
        reason = f"sum waiting {waiting:g}: {proposal}"
        return Action(batch=self.batch, replicas=replicas, reason=reason)


@dataclass(frozen=True)
class FleetSizing:
    """What the static fleets are sized from: the trace's rates and one replica's capacity."""

    mean_rate: float  # requests/s over the trace
    peak_rate: float  # requests/s in its busiest window
    capacity: dict[int, float]  # requests/s one replica serves, by fixed batch

    def mean_replicas(self, batch: int, max_replicas: int) -> int:
        return min(max_replicas, max(1, math.ceil(self.mean_rate / self.capacity[batch])))

    def peak_candidates(self, batch: int, max_replicas: int) -> list[int]:
        """The replica counts the peak search simulates: from half the mean fleet (the planner's
        capacity is an estimate: a replica often serves more than it says) to three times what
        the busiest window needs at full batches (a fleet that light runs its steps fast, for the
        long answers' E2E), within max replicas."""
        mean = self.mean_replicas(batch, max_replicas)
        low = max(1, mean // 2)
        high = max(mean, math.ceil(PEAK_HEADROOM * self.peak_rate / self.capacity[batch]))
        return list(range(low, min(high, max_replicas) + 1))


_SIZINGS: dict[int, tuple[PolicyContext, FleetSizing]] = {}


def sizing(ctx: PolicyContext) -> FleetSizing:
    """The sizing of a run, computed once per context (every simulation worker asks for it)."""
    cached = _SIZINGS.get(id(ctx))
    if cached is not None and cached[0] is ctx:
        return cached[1]
    mix = LengthMix.of_requests(ctx.requests, ctx.profile.max_model_len)
    slos = Slos(ctx.slo_ttft_s, ctx.slo_tpot_s, ctx.slo_e2e_s)
    result = FleetSizing(
        mean_rate=arrival_rate(ctx.requests) or float(len(ctx.requests)),
        peak_rate=peak_rate(ctx.requests, PEAK_WINDOW_S),
        capacity={b: replica_capacity(ctx.profile, mix, b, slos) for b in ctx.sweep_batches()},
    )
    _SIZINGS[id(ctx)] = (ctx, result)
    return result


def smallest_reaching_target(results: Sequence[Scored]) -> int:
    """Among the variants at the attainment target, the fewest GPU-hours, and of those (the same
    fleet at several B) the best attainment; if none reaches it, the best."""
    reaching = [i for i, r in enumerate(results) if r.slo_attainment >= TARGET_ATTAINMENT]
    if not reaching:
        return max(
            range(len(results)), key=lambda i: (results[i].slo_attainment, -results[i].gpu_hours)
        )
    return min(reaching, key=lambda i: (results[i].gpu_hours, -results[i].slo_attainment))


def _static_peak(ctx: PolicyContext) -> list[Policy]:
    return [
        StaticPolicy("static-peak", batch=b, replicas=n)
        for b in ctx.sweep_batches()
        for n in sizing(ctx).peak_candidates(b, ctx.max_replicas)
    ]


def _static_mean(ctx: PolicyContext) -> list[Policy]:
    return [
        StaticPolicy(
            "static-mean", batch=b, replicas=sizing(ctx).mean_replicas(b, ctx.max_replicas)
        )
        for b in ctx.sweep_batches()
    ]


def _hpa_waiting(ctx: PolicyContext) -> list[Policy]:
    return [
        HpaPolicy("hpa-waiting", metric=waiting_metric, target=WAITING_TARGET, batch=b, ctx=ctx)
        for b in ctx.sweep_batches()
    ]


def _keda_waiting(ctx: PolicyContext) -> list[Policy]:
    return [KedaPolicy("keda-waiting", batch=b, ctx=ctx) for b in ctx.sweep_batches()]


def _hpa_concurrency(target: int) -> Callable[[PolicyContext], list[Policy]]:
    def variants(ctx: PolicyContext) -> list[Policy]:
        return [
            HpaPolicy(
                f"hpa-concurrency-{target}",
                metric=concurrency_metric,
                target=float(target),
                batch=b,
                ctx=ctx,
            )
            for b in ctx.sweep_batches()
        ]

    return variants


def _hpa_concurrency_swept(ctx: PolicyContext) -> list[Policy]:
    return [p for target in SWEPT_CONCURRENCY_TARGETS for p in _hpa_concurrency(target)(ctx)]


def _keda_waiting_swept(ctx: PolicyContext) -> list[Policy]:
    return [
        KedaPolicy(f"keda-waiting-{threshold}", batch=b, ctx=ctx, threshold=float(threshold))
        for threshold in SWEPT_WAITING_THRESHOLDS
        for b in ctx.sweep_batches()
    ]


def _ceiling(ctx: PolicyContext) -> list[Policy]:
    return [CeilingPolicy(batch=b, ctx=ctx) for b in ctx.sweep_batches()]


register("static-peak", PolicyEntry(variants=_static_peak, pick=smallest_reaching_target))
register("static-mean", PolicyEntry(variants=_static_mean))
register("hpa-waiting", PolicyEntry(variants=_hpa_waiting))
register("keda-waiting", PolicyEntry(variants=_keda_waiting))
for _target in CONCURRENCY_TARGETS:
    register(f"hpa-concurrency-{_target}", PolicyEntry(variants=_hpa_concurrency(_target)))
register("hpa-concurrency-swept", PolicyEntry(variants=_hpa_concurrency_swept, in_all=False))
register("keda-waiting-swept", PolicyEntry(variants=_keda_waiting_swept, in_all=False))
register("ceiling", PolicyEntry(variants=_ceiling))
