"""The plots of `wok simulate --plot`, read from matplotlib's figure objects: what a reader needs
to find on them (the SLOs in a legend, whole replica counts, the same arrivals under every
policy, a comparison only when there is something to compare)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from wok_sim.fleet import Tick
from wok_sim.report import (
    ARRIVAL_BIN_S,
    PolicyResult,
    Slos,
    arrival_rates,
    comparison_figure,
    policy_figure,
    write_plots,
)

SLOS = Slos(ttft_s=2.0, tpot_s=0.1, e2e_s=5.0)
ARRIVALS = [0.5 * i for i in range(1200)]  # 2 req/s for 10 minutes


def result(name: str, desired: list[int], *, interval_s: float) -> PolicyResult:
    """A run whose replicas follow `desired`, one control tick per `interval_s`."""
    ticks = tuple(
        Tick(
            time_s=i * interval_s,
            arrival_rate=0.5 + i % 7,
            desired=d,
            ready=d,
            pending=0,
            batch=8 + i % 3,
            waiting=0,
            p99_ttft_s=0.5,
            p99_tpot_s=0.05,
            p99_e2e_s=3.0,
            reason="",
        )
        for i, d in enumerate(desired)
    )
    return PolicyResult(
        name=name, batch_size=None, requests=len(ARRIVALS), slo_attainment=0.99,
        ttft_attainment=0.99, tpot_attainment=1.0, e2e_attainment=0.99, p99_ttft_s=0.5,
        p99_tpot_s=0.05, p99_e2e_s=3.0, gpu_hours=1.0, gpu_hours_per_1k_tokens=0.01,
        output_tokens=1000, scale_events=2, flips=0, max_queue=3, rejected=0, timeouts=0,
        dropped=0, clipped_requests=0, wall_seconds=0.1, steps=10, timeline=ticks,
    )  # fmt: skip


def test_the_arrivals_are_binned_the_same_under_every_policy():
    fast = result("wok", [2, 3, 3, 2] * 30, interval_s=5.0)
    slow = result("hpa-waiting", [2, 3] * 20, interval_s=15.0)
    curves = []
    for r in (fast, slow):
        fig = policy_figure(r, SLOS, ARRIVALS)
        [line] = fig.axes[0].get_lines()
        curves.append((list(line.get_xdata()), list(line.get_ydata())))
    assert curves[0] == curves[1]
    starts, rates = arrival_rates(ARRIVALS)
    assert starts[1] - starts[0] == ARRIVAL_BIN_S and rates[0] == 2.0
    assert sum(rate * ARRIVAL_BIN_S for rate in rates) == len(ARRIVALS)


def test_the_slos_are_in_the_legend():
    fig = policy_figure(result("wok", [1, 2, 2], interval_s=5.0), SLOS, ARRIVALS)
    labels = [text.get_text() for text in fig.axes[3].get_legend().get_texts()]
    assert {"TTFT SLO (2 s)", "TPOT SLO (0.1 s)", "E2E SLO (5 s)"} <= set(labels)
    no_e2e = dataclasses.replace(SLOS, e2e_s=None)
    fig = policy_figure(result("wok", [1, 2, 2], interval_s=5.0), no_e2e, ARRIVALS)
    assert "E2E SLO" not in " ".join(t.get_text() for t in fig.axes[3].get_legend().get_texts())


def test_replica_and_batch_ticks_are_whole_numbers():
    # Two or three pods: left to itself matplotlib ticks 2.2, 2.4, …
    fig = policy_figure(result("wok", [2, 3, 2, 3], interval_s=5.0), SLOS, ARRIVALS)
    for axes in (fig.axes[1], fig.axes[2]):
        low, high = axes.get_ylim()
        shown = [v for v in axes.get_yticks() if low <= v <= high]
        assert shown and all(float(v).is_integer() for v in shown)


def test_a_policy_at_32_pods_does_not_flatten_the_others():
    few = result("wok", [2, 3, 4, 3], interval_s=5.0)
    many = result("ceiling", [32, 32, 32, 32], interval_s=5.0)
    fig = comparison_figure([few, many])
    replicas = fig.axes[2]
    assert replicas.get_yscale() == "log"
    ticks = list(replicas.get_yticks())
    assert ticks == [1, 2, 4, 8, 16, 32]
    # On the log axis, 2 → 4 pods takes a fifth of the height that 1 → 32 does.
    span = math.log2(32) - math.log2(1)
    assert (math.log2(4) - math.log2(2)) / span == pytest.approx(0.2)


def test_one_policy_gets_no_comparison_chart(tmp_path):
    paths = write_plots(
        [result("wok", [1, 2], interval_s=5.0)], SLOS, tmp_path, arrivals_s=ARRIVALS
    )
    assert [p.name for p in paths] == ["simulate-wok.png"]
    two = [result("wok", [1, 2], interval_s=5.0), result("hpa-waiting", [1, 3], interval_s=15.0)]
    paths = write_plots(two, SLOS, tmp_path, arrivals_s=ARRIVALS)
    assert [p.name for p in paths][-1] == "simulate-comparison.png"
    assert all(p.stat().st_size > 0 for p in paths)
