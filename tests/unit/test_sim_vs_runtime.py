"""A differential test: the simulator's `SimReplica` against the runtime's own `Scheduler`, with a
fake clock that charges each step what the same step profile says. Both must admit, chunk,
preempt and finish every request at the same times, also under KV pressure, where the order of
admission decides who waits (a small request must not pass the head of the queue), and when the
step token budget moves mid-run (the admin API's `max_num_batched_tokens`)."""

from __future__ import annotations

import math
import random

import pytest

from wok_contracts.profile import StepProfile
from wok_contracts.traces import TraceRequest
from wok_runtime.core.block_manager import BlockManager
from wok_runtime.core.request_queue import RequestQueue
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.scheduler import Scheduler
from wok_runtime.core.sequence import Sequence
from wok_sim.replica import SimReplica, run_single

# A small pod: 64 blocks of 16 tokens, so a burst of long prompts fills the pool.
PROFILE = StepProfile(
    name="differential",
    kind="model",
    device="fake",
    a_s=0.01,
    b_s_per_seq=0.0005,
    c_s_per_prefill_token=0.0001,
    d_s_per_context_token=0.000001,
    step_token_budget=256,
    kv_capacity_tokens=64 * 16,
    block_size=16,
    max_model_len=512,
)
QUEUE_TIMEOUT_S = 1e6  # nothing expires: this compares scheduling, not timeouts
Budgets = tuple[tuple[float, int], ...]  # (from time, step token budget), in time order


def runtime_times(
    requests: list[TraceRequest], batch_cap: int, budgets: Budgets = ()
) -> list[tuple[float, float]]:
    """(first token, finish) per request from the runtime scheduler on a fake clock; each
    budget applies from the first step that starts at or after its time."""
    sched = Scheduler(
        mode="continuous",
        max_batch_size=batch_cap,
        max_wait_ms=0,
        max_num_batched_tokens=PROFILE.step_token_budget,
        max_model_len=PROFILE.max_model_len,
        # Without hash_ids the simulator caches nothing; the runtime's cache would also let a
        # preempted request resume from its own blocks instead of recomputing them.
        block_manager=BlockManager(PROFILE.kv_blocks, PROFILE.block_size, prefix_caching=False),
        queue=RequestQueue(max_size=10_000, aging_s=0.0),
        eos_token_id=None,
    )
    seqs = [
        Sequence(
            f"r{i}",
            [1] * r.prompt_tokens,
            SamplingParams(max_tokens=r.output_tokens, ignore_eos=True),
            arrival_time=r.arrival_s,
        )
        for i, r in enumerate(requests)
    ]
    clock, pending, changes = 0.0, 0, list(budgets)
    while pending < len(seqs) or sched.has_work():
        while pending < len(seqs) and seqs[pending].arrival_time <= clock:
            sched.add(seqs[pending], now=seqs[pending].arrival_time)
            pending += 1
        while changes and changes[0][0] <= clock:
            sched.set_batching(max_num_batched_tokens=changes.pop(0)[1])
        out = sched.schedule(clock)
        if not out.scheduled:
            assert pending < len(seqs), "work left that the scheduler will not run"
            clock = max(clock, seqs[pending].arrival_time)
            continue
        decodes = prefill = context = 0
        for item in out.scheduled:
            if item.seq.num_uncomputed_tokens == 1 and item.seq.num_output_tokens > 0:
                decodes += 1
            else:
                prefill += item.num_tokens
            context += item.start_pos + item.num_tokens
        clock += PROFILE.step_seconds(decodes, prefill, context)
        sched.postprocess(out, {item.seq: 1 for item in out.scheduled if item.samples}, clock)
    return [(s.first_token_time or math.nan, s.finished_time or math.nan) for s in seqs]


def burst(seed: int, n: int = 120) -> list[TraceRequest]:
    """Long and short prompts arriving faster than one pod serves them."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(8.0)
        prompt = rng.choice((rng.randint(8, 40), rng.randint(200, 480)))
        out.append(TraceRequest(t, prompt, rng.randint(1, 30)))
    return out


@pytest.mark.parametrize(("seed", "batch_cap"), [(0, 8), (1, 16), (2, 32), (3, 64)])
def test_the_simulated_replica_schedules_as_the_runtime_does(seed: int, batch_cap: int) -> None:
    requests = burst(seed)
    sim = run_single(
        PROFILE, requests, batch_cap=batch_cap, queue_timeout_s=QUEUE_TIMEOUT_S,
        max_queue=10_000, fast=False,
    )  # fmt: skip
    assert all(r.outcome == "ok" for r in sim)
    runtime = runtime_times(requests, batch_cap)
    for record, (first, finish) in zip(sim, runtime, strict=True):
        assert record.first_token_s == pytest.approx(first, abs=1e-9), record
        assert record.finish_s == pytest.approx(finish, abs=1e-9), record


def sim_times(
    requests: list[TraceRequest], batch_cap: int, budgets: Budgets, *, fast: bool
) -> list[tuple[float, float]]:
    """The same from one `SimReplica`, its budget set at each change's time."""
    replica = SimReplica(
        PROFILE, batch_cap=batch_cap, queue_timeout_s=QUEUE_TIMEOUT_S, max_queue=10_000, fast=fast
    )
    events = sorted([(r.arrival_s, 0, i) for i, r in enumerate(requests)] + [
        (t, 1, budget) for t, budget in budgets
    ])  # fmt: skip
    for t, kind, value in events:
        replica.advance_to(t)
        if kind == 0:
            replica.add(value, requests[value])
        else:
            replica.set_token_budget(value)
    replica.advance_to(math.inf)
    records = sorted(replica.records, key=lambda r: r.request_id)
    assert all(r.outcome == "ok" for r in records)
    return [(r.first_token_s or math.nan, r.finish_s) for r in records]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize(
    "budgets",
    [((3.0, 40), (8.0, 200)), ((1.0, 7), (5.0, 10_000), (9.0, 64))],  # 10 000: clamped to 256
)
def test_a_budget_that_moves_mid_run_schedules_as_the_runtime_does(
    budgets: Budgets, fast: bool
) -> None:
    requests = burst(4)
    runtime = runtime_times(requests, 16, budgets)
    assert runtime != runtime_times(requests, 16), "the budget changes nothing here"
    sim = sim_times(requests, 16, budgets, fast=fast)
    flat = [t for pair in runtime for t in pair]
    assert [t for pair in sim for t in pair] == pytest.approx(flat, abs=1e-9)
