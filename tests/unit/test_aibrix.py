"""The AIBrix KPA/APA port against upstream's own tables.

Rows transcribed from vllm-project/aibrix at e3e10f9e4aebe9aac5e7d992fb87d2648e01628b:
pkg/controller/podautoscaler/algorithm/kpa_test.go (TestKPAAlgorithm_ComputeTargetReplicas),
algorithm/apa_test.go (TestAPAAlgorithm_ComputeTargetReplicas), types/metrics_test.go
(TestTimeWindow) and autoscaler_test.go (TestComputeDesiredReplicas, the metric windows test).
Upstream's mock context leaves the tolerances at 0 and the replica bounds out of
`computeTargetReplicas`, so the rows run the algorithms before `applyConstraints`."""

from __future__ import annotations

import pytest

from wok_contracts.signals import PodView, ServiceSignals
from wok_sim.aibrix import (
    MetricWindows,
    ScalingContext,
    Stabilizer,
    TimeWindow,
    apa_recommendation,
    apa_target_replicas,
    kpa_recommendation,
    kpa_target_replicas,
)
from wok_sim.aibrix_policy import AibrixPolicy, pod_samples
from wok_sim.policies import PolicyContext
from wok_sim.policy import FleetView, PodSample


def kpa_ctx(*, up: float = 2.0, down: float = 2.0, activation: int = 1, panic_pods: int = 0):
    return ScalingContext(
        target=10.0,
        min_replicas=0,
        max_replicas=20,
        max_scale_up_rate=up,
        max_scale_down_rate=down,
        up_tolerance=0.0,
        down_tolerance=0.0,
        activation_scale=activation,
        max_panic_pods=panic_pods,
    )


@pytest.mark.parametrize(
    ("upstream_case", "current", "ctx", "stable", "panic", "in_panic", "expected"),
    [
        ("stable_mode_basic_scaling", 2, kpa_ctx(), 20.0, 20.0, False, 2),
        ("panic_mode_scaling_up", 2, kpa_ctx(panic_pods=2), 30.0, 40.0, True, 4),
        ("panic_mode_no_scale_down", 5, kpa_ctx(panic_pods=5), 20.0, 20.0, True, 5),
        ("scale_to_zero", 1, kpa_ctx(), 0.0, 0.0, False, 0),
        ("activation_scale_from_zero", 0, kpa_ctx(activation=3), 15.0, 15.0, False, 3),
        ("max_scale_up_rate_limit", 2, kpa_ctx(up=1.5), 100.0, 100.0, False, 3),
        ("max_scale_down_rate_limit", 4, kpa_ctx(), 5.0, 5.0, False, 2),
    ],
)
def test_kpa_matches_upstream(upstream_case, current, ctx, stable, panic, in_panic, expected):
    got = kpa_target_replicas(current, ctx, stable=stable, panic=panic, in_panic=in_panic)
    assert got == expected, upstream_case


def apa_ctx(*, target: float = 30.0, up: float = 2.0, down: float = 2.0) -> ScalingContext:
    return ScalingContext(
        target=target, max_scale_up_rate=up, max_scale_down_rate=down,
        up_tolerance=0.1, down_tolerance=0.1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("upstream_case", "current", "ctx", "use_per_pod", "expected"),
    [
        ("basic_scale_up", 2, apa_ctx(), 45.0, 3),
        ("scale_up_upto_ceiling", 2, apa_ctx(), 35.0, 3),
        ("scale_up_upto_max_scale_up", 2, apa_ctx(), 90.0, 4),
        ("scale_up_upto_max_scale_up_ceiling", 2, apa_ctx(up=2.5), 90.0, 5),
        ("basic_scale_down", 6, apa_ctx(), 20.0, 4),
        ("scale_down_upto_ceiling", 6, apa_ctx(), 18.0, 4),
        ("scale_down_upto_max_scale_down", 6, apa_ctx(), 10.0, 3),
        ("scale_down_upto_max_scale_down_floor", 6, apa_ctx(down=2.5), 5.0, 2),
        ("no_scaling_as_within_up_tolerance", 2, apa_ctx(), 33.0, 2),
        ("no_scaling_as_within_down_tolerance", 2, apa_ctx(), 27.0, 2),
        ("division_by_zero", 1, apa_ctx(target=0.0, up=1000.0), 10.0, 1),
    ],
)
def test_apa_matches_upstream(upstream_case, current, ctx, use_per_pod, expected):
    assert apa_target_replicas(current, ctx, use_per_pod=use_per_pod) == expected, upstream_case


def test_time_window_matches_upstream() -> None:
    # TestTimeWindow: a 2-minute window at 1-minute granularity, one record every 30 s.
    window = TimeWindow(duration_s=120.0, granularity_s=60.0)
    expected_after = [
        (0, 10.0, [10]), (30, 20.0, [20]), (60, 30.0, [20, 30]), (90, 40.0, [20, 40]),
        (120, 50.0, [20, 40, 50]), (150, 60.0, [20, 40, 60]), (180, 70.0, [40, 60, 70]),
        (210, 80.0, [40, 60, 80]),
    ]  # fmt: skip
    for at, value, values in expected_after:
        window.record(at, value)
        assert window.values == values, at


