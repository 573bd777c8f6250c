"""The simulated runtime pod: the scheduler's semantics, hand-computed, and its fast path."""

from __future__ import annotations

import dataclasses

import pytest

from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.traces import TraceRequest, clip_to_model, poisson
from wok_sim.replica import SimReplica, run_single


def profile(**overrides: float) -> StepProfile:
    values = {
        "name": "test",
        "kind": "model",
        "device": "test",
        "a_s": 0.002,
        "b_s_per_seq": 0.0,
        "c_s_per_prefill_token": 0.0,
        "d_s_per_context_token": 0.0,
        "step_token_budget": 512,
        "kv_capacity_tokens": 16_384,
        "block_size": 16,
        "max_model_len": 256,
    }
    values.update(overrides)
    return StepProfile(**values)  # type: ignore[arg-type]


def test_the_briefs_dynamic_batcher_in_static_mode():
    # Batch 4, window 50 ms, 2 ms per token, 32 tokens, the engine busy while a batch runs.
    # 0-24 ms: four arrivals fill the batch at 24 ms; 32 steps of 2 ms end it at 88 ms. The next
    # four (60-78 ms) are a full batch when the engine frees up: 88 → 152 ms. The last two
    # (120, 130 ms) wait for the window of the older one: 120 + 50 = 170 → 234 ms.
    arrivals_ms = [0, 8, 16, 24, 60, 66, 72, 78, 120, 130]
    requests = [TraceRequest(ms / 1000, 4, 32) for ms in arrivals_ms]
    records = run_single(profile(), requests, batch_cap=4, mode="static", max_wait_ms=50)
    starts = [round(r.first_scheduled_s * 1000, 6) for r in records]
    finishes = [round(r.finish_s * 1000, 6) for r in records]
    assert starts == [24] * 4 + [88] * 4 + [170] * 2
    assert finishes == [88] * 4 + [152] * 4 + [234] * 2
    assert all(r.outcome == "ok" and r.output_tokens == 32 for r in records)


def test_chunked_prefill_by_hand():
    # 1200 prompt tokens in a 512-token budget: chunks of 512, 512, 176; the last one samples the
    # first token. Then two decode steps of `a` each.
    p = profile(a_s=0.001, c_s_per_prefill_token=0.0001, max_model_len=2048)
    [record] = run_single(p, [TraceRequest(0.0, 1200, 3)], batch_cap=8)
    ttft = 2 * (0.001 + 0.0512) + (0.001 + 0.0176)
    assert record.first_token_s == pytest.approx(ttft)
    assert record.finish_s == pytest.approx(ttft + 2 * 0.001)
    assert record.tpot_s == pytest.approx(0.001)


def test_a_prompt_shares_the_budget_with_running_decodes():
    # The first request's 10-token prefill runs from 0 to 2 ms. The second arrives inside that
    # step and is admitted at the next one (2 ms), next to the first's decode: 1 decode token +
    # a 511-token chunk per step (0.001 + 0.0511 s), two steps for its 1022 tokens.
    p = profile(a_s=0.001, c_s_per_prefill_token=0.0001, max_model_len=2048)
    first, second = run_single(
        p, [TraceRequest(0.0, 10, 50), TraceRequest(0.0015, 1022, 2)], batch_cap=8
    )
    assert first.first_token_s == pytest.approx(0.002)
    assert second.first_scheduled_s == pytest.approx(0.002)
    assert second.first_token_s == pytest.approx(0.002 + 2 * 0.0521)


def test_preemption_when_kv_runs_out_loses_nothing():
    # 8 blocks of 4 tokens. Three 8-token prompts take 6 blocks; when they grow past 8 tokens
    # each needs a third block, and the newest is preempted (recomputed later).
    p = profile(kv_capacity_tokens=32, block_size=4, max_model_len=16, step_token_budget=64)
    requests = [TraceRequest(0.0, 8, 8), TraceRequest(0.0001, 8, 8), TraceRequest(0.0002, 8, 8)]
    replica = SimReplica(p, batch_cap=3)
    for i, request in enumerate(requests):
        replica.advance_to(request.arrival_s)
        replica.add(i, request)
    replica.advance_to(float("inf"))
    records = sorted(replica.records, key=lambda r: r.request_id)
    assert replica.num_preemptions >= 1
    assert [r.outcome for r in records] == ["ok"] * 3
    assert [r.output_tokens for r in records] == [8] * 3
    assert records[2].finish_s > records[1].finish_s
    assert replica.used == 0
    slow = run_single(p, requests, batch_cap=3, fast=False)
    assert [r.finish_s for r in slow] == pytest.approx([r.finish_s for r in records])


def test_a_full_queue_rejects_and_a_stale_request_times_out():
    p = profile(a_s=0.01)
    requests = [TraceRequest(0.0, 4, 200)] + [TraceRequest(0.0, 4, 1)] * 3
    records = run_single(p, requests, batch_cap=1, max_queue=2, queue_timeout_s=1.0)
    assert [r.outcome for r in records] == ["ok", "timeout", "rejected", "rejected"]
    # The waiting request expires at the first step that starts at or after its deadline.
    assert 1.0 <= records[1].finish_s < 1.0 + 0.01 + 1e-9
    assert records[2].finish_s == 0.0 and records[2].first_token_s is None


