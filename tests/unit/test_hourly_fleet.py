"""The scheduled fleet (pods added on a step pay the pod start, the count follows the schedule)
and the hindsight hourly fleet's search (the fewest pods per hour, by bisection)."""

from __future__ import annotations

import dataclasses

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.slos import Slos
from wok_contracts.traces import cut_window, poisson
from wok_sim.baselines import StaticPolicy
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.hourly_fleet import HourFleet, HourlySearch, fewest_pods, met_share
from wok_sim.scheduled_policy import ScheduledPolicy, Step

PROFILE = load_profile("sim:llama-3-8b-80g")
SLOS = Slos(2.0, 0.1)
PERIOD_S = 300.0  # a short "hour", to keep the simulations small


def test_a_schedule_must_start_at_zero_in_order_on_ticks():
    with pytest.raises(ValueError, match="starts at 0"):
        ScheduledPolicy("s", [Step(60.0, 1, 8)])
    with pytest.raises(ValueError, match="in order"):
        ScheduledPolicy("s", [Step(0.0, 1, 8), Step(120.0, 2, 8), Step(60.0, 1, 8)])
    with pytest.raises(ValueError, match="tick"):
        ScheduledPolicy("s", [Step(0.0, 1, 8), Step(90.0, 2, 8)])
    assert ScheduledPolicy("s", [Step(0.0, 1, 8), Step(60.0, 2, 8)]).fixed_batch == 8
    assert ScheduledPolicy("s", [Step(0.0, 1, 8), Step(60.0, 2, 16)]).fixed_batch is None


def test_pods_added_on_a_step_pay_the_pod_start_and_the_count_follows_the_schedule():
    requests = [
        dataclasses.replace(r, arrival_s=60.0 + r.arrival_s)
        for r in poisson(2.0, 50.0, mean_prompt=64, mean_output=8, seed=3)
    ]
    policy = ScheduledPolicy("s", [Step(0.0, 1, 8), Step(60.0, 3, 8), Step(180.0, 1, 8)])
    run = simulate_fleet(requests, policy, FleetConfig(PROFILE, cold_start_s=20, duration_s=240))
    fleet = {t.time_s: (t.desired, t.ready, t.pending) for t in run.timeline}
    assert fleet[60.0] == (3, 1, 2)  # asked for on the step, pending for the pod start
    assert fleet[120.0] == (3, 3, 0)
    assert fleet[180.0][0] == 1 and fleet[240.0] == (1, 1, 0)
    # Until the new pods are ready (60 + 20 s) every request goes to the first; then all share.
    assert {r.pod for r in run.records if r.arrival_s < 80.0} == {0}
    assert {r.pod for r in run.records if r.arrival_s >= 80.0} == {0, 1, 2}
    # Billed from creation: the first pod 240 s, the two added from 60 s until they exit, idle,
    # at the first scrape after they were removed (185 s).
    assert run.gpu_seconds == pytest.approx(240.0 + 2 * 125.0)


def test_fewest_pods_bisects_to_the_first_count_that_reaches_the_target():
    calls: list[HourFleet] = []

    def attain(fleet: HourFleet) -> float:
        calls.append(fleet)
        return 1.0 if fleet.replicas >= 7 else 0.5

    decision = fewest_pods(attain, guess=2, max_replicas=32, batches=(64,))
    assert decision.fleet == HourFleet(7, 64)
    # A gallop up from the guess, then a bisection: not a walk over every count.
    assert [f.replicas for f in calls] == [2, 3, 5, 9, 7, 6]
    assert decision.probes[HourFleet(6, 64)] == 0.5


def test_fewest_pods_tries_the_next_batch_where_the_first_misses():
    def attain(fleet: HourFleet) -> float:
        return 0.995 if fleet.replicas >= 3 or (fleet.replicas == 2 and fleet.batch == 32) else 0.9

    decision = fewest_pods(attain, guess=3, max_replicas=8, batches=(64, 32))
    assert decision.fleet == HourFleet(2, 32)
    assert decision.probes[HourFleet(3, 64)] == 0.995
    assert HourFleet(3, 32) not in decision.probes  # B64 reached it: B32 not simulated there
    assert decision.probes[HourFleet(1, 32)] == 0.9


