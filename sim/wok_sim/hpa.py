"""The upstream Kubernetes HPA v2 algorithm as pure functions, for the simulator's HPA and KEDA
baselines.

A baseline is only a fair comparison if it is the algorithm teams really run, not a sketch of it.
This is a port of kubernetes/kubernetes `pkg/controller/podautoscaler`:

- `replica_calculator.go`: `calcPlainMetricReplicas` with `groupPods` (a Pods metric with an
  `AverageValue` target), `GetExternalMetricReplicas` (External, `Value` target) and
  `GetExternalPerPodMetricReplicas` (External, `AverageValue` target: what KEDA's scalers feed);
- `horizontal.go`: `reconcileAutoscaler`'s bounds, `stabilizeRecommendationWithBehaviors` and
  `convertDesiredReplicasWithBehaviorRate` with the default `behavior` of an autoscaling/v2 HPA
  (scale up: 0 s window, max(100 %, 4 pods) per 15 s; scale down: 300 s window, 100 % per 15 s).

Metric values are compared in milli-units with integer averaging, as upstream does with
`Quantity.MilliValue()`, so upstream's table tests reproduce exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

SYNC_PERIOD_S = 15.0  # --horizontal-pod-autoscaler-sync-period
DOWNSCALE_STABILIZATION_S = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization


@dataclass(frozen=True)
class Tolerance:
    """Upstream's `Tolerances`: a usage ratio within [1 − down, 1 + up] leaves the count as is."""

    down: float = 0.1
    up: float = 0.1

    def within(self, ratio: float) -> bool:
        return 1.0 - self.down <= ratio <= 1.0 + self.up


DEFAULT_TOLERANCE = Tolerance()


@dataclass(frozen=True)
class HpaPod:
    """One pod of the scale target as `groupPods` sees it (a non-CPU metric: readiness is not
    looked at, only the phase and the sample)."""

    value: float | None = None  # the pod's metric sample; None when the metrics API has none
    pending: bool = False  # phase Pending: unready, left out of the average
    deleting: bool = False  # deletionTimestamp set or phase Failed: ignored altogether


def _milli(value: float) -> int:
    return round(value * 1000)