def test_configured_windows_match_upstream() -> None:
    # TestComputeDesiredReplicasConfiguresMetricWindowsFromPodAutoscalerSpec: 120 s / 30 s.
    windows = MetricWindows(stable=TimeWindow(120.0), panic=TimeWindow(30.0))
    windows.update(0.0, [10.0])
    windows.update(60.0, [70.0])
    assert (windows.stable.avg(), windows.panic.avg()) == (40.0, 70.0)


def test_apa_pipeline_matches_upstream() -> None:
    # TestComputeDesiredReplicas "with one metrics source": APA, one pod at 70, target 50,
    # maxReplicas 6, max scale-up rate 4 → 2.
    ctx = ScalingContext(target=50.0, min_replicas=0, max_replicas=6, max_scale_up_rate=4.0)
    windows = MetricWindows()
    windows.update(0.0, [70.0])
    assert apa_recommendation(1, ctx, stable=windows.stable.avg()) == 2


def test_kpa_divides_the_pod_mean_by_the_target() -> None:
    # Upstream records the pods' mean, so four pods at 0.9 KV usage, target 0.5, ask for 2.
    ctx = ScalingContext(target=0.5, max_replicas=10)
    assert kpa_recommendation(4, ctx, stable=0.9, panic=0.9) == 2


def test_kpa_panics_on_a_spike_and_never_scales_down_in_panic() -> None:
    ctx = ScalingContext(target=10.0, max_replicas=10)
    assert kpa_recommendation(2, ctx, stable=10.0, panic=50.0) == 4  # ×2 rate cap
    # stable 0 is panic mode: the larger of the two counts, never the stable one's drop alone
    assert kpa_recommendation(3, ctx, stable=0.0, panic=30.0) == 3


def test_cooldown_takes_the_smallest_recent_recommendation_down_and_largest_up() -> None:
    ctx = ScalingContext(target=1.0)
    stabilizer = Stabilizer()
    assert stabilizer.stabilize(ctx, now=0.0, recommendation=5, current=4) == 5
    assert stabilizer.stabilize(ctx, now=10.0, recommendation=2, current=5) == 2
    assert stabilizer.stabilize(ctx, now=20.0, recommendation=3, current=2) == 3
    # a scale-down 100 s later picks the smallest of the last 300 s: 2
    assert stabilizer.stabilize(ctx, now=120.0, recommendation=4, current=5) == 2
    # outside the 300 s window the old recommendations no longer count
    assert stabilizer.stabilize(ctx, now=500.0, recommendation=4, current=5) == 4


def _view(now: float, replicas: int, kv: list[float | None], pending: int = 0) -> FleetView:
    pods = [
        PodSample(PodView(f"p{i}", f"u{i}", "10.0.0.1", True, False), 0.0, 1.0, value)
        for i, value in enumerate(kv)
    ] + [
        PodSample(PodView(f"s{i}", f"v{i}", None, False, False), None, None, None)
        for i in range(pending)
    ]
    return FleetView(
        now=now, replicas=replicas, batch=32, pods=tuple(pods), signals=ServiceSignals()
    )


def _ctx() -> PolicyContext:
    from wok_contracts.profile import load_profile

    return PolicyContext(
        profile=load_profile("sim:llama-3-8b-80g"), slo_ttft_s=2.0, slo_tpot_s=0.1,
        slo_e2e_s=None, max_replicas=8, batch_mem=256, cold_start_s=60.0, requests=(),
        start_replicas=2,
    )  # fmt: skip


def test_a_loading_pod_is_left_out_of_the_mean() -> None:
    view = _view(0.0, 3, [0.9, 0.7], pending=1)
    assert pod_samples(view) == [0.9, 0.7]
    assert pod_samples(view, "waiting") == [0.0, 0.0]


def test_apa_policy_scales_on_kv_usage_and_holds_without_samples() -> None:
    policy = AibrixPolicy("aibrix-apa", strategy="apa", target=0.5, batch=32, ctx=_ctx())
    assert policy.start().replicas == 2
    assert policy.decide(_view(0.0, 2, [None, None])).replicas == 2  # no sample: hold
    # mean 0.9 vs 0.5: ceil(2 × 1.8) = 4 (within the ×2 rate cap)
    assert policy.decide(_view(10.0, 2, [0.9, 0.9])).replicas == 4


def test_replica_bounds_come_before_any_metric() -> None:
    from wok_sim.aibrix import boundary_decision

    ctx = ScalingContext(target=0.5, min_replicas=1, max_replicas=4)
    assert [boundary_decision(ctx, n) for n in (0, 1, 4, 6)] == [0, None, None, 4]