def test_fewest_pods_where_none_reaches_the_target_takes_the_fewest_near_the_largest():
    def attain(f: HourFleet) -> float:  # a plateau under the target, with the routing's noise
        return min(0.95, 0.3 * f.replicas) + 0.001 * (f.replicas % 2)

    decision = fewest_pods(attain, guess=2, max_replicas=32, batches=(64,))
    assert decision.fleet == HourFleet(4, 64)  # 0.95 at 4, within 0.5 points of 32's 0.95


def two_periods() -> list:
    """A load one pod serves in the first period and one that needs more in the second."""
    quiet = poisson(1.0, PERIOD_S, mean_prompt=256, mean_output=64, seed=1)
    busy = poisson(30.0, PERIOD_S, mean_prompt=256, mean_output=64, seed=2)
    return quiet + [dataclasses.replace(r, arrival_s=r.arrival_s + PERIOD_S) for r in busy]


def fewest_static_pods(requests: list, batch: int) -> int:
    """The fewest pods of a static fleet that serve `requests` at 99 %, counted up from one."""
    for n in range(1, 9):
        run = simulate_fleet(
            requests, StaticPolicy("s", batch=batch, replicas=n), FleetConfig(PROFILE)
        )
        if met_share(run, SLOS, 0.0, PERIOD_S) >= 0.99:
            return n
    raise AssertionError("no static fleet up to 8 pods serves the busy period")


def test_the_search_finds_one_pod_for_the_quiet_period_and_a_static_fleets_count_for_the_busy():
    requests = two_periods()
    search = HourlySearch(
        requests,
        FleetConfig(PROFILE, cold_start_s=0.0),  # ready at once: the static fleet's answer
        SLOS,
        max_replicas=8,
        hour_s=PERIOD_S,
        warm_up_s=60.0,
        look_ahead_s=0.0,
        batches=(16,),
    )
    decisions = search.day()
    assert len(decisions) == 2 and decisions[0].fleet == HourFleet(1, 16)
    busy = fewest_static_pods(cut_window(requests, PERIOD_S, 2 * PERIOD_S), 16)
    assert busy > 1
    assert decisions[1].fleet.replicas == busy
    assert decisions[1].probes[decisions[1].fleet] >= 0.99
    fewer = HourFleet(decisions[1].fleet.replicas - 1, 16)
    assert decisions[1].probes[fewer] < 0.99
    # The whole run of the schedule: the fleet switched on the boundary, and each period served
    # as its window was.
    run = search.run_day([d.fleet for d in decisions])
    at_boundary = next(t for t in run.timeline if t.time_s == PERIOD_S)
    assert (at_boundary.desired, at_boundary.ready, at_boundary.pending) == (busy, 1, busy - 1)
    for period, d in enumerate(decisions):
        day = met_share(run, SLOS, period * PERIOD_S, (period + 1) * PERIOD_S)
        assert day == pytest.approx(d.probes[d.fleet], abs=0.01)


def test_settle_adds_a_pod_where_the_whole_day_served_an_hour_under_the_target():
    search = HourlySearch(
        two_periods(), FleetConfig(PROFILE, cold_start_s=0.0), SLOS, 8, hour_s=PERIOD_S
    )
    fleets = [HourFleet(1, 16), HourFleet(1, 16)]  # one pod cannot serve the busy period
    windows = [1.0, 0.995]  # each hour at 99 % in its window
    assert search.settle(fleets, [1.0, 0.995], windows) == (fleets, None)  # and in the day
    assert search.settle(fleets, [1.0, 0.5], [1.0, 0.6]) == (fleets, None)  # reached nowhere
    settled, run = search.settle(fleets, [1.0, 0.5], windows, rounds=1)
    assert settled == [HourFleet(1, 16), HourFleet(2, 16)]
    assert run is not None
    assert max(t.desired for t in run.timeline) == 2
    shares = search.hour_shares(run)
    assert shares[0] == pytest.approx(1.0) and shares[1] >= 0.98
