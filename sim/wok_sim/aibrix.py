"""AIBrix's KPA and APA autoscalers as pure functions, for the simulator's `aibrix-*` policies.

A port of vllm-project/aibrix at e3e10f9e4aebe9aac5e7d992fb87d2648e01628b (v0.7.0-156),
`pkg/controller/podautoscaler/`:

- `algorithm/kpa.go` `computeTargetReplicas` / `shouldEnterPanicMode` and `algorithm/apa.go`
  `computeTargetReplicas`, with `algorithm.go`'s `applyConstraints`;
- `types/metrics.go` `TimeWindow` (one value per 1 s bucket, `Avg` over the buckets kept) and
  `metrics/client.go` `UpdateMetrics` (each sync records the *mean over the pods that answered*
  into a 180 s stable and a 60 s panic window);
- `context/context.go` `NewBaseScalingContext`'s defaults (scale rates 2 and 2, tolerances 0.1
  and 0.1, panic threshold 2, scale-up cooldown 0 s, scale-down cooldown 300 s). The context is
  built afresh on every reconcile and its `GetMaxPanicPods` is 0 and `GetActivationScale` 1, so
  neither panic mode nor a panic floor survives from one sync to the next;
- `podautoscaler_controller.go` `computeScaleDecision` and `stabilizeRecommendation` (the
  cooldown windows: on a scale-up the *largest*, on a scale-down the *smallest* recommendation of
  its window; the history is kept per PodAutoscaler across syncs), run every 10 s
  (`DefaultResyncInterval`).

Two upstream behaviours this port keeps because they are what AIBrix does: the KPA divides the
windowed *per-pod mean* by the per-pod target (`ceil(mean / target)`, whatever the pod count),
so on a bounded metric such as the KV cache's usage it never asks for more than
ceil(1 / target) pods; and the scale-down cooldown picks the smallest recent recommendation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

RESYNC_INTERVAL_S = 10.0  # DefaultResyncInterval
STABLE_WINDOW_S = 180.0  # DefaultStableWindowDuration
PANIC_WINDOW_S = 60.0  # DefaultPanicWindowDuration
GRANULARITY_S = 1.0  # NewMetricsClient(time.Second)


@dataclass(frozen=True)
class ScalingContext:
    """The fields of upstream's `ScalingContext` the algorithms read, at their defaults."""

    target: float
    min_replicas: int = 1
    max_replicas: int = 10
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    up_tolerance: float = 0.1
    down_tolerance: float = 0.1
    panic_threshold: float = 2.0
    activation_scale: int = 1
    max_panic_pods: int = 0
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 300.0


def apply_constraints(replicas: int, ctx: ScalingContext) -> int:
    return min(max(replicas, ctx.min_replicas), ctx.max_replicas)


def should_enter_panic(stable: float, panic: float, panic_threshold: float) -> bool:
    if stable <= 0:
        return True
    return panic / stable > panic_threshold


def _go_int32(value: float) -> int:
    return int(value)  # Go's int32(float64) truncates toward zero


def kpa_target_replicas(
    current: float, ctx: ScalingContext, *, stable: float, panic: float, in_panic: bool
) -> int:
    """`KPAAlgorithm.computeTargetReplicas` (before `applyConstraints`)."""
    target = ctx.target
    ready = max(0.0, current)
    max_up = max(1.0, math.ceil(ctx.max_scale_up_rate * ready))
    max_down = math.floor(ready / ctx.max_scale_down_rate)
    up_threshold = target * (1 + ctx.up_tolerance)
    down_threshold = target * (1 - ctx.down_tolerance)
    dspc = math.ceil(stable / target) if not down_threshold <= stable <= up_threshold else current
    dppc = math.ceil(panic / target) if not down_threshold <= panic <= up_threshold else current
    desired_stable = _go_int32(min(max(dspc, max_down), max_up))
    desired_panic = _go_int32(min(max(dppc, max_down), max_up))
    if ctx.activation_scale > 1:
        if ctx.activation_scale > desired_stable > 0:
            desired_stable = ctx.activation_scale
        if ctx.activation_scale > desired_panic > 0:
            desired_panic = ctx.activation_scale
    desired = desired_stable
    if in_panic:
        # Never below the panic floor while panicking (upstream's floor is 0 in production).
        desired = max(desired, desired_panic, ctx.max_panic_pods)
    return desired


