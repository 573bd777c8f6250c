"""The step token budget in the fleet simulator: pushed to every pod like the batch cap, and the
rule that would move it (`wok_sim.budget_policy`) against its control, the law alone."""

from __future__ import annotations

import dataclasses

import pytest
from test_sim_fleet import context

from wok_contracts.profile import load_profile
from wok_contracts.traces import TraceRequest, poisson
from wok_sim.budget_policy import BUDGET_FLOOR, BudgetLawPolicy, next_token_budget
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policies import load_registry
from wok_sim.policy import Action, FleetView

PROFILE = load_profile("sim:llama-3-8b-80g")
SLOS = {"slo_ttft_s": 1.0, "slo_tpot_s": 0.05}


def rule(budget: int, ttft: float | None, tpot: float | None) -> int:
    return next_token_budget(
        budget, p99_ttft_s=ttft, p99_tpot_s=tpot, **SLOS, floor=256, ceiling=8192
    )


def test_the_rule_lowers_on_tpot_first_raises_on_ttft_with_slack_and_holds_on_no_data():
    assert rule(2048, 0.5, 0.06) == 1024  # TPOT breach
    assert rule(2048, 3.0, 0.06) == 1024  # both: TPOT first
    assert rule(256, 3.0, 0.06) == 256  # at the floor
    assert rule(2048, 3.0, 0.03) == 4096  # TTFT breach, TPOT slack (< 0.8 · SLO)
    assert rule(8192, 3.0, 0.03) == 8192  # at the ceiling
    assert rule(2048, 3.0, 0.045) == 2048  # TTFT breach, no TPOT slack
    assert rule(2048, 0.5, 0.03) == 2048  # inside both
    assert rule(2048, None, 0.06) == rule(2048, 3.0, None) == 2048  # no data holds


class Scripted:
    """Scales from zero to one pod at t = 5 s, with a step token budget set from the start."""

    name = "scripted"
    interval_s = 5.0
    fixed_batch = 8

    def __init__(self, token_budget: int | None) -> None:
        self.token_budget = token_budget

    def start(self) -> Action:
        return Action(batch=8, replicas=0, token_budget=self.token_budget)

    def decide(self, view: FleetView) -> Action:
        return Action(batch=8, replicas=1)  # leaves the budget where it is


def test_the_budget_reaches_a_pod_created_after_it_was_set():
    requests = [TraceRequest(30.0, 2000, 2)]
    config = FleetConfig(PROFILE, cold_start_s=20, duration_s=60)
    (default,) = simulate_fleet(requests, Scripted(None), config).records
    (chunked,) = simulate_fleet(requests, Scripted(64), config).records
    assert default.ttft_s == pytest.approx(PROFILE.step_seconds(0, 2000, 2000))
    chunks = [64] * 31 + [16]
    ends = [sum(chunks[: i + 1]) for i in range(len(chunks))]
    expected = sum(PROFILE.step_seconds(0, n, end) for n, end in zip(chunks, ends, strict=True))
    assert chunked.ttft_s == pytest.approx(expected)


def test_the_fixed_budget_control_is_the_law_itself():
    requests = poisson(6.0, 300.0, seed=3)
    config = FleetConfig(PROFILE, cold_start_s=60, duration_s=300)
    registry = load_registry()
    (law,) = registry["wok"].variants(context())
    (fixed,) = registry["wok-fixed-budget"].variants(context())
    assert simulate_fleet(requests, fixed, config).records == (
        simulate_fleet(requests, law, config).records
    )


class Recorder:
    """Runs a policy and keeps each of its actions (a real policy underneath)."""

    def __init__(self, policy: BudgetLawPolicy) -> None:
        self.policy = policy
        self.name, self.interval_s, self.fixed_batch = policy.name, policy.interval_s, None
        self.actions: list[Action] = []

    def start(self) -> Action:
        self.actions.append(self.policy.start())
        return self.actions[-1]

    def decide(self, view: FleetView) -> Action:
        self.actions.append(self.policy.decide(view))
        return self.actions[-1]


def test_on_a_tpot_breach_the_budget_steps_down_before_the_batch():
    wide = dataclasses.replace(PROFILE, step_token_budget=8192)
    ctx = context(
        profile=wide, slo_tpot_s=0.02, max_replicas=1
    )  # at its most pods: the batch may fall
    (policy,) = load_registry()["wok-step-budget"].variants(ctx)
    assert isinstance(policy, BudgetLawPolicy)
    recorder = Recorder(policy)
    requests = [dataclasses.replace(r, prompt_tokens=3000) for r in poisson(8.0, 600.0, seed=1)]
    simulate_fleet(requests, recorder, FleetConfig(wide, cold_start_s=60, duration_s=600))
    budgets = [a.token_budget for a in recorder.actions]
    assert budgets[0] == 2048  # the InferenceService default, under the 8192 ceiling
    lowered = [
        (before, after)
        for before, after in zip(recorder.actions, recorder.actions[1:], strict=False)
        if after.token_budget < before.token_budget  # type: ignore[operator]
    ]
    assert lowered, "the load never breached TPOT"
    assert all(after.batch >= before.batch for before, after in lowered)
    assert min(budgets) >= BUDGET_FLOOR  # type: ignore[type-var]
