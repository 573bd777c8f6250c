"""The HPA port against upstream's own replica-calculator table
(kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator_test.go; upstream levels and
targets are milli-values, written here divided by 1000), plus the default behaviour's rules."""

from __future__ import annotations

import pytest

from wok_sim.hpa import (
    HpaPod,
    HpaSpec,
    HpaState,
    Tolerance,
    external_average_replicas,
    external_value_replicas,
    pods_metric_replicas,
    reconcile,
)

TIGHT_UP = Tolerance(down=0.1, up=0.01)  # upstream's Tolerances{defaultTestingTolerance, .01}


def running(*values: float) -> list[HpaPod]:
    return [HpaPod(value=v) for v in values]


@pytest.mark.parametrize(
    ("upstream_test", "current", "pods", "target", "tolerance", "expected"),
    [
        ("TestReplicaCalcScaleUpCM", 3, running(20, 10, 30), 15, Tolerance(), 4),
        # A Pods metric does not look at readiness, so the unready pod's 50 counts: 6, not 4.
        (
            "TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale",
            3,
            running(50, 10, 30),
            15,
            Tolerance(),
            6,
        ),
        # average 31666 m (integer division), ratio 2.111 → ceil(6.33) = 7
        (
            "TestReplicaCalcScaleUpCMUnreadyHotCpuScaleWouldScaleDown",
            3,
            running(50, 15, 30),
            15,
            Tolerance(),
            7,
        ),
        ("TestReplicaCalcScaleUpCMExternal (podMetric)", 1, running(8.6), 4.4, Tolerance(), 2),
        ("TestReplicaCalcScaleDownCM", 5, running(12, 12, 12, 12, 12), 20, Tolerance(), 3),
        ("TestReplicaCalcToleranceCM", 3, running(20, 21, 21), 20, Tolerance(), 3),
        ("TestReplicaCalcConfigurableToleranceCM", 3, running(20, 21, 21), 20, TIGHT_UP, 4),
        # 5 pods, 2 without a sample, ratio exactly 1: nothing is filled in, the count holds
        (
            "TestPlainMetricReplicaCalcMissingMetricsNoChangeEq",
            5,
            [*running(20, 19, 21), HpaPod(), HpaPod()],
            20,
            Tolerance(),
            5,
        ),
        # the surge pod has no sample: filled at target, ceil(0.725 × 3) = 3 > 2 reverses → 2
        (
            "TestReplicaCalcDuringRollingUpdateWithMaxSurgeCM",
            2,
            [*running(10, 10), HpaPod()],
            17,
            Tolerance(),
            2,
        ),
    ],
)
def test_pods_metric_matches_upstream(upstream_test, current, pods, target, tolerance, expected):
    assert pods_metric_replicas(current, target, pods, tolerance) == expected, upstream_test


@pytest.mark.parametrize(
    ("upstream_test", "current", "ready", "metric", "target", "tolerance", "expected"),
    [
        # 3 replicas, 2 unready: ceil(8600/4400 × 1 ready) = 2, not 6
        ("TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods", 3, 1, 8.6, 4.4, Tolerance(), 2),
        ("TestReplicaCalcScaleDownCMExternal", 5, 5, 8.6, 14.334, Tolerance(), 3),
        ("TestReplicaCalcToleranceCMExternal", 3, 3, 8.6, 8.888, Tolerance(), 3),
        ("TestReplicaCalcConfigurableToleranceCMExternal", 3, 3, 8.9, 8.8, TIGHT_UP, 4),
    ],
)
def test_external_value_matches_upstream(
    upstream_test, current, ready, metric, target, tolerance, expected
):
    assert external_value_replicas(current, ready, metric, target, tolerance) == expected, (
        upstream_test
    )


