"""The continuous-batching scheduler, driven by a fake model that really reads its paged cache.

`FakePagedModel` stands in for the model runner (the real one is exercised in test_engine.py):
it stores each token in the slot its block table names and computes the next token from what it
reads back through the table. A scheduling bug that loses, reuses or misplaces KV blocks, or that
recomputes a preempted sequence wrongly, therefore changes the outputs, and these tests see it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from wok_runtime.core.block_manager import BlockManager
from wok_runtime.core.request_queue import QueueFullError, RequestQueue
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.scheduler import ONLINE_HEADROOM_SLOTS, Scheduler, SchedulerOutput
from wok_runtime.core.sequence import Sequence, SequenceStatus

VOCAB = 97
EOS = 0


class FakePagedModel:
    """Pure-Python stand-in for the model runner: a slot store plus a rolling hash."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)

    def step(self, out: SchedulerOutput) -> dict[Sequence, int]:
        sampled: dict[Sequence, int] = {}
        bs = self.block_size
        for item in out.scheduled:
            table = item.seq.block_table
            assert len(table) * bs >= item.start_pos + item.num_tokens
            for offset, token in enumerate(item.token_ids):
                p = item.start_pos + offset
                self.slots[table[p // bs] * bs + p % bs] = token
            if item.samples:
                end = item.start_pos + item.num_tokens
                seen = [self.slots[table[p // bs] * bs + p % bs] for p in range(end)]
                assert seen == item.seq.token_ids[:end], "the cache does not hold the sequence"
                h = 17
                for t in seen:
                    h = (h * 31 + int(t)) % 1_000_003  # type: ignore[arg-type]
                sampled[item.seq] = 1 + h % (VOCAB - 1)  # never EOS unless a test asks for it
        return sampled


def make_scheduler(
    *,
    mode: str = "continuous",
    max_batch_size: int = 8,
    num_blocks: int = 64,
    block_size: int = 4,
    budget: int = 64,
    max_model_len: int = 64,
    max_wait_ms: int = 0,
    share: float = 1.0,
    aging_s: float = 0.0,
    batch_queue_size: int = 1000,
    batch_max: int | None = None,
    grace_s: float = 0.05,
    prefix_caching: bool = True,
    budget_limit: int | None = None,
) -> Scheduler:
    return Scheduler(
        mode=mode,  # type: ignore[arg-type]
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        block_manager=BlockManager(
            num_blocks, block_size, tenant_kv_share=share, prefix_caching=prefix_caching
        ),
        queue=RequestQueue(max_size=1000, aging_s=aging_s),
        batch_queue=RequestQueue(max_size=batch_queue_size, aging_s=aging_s, name="batch queue"),
        batch_lane_max_batch_size=batch_max,
        online_idle_grace_s=grace_s,
        eos_token_id=EOS,
        token_budget_limit=budget_limit,
    )


def make_requests(n: int, seed: int = 0, max_prompt: int = 20, max_out: int = 20) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "request_id": f"r{i}",
            "prompt_token_ids": [
                rng.randrange(1, VOCAB) for _ in range(rng.randint(1, max_prompt))
            ],
            "params": SamplingParams(max_tokens=rng.randint(1, max_out), ignore_eos=True),
            "priority": rng.randint(0, 2),
        }
        for i in range(n)
    ]


def run(
    sched: Scheduler,
    requests: list[dict],
    max_steps: int = 10_000,
    prefilled: list[int] | None = None,
) -> dict[str, list[int]]:
    """Submits everything at t=0 and steps until done; checks the invariants at every step.
    `prefilled` gets each step's prefill tokens."""
    bm = sched.block_manager
    model = FakePagedModel(bm.num_blocks, bm.block_size)
    seqs = [Sequence(arrival_time=i * 1e-3, **r) for i, r in enumerate(requests)]
    for s in seqs:
        sched.add(s, now=0.0)
    now = 0.0
    for _ in range(max_steps):
        if not sched.has_work():
            break
        now += 0.01
        out = sched.schedule(now)
        assert len(sched.running) <= sched.max_batch_size or not any(
            s.first_scheduled_time == now for s in sched.running
        )
        assert sum(item.num_tokens for item in out.scheduled) <= sched.max_num_batched_tokens
        if prefilled is not None:
            prefilled.append(out.num_prefill_tokens)
        bm.check_invariants()
        sched.postprocess(out, model.step(out), now)
    else:
        pytest.fail("the scheduler did not finish")
    assert bm.num_used_blocks == 0
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)
    return {s.request_id: s.output_token_ids for s in seqs}


def test_all_modes_give_the_same_outputs() -> None:
    requests = make_requests(20)
    outputs = {
        mode: run(make_scheduler(mode=mode, max_batch_size=6), requests)
        for mode in ("continuous", "static", "serial")
    }
    assert outputs["continuous"] == outputs["static"] == outputs["serial"]
    for r in requests:
        assert len(outputs["continuous"][r["request_id"]]) == r["params"].max_tokens


def test_chunked_prefill_gives_the_same_outputs() -> None:
    requests = make_requests(10, max_prompt=40)
    whole = run(make_scheduler(budget=256), requests)
    sched = make_scheduler(budget=7)
    assert run(sched, requests) == whole


def test_a_lowered_token_budget_bounds_the_next_step_and_loses_nothing() -> None:
    """A prompt part-way through its prefill goes on from where it was, in chunks of the new
    budget; the outputs are those of an unchunked run (nothing dropped, nothing reordered)."""
    requests = make_requests(6, seed=3, max_prompt=40)
    for r in requests:
        r["prompt_token_ids"] = (r["prompt_token_ids"] * 3)[:40]  # all 40 tokens: 6 × 40 > 64
    whole = run(make_scheduler(budget=256, budget_limit=256), requests)
    sched = make_scheduler(budget=64, budget_limit=256)
    model = FakePagedModel(64, 4)
    seqs = [Sequence(arrival_time=i * 1e-3, **r) for i, r in enumerate(requests)]
    for seq in seqs:
        sched.add(seq, now=0.0)
    out = sched.schedule(0.0)
    assert [item.num_tokens for item in out.scheduled] == [40, 24]  # the second one is cut
    second = out.scheduled[1].seq.request_id
    sched.postprocess(out, model.step(out), 0.0)
    sched.set_batching(max_num_batched_tokens=8)
    now, chunks = 0.0, []
    while sched.has_work():
        now += 0.01
        out = sched.schedule(now)
        assert sum(item.num_tokens for item in out.scheduled) <= 8
        chunks += [(item.seq.request_id, item.start_pos) for item in out.scheduled]
        sched.postprocess(out, model.step(out), now)
    assert next(start for rid, start in chunks if rid == second) == 24  # not started again
    assert {s.request_id: s.output_token_ids for s in seqs} == whole
    sched.set_batching(max_num_batched_tokens=10**6)
    assert sched.max_num_batched_tokens == 256  # clamped to the runner's limit
    sched.set_batching(max_num_batched_tokens=0)
    assert sched.max_num_batched_tokens == 1


def test_a_start_budget_above_its_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be in"):
        make_scheduler(budget=64, budget_limit=32)


def test_preemption_by_recompute_loses_nothing() -> None:
    requests = make_requests(16, seed=3, max_prompt=12, max_out=30)
    roomy = run(make_scheduler(num_blocks=256, max_model_len=48), requests)
    tight = make_scheduler(num_blocks=14, max_model_len=48)  # 12 blocks make one full sequence
    assert run(tight, requests) == roomy
    assert tight.num_preemptions_total > 0


def shared_prefix_requests(n: int, seed: int = 0, prefix_len: int = 21) -> list[dict]:
    """Every prompt starts with one shared prefix (a system prompt) and ends in its own."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(prefix_len)]
    requests = make_requests(n, seed=seed, max_prompt=10, max_out=12)
    for r in requests:
        r["prompt_token_ids"] = prefix + r["prompt_token_ids"]
    return requests


@pytest.mark.parametrize(
    ("num_blocks", "budget"),
    [(64, 64), (64, 9), (12, 64)],  # roomy; chunked prefill; a pool short enough to preempt
)
def test_prefix_caching_gives_the_same_outputs_and_prefills_the_shared_prefix_once(
    num_blocks: int, budget: int
) -> None:
    requests = shared_prefix_requests(16, seed=num_blocks + budget)
    steps_off: list[int] = []
    off = run(
        make_scheduler(
            num_blocks=num_blocks,
            budget=budget,
            max_batch_size=4,
            max_model_len=48,
            prefix_caching=False,
        ),
        requests,
        prefilled=steps_off,
    )
    steps_on: list[int] = []
    sched = make_scheduler(num_blocks=num_blocks, budget=budget, max_batch_size=4, max_model_len=48)
    # The fake model checks at every sample that the blocks read back hold the sequence's tokens,
    # so a hit on a block of another prefix would fail here, not only change the outputs.
    assert run(sched, requests, prefilled=steps_on) == off
    bm = sched.block_manager
    # The first four are admitted together, before anything is cached; the twelve after them
    # each find the five full blocks (20 tokens) of the shared prefix.
    assert bm.prefix_hits >= 12 * 20
    assert bm.prefix_queries == sum(len(r["prompt_token_ids"]) for r in requests)
    # (Preemptions differ between the two runs, so the saving is not exactly the hits.)
    assert sum(steps_on) < sum(steps_off) - 8 * 20


def test_the_victim_is_the_lowest_priority_newest_sequence() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4, max_model_len=24, max_batch_size=3)
    model = FakePagedModel(6, 4)
    p = SamplingParams(max_tokens=12, ignore_eos=True)
    important = Sequence("important", [1] * 4, p, arrival_time=0.0, priority=0)
    old_batch = Sequence("old-batch", [1] * 4, p, arrival_time=1.0, priority=2)
    new_batch = Sequence("new-batch", [1] * 4, p, arrival_time=2.0, priority=2)
    for s in (important, old_batch, new_batch):
        sched.add(s, now=2.0)
    preempted: list[str] = []
    now = 2.0
    while sched.has_work():
        now += 0.01
        out = sched.schedule(now)
        preempted += [s.request_id for s in out.preempted]
        sched.postprocess(out, model.step(out), now)
    assert preempted and preempted[0] == "new-batch"
    assert important.num_preemptions == 0


def test_priorities_decide_admission_order() -> None:
    sched = make_scheduler(mode="serial")
    p = SamplingParams(max_tokens=2, ignore_eos=True)
    for rid, prio, t in [("batch", 2, 0.0), ("standard", 1, 0.1), ("interactive", 0, 0.2)]:
        sched.add(Sequence(rid, [5, 6], p, arrival_time=t, priority=prio), now=t)
    model = FakePagedModel(64, 4)
    order: list[str] = []
    now = 1.0
    while sched.has_work():
        now += 0.01
        out = sched.schedule(now)
        order += [i.seq.request_id for i in out.scheduled if i.seq.request_id not in order]
        sched.postprocess(out, model.step(out), now)
    assert order == ["interactive", "standard", "batch"]


def test_lowering_the_cap_drains_without_preempting_and_raising_is_clamped() -> None:
    sched = make_scheduler(max_batch_size=8, num_blocks=64, max_model_len=32)
    assert sched.capacity == 64  # one block per sequence at the least
    assert sched.kv_safe_batch_size == 8  # 64 blocks / (32 / 4) per full-length sequence
    sched.set_batching(max_batch_size=1000)
    assert sched.max_batch_size == 64
    sched.set_batching(max_batch_size=8)
    model = FakePagedModel(64, 4)
    p = SamplingParams(max_tokens=10, ignore_eos=True)
    for i in range(16):
        sched.add(Sequence(f"r{i}", [3, 4, 5], p, arrival_time=i * 1e-3), now=0.0)
    now = 0.0
    out = sched.schedule(now)
    sched.postprocess(out, model.step(out), now)
    assert len(sched.running) == 8
    sched.set_batching(max_batch_size=3)
    saw_drain = False
    while sched.has_work():
        now += 0.01
        before = len(sched.running)
        out = sched.schedule(now)
        assert not out.preempted
        if before > 3:
            assert len(sched.running) <= before  # nobody admitted while above the new cap
            saw_drain = True
        else:
            assert len(sched.running) <= 3
        sched.postprocess(out, model.step(out), now)
    assert saw_drain and sched.num_preemptions_total == 0


def test_static_mode_waits_for_a_full_batch_or_max_wait() -> None:
    sched = make_scheduler(mode="static", max_batch_size=3, max_wait_ms=100)
    p = SamplingParams(max_tokens=3, ignore_eos=True)
    sched.add(Sequence("a", [1, 2], p, arrival_time=0.0), now=0.0)
    assert sched.schedule(0.05).is_empty  # one waiting, 50 ms: not due
    assert sched.next_wakeup(0.05) == pytest.approx(0.1)
    out = sched.schedule(0.1)  # max_wait_ms reached: a batch of one
    assert [i.seq.request_id for i in out.scheduled] == ["a"]
    model = FakePagedModel(64, 4)
    sched.postprocess(out, model.step(out), 0.1)
    sched.add(Sequence("b", [1, 2], p, arrival_time=0.11), now=0.11)
    out = sched.schedule(0.5)  # "a" still runs: no admission mid-batch
    assert [i.seq.request_id for i in out.scheduled] == ["a"]
    sched.postprocess(out, model.step(out), 0.5)
    for rid in ("c", "d"):
        sched.add(Sequence(rid, [1, 2], p, arrival_time=0.6), now=0.6)
    out = sched.schedule(0.6)
    sched.postprocess(out, model.step(out), 0.6)  # "a" finishes here (3 tokens)
    assert not sched.running
    out = sched.schedule(0.61)  # three waiting = max_batch_size: due at once
    assert sorted(i.seq.request_id for i in out.scheduled) == ["b", "c", "d"]
    for item in out.scheduled:
        sched.finish(item.seq, "abort", 0.61)


def test_a_tenant_at_its_share_waits_while_another_is_admitted() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_model_len=32, share=0.5)
    p = SamplingParams(max_tokens=1, ignore_eos=True)
    a1 = Sequence("a1", [1] * 30, p, arrival_time=0.0, tenant="A")  # 8 blocks: A's whole share
    a2 = Sequence("a2", [1] * 4, p, arrival_time=0.1, tenant="A")
    b1 = Sequence("b1", [1] * 4, p, arrival_time=0.2, tenant="B")
    for s in (a1, a2, b1):
        sched.add(s, now=0.2)
    out = sched.schedule(0.3)
    assert {i.seq.request_id for i in out.scheduled} == {"a1", "b1"}
    assert a2.status is SequenceStatus.WAITING
    for s in (a1, a2, b1):
        sched.finish(s, "abort", 0.3)


def test_under_kv_pressure_a_small_request_never_passes_the_head_of_its_tenant() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_model_len=32, budget=64)
    p = SamplingParams(max_tokens=1, ignore_eos=True)
    seqs = [
        Sequence("r1", [1] * 30, p, arrival_time=0.0),  # 8 blocks
        Sequence("r2", [1] * 20, p, arrival_time=0.1),  # 5 blocks: 3 left
        Sequence("r3", [1] * 30, p, arrival_time=0.2),  # its 14-token chunk needs 4: waits
        Sequence("r4", [1] * 4, p, arrival_time=0.3),  # 1 block would fit, but r3 is first
    ]
    for s in seqs:
        sched.add(s, now=0.3)
    out = sched.schedule(0.4)
    assert [i.seq.request_id for i in out.scheduled] == ["r1", "r2"]
    assert seqs[3].status is SequenceStatus.WAITING
    for s in seqs:
        sched.finish(s, "abort", 0.4)


def test_stop_conditions() -> None:
    sched = make_scheduler()
    model = FakePagedModel(64, 4)
    # The fake model's first token for prompt [1] tells us what to use as a stop token.
    probe = Sequence("probe", [1], SamplingParams(max_tokens=1), arrival_time=0.0)
    sched.add(probe, 0.0)
    out = sched.schedule(0.0)
    sched.postprocess(out, model.step(out), 0.0)
    first = probe.output_token_ids[0]
    assert probe.finish_reason == "length"
    stop = Sequence("stop", [1], SamplingParams(max_tokens=5, stop_token_ids=(first,)), 0.0)
    sched.add(stop, 0.0)
    out = sched.schedule(0.1)
    sched.postprocess(out, model.step(out), 0.1)
    assert stop.finish_reason == "stop" and stop.output_token_ids == [first]
    eos = Sequence("eos", [1], SamplingParams(max_tokens=5), 0.0)
    sched.add(eos, 0.0)
    out = sched.schedule(0.2)
    sched.postprocess(out, {eos: EOS}, 0.2)
    assert eos.finish_reason == "stop"


def test_pool_too_small_for_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        make_scheduler(num_blocks=3, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="tenant_kv_share"):
        make_scheduler(num_blocks=16, block_size=4, max_model_len=64, share=0.5)


def test_the_pure_modules_never_import_torch() -> None:
    """The scheduler side stays testable in milliseconds, and importable without torch."""
    import subprocess
    import sys

    modules = "sequence block_manager request_queue scheduler engine_config sampling_params"
    code = "; ".join(f"import wok_runtime.core.{m}" for m in modules.split())
    code += "; import sys; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the batch lane ----------------------------------------------------------------------------


def lane_requests(n: int, seed: int, batch_every: int = 2, **kw) -> list[dict]:
    """`make_requests`, every `batch_every`-th one in the batch lane."""
    reqs = make_requests(n, seed=seed, **kw)
    for i, r in enumerate(reqs):
        r["lane"] = "batch" if i % batch_every == 0 else "online"
    return reqs


@dataclass
class LaneStep:
    now: float
    online_waiting: int  # after the step's admissions
    admitted: list[Sequence]
    preempted: list[Sequence]
    scheduled: list[Sequence]
    running: list[Sequence]


def drive(
    sched: Scheduler, arrivals: list[tuple[float, Sequence]], max_steps: int = 20_000
) -> list[LaneStep]:
    """Steps every 10 ms, adding each sequence at its time; checks the invariants each step."""
    bm = sched.block_manager
    model = FakePagedModel(bm.num_blocks, bm.block_size)
    pending = sorted(arrivals, key=lambda a: a[0])
    steps: list[LaneStep] = []
    now = 0.0
    for _ in range(max_steps):
        while pending and pending[0][0] <= now:
            sched.add(pending.pop(0)[1], now)
        if not pending and not sched.has_work():
            return steps
        before = set(sched.running)
        out = sched.schedule(now)
        bm.check_invariants()
        scheduled = [i.seq for i in out.scheduled]
        # Online work is preempted only once no batch sequence is left to take from.
        if any(not s.is_batch for s in out.preempted):
            assert not any(s.is_batch for s in scheduled), now
        steps.append(
            LaneStep(
                now=now,
                online_waiting=len(sched.queue),
                admitted=[s for s in sched.running if s not in before],
                preempted=list(out.preempted),
                scheduled=scheduled,
                running=list(sched.running),
            )
        )
        sched.postprocess(out, model.step(out), now)
        now = round(now + 0.01, 6)
    pytest.fail("the scheduler did not finish")


def sequences(requests: list[dict], spacing: float = 0.0) -> list[tuple[float, Sequence]]:
    return [(i * spacing, Sequence(arrival_time=i * spacing, **r)) for i, r in enumerate(requests)]


def test_online_requests_are_scheduled_before_batch_ones_that_came_first() -> None:
    sched = make_scheduler(max_batch_size=2)
    p = SamplingParams(max_tokens=3, ignore_eos=True)
    for i in range(3):
        sched.add(Sequence(f"b{i}", [1, 2], p, arrival_time=0.0, lane="batch"), now=0.0)
    sched.add(Sequence("o0", [1, 2], p, arrival_time=0.1, priority=2), now=0.1)
    sched.add(Sequence("o1", [1, 2], p, arrival_time=0.2, priority=2), now=0.2)
    out = sched.schedule(0.2)
    assert [i.seq.request_id for i in out.scheduled] == ["o0", "o1"]
    assert len(sched.batch_queue) == 3
    for seq in [*sched.running, *sched.waiting(0.2)]:
        sched.finish(seq, "abort", 0.2)


def test_batch_is_never_admitted_while_online_waits_nor_online_preempted_for_it() -> None:
    requests = lane_requests(60, seed=5, batch_every=2, max_prompt=12, max_out=24)
    sched = make_scheduler(max_batch_size=4, num_blocks=20, max_model_len=40)
    seqs = sequences(requests, spacing=0.015)
    steps = drive(sched, seqs)  # checks that online is preempted only with no batch left
    for step in steps:
        if step.online_waiting:
            assert not any(s.is_batch for s in step.admitted), step.now
        # With online work about, batch only fills the slots below the online cap.
        if any(not s.is_batch for s in step.running):
            assert len(step.running) <= sched.max_batch_size or not any(
                s.is_batch for s in step.admitted
            )
    assert sched.preemptions["batch"] > 0
    assert all(s.finish_reason == "length" for _, s in seqs)


def test_batch_is_preempted_first_and_resumes_with_the_same_output() -> None:
    requests = lane_requests(24, seed=7, batch_every=3, max_prompt=12, max_out=30)
    roomy = run(make_scheduler(num_blocks=512, max_model_len=48), requests)
    tight = make_scheduler(num_blocks=16, max_model_len=48)  # 12 blocks: one full sequence
    seqs = sequences(requests, spacing=0.02)
    drive(tight, seqs)
    assert {s.request_id: s.output_token_ids for _, s in seqs} == roomy
    assert tight.preemptions["batch"] > 0
    assert all(len(s.output_token_ids) == s.params.max_tokens for _, s in seqs)


def test_online_never_evicted_by_batch_even_when_the_pool_is_short() -> None:
    sched = make_scheduler(num_blocks=12, block_size=4, max_model_len=40, max_batch_size=4)
    p = SamplingParams(max_tokens=30, ignore_eos=True)
    online = Sequence("online", [1] * 8, p, arrival_time=1.0)
    batch = [Sequence(f"b{i}", [1] * 4, p, arrival_time=0.0, lane="batch") for i in range(3)]
    steps = drive(sched, [(0.0, b) for b in batch] + [(0.1, online)])
    assert online.num_preemptions == 0
    assert sum(b.num_preemptions for b in batch) > 0
    assert any(s.preempted for s in steps)


def test_online_arrivals_take_the_headroom_then_preempt_only_what_they_need() -> None:
    sched = make_scheduler(max_batch_size=4, num_blocks=64, grace_s=10.0)
    p = SamplingParams(max_tokens=40, ignore_eos=True)
    sched.add(Sequence("o0", [1, 2], p, arrival_time=0.0), now=0.0)
    for i in range(6):
        sched.add(Sequence(f"b{i}", [1, 2], p, arrival_time=0.0, lane="batch"), now=0.0)
    model = FakePagedModel(64, 4)
    out = sched.schedule(0.0)
    sched.postprocess(out, model.step(out), 0.0)
    # The free slots under the online cap, less one kept for the next online arrival.
    assert sum(s.is_batch for s in sched.running) == 4 - 1 - ONLINE_HEADROOM_SLOTS
    late = [Sequence(f"o{i}", [1, 2], p, arrival_time=0.01) for i in (1, 2)]
    sched.add(late[0], now=0.01)
    out = sched.schedule(0.01)
    assert not out.preempted and late[0] in sched.running  # the headroom slot
    sched.postprocess(out, model.step(out), 0.01)
    sched.add(late[1], now=0.02)
    out = sched.schedule(0.02)
    assert len(out.preempted) == 1 and out.preempted[0].is_batch  # one slot, one victim
    assert late[1] in sched.running and len(sched.running) == 4
    for seq in [*sched.running, *sched.waiting(0.02)]:
        sched.finish(seq, "abort", 0.02)


def test_a_full_batch_queue_refuses_only_batch_work() -> None:
    sched = make_scheduler(batch_queue_size=2)
    p = SamplingParams(max_tokens=2)
    for i in range(2):
        sched.add(Sequence(f"b{i}", [1], p, arrival_time=0.0, lane="batch"), now=0.0)
    with pytest.raises(QueueFullError, match="batch queue full") as caught:
        sched.add(Sequence("b2", [1], p, arrival_time=0.0, lane="batch"), now=0.0)
    assert caught.value.retry_after_s > 0
    for i in range(10):  # the online queue has a bound of its own
        sched.add(Sequence(f"o{i}", [1], p, arrival_time=0.0), now=0.0)
    assert len(sched.queue) == 10 and len(sched.batch_queue) == 2


def test_the_batch_lane_grows_past_the_online_cap_only_when_online_is_idle() -> None:
    sched = make_scheduler(max_batch_size=2, batch_max=6, num_blocks=128, grace_s=0.05)
    p = SamplingParams(max_tokens=60, ignore_eos=True)
    batch = [Sequence(f"b{i}", [1, 2], p, arrival_time=0.0, lane="batch") for i in range(10)]
    online = Sequence("o", [1, 2], SamplingParams(max_tokens=5, ignore_eos=True), 0.2)
    steps = drive(sched, [(0.0, b) for b in batch] + [(0.2, online)])
    by_time = {s.now: s for s in steps}
    assert len(by_time[0.0].running) == 6  # idle from the start: the batch lane's own cap
    arrival = by_time[0.2]
    assert online in arrival.running and len(arrival.running) == 2  # back under the online cap
    assert len(arrival.preempted) == 5
    # The online request runs 5 steps; then the grace (50 ms) before the lane grows again.
    assert max(len(by_time[t].running) for t in (0.25, 0.26, 0.27)) <= 2
    assert any(len(s.running) == 6 for s in steps if s.now > 0.3)
    assert online.num_preemptions == 0


def test_all_modes_give_the_same_outputs_with_both_lanes() -> None:
    requests = lane_requests(16, seed=11)
    outputs = {
        mode: run(make_scheduler(mode=mode, max_batch_size=5), requests)
        for mode in ("continuous", "static", "serial")
    }
    assert outputs["continuous"] == outputs["static"] == outputs["serial"]


def test_an_idle_engine_wakes_when_the_online_grace_opens_the_batch_lane() -> None:
    # With a cap of 1 the headroom leaves the batch lane no slot while online work is recent.
    sched = make_scheduler(max_batch_size=1, grace_s=0.5)
    model = FakePagedModel(64, 4)
    online = Sequence("o", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.0)
    sched.add(online, now=0.0)
    out = sched.schedule(0.0)
    sched.postprocess(out, model.step(out), 0.0)
    batch = Sequence("b", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.1, lane="batch")
    sched.add(batch, now=0.1)
    assert sched.schedule(0.1).is_empty
    assert sched.next_wakeup(0.1) == pytest.approx(0.5)
    out = sched.schedule(0.5)
    assert [i.seq for i in out.scheduled] == [batch]
    sched.postprocess(out, model.step(out), 0.5)