def test_lowering_the_cap_only_stops_admissions():
    p = profile(a_s=0.01)
    replica = SimReplica(p, batch_cap=4)
    for i in range(6):
        replica.add(i, TraceRequest(0.0, 4, 100))
    replica.advance_to(0.05)
    assert (replica.num_running, replica.num_waiting) == (4, 2)
    replica.set_batch_cap(2)
    replica.advance_to(0.5)
    assert replica.num_running == 4  # nobody is evicted
    replica.advance_to(1.5)
    assert replica.num_running <= 2 and replica.num_waiting == 0


@pytest.mark.parametrize("shared_blocks", [0, 2])
def test_fast_forward_gives_the_same_times_as_stepping_one_by_one(shared_blocks: int):
    p = profile(
        a_s=0.005,
        b_s_per_seq=1e-4,
        c_s_per_prefill_token=2e-5,
        d_s_per_context_token=1e-7,
        kv_capacity_tokens=8192,
        max_model_len=2048,
    )
    requests = poisson(15, 60, mean_prompt=300, mean_output=150, seed=2)
    if shared_blocks:  # a shared system prompt before each prompt, then the prompt's own blocks
        requests = [
            dataclasses.replace(
                r,
                prompt_tokens=r.prompt_tokens + 512 * shared_blocks,
                hash_ids=(*range(shared_blocks), *(100 + 4 * i + j for j in range(4))),
            )
            for i, r in enumerate(requests)
        ]
    requests, _ = clip_to_model(requests, 2048)
    replica = SimReplica(p, batch_cap=48, max_queue=64)
    for i, request in enumerate(requests):
        replica.advance_to(request.arrival_s)
        replica.add(i, request)
    replica.advance_to(float("inf"))
    fast = sorted(replica.records, key=lambda r: r.request_id)
    slow = run_single(p, requests, batch_cap=48, max_queue=64, fast=False)
    assert replica.num_jumps > 0 and replica.num_preemptions > 0  # both paths are exercised
    assert [r.outcome for r in fast] == [r.outcome for r in slow]
    assert {r.outcome for r in fast} >= {"ok", "rejected"}  # overloaded: 429s too
    assert any(r.cached_tokens for r in fast) == bool(shared_blocks)
    for a, b in zip(fast, slow, strict=True):
        assert a.output_tokens == b.output_tokens
        assert a.cached_tokens == b.cached_tokens
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-9)
        assert (a.first_token_s or 0.0) == pytest.approx(b.first_token_s or 0.0, abs=1e-9)


def test_littles_law_at_steady_state():
    # Mean running (time-averaged) = arrival rate x mean time from admission to finish.
    p = load_profile("sim:llama-3-8b-80g")
    requests = poisson(5.0, 600.0, mean_prompt=400, mean_output=120, seed=7)
    replica = SimReplica(p, batch_cap=256)
    samples, t, dt, i = [], 0.0, 0.1, 0
    while t < 600.0:
        while i < len(requests) and requests[i].arrival_s <= t:
            replica.advance_to(requests[i].arrival_s)
            replica.add(i, requests[i])
            i += 1
        replica.advance_to(t)
        if t >= 60.0:  # past the warm-up
            samples.append(replica.num_running)
        t += dt
    records = [r for r in replica.records if r.arrival_s >= 60.0 and r.finish_s < 590.0]
    service = sum(r.finish_s - r.first_scheduled_s for r in records) / len(records)
    rate = len([r for r in requests if 60.0 <= r.arrival_s < 600.0]) / 540.0
    mean_running = sum(samples) / len(samples)
    assert mean_running == pytest.approx(rate * service, rel=0.05)


def test_a_cached_prefix_is_not_prefilled_again_by_hand():
    # Two 1100-token prompts that share their first two 512-token blocks (ids 7, 8). The first
    # prefills all 1100 tokens (1 ms + 0.1 ms a token per step, 1024-token budget: two chunks).
    # The second arrives once the first has finished and is admitted after the 1024 cached
    # tokens: one step of 76 prefill tokens. With caching off it prefills all 1100 again.
    p = profile(a_s=0.001, c_s_per_prefill_token=0.0001, max_model_len=2048, step_token_budget=1024)
    first = TraceRequest(0.0, 1100, 2, (7, 8, 9))
    second = TraceRequest(1.0, 1100, 2, (7, 8, 10))
    cached, full = (
        run_single(p, [first, second], batch_cap=8, prefix_caching=caching) for caching in (1, 0)
    )
    prefill_all = 2 * 0.001 + 0.1024 + 0.0076
    assert cached[0].ttft_s == full[0].ttft_s == pytest.approx(prefill_all)
    assert full[1].ttft_s == pytest.approx(prefill_all)
    assert cached[1].ttft_s == pytest.approx(0.001 + 0.0076)
    assert [r.cached_tokens for r in cached] == [0, 1024]
    assert [r.cached_tokens for r in full] == [0, 0]


def test_the_prefix_cache_needs_whole_blocks_leaves_the_last_token_and_forgets_lru():
    p = profile(max_model_len=1100, kv_capacity_tokens=1200)  # room for two 512-token blocks
    records = run_single(
        p,
        [
            TraceRequest(0.0, 1024, 1, (1, 2)),
            TraceRequest(1.0, 1024, 1, (1, 2)),  # all cached, but the last token is computed
            TraceRequest(2.0, 1000, 1, (3, 4)),  # block 4 is not full: only 3 enters the cache
            TraceRequest(3.0, 1000, 1, (1, 2)),  # 3 took the least recently used block, 1
        ],
        batch_cap=8,
    )
    assert [r.cached_tokens for r in records] == [0, 512, 0, 0]