@pytest.mark.parametrize(
    ("upstream_test", "status_replicas", "metric", "target", "tolerance", "expected"),
    [
        ("TestReplicaCalcScaleUpPerPodCMExternal", 3, 8.6, 2.15, Tolerance(), 4),
        ("TestReplicaCalcScaleDownPerPodCMExternal", 5, 8.6, 2.867, Tolerance(), 3),
        ("TestReplicaCalcTolerancePerPodCMExternal", 3, 8.6, 2.9, Tolerance(), 3),
        ("TestReplicaCalcConfigurableTolerancePerPodCMExternal", 3, 8.6, 2.8, TIGHT_UP, 4),
    ],
)
def test_external_average_matches_upstream(
    upstream_test, status_replicas, metric, target, tolerance, expected
):
    assert external_average_replicas(status_replicas, metric, target, tolerance) == expected, (
        upstream_test
    )


def test_pending_pods_count_as_idle_on_a_scale_up() -> None:
    # ready [30, 30] vs 10 is ×3; two Pending pods join at 0: average 15, ×1.5 over 4 pods = 6
    pods = [*running(30, 30), HpaPod(pending=True), HpaPod(pending=True)]
    assert pods_metric_replicas(4, 10, pods) == 6
    without_pending = pods_metric_replicas(2, 10, running(30, 30))
    assert without_pending == 6  # same answer here, reached without damping: ceil(3 × 2)


def test_pending_pods_are_left_out_of_a_scale_down() -> None:
    pods = [*running(2, 2), HpaPod(pending=True)]
    assert pods_metric_replicas(3, 10, pods) == 1  # ceil(0.2 × 2 ready)


def test_a_silent_running_pod_damps_a_scale_down() -> None:
    # ratio 0.5 from [5, 5]; the silent pod is assumed at target: average 6.666, ×0.666 over 3 → 2
    assert pods_metric_replicas(3, 10, [*running(5, 5), HpaPod()]) == 2
    assert pods_metric_replicas(3, 10, running(5, 5)) == 1


def test_deleting_pods_are_ignored_and_no_sample_holds() -> None:
    assert pods_metric_replicas(2, 10, [*running(20), HpaPod(value=0, deleting=True)]) == 2
    assert pods_metric_replicas(3, 10, [HpaPod(), HpaPod(pending=True)]) is None


def test_external_average_from_zero_pods_is_the_plain_quotient() -> None:
    assert external_average_replicas(0, 12, 5) == 3


SPEC = HpaSpec(min_replicas=1, max_replicas=30)


def run_syncs(proposals: list[int], *, current: int, period: float = 15.0) -> list[int]:
    state = HpaState()
    counts = []
    for i, proposal in enumerate(proposals):
        current, state = reconcile(SPEC, state, now=i * period, current=current, proposal=proposal)
        counts.append(current)
    return counts


def test_scale_down_waits_for_the_300s_window() -> None:
    # one recommendation of 10 at t = 0, then 2 every sync: held while t = 0 is inside the window
    counts = run_syncs([10] + [2] * 21, current=10)
    assert counts[:20] == [10] * 20  # t = 0 … 285
    assert counts[20] == 2  # t = 300: the 10 has left the window (strictly after now − 300)


def test_scale_up_is_limited_to_max_of_double_and_four_pods_per_15s() -> None:
    assert run_syncs([30] * 4, current=1) == [5, 10, 20, 30]
    assert run_syncs([100] * 2, current=12) == [24, 30]  # 100 % beats 4 pods; max replicas caps


def test_a_faster_sync_cannot_exceed_the_period_budget() -> None:
    # syncs every 5 s: the +4 taken at t = 0 still counts at t = 5 and 10, not at t = 15
    assert run_syncs([30] * 4, current=1, period=5.0) == [5, 5, 5, 10]


def test_bounds_and_missing_metrics() -> None:
    state = HpaState()
    assert reconcile(SPEC, state, now=0, current=40, proposal=None)[0] == 30
    assert reconcile(SPEC, state, now=0, current=3, proposal=None) == (3, state)
    assert reconcile(SPEC, state, now=0, current=0, proposal=8)[0] == 0  # disabled by hand
    assert reconcile(HpaSpec(2, 30), state, now=0, current=1, proposal=None)[0] == 2
