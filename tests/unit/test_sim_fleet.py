"""The fleet: cold starts, drains, routing, churn counts, and the operator's own law inside."""

from __future__ import annotations

import dataclasses

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.quantiles import nearest_rank
from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest, poisson
from wok_operator import control, loop
from wok_sim import wok_policy
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policies import PolicyContext, load_registry
from wok_sim.policy import Action, FleetView
from wok_sim.report import attainment, p99, slo_hits, summarize

PROFILE = load_profile("sim:llama-3-8b-80g")


class Scripted:
    """A policy that sets the replica count at given ticks (a real Policy, not a mock)."""

    name = "scripted"
    interval_s = 5.0
    fixed_batch = 8

    def __init__(self, start: int, plan: dict[float, int]) -> None:
        self.first, self.plan = start, plan
        self.views: list[FleetView] = []

    def start(self) -> Action:
        return Action(batch=self.fixed_batch, replicas=self.first)

    def decide(self, view: FleetView) -> Action:
        self.views.append(view)
        return Action(batch=self.fixed_batch, replicas=self.plan.get(view.now, view.replicas))


def context(**overrides: object) -> PolicyContext:
    values: dict[str, object] = {
        "profile": PROFILE,
        "slo_ttft_s": 2.0,
        "slo_tpot_s": 0.1,
        "slo_e2e_s": None,
        "max_replicas": 8,
        "batch_mem": PROFILE.kv_capacity_tokens // PROFILE.max_model_len,
        "cold_start_s": 90.0,
        "requests": (),
    }
    values.update(overrides)
    return PolicyContext(**values)  # type: ignore[arg-type]


def test_the_simulator_runs_the_operators_own_law():
    assert wok_policy.decide is control.decide
    assert wok_policy.control_tick is loop.control_tick  # observe → decide, as in the operator
    policy = load_registry()["wok"].variants(context())[0]
    assert isinstance(policy, wok_policy.LawPolicy)
    assert policy.law is control.decide
    assert policy.spec.scaling.max_replicas == 8
    # B_mem as the operator sizes it: maxModelLen until a mean length is observed, then that.
    assert policy.batch_mem(None) == 450_000 // 8192
    assert policy.batch_mem(2000.0) == 450_000 // 2000
    assert policy.batch_mem(None) == 450_000 // 2000  # a quiet window keeps the last length


def test_a_new_pod_serves_after_its_cold_start_and_bills_from_creation():
    requests = [TraceRequest(1.0, 10, 5), TraceRequest(10.0, 10, 5), TraceRequest(30.0, 10, 5)]
    policy = Scripted(start=0, plan={5.0: 1})
    run = simulate_fleet(requests, policy, FleetConfig(PROFILE, cold_start_s=20, duration_s=60))
    assert [r.outcome for r in run.records] == ["rejected", "rejected", "ok"]
    assert [r.pod for r in run.records] == [-1, -1, 0]  # no ready pod: refused at the gateway
    assert run.gpu_seconds == pytest.approx(55.0)
    pending = next(v for v in policy.views if v.now == 10.0).pods
    assert [(s.pod.pending, s.waiting) for s in pending] == [(True, None)]
    ready = next(v for v in policy.views if v.now == 25.0).pods  # ready at 5 + 20 s
    assert [(s.pod.ready, s.waiting) for s in ready] == [(True, 0)]


def test_the_scored_start_drops_the_same_warm_up_for_every_policy():
    requests = [TraceRequest(1.0, 10, 5), TraceRequest(10.0, 10, 5), TraceRequest(30.0, 10, 5)]
    config = FleetConfig(PROFILE, cold_start_s=20, duration_s=60, score_from_s=15.0)
    late = simulate_fleet(requests, Scripted(start=0, plan={5.0: 1}), config)
    assert [(r.request_id, r.outcome) for r in late.records] == [(2, "ok")]
    assert late.gpu_seconds == pytest.approx(45.0)  # billed from 15 s, not from creation at 5
    warm = simulate_fleet(requests, Scripted(start=2, plan={}), config)
    assert len(warm.records) == 1 and warm.gpu_seconds == pytest.approx(2 * 45.0)


def test_a_removed_pod_drains_then_drops_what_is_left():
    # Two long answers (about 12 s each), one per pod; at 5 s one pod is removed with a 2 s drain.
    requests = [TraceRequest(0.0, 100, 2000), TraceRequest(0.0, 100, 2000)]
    config = FleetConfig(PROFILE, routing="least-loaded", drain_s=2.0, duration_s=60)
    run = simulate_fleet(requests, Scripted(start=2, plan={5.0: 1}), config)
    assert sorted(r.outcome for r in run.records) == ["dropped", "ok"]
    dropped = next(r for r in run.records if r.outcome == "dropped")
    assert dropped.finish_s == pytest.approx(7.0)
    assert 0 < dropped.output_tokens < 2000
    assert run.gpu_seconds == pytest.approx(7.0 + 60.0)
    assert (run.scale_events, run.flips) == (1, 0)