def kpa_recommendation(current: int, ctx: ScalingContext, *, stable: float, panic: float) -> int:
    """`KPAAlgorithm.ComputeRecommendation`: panic mode from this sync's windows, constrained."""
    in_panic = should_enter_panic(stable, panic, ctx.panic_threshold)
    desired = kpa_target_replicas(current, ctx, stable=stable, panic=panic, in_panic=in_panic)
    return apply_constraints(desired, ctx)


def apa_target_replicas(current: float, ctx: ScalingContext, *, use_per_pod: float) -> int:
    """`APAAlgorithm.computeTargetReplicas` (before `applyConstraints`)."""
    expected = ctx.target
    if expected <= 0:
        return _go_int32(current)
    ratio = use_per_pod / expected
    if ratio > 1 + ctx.up_tolerance:
        max_up = _go_int32(math.ceil(ctx.max_scale_up_rate * current))
        return min(_go_int32(math.ceil(current * ratio)), max_up)
    if ratio < 1 - ctx.down_tolerance:
        max_down = _go_int32(math.floor(current / ctx.max_scale_down_rate))
        return max(_go_int32(math.ceil(current * ratio)), max_down)
    return _go_int32(current)


def apa_recommendation(current: int, ctx: ScalingContext, *, stable: float) -> int:
    return apply_constraints(apa_target_replicas(current, ctx, use_per_pod=stable), ctx)


@dataclass
class TimeWindow:
    """`types.TimeWindow`: the last value recorded in each granularity bucket, buckets older than
    the window dropped on each record (the bucket at the cutoff is kept)."""

    duration_s: float
    granularity_s: float = GRANULARITY_S
    buckets: dict[int, float] = field(default_factory=dict)

    def record(self, now: float, value: float) -> None:
        self.buckets[math.floor(now / self.granularity_s)] = value
        cutoff = math.floor((now - self.duration_s) / self.granularity_s)
        self.buckets = {b: v for b, v in self.buckets.items() if b >= cutoff}

    @property
    def values(self) -> list[float]:
        return [self.buckets[b] for b in sorted(self.buckets)]

    def avg(self) -> float:
        values = self.values
        return sum(values) / len(values) if values else 0.0


@dataclass
class MetricWindows:
    """`MetricsClient` for one metric of one PodAutoscaler: the pods' mean into both windows."""

    stable: TimeWindow = field(default_factory=lambda: TimeWindow(STABLE_WINDOW_S))
    panic: TimeWindow = field(default_factory=lambda: TimeWindow(PANIC_WINDOW_S))

    def update(self, now: float, pod_values: Sequence[float]) -> None:
        if not pod_values:
            return
        mean = sum(pod_values) / len(pod_values)
        self.stable.record(now, mean)
        self.panic.record(now, mean)


@dataclass
class Stabilizer:
    """`stabilizeRecommendation`: the cooldown windows over this PodAutoscaler's history."""

    history: list[tuple[float, int]] = field(default_factory=list)

    def stabilize(
        self, ctx: ScalingContext, *, now: float, recommendation: int, current: int
    ) -> int:
        self.history.append((now, recommendation))
        horizon = max(ctx.scale_up_cooldown_s, ctx.scale_down_cooldown_s)
        self.history = [(t, r) for t, r in self.history if t > now - horizon]
        if recommendation == current:
            return current
        scale_up = recommendation > current
        window = ctx.scale_up_cooldown_s if scale_up else ctx.scale_down_cooldown_s
        recent = [r for t, r in self.history if t > now - window]
        if not recent:
            return recommendation
        return max(recent) if scale_up else min(recent)


def scale_decision(
    ctx: ScalingContext, stabilizer: Stabilizer, *, now: float, current: int, recommendation: int
) -> int:
    """`computeScaleDecision` after the metrics: cooldown, then min/max replicas."""
    desired = stabilizer.stabilize(ctx, now=now, recommendation=recommendation, current=current)
    return apply_constraints(desired, ctx)


def boundary_decision(ctx: ScalingContext, current: int) -> int | None:
    """`computeScaleDecision`'s checks before any metric: a target at 0 replicas (with a minimum
    above 0) is left alone, one outside [min, max] is moved to the bound. None: go on."""
    if current == 0 and ctx.min_replicas != 0:
        return 0
    if current > ctx.max_replicas:
        return ctx.max_replicas
    if current < ctx.min_replicas:
        return ctx.min_replicas
    return None
