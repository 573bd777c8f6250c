"""The fleet simulator's two engines, run side by side: `step` (one exact scheduler iteration per
engine step, the reference) and `event` (the default: decode stretches in closed form, steps with
prefill or admissions that leave the decoding sequences lazy). On seeded loads that scale the
fleet, chunk prompts, run out of KV and reuse cached prefixes, every request must end the same
way at the same times and every control tick must see and decide the same."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.traces import Phase, TraceRequest, load_trace, scale_rate, scripted
from wok_operator.plan import batch_mem_of
from wok_sim.baselines import StaticPolicy
from wok_sim.fleet import FleetConfig, FleetRun, simulate_fleet
from wok_sim.policies import PolicyContext, load_registry
from wok_sim.policy import Policy

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"
LLAMA = load_profile("sim:llama-3-8b-80g")
# Far below one engine step (the profile's fixed cost alone is milliseconds): the engines differ
# only by the rounding of a closed-form sum against a running one.
TOLERANCE_S = 1e-6


def tight(profile: StepProfile) -> StepProfile:
    """The same model on a small KV pool and step budget: prompts are chunked and decodes
    preempt one another."""
    return dataclasses.replace(profile, kv_capacity_tokens=40_000, step_token_budget=512)


def policy_for(name: str, profile: StepProfile, requests: list[TraceRequest]) -> Policy:
    ctx = PolicyContext(
        profile=profile,
        slo_ttft_s=2.0,
        slo_tpot_s=0.1,
        slo_e2e_s=None,
        max_replicas=6,
        batch_mem=batch_mem_of(profile, requests),
        cold_start_s=30.0,
        requests=tuple(requests),
        start_replicas=1,
    )
    return load_registry()[name].variants(ctx)[0]


def both(
    requests: list[TraceRequest], policy: str | Policy, profile: StepProfile, **config: object
) -> tuple[FleetRun, FleetRun]:
    """The same run on the step engine, then on the event engine (a registered policy is built
    afresh for each; a policy given as an object must keep no state)."""
    runs = []
    for fast in (False, True):
        settings = FleetConfig(profile=profile, cold_start_s=30.0, fast=fast, **config)  # type: ignore[arg-type]
        law = policy_for(policy, profile, requests) if isinstance(policy, str) else policy
        runs.append(simulate_fleet(requests, law, settings))
    return runs[0], runs[1]


def assert_same(step: FleetRun, event: FleetRun) -> None:
    assert event.steps == step.steps  # the same engine steps, however many were jumped
    assert event.jumps > 0 and step.jumps == 0
    assert [r.request_id for r in event.records] == [r.request_id for r in step.records]
    for a, b in zip(step.records, event.records, strict=True):
        assert (b.outcome, b.pod, b.output_tokens, b.cached_tokens) == (
            a.outcome,
            a.pod,
            a.output_tokens,
            a.cached_tokens,
        ), a.request_id
        assert b.e2e_s == pytest.approx(a.e2e_s, abs=TOLERANCE_S), a.request_id
        assert (b.ttft_s is None) == (a.ttft_s is None), a.request_id
        if a.ttft_s is not None:
            assert b.ttft_s == pytest.approx(a.ttft_s, abs=TOLERANCE_S), a.request_id
        assert (b.tpot_s is None) == (a.tpot_s is None), a.request_id
        if a.tpot_s is not None:
            assert b.tpot_s == pytest.approx(a.tpot_s, abs=TOLERANCE_S), a.request_id
    # Every tick saw the same fleet and queue and decided the same.
    assert event.timeline == step.timeline
    assert (event.scale_events, event.flips, event.max_waiting) == (
        step.scale_events,
        step.flips,
        step.max_waiting,
    )
    assert event.gpu_seconds == pytest.approx(step.gpu_seconds, abs=TOLERANCE_S)


def test_the_law_scaling_a_tight_fleet_through_a_ramp():
    profile = tight(LLAMA)
    phases = (Phase(60, 2.0, 12.0), Phase(90, 12.0), Phase(60, 12.0, 1.0))
    requests = scripted(phases, mean_prompt=1500, mean_output=250, seed=7)
    step, event = both(requests, "wok", profile, seed=3)
    assert_same(step, event)
    assert step.scale_events > 0  # the law moved the fleet
    assert {t.batch for t in step.timeline} != {step.timeline[0].batch}  # and the batch
    assert sum(r.outcome == "ok" for r in step.records) > 1000


def test_least_loaded_hpa_on_the_mooncake_trace_with_prefix_caching():
    requests = [
        r for r in load_trace(str(TRACES / "mooncake_conversation.jsonl")) if r.arrival_s < 240
    ]
    step, event = both(requests, "hpa-waiting", tight(LLAMA), routing="least-loaded", seed=1)
    assert_same(step, event)
    assert any(r.cached_tokens for r in step.records)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_one_overloaded_pod_on_the_code_trace_rejects_and_times_out(mode: str):
    trace = load_trace(str(TRACES / "azure_llm_2023_code.csv"), seed=2)
    window = [
        dataclasses.replace(r, arrival_s=r.arrival_s - 1200)
        for r in trace
        if 1200 <= r.arrival_s < 1290
    ]
    requests = scale_rate(window, 3.0, mode="overlay", seed=2)
    pod = StaticPolicy("static-1", batch=32, replicas=1)
    step, event = both(
        requests, pod, tight(LLAMA), seed=2, max_queue=64, queue_timeout_s=5.0, mode=mode
    )
    assert_same(step, event)
    assert {r.outcome for r in step.records} >= {"ok", "rejected", "timeout"}