def test_least_loaded_routing_spreads_and_churn_is_counted():
    requests = [TraceRequest(0.0, 100, 500)] * 4
    config = FleetConfig(PROFILE, routing="least-loaded", duration_s=30, cold_start_s=0)
    run = simulate_fleet(requests, Scripted(start=2, plan={5.0: 3, 10.0: 2, 15.0: 3}), config)
    assert sorted(r.pod for r in run.records) == [0, 0, 1, 1]
    assert (run.scale_events, run.flips) == (3, 2)


def test_the_wok_policy_on_a_short_load_accounts_for_every_request():
    requests = poisson(20.0, 120.0, seed=3)
    policy = load_registry()["wok"].variants(context(requests=tuple(requests)))[0]
    run = simulate_fleet(requests, policy, FleetConfig(PROFILE, seed=3))
    assert [r.request_id for r in run.records] == list(range(len(requests)))
    assert {r.outcome for r in run.records} <= {"ok", "rejected", "timeout", "dropped"}
    assert len(run.timeline) >= 120 / policy.interval_s - 1
    assert run.timeline[-1].p99_ttft_s is not None  # the policy saw TTFT through Prometheus


def test_prefix_caching_changes_the_fleet_the_law_asks_for():
    # 4096-token prompts whose first six 512-token blocks are one shared system prompt: with
    # caching a prefill is 1024 tokens, not 4096, and one pod keeps up where the law needs more.
    base = poisson(6.0, 300.0, mean_output=64, seed=4)
    requests = [
        dataclasses.replace(r, prompt_tokens=4096, hash_ids=(*range(6), 100 + 2 * i, 101 + 2 * i))
        for i, r in enumerate(base)
    ]
    runs = {}
    for caching in (True, False):
        policy = load_registry()["wok"].variants(context(requests=tuple(requests)))[0]
        config = FleetConfig(PROFILE, seed=4, prefix_caching=caching)
        runs[caching] = simulate_fleet(requests, policy, config)
    hit_rate = summarize("wok", runs[True], Slos(2.0, 0.1)).prefix_hit_rate
    assert 0.7 < hit_rate <= 6 / 8  # every prompt after the first few finds the six blocks
    assert summarize("wok", runs[False], Slos(2.0, 0.1)).prefix_hit_rate == 0.0
    most = {caching: max(tick.desired for tick in run.timeline) for caching, run in runs.items()}
    assert most[True] < most[False]
    assert runs[True].gpu_seconds < 0.5 * runs[False].gpu_seconds


def test_the_batch_ablations_pin_the_batch_and_keep_the_law_for_the_replicas():
    """`wok-frozen-cap` runs at min(B_max, B_mem) and `wok-frozen-plan` at the planner's B_opt
    on every tick; `wok` moves its batch from the spec's initial one."""
    requests = tuple(poisson(20.0, 120.0, seed=3))
    ctx = context(requests=requests)
    registry = load_registry()
    b_opt = wok_policy.plan_batch(ctx)
    runs = {}
    for name in ("wok", "wok-frozen-cap", "wok-frozen-plan"):
        policy = registry[name].variants(ctx)[0]
        assert isinstance(policy, wok_policy.LawPolicy) and policy.law is control.decide
        runs[name] = simulate_fleet(list(requests), policy, FleetConfig(PROFILE, seed=3))
    caps = {t.batch for t in runs["wok-frozen-cap"].timeline}
    cap = wok_policy.LawPolicy("cap", control.decide, ctx).spec.batching.max_batch_size
    assert max(caps) <= cap and len(caps) <= 2  # B_mem settles once a mean length is observed
    assert {t.batch for t in runs["wok-frozen-plan"].timeline} == {min(b_opt, c) for c in caps}
    assert runs["wok"].timeline[0].batch == 32  # the spec's initial batch, its own to move


def test_attainment_counts_every_request_and_misses_those_never_served():
    slos = Slos(ttft_s=1.0, tpot_s=0.1, e2e_s=10.0)
    assert slo_hits(slos, 0.5, None, 3.0) == (True, True, True)  # one token: no TPOT to miss
    assert slo_hits(slos, 1.5, 0.05, 12.0) == (False, True, False)
    assert slo_hits(slos, None, None, None) == (False, False, False)
    assert slo_hits(Slos(ttft_s=1.0, tpot_s=0.1), 0.5, 0.2, 1e6) == (True, False, True)
    hits = [(True, True, True), (True, False, True)]
    assert attainment(hits, total=4) == (0.5, 0.25, 0.5, 0.25)  # 2 of 4 rejected
    assert attainment([], total=0) == (1.0, 1.0, 1.0, 1.0)


def test_the_p99_is_a_nearest_rank_value_that_occurred():
    values = [float(v) for v in range(1, 201)]
    assert nearest_rank(values) == 198.0  # ceil(0.99 · 200) = 198th
    assert nearest_rank(values, 0.5) == 100.0
    assert nearest_rank([3.0]) == 3.0
    assert p99([]) is None and p99(values) == 198.0
