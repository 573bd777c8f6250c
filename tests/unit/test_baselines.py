"""The HPA, KEDA and static baselines: what each reads from a fleet view, what it answers, and a
short run through the real fleet simulator."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.signals import PodView, ServiceSignals
from wok_contracts.traces import Phase, TraceRequest, scripted
from wok_operator.control import decide
from wok_operator.plan import peak_rate
from wok_sim import baselines
from wok_sim.baselines import (
    FleetSizing,
    HpaPolicy,
    KedaPolicy,
    StaticPolicy,
    concurrency_metric,
    smallest_reaching_target,
    waiting_metric,
)
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policies import PolicyContext, load_registry, resolve
from wok_sim.policy import FleetView, PodSample
from wok_sim.wok_policy import LawPolicy

PROFILE = load_profile("sim:llama-3-8b-80g")


def context(requests: list[TraceRequest], *, max_replicas: int = 10) -> PolicyContext:
    return PolicyContext(
        profile=PROFILE,
        slo_ttft_s=2.0,
        slo_tpot_s=0.1,
        slo_e2e_s=None,
        max_replicas=max_replicas,
        batch_mem=PROFILE.kv_capacity_tokens // PROFILE.max_model_len,
        cold_start_s=90.0,
        requests=tuple(requests),
    )


CTX = context([TraceRequest(float(t), 512, 64) for t in range(60)], max_replicas=32)


def pod(
    name: str, *, waiting: float | None = 0, running: float | None = 0, state: str = "ready"
) -> PodSample:
    view = PodView(
        name=name,
        uid=name,
        ip=None,
        ready=state == "ready",
        terminating=state == "deleting",
    )
    return PodSample(pod=view, waiting=waiting, running=running, kv_usage=None)


def fleet(now: float, replicas: int, *pods: PodSample, waiting: float | None = None) -> FleetView:
    return FleetView(
        now=now,
        replicas=replicas,
        batch=32,
        pods=pods,
        signals=ServiceSignals(waiting=waiting),
    )


def test_every_autoscaler_starts_with_the_runs_fleet_as_wok_does() -> None:
    ctx = replace(CTX, start_replicas=3)
    assert LawPolicy("wok", decide, ctx).start().replicas == 3
    for name in ("hpa-waiting", "keda-waiting", "hpa-concurrency-32"):
        for policy in load_registry()[name].variants(ctx):
            assert policy.start().replicas == 3
            assert policy.start().batch == policy.fixed_batch


def test_every_baseline_is_registered_and_swept_over_the_batches_that_fit() -> None:
    registry = load_registry()
    names = ["hpa-waiting", "keda-waiting", "static-peak", "static-mean"]
    names += [f"hpa-concurrency-{t}" for t in (16, 32, 48)]
    assert CTX.sweep_batches() == [16, 32]  # B_mem = 450k / 8192 = 54
    for name in names:
        batches = {p.fixed_batch for p in registry[name].variants(CTX)}
        assert batches == {16, 32}, name
        assert {p.name for p in registry[name].variants(CTX)} == {name}


def test_hpa_waiting_scales_up_within_the_upstream_rate_limit() -> None:
    policy = HpaPolicy("hpa-waiting", metric=waiting_metric, target=5.0, batch=32, ctx=CTX)
    # two ready pods with 20 waiting each: ×4 → 8 wanted, but from 2 at most max(4, 2 + 4) = 6
    action = policy.decide(fleet(15, 2, pod("a", waiting=20), pod("b", waiting=20)))
    assert (action.replicas, action.batch) == (6, 32)


def test_hpa_counts_starting_pods_as_idle_and_leaves_deleting_ones_out() -> None:
    policy = HpaPolicy("hpa-waiting", metric=waiting_metric, target=5.0, batch=32, ctx=CTX)
    view = fleet(
        15,
        4,
        pod("a", waiting=15),
        pod("b", waiting=15),
        pod("c", waiting=None, state="starting"),
        pod("d", waiting=None, state="starting"),
        pod("e", waiting=100, state="deleting"),
    )
    # ready average 15 vs 5 is ×3; with the two starting pods at 0: ×1.5 over 4 pods = 6
    assert policy.decide(view).replicas == 6


def test_hpa_holds_when_no_pod_reports() -> None:
    policy = HpaPolicy("hpa-waiting", metric=waiting_metric, target=5.0, batch=32, ctx=CTX)
    action = policy.decide(fleet(15, 3, pod("a", waiting=None), pod("b", waiting=None)))
    assert action.replicas == 3


def test_concurrency_is_running_plus_waiting() -> None:
    assert concurrency_metric(pod("a", waiting=3, running=29)) == 32
    assert concurrency_metric(pod("a", waiting=None, running=29)) is None
    policy = HpaPolicy(
        "hpa-concurrency-16", metric=concurrency_metric, target=16.0, batch=32, ctx=CTX
    )
    # 40 per pod vs 16: ×2.5 → ceil(2.5 × 2) = 5 (within the +4 limit)
    view = fleet(15, 2, pod("a", waiting=8, running=32), pod("b", waiting=8, running=32))
    assert policy.decide(view).replicas == 5


def test_keda_in_its_default_configuration_queries_at_every_hpa_sync() -> None:
    policy = KedaPolicy("keda-waiting", batch=32, ctx=CTX)
    pods = (pod("a"), pod("b"))
    # t = 15: 30 waiting; AverageValue 5 → ceil(30 / 5) = 6 (2 + 4 allowed)
    assert policy.decide(fleet(15, 2, *pods, waiting=30)).replicas == 6
    # t = 30: no metrics cache: the next sync sees 60 waiting → 12 wanted; from 6 the limit is 12
    assert policy.decide(fleet(30, 6, *pods, waiting=60)).replicas == 12


def test_the_swept_baselines_cover_their_targets_and_every_batch() -> None:
    registry = load_registry()
    hpa_names = {p.name for p in registry["hpa-concurrency-swept"].variants(CTX)}
    assert hpa_names == {f"hpa-concurrency-{t}" for t in (2, 4, 8, 16, 32, 48)}
    keda = registry["keda-waiting-swept"].variants(CTX)
    assert {p.name for p in keda} == {f"keda-waiting-{t}" for t in (1, 2, 5, 10, 20)}
    assert len(keda) == 5 * len(CTX.sweep_batches())
    assert "keda-waiting-swept" not in resolve("all")


def test_keda_reads_an_empty_result_as_zero_and_waits_out_the_window() -> None:
    policy = KedaPolicy("keda-waiting", batch=32, ctx=CTX)
    pods = [pod(name) for name in "abcd"]
    assert policy.decide(fleet(15, 4, *pods, waiting=20)).replicas == 4  # 20 / (5 × 4): hold
    assert policy.decide(fleet(45, 4, *pods, waiting=None)).replicas == 4  # 0, but 4 at 15 s
    assert policy.decide(fleet(330, 4, *pods, waiting=None)).replicas == 1  # 0 → min 1


def test_static_policy_never_moves() -> None:
    policy = StaticPolicy("static-peak", batch=16, replicas=7)
    assert policy.start() == policy.decide(fleet(60, 7, pod("a", waiting=500)))
    assert (policy.start().replicas, policy.fixed_batch) == (7, 16)


def test_peak_rate_is_the_busiest_window() -> None:
    times = [0.0, 1.0, 2.0, 100.0, 100.5, 101.0, 101.5, 200.0]
    requests = [TraceRequest(t, 10, 10) for t in times]
    assert peak_rate(requests, window_s=10.0) == pytest.approx(4 / 10.0)


def test_static_fleets_are_sized_from_mean_and_peak() -> None:
    sizing = FleetSizing(mean_rate=10.0, peak_rate=25.0, capacity={16: 4.0})
    assert sizing.mean_replicas(16, max_replicas=32) == 3
    # From half the mean fleet (the planner's capacity is an estimate) up to 3 × 6.25.
    assert sizing.peak_candidates(16, max_replicas=32) == list(range(1, 20))
    assert sizing.peak_candidates(16, max_replicas=8) == list(range(1, 9))
    busy = FleetSizing(mean_rate=40.0, peak_rate=50.0, capacity={16: 4.0})
    assert busy.peak_candidates(16, max_replicas=32)[0] == 5  # below the mean fleet of 10


@dataclass(frozen=True)
class Result:
    slo_attainment: float
    gpu_hours: float


def test_static_peak_picks_the_cheapest_fleet_at_99_percent() -> None:
    results = [Result(0.90, 1.0), Result(0.991, 2.0), Result(0.999, 3.0), Result(0.995, 1.8)]
    assert smallest_reaching_target(results) == 3
    assert smallest_reaching_target([Result(0.5, 1.0), Result(0.8, 2.0)]) == 1


def test_static_peak_takes_the_best_batch_of_the_same_fleet() -> None:
    # The same 5 pods at B 16 and B 32 cost the same GPU-hours: the better attainment wins.
    assert smallest_reaching_target([Result(0.9946, 4.77), Result(0.9964, 4.77)]) == 1


def test_hpa_concurrency_follows_a_burst_in_the_fleet_simulator() -> None:
    requests = scripted((Phase(60, 1.0), Phase(240, 30.0)), mean_prompt=256, mean_output=64)
    ctx = context(requests)
    policy = HpaPolicy(
        "hpa-concurrency-16", metric=concurrency_metric, target=16, batch=16, ctx=ctx
    )
    run = simulate_fleet(requests, policy, FleetConfig(profile=PROFILE, cold_start_s=30.0))
    desired = [tick.desired for tick in run.timeline]
    assert desired[0] == 1
    assert max(desired) > 1  # the burst brought pods
    assert max(desired) <= ctx.max_replicas
    # the rate limit holds on every sync: never more than max(2×, +4) in one step
    assert all(b <= max(2 * a, a + 4) for a, b in itertools.pairwise(desired))
    assert policy.interval_s == baselines.hpa.SYNC_PERIOD_S


def test_the_ceiling_asks_for_every_pod_at_its_first_tick_from_the_runs_start() -> None:
    ctx = replace(CTX, start_replicas=3, max_replicas=12)
    variants = load_registry()["ceiling"].variants(ctx)
    assert [v.fixed_batch for v in variants] == ctx.sweep_batches()
    ceiling = variants[0]
    assert ceiling.start().replicas == 3
    assert ceiling.decide(fleet(15.0, 3, pod("a"))).replicas == 12


def test_no_autoscaler_serves_more_than_the_ceiling_from_the_same_start() -> None:
    """A burst one pod start into the run: the warm start serves it alone until new pods are up,
    for every policy; the ceiling has every pod on its way from the first tick."""
    from wok_contracts.slos import Slos
    from wok_sim.report import summarize

    requests = scripted((Phase(30, 1.0), Phase(180, 40.0)), mean_prompt=1024, mean_output=64)
    ctx = replace(context(requests, max_replicas=8), start_replicas=1)
    slos = Slos(ctx.slo_ttft_s, ctx.slo_tpot_s, ctx.slo_e2e_s)
    config = FleetConfig(profile=PROFILE, cold_start_s=30.0)
    batch = 32
    ceiling = baselines.CeilingPolicy(batch=batch, ctx=ctx)
    bound = summarize("ceiling", simulate_fleet(requests, ceiling, config), slos).slo_attainment
    others = [
        LawPolicy("wok", decide, ctx),
        HpaPolicy("hpa-concurrency-16", metric=concurrency_metric, target=16, batch=batch, ctx=ctx),
        KedaPolicy("keda-waiting", batch=batch, ctx=ctx),
        StaticPolicy("static", batch=batch, replicas=1),
    ]
    reached = {p.name: summarize(p.name, simulate_fleet(requests, p, config), slos) for p in others}
    assert bound < 1.0  # the burst outruns the start: the bound is a real one here
    for name, result in reached.items():
        assert result.slo_attainment <= bound + 1e-9, name