def _average_ratio(values: Sequence[int], target: int) -> float:
    # GetMetricUsageRatio: the average is an integer division of milli-values.
    return (sum(values) // len(values)) / target


def pods_metric_replicas(
    current: int, target: float, pods: Sequence[HpaPod], tolerance: Tolerance = DEFAULT_TOLERANCE
) -> int | None:
    """Desired replicas for a Pods metric with an `AverageValue` target (`calcPlainMetricReplicas`).

    None when no pod has a sample: upstream returns an error there and the HPA does not scale.
    """
    target_m = _milli(target)
    ready: list[int] = []
    missing = 0
    unready = 0
    for pod in pods:
        if pod.deleting:
            continue
        if pod.pending:
            unready += 1
        elif pod.value is None:
            missing += 1
        else:
            ready.append(_milli(pod.value))
    if not ready:
        return None
    ratio = _average_ratio(ready, target_m)
    scale_up_with_unready = unready > 0 and ratio > 1.0
    if not scale_up_with_unready and missing == 0:
        if tolerance.within(ratio):
            return current
        return math.ceil(ratio * len(ready))

    # Fill in the conservative values: each one damps the move it would otherwise exaggerate.
    values = list(ready)
    if missing and ratio < 1.0:
        values += [target_m] * missing  # on a scale-down a silent pod is assumed at target
    elif missing and ratio > 1.0:
        values += [0] * missing  # on a scale-up it is assumed idle
    if scale_up_with_unready:
        values += [0] * unready
    new_ratio = _average_ratio(values, target_m)
    flipped = (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio)
    if tolerance.within(new_ratio) or flipped:
        return current
    proposal = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
        return current  # the count of pods considered would reverse the direction
    return proposal


def external_value_replicas(
    current: int,
    ready: int,
    metric: float,
    target: float,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
) -> int:
    """Desired replicas for an External metric with a `Value` target (`GetExternalMetricReplicas`):
    ceil(metric / target × ready pods); from 0 replicas, ceil(metric / target)."""
    ratio = _milli(metric) / _milli(target)
    if current == 0:
        return math.ceil(ratio)
    if tolerance.within(ratio):
        return current
    return math.ceil(ratio * ready)


def external_average_replicas(
    status_replicas: int,
    metric: float,
    target_average: float,
    tolerance: Tolerance = DEFAULT_TOLERANCE,
) -> int:
    """Desired replicas for an External metric with an `AverageValue` target
    (`GetExternalPerPodMetricReplicas`): ceil(metric / target), unless metric / (target × the
    pods that exist, ready or not) is within the tolerance."""
    usage, target_m = _milli(metric), _milli(target_average)
    if status_replicas > 0 and tolerance.within(usage / (target_m * status_replicas)):
        return status_replicas
    return math.ceil(usage / target_m)


@dataclass(frozen=True)
class ScalingPolicy:
    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    """One direction of an HPA's `behavior`."""

    stabilization_s: float
    policies: tuple[ScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"

    @property
    def longest_period_s(self) -> float:
        return max((p.period_s for p in self.policies), default=0.0)


DEFAULT_SCALE_UP = ScalingRules(
    stabilization_s=0.0,
    policies=(ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0)),
)
DEFAULT_SCALE_DOWN = ScalingRules(
    stabilization_s=DOWNSCALE_STABILIZATION_S, policies=(ScalingPolicy("Percent", 100, 15.0),)
)


@dataclass(frozen=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= minReplicas <= maxReplicas, got {self}")


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    change: int  # pods added (scale-up list) or removed (scale-down list), > 0


@dataclass(frozen=True)
class HpaState:
    """What the controller remembers per HPA: its recent recommendations and scale events."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, unstabilized desired replicas)
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


def _changed_within(events: Sequence[ScaleEvent], now: float, period_s: float) -> int:
    # getReplicasChangePerPeriod: events strictly after the cutoff count.
    return sum(e.change for e in events if e.at > now - period_s)


def _period_start(state: HpaState, *, now: float, current: int, period_s: float) -> int:
    """The replica count at the start of a policy's period (current minus the period's moves)."""
    return (
        current
        - _changed_within(state.scale_up_events, now, period_s)
        + _changed_within(state.scale_down_events, now, period_s)
    )


def scale_up_limit(rules: ScalingRules, state: HpaState, *, now: float, current: int) -> int:
    """`calculateScaleUpLimitWithScalingRules`: the most replicas the policies allow now."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(state, now=now, current=current, period_s=policy.period_s)
        if policy.kind == "Pods":
            proposals.append(start + policy.value)
        else:  # rounded up, or a small count could never grow
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    return (min if rules.select == "Min" else max)(proposals)


def scale_down_limit(rules: ScalingRules, state: HpaState, *, now: float, current: int) -> int:
    """`calculateScaleDownLimitWithBehaviors`: the fewest replicas the policies allow now."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(state, now=now, current=current, period_s=policy.period_s)
        if policy.kind == "Pods":
            proposals.append(start - policy.value)
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    return (max if rules.select == "Min" else min)(proposals)


def stabilize(
    spec: HpaSpec, state: HpaState, *, now: float, current: int, desired: int
) -> tuple[int, HpaState]:
    """`stabilizeRecommendationWithBehaviors`: the lowest recommendation of the scale-up window
    and the highest of the scale-down window bound the move; `desired` is recorded unstabilized."""
    up, down = desired, desired
    for at, recommendation in state.recommendations:
        if at > now - spec.scale_up.stabilization_s:
            up = min(up, recommendation)
        if at > now - spec.scale_down.stabilization_s:
            down = max(down, recommendation)
    stabilized = min(max(current, up), down)
    horizon = max(spec.scale_up.stabilization_s, spec.scale_down.stabilization_s)
    kept = tuple(r for r in state.recommendations if r[0] >= now - horizon)
    return stabilized, replace(state, recommendations=(*kept, (now, desired)))


def limit_rate(spec: HpaSpec, state: HpaState, *, now: float, current: int, desired: int) -> int:
    """`convertDesiredReplicasWithBehaviorRate`: the scaling policies and min/max replicas."""
    if desired > current:
        ceiling = max(scale_up_limit(spec.scale_up, state, now=now, current=current), current)
        return min(desired, spec.max_replicas, ceiling)
    if desired < current:
        floor = min(scale_down_limit(spec.scale_down, state, now=now, current=current), current)
        return max(desired, spec.min_replicas, floor)
    return desired


def _record_scale(
    state: HpaState, spec: HpaSpec, *, now: float, before: int, after: int
) -> HpaState:
    # storeScaleEvent: events older than the longest policy period are dropped (upstream reuses
    # their slots, which is the same).
    if after > before:
        horizon = spec.scale_up.longest_period_s
        kept = tuple(e for e in state.scale_up_events if e.at >= now - horizon)
        return replace(state, scale_up_events=(*kept, ScaleEvent(now, after - before)))
    horizon = spec.scale_down.longest_period_s
    kept = tuple(e for e in state.scale_down_events if e.at >= now - horizon)
    return replace(state, scale_down_events=(*kept, ScaleEvent(now, before - after)))


def reconcile(
    spec: HpaSpec, state: HpaState, *, now: float, current: int, proposal: int | None
) -> tuple[int, HpaState]:
    """One HPA sync after the metrics: `current` is the target's spec.replicas, `proposal` the
    replica calculator's answer (None: no usable metric, so nothing moves)."""
    if current == 0:
        return 0, state  # a target scaled to zero by hand has autoscaling disabled
    if current > spec.max_replicas:
        desired = spec.max_replicas
    elif current < spec.min_replicas:
        desired = spec.min_replicas
    elif proposal is None:
        return current, state
    else:
        stabilized, state = stabilize(spec, state, now=now, current=current, desired=proposal)
        desired = limit_rate(spec, state, now=now, current=current, desired=stabilized)
    if desired != current:
        state = _record_scale(state, spec, now=now, before=current, after=desired)
    return desired, state
