"""The simulator's `wok` policy and its batch ablations: the law's own batch reaches the pods, and
a pinned batch stays pinned."""

from __future__ import annotations

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.traces import Phase, scripted
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policies import PolicyContext, load_registry

PROFILE = load_profile("sim:llama-3-8b-80g")
# Quiet, then a load that fills a small batch: the law raises its batch on the queue.
REQUESTS = scripted((Phase(60, 1.0), Phase(240, 1.0, 40.0)), mean_prompt=256, mean_output=128)
CTX = PolicyContext(
    profile=PROFILE,
    slo_ttft_s=2.0,
    slo_tpot_s=0.1,
    slo_e2e_s=None,
    max_replicas=4,
    batch_mem=PROFILE.kv_capacity_tokens // PROFILE.max_model_len,
    cold_start_s=90.0,
    requests=tuple(REQUESTS),
)


def batches(name: str) -> list[int]:
    policy = load_registry()[name].variants(CTX)[0]
    run = simulate_fleet(list(REQUESTS), policy, FleetConfig(profile=PROFILE, cold_start_s=90.0))
    return [tick.batch for tick in run.timeline]


def test_the_law_moves_the_pods_batch() -> None:
    # The law's decision, not the batch it started from, is what the pods run with.
    seen = batches("wok")
    assert seen[0] == 32  # the spec's initial batch
    assert max(seen) > 32


def test_a_frozen_batch_stays_at_its_pin() -> None:
    seen = batches("wok-frozen-plan")
    assert len(set(seen[1:])) == 1


def test_the_law_prices_each_ticks_mix_with_the_runs_step_profile() -> None:
    """`wok` runs as an InferenceService with the run's profile as `scaling.stepProfile`: μ's
    prior is `wok plan`'s QPS_max for the mean prompt and output the tick's signals show (within
    the 2 % the buckets allow); `wok-no-profile` has none."""
    from wok_contracts.signals import ServiceSignals
    from wok_contracts.slos import Slos
    from wok_operator.loop import capacity_of_mix
    from wok_operator.plan import LengthMix, plan

    registry = load_registry()
    law, bare = registry["wok"].variants(CTX)[0], registry["wok-no-profile"].variants(CTX)[0]
    assert bare.spec.scaling.step_profile is None  # type: ignore[attr-defined]
    expected = plan(PROFILE, LengthMix.of_means(1000, 200), Slos(2.0, 0.1, None)).qps_max
    seen = capacity_of_mix(
        law.spec,  # type: ignore[attr-defined]
        ServiceSignals(mean_prompt_tokens=1000.0, mean_output_tokens=200.0),
    )
    assert seen == pytest.approx(expected, rel=0.03) and expected > 0
    shorter = capacity_of_mix(
        law.spec,  # type: ignore[attr-defined]
        ServiceSignals(mean_prompt_tokens=500.0, mean_output_tokens=200.0),
    )
    assert shorter > seen  # type: ignore[operator]
    assert capacity_of_mix(law.spec, ServiceSignals()) is None  # type: ignore[attr-defined]
    assert (
        capacity_of_mix(bare.spec, ServiceSignals(mean_prompt_tokens=1.0, mean_output_tokens=1.0))
        is None
    )  # type: ignore[attr-defined]


def test_b_sla_is_the_largest_batch_whose_predicted_step_meets_the_tpot_slo() -> None:
    from wok_contracts.slos import Slos
    from wok_operator.plan import LengthMix, batch_point, batch_sla

    mix = LengthMix.of_means(2048, 32)
    slos = Slos(2.0, 0.05, None)
    b = batch_sla(PROFILE, mix, slos)
    assert batch_point(PROFILE, mix, b, slos).step_s <= 0.05
    assert batch_point(PROFILE, mix, b + 1, slos).step_s > 0.05
    law = load_registry()["wok-sla"].variants(CTX)[0]
    assert law.batch_sla == batch_sla(  # type: ignore[attr-defined]
        PROFILE, LengthMix.of_requests(REQUESTS, PROFILE.max_model_len), Slos(2.0, 0.1, None)
    )
    assert load_registry()["wok"].variants(CTX)[0].batch_sla is None  # type: ignore[attr-defined]
