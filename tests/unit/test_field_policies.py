"""The field's autoscalers in the policy registry: named, swept over their targets, out of
`all`, and each running in a small simulation."""

from __future__ import annotations

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.signals import PodView, ServiceSignals
from wok_contracts.traces import TraceRequest
from wok_sim.policies import PolicyContext, load_registry, resolve
from wok_sim.policy import FleetView, PodSample

FIELD = ("aibrix-kpa", "aibrix-apa", "dynamo-planner", "wva")
SWEPT = ("aibrix-kpa-swept", "aibrix-apa-swept", "dynamo-planner-swept", "wva-swept")


def _ctx(requests: tuple[TraceRequest, ...] = ()) -> PolicyContext:
    return PolicyContext(
        profile=load_profile("sim:llama-3-8b-80g"), slo_ttft_s=2.0, slo_tpot_s=0.1,
        slo_e2e_s=None, max_replicas=16, batch_mem=64, cold_start_s=60.0, requests=requests,
        start_replicas=1,
    )  # fmt: skip


def test_the_field_is_registered_out_of_all_and_swept_by_target() -> None:
    registry = load_registry()
    for name in (*FIELD, *SWEPT):
        assert name in registry and name not in resolve("all")
    ctx = _ctx()
    for name in SWEPT:
        names = {p.name for p in registry[name].variants(ctx)}
        assert len(names) >= 4 and all(n.startswith(name.removesuffix("-swept")) for n in names)
    swept = {p.name for p in registry["aibrix-apa-swept"].variants(ctx)}
    assert swept >= {"aibrix-apa-kv-0.05", "aibrix-apa-kv-0.1", "aibrix-apa-waiting-100"}
    # KV usage targets that never scale past one pod on the matrix's traces are not swept.
    assert not swept & {"aibrix-apa-kv-0.2", "aibrix-apa-kv-0.5"}
    assert {p.name for p in registry["aibrix-apa"].variants(ctx)} == {"aibrix-apa"}


def _view(now: float, replicas: int, finished_per_s: float) -> FleetView:
    pods = tuple(
        PodSample(PodView(f"p{i}", f"u{i}", "10.0.0.1", True, False), 0.0, 8.0, 0.1)
        for i in range(replicas)
    )
    signals = ServiceSignals(finished_per_s=finished_per_s)
    return FleetView(now=now, replicas=replicas, batch=32, pods=pods, signals=signals)


@pytest.mark.parametrize("name", ["dynamo-planner", "wva"])
def test_model_based_policies_scale_with_the_load(name: str) -> None:
    low = tuple(TraceRequest(arrival_s=i * 1.0, prompt_tokens=1000, output_tokens=200)
                for i in range(180))  # fmt: skip
    high = tuple(TraceRequest(arrival_s=i * 0.02, prompt_tokens=1000, output_tokens=200)
                 for i in range(9000))  # fmt: skip
    counts = []
    for requests, rate in ((low, 1.0), (high, 50.0)):
        [policy] = [
            p for p in load_registry()[name].variants(_ctx(requests)) if p.fixed_batch == 32
        ]
        action = policy.decide(_view(policy.interval_s, 1, rate))
        counts.append(action.replicas)
    assert counts[0] == 1 and counts[1] > 2, counts
