"""vLLM pods in the simulator: the batch cap and step budget fixed at start, an unbounded queue;
the rest is the runtime's scheduler (replica.py)."""

from __future__ import annotations

import pytest

from wok_contracts.profile import load_profile
from wok_contracts.traces import TraceRequest
from wok_sim.fleet import FleetConfig, simulate_fleet
from wok_sim.policy import Action, FleetView
from wok_sim.replica import DEFAULT_MAX_QUEUE, SimReplica, run_single
from wok_sim.vllm_pod import VllmReplica, run_single_vllm

PROFILE = load_profile("sim:llama-3-8b-80g")


def test_the_batch_cap_and_budget_stay_what_the_pod_started_with():
    replica = VllmReplica(PROFILE, max_num_seqs=2)
    replica.set_batch_cap(32)
    replica.set_token_budget(64)
    assert (replica.batch_cap, replica.token_budget) == (2, PROFILE.step_token_budget)
    for i in range(5):
        replica.add(i, TraceRequest(0.0, 16, 50))
    replica.advance_to(0.05)
    assert (replica.num_running, replica.num_waiting) == (2, 3)


def test_a_burst_beyond_wok_s_queue_bound_waits_instead_of_being_refused():
    burst = [TraceRequest(0.0, 16, 4) for _ in range(DEFAULT_MAX_QUEUE + 40)]
    wok = run_single(PROFILE, burst, batch_cap=8)
    vllm = run_single_vllm(PROFILE, burst, max_num_seqs=8)
    assert sum(r.outcome == "rejected" for r in wok) > 0
    assert {r.outcome for r in vllm} == {"ok"}


def test_a_long_wait_does_not_time_out():
    # one slot, long outputs: the last request waits far past wok's 30 s queue timeout
    requests = [TraceRequest(0.0, 16, 2000) for _ in range(8)]
    vllm = run_single_vllm(PROFILE, requests, max_num_seqs=1)
    assert {r.outcome for r in vllm} == {"ok"}
    assert max(r.ttft_s or 0.0 for r in vllm) > 30.0


class GrowingBatch:
    """A policy that raises the batch cap every tick (a real Policy, not a mock)."""

    name = "growing"
    interval_s = 5.0

    def start(self) -> Action:
        return Action(batch=4, replicas=2)

    def decide(self, view: FleetView) -> Action:
        return Action(batch=4 + int(view.now), replicas=2)


def most_running_at_once(records):
    """The most requests any one pod ran at the same time (from first scheduled to finish)."""
    edges = sorted(
        (t, step, r.pod)
        for r in records
        for t, step in ((r.first_scheduled_s, 1), (r.finish_s, -1))
    )
    running: dict[int, int] = {}
    most = 0
    for _, step, pod in edges:
        running[pod] = running.get(pod, 0) + step
        most = max(most, running[pod])
    return most


@pytest.mark.parametrize(("vllm_cap", "most"), [(3, 3), (None, 20)])
def test_fleet_vllm_pods_ignore_the_law_s_batch_and_keep_their_cap(vllm_cap, most):
    requests = [TraceRequest(10.0 + i / 40, 32, 400) for i in range(120)]
    config = FleetConfig(PROFILE, cold_start_s=0, duration_s=60, vllm_max_num_seqs=vllm_cap)
    run = simulate_fleet(requests, GrowingBatch(), config)
    assert run.timeline[-1].batch > 3  # the law moved its batch
    assert {r.outcome for r in run.records} == {"ok"}
    if vllm_cap:
        assert most_running_at_once(run.records) == most  # the pods did not follow
    else:
        assert most_running_at_once(run.records) >= most  # wok's runtime pods did


def test_pods_are_vllm_replicas_only_when_asked():
    with pytest.raises(ValueError, match="max-num-seqs"):
        FleetConfig(PROFILE, vllm_max_num_seqs=0)
    assert issubclass(VllmReplica, SimReplica)
