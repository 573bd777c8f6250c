"""LLMEngine with the real model runner on builtin:tiny: modes agree, preemption and chunking lose
nothing, the live cap holds, bad requests fail alone, timeouts and aborts free everything."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest
import torch

from wok_runtime.core.engine import (
    EngineConfig,
    EngineDeadError,
    InvalidRequestError,
    LLMEngine,
    QueueFullError,
    RequestOutput,
    SamplingParams,
    StepStats,
)
from wok_runtime.core.model_runner import ModelRunner, StepInput

BLOCK = 16
MAX_LEN = 128
POISON = 4242  # a prompt holding this token gets NaN logits from the fault injector


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner.from_source(
        "builtin:tiny",
        kv_cache_bytes=64 * BLOCK * 4096,  # 64 blocks
        block_size=BLOCK,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=512,
    )


@pytest.fixture(scope="module")
def small_runner() -> ModelRunner:
    """Room for 24 blocks: 8 requests of ~80 tokens need ~40, so the engine must preempt."""
    return ModelRunner.from_source(
        "builtin:tiny",
        kv_cache_bytes=24 * BLOCK * 4096,
        block_size=BLOCK,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=512,
    )


class Collector:
    """Gathers the outputs of many requests, as the server would."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.final: dict[str, RequestOutput] = {}
        self.done = threading.Event()
        self.expected = 0
        self.threads: set[str] = set()

    def __call__(self, out: RequestOutput) -> None:
        self.threads.add(threading.current_thread().name)
        self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            self.final[out.request_id] = out
            if len(self.final) >= self.expected:
                self.done.set()


def requests(
    n: int = 8, seed: int = 0, max_out: int = 24
) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(1, 8000) for _ in range(rng.randint(4, 40))],
            SamplingParams(max_tokens=rng.randint(4, max_out), ignore_eos=True),
        )
        for _ in range(n)
    ]


def drive(engine: LLMEngine, reqs: list[tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    """Runs all requests to completion on the engine's own thread; returns tokens by request."""
    got = Collector()
    got.expected = len(reqs)
    engine.start()
    try:
        for i, (prompt, params) in enumerate(reqs):
            engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")
        assert got.done.wait(60), "requests did not finish"
    finally:
        engine.shutdown(drain_timeout_s=5)
    assert got.threads == {"wok-engine"}
    assert all(o.finish_reason == "length" for o in got.final.values()), got.final
    return got.tokens


def test_all_modes_give_the_same_greedy_outputs(runner: ModelRunner) -> None:
    reqs = requests()
    results = {
        mode: drive(LLMEngine(runner, EngineConfig(mode=mode, max_batch_size=4)), reqs)
        for mode in ("continuous", "static", "serial")
    }
    assert results["continuous"] == results["static"] == results["serial"]
    assert [len(results["serial"][f"r{i}"]) for i in range(len(reqs))] == [
        p.max_tokens for _, p in reqs
    ]


def test_preemption_and_chunked_prefill_lose_nothing(
    runner: ModelRunner, small_runner: ModelRunner
) -> None:
    rng = random.Random(1)
    reqs = [  # 8 × ~7 blocks of demand on a 24-block pool
        (
            [rng.randrange(1, 8000) for _ in range(rng.randint(20, 40))],
            SamplingParams(max_tokens=rng.randint(60, 80), ignore_eos=True),
        )
        for _ in range(8)
    ]
    reference = drive(LLMEngine(runner, EngineConfig(max_batch_size=8)), reqs)
    preemptions: list[int] = []
    tight = LLMEngine(
        small_runner,
        EngineConfig(max_batch_size=8),
        on_step=lambda s: preemptions.append(s.num_preempted),
    )
    assert drive(tight, reqs) == reference
    assert sum(preemptions) > 0 and tight.stats().num_preemptions_total == sum(preemptions)
    chunked = LLMEngine(runner, EngineConfig(max_batch_size=8, max_num_batched_tokens=12))
    assert drive(chunked, reqs) == reference


def test_prefix_caching_gives_the_same_greedy_outputs_and_skips_the_cached_prefill(
    runner: ModelRunner,
) -> None:
    rng = random.Random(2)
    system = [rng.randrange(1, 8000) for _ in range(40)]  # two full blocks and a part
    reqs = [
        (system + [rng.randrange(1, 8000) for _ in range(rng.randint(1, 30))], params)
        for params in (SamplingParams(max_tokens=n, ignore_eos=True) for n in (8, 12, 5, 9, 16, 7))
    ]
    reqs.append(reqs[0])  # a prompt cached in full: its last block is computed again
    reqs.append((system[:32], SamplingParams(max_tokens=6, ignore_eos=True)))  # block-aligned
    prefilled: dict[bool, int] = {}
    results = {}
    for caching in (False, True):
        steps: list[StepStats] = []
        engine = LLMEngine(
            runner,
            EngineConfig(max_batch_size=2, enable_prefix_caching=caching),
            on_step=steps.append,
        )
        results[caching] = drive(engine, reqs)
        prefilled[caching] = sum(s.num_prefill_tokens for s in steps)
        stats = engine.stats()
    assert results[True] == results[False]
    # Two run before anything is cached; of the six after them, five find at least the two full
    # blocks, and the block-aligned one the first (its last token must be computed).
    assert stats.prefix_cache_hits >= 5 * 32 + 16
    assert stats.prefix_cache_queries == sum(len(prompt) for prompt, _ in reqs)
    assert prefilled[True] == prefilled[False] - stats.prefix_cache_hits


def test_a_prefix_block_both_lanes_hold_counts_as_online(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig(max_batch_size=4))
    got = Collector()
    prompt = list(range(1, 41))  # two full blocks and a part
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request(prompt, params, on_output=got, request_id="online")
    engine.step()  # its prefill publishes its two full blocks
    engine.add_request(prompt, params, on_output=got, request_id="batch", lane="batch")
    engine.step()  # the batch request shares them, and adds one block of its own
    stats = engine.stats()
    assert (stats.num_running, stats.batch_running) == (1, 1)
    assert stats.kv_blocks_used == 3 + 1
    assert stats.batch_kv_blocks == 1
    assert stats.kv_usage == 3 / stats.kv_blocks_total
    got.expected = 2
    while engine.step():
        pass
    assert set(got.final) == {"online", "batch"}


def test_the_cap_holds_from_the_next_step_and_lowering_never_preempts(runner: ModelRunner) -> None:
    steps: list[StepStats] = []
    engine = LLMEngine(runner, EngineConfig(max_batch_size=6), on_step=steps.append)
    got = Collector()
    for i, (prompt, params) in enumerate(requests(10, seed=2, max_out=12)):
        engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")
    engine.step()
    assert steps[-1].num_running == 6
    assert engine.set_batching(max_batch_size=2).max_batch_size == 2
    mark = len(steps)
    while engine.step():
        pass
    after = [s.num_running for s in steps[mark:]]
    assert all(s.num_preempted == 0 for s in steps)
    for before, now in zip([6, *after], after, strict=False):
        assert now <= max(before, 2)  # draining down, never admitting above the new cap
    assert after[-1] == 0 and len(got.final) == 10
    assert (
        engine.set_batching(max_batch_size=10**6).max_batch_size == engine.get_batching().capacity
    )


def test_a_lowered_token_budget_holds_from_the_next_step_and_changes_no_output(
    runner: ModelRunner,
) -> None:
    rng = random.Random(4)
    reqs = [  # 8 × 60-100 prompt tokens: more than the runner's 512 in one step
        (
            [rng.randrange(1, 8000) for _ in range(rng.randint(60, 100))],
            SamplingParams(max_tokens=rng.randint(4, 24), ignore_eos=True),
        )
        for _ in range(8)
    ]
    reference = drive(LLMEngine(runner, EngineConfig(max_batch_size=8)), reqs)
    steps: list[StepStats] = []
    engine = LLMEngine(runner, EngineConfig(max_batch_size=8), on_step=steps.append)
    got = Collector()
    for i, (prompt, params) in enumerate(reqs):
        engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")
    engine.step()
    assert steps[-1].num_prefill_tokens == 512  # the start budget, the runner's
    assert engine.set_batching(max_num_batched_tokens=16).max_num_batched_tokens == 16
    mark = len(steps)
    while engine.step():
        pass
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 16 for s in steps[mark:])
    assert got.tokens == reference and len(got.final) == 8
    assert engine.stats().max_num_batched_tokens == 16
    raised = engine.set_batching(max_num_batched_tokens=10**6)
    assert raised.max_num_batched_tokens == raised.max_num_batched_tokens_limit == 512


def test_bad_requests_are_refused_with_a_reason(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig())
    ok = SamplingParams(max_tokens=4)
    cases: list[tuple[list[int], SamplingParams, str]] = [
        ([], ok, "empty"),
        ([1] * MAX_LEN, ok, "maximum context length"),
        ([1, 2], SamplingParams(max_tokens=MAX_LEN + 1), "maximum context length"),
        ([1, 10**9], ok, "token ids"),
        ([1, -1], ok, "token ids"),
    ]
    for prompt, params, reason in cases:
        with pytest.raises(InvalidRequestError, match=reason):
            engine.add_request(prompt, params, on_output=lambda _: None)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    assert engine.stats().num_waiting == 0


class NaNInjectingRunner:
    """Fault injector: the real runner, but the logits row of any input holding POISON is NaN."""

    def __init__(self, inner: ModelRunner) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def forward(self, inputs: list[StepInput]) -> torch.Tensor:
        logits = self.inner.forward(inputs).clone()  # inference tensors are read-only
        for row, item in enumerate(inputs):
            if POISON in item.token_ids:
                logits[row] = float("nan")
        return logits


class RaisingRunner(NaNInjectingRunner):
    """Fault injector: the whole forward raises when any input holds POISON."""

    def forward(self, inputs: list[StepInput]) -> torch.Tensor:
        if any(POISON in item.token_ids for item in inputs):
            raise RuntimeError("injected fault")
        return self.inner.forward(inputs)


@pytest.mark.parametrize("injector", [NaNInjectingRunner, RaisingRunner])
def test_a_failing_request_fails_alone_and_the_loop_lives(
    runner: ModelRunner, injector: Callable[[ModelRunner], object]
) -> None:
    reqs = requests(6, seed=4)
    reference = drive(LLMEngine(runner, EngineConfig()), reqs)
    engine = LLMEngine(injector(runner), EngineConfig())  # type: ignore[arg-type]
    got = Collector()
    got.expected = len(reqs) + 1
    engine.start()
    try:
        engine.add_request([5, POISON, 6], SamplingParams(), on_output=got, request_id="bad")
        for i, (prompt, params) in enumerate(reqs):
            engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")
        assert got.done.wait(60)
        bad = got.final.pop("bad")
        assert bad.finish_reason == "error" and bad.error
        assert ("non-finite" in bad.error) == (injector is NaNInjectingRunner)
        assert {k: got.tokens[k] for k in got.final} == reference
        # and the loop still serves new work afterwards
        later = Collector()
        later.expected = 1
        engine.add_request([7, 8, 9], SamplingParams(max_tokens=3), on_output=later)
        assert later.done.wait(30)
    finally:
        engine.shutdown(drain_timeout_s=5)


def test_a_post_processing_fault_fails_its_step_and_the_loop_goes_on(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = LLMEngine(runner, EngineConfig())
    postprocess = engine.scheduler.postprocess
    armed = [True]

    def faulty(*args: object, **kwargs: object) -> object:  # fault injection, once
        if armed.pop() if armed else False:
            raise RuntimeError("injected post-processing fault")
        return postprocess(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.scheduler, "postprocess", faulty)
    got = Collector()
    got.expected = 1
    engine.start()
    try:
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=4), on_output=got, request_id="a")
        assert got.done.wait(30)
        bad = got.final["a"]
        assert bad.finish_reason == "error" and "injected post-processing fault" in bad.error
        assert engine.failure is None and engine.stats().kv_blocks_used == 0
        later = Collector()
        later.expected = 1
        engine.add_request([4, 5], SamplingParams(max_tokens=3, ignore_eos=True), on_output=later)
        assert later.done.wait(30)
        assert next(iter(later.final.values())).finish_reason == "length"
    finally:
        engine.shutdown(drain_timeout_s=5)


def test_a_scheduler_fault_fails_every_request_and_stops_the_engine(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = LLMEngine(runner, EngineConfig(max_batch_size=1))
    got = Collector()
    got.expected = 2
    long = SamplingParams(max_tokens=100, ignore_eos=True)
    engine.add_request([1, 2, 3], long, on_output=got, request_id="running")
    engine.add_request([4, 5, 6], long, on_output=got, request_id="waiting")
    assert engine.step()  # "running" runs, "waiting" waits behind the cap of 1

    def faulty(now: float) -> object:  # fault injection
        raise RuntimeError("injected scheduler fault")

    monkeypatch.setattr(engine.scheduler, "schedule", faulty)
    engine.start()
    try:
        assert got.done.wait(30), "the requests were left hanging"
        for out in got.final.values():
            assert out.finish_reason == "error" and "injected scheduler fault" in out.error
        assert engine.failure is not None and "injected scheduler fault" in engine.failure
        assert engine._thread is not None
        engine._thread.join(10)
        assert not engine._thread.is_alive()
        with pytest.raises(EngineDeadError, match="injected scheduler fault"):
            engine.add_request([1], SamplingParams(), on_output=got)
    finally:
        engine.shutdown(drain_timeout_s=1)


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_queue_timeout_is_capped_by_the_engine_default(runner: ModelRunner) -> None:
    clock = ManualClock()
    engine = LLMEngine(runner, EngineConfig(mode="serial", queue_timeout_s=0.3), clock=clock)
    got = Collector()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4), on_output=got, request_id="busy")
    engine.add_request(
        [1, 2], SamplingParams(), on_output=got, request_id="short", queue_timeout_s=0.05
    )
    engine.add_request(
        [1, 2], SamplingParams(), on_output=got, request_id="greedy", queue_timeout_s=1e6
    )
    assert engine.step()  # "busy" is admitted; the others wait behind it
    clock.now += 0.1
    engine.step()
    assert got.final["short"].finish_reason == "timeout" and "queue" in got.final["short"].error
    assert "greedy" not in got.final
    clock.now += 0.25
    engine.step()
    assert got.final["greedy"].finish_reason == "timeout"  # 1e6 s was capped to 0.3 s
    while engine.step():
        pass
    assert got.final["busy"].finish_reason in ("length", "stop")


def test_abort_frees_a_running_request_and_unknown_ids_are_ignored(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig())
    got = Collector()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=50), on_output=got, request_id="a")
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=50), on_output=got, request_id="b")
    engine.step()
    engine.step()
    assert engine.stats().kv_blocks_used > 0
    engine.abort("a")
    engine.abort("no-such-request")
    engine.step()
    assert got.final["a"].finish_reason == "abort"
    engine.abort("b")
    engine.step()
    assert engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0


def test_a_full_queue_refuses_with_retry_after(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig(max_queue=2))
    for _ in range(2):
        engine.add_request([1, 2], SamplingParams(), on_output=lambda _: None)
    with pytest.raises(QueueFullError) as caught:
        engine.add_request([1, 2], SamplingParams(), on_output=lambda _: None)
    assert caught.value.retry_after_s > 0
    assert engine.stats().waiting_by_priority == {1: 2}
    engine.shutdown(drain_timeout_s=0)  # never started: leftovers are aborted at once


def test_shutdown_drains_in_flight_work_then_refuses(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig(mode="static", max_batch_size=8, max_wait_ms=60_000))
    got = Collector()
    engine.start()
    for i, (prompt, params) in enumerate(requests(3, seed=5)):
        engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")
    engine.shutdown(drain_timeout_s=30)  # the static batch is not due; draining forms it now
    assert {o.finish_reason for o in got.final.values()} == {"length"} and len(got.final) == 3
    with pytest.raises(QueueFullError, match="shutting down"):
        engine.add_request([1], SamplingParams(), on_output=got)


def test_shutdown_past_its_drain_timeout_aborts_the_rest(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig())
    got = Collector()
    engine.start()
    engine.add_request([1, 2], SamplingParams(max_tokens=100), on_output=got, request_id="long")
    engine.shutdown(drain_timeout_s=0)
    assert got.final["long"].finish_reason == "abort"


def test_an_idle_engine_does_not_spin(runner: ModelRunner) -> None:
    engine = LLMEngine(runner, EngineConfig())
    engine.start()
    time.sleep(0.3)
    idle_iterations = engine.loop_iterations
    engine.shutdown(drain_timeout_s=1)
    assert idle_iterations <= 2


def test_seeded_sampling_does_not_depend_on_batch_companions(runner: ModelRunner) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=7)
    alone = drive(LLMEngine(runner, EngineConfig()), [([3, 4, 5], params)])
    crowd = [([3, 4, 5], params), *requests(5, seed=6)]
    assert drive(LLMEngine(runner, EngineConfig()), crowd)["r0"] == alone["r0"]
    other_seed = SamplingParams(max_tokens=12, temperature=0.9, seed=8)
    assert drive(LLMEngine(runner, EngineConfig()), [([3, 4, 5], other_seed)]) != alone


def test_raising_the_cap_admits_at_the_next_step(runner: ModelRunner) -> None:
    steps: list[StepStats] = []
    engine = LLMEngine(runner, EngineConfig(max_batch_size=2), on_step=steps.append)
    got = Collector()
    for i in range(8):
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        engine.add_request([1, 2, 3 + i], params, on_output=got, request_id=f"r{i}")
    engine.step()
    assert steps[-1].num_running == 2 and steps[-1].num_waiting == 6
    engine.set_batching(max_batch_size=6)
    engine.step()
    assert steps[-1].num_running == 6 and steps[-1].max_batch_size == 6
    for i in range(8):
        engine.abort(f"r{i}")
    engine.step()
    assert len(got.final) == 8


def test_the_batch_lane_on_the_real_model_loses_nothing_and_is_counted_apart(
    runner: ModelRunner, small_runner: ModelRunner
) -> None:
    rng = random.Random(4)
    reqs = [  # 7 × ~7 blocks of demand on a 24-block pool; the 3 online ones fit in it
        (
            [rng.randrange(1, 8000) for _ in range(rng.randint(20, 40))],
            SamplingParams(max_tokens=rng.randint(60, 80), ignore_eos=True),
        )
        for _ in range(7)
    ]
    reference = drive(LLMEngine(runner, EngineConfig(max_batch_size=8)), reqs)
    config = EngineConfig(max_batch_size=4, batch_max_queue=4, batch_lane_max_batch_size=4)
    engine = LLMEngine(small_runner, config)  # (the default batch lane cap here: 3, KV-safe)
    got = Collector()
    got.expected = len(reqs)
    for i, (prompt, params) in enumerate(reqs[:4]):
        engine.add_request(prompt, params, on_output=got, request_id=f"r{i}", lane="batch")
    with pytest.raises(QueueFullError, match="batch queue full"):
        engine.add_request([1], SamplingParams(), on_output=got, lane="batch")
    engine.step()  # the online lane is idle: the batch lane fills the pool
    stats = engine.stats()
    assert (stats.batch_running, stats.num_running, stats.kv_usage) == (4, 0, 0.0)
    assert stats.batch_kv_blocks == stats.kv_blocks_used > 0
    assert stats.batch_pending_tokens == sum(p.max_tokens for _, p in reqs[:4]) - 4
    for i, (prompt, params) in enumerate(reqs[4:], start=4):
        engine.add_request(prompt, params, on_output=got, request_id=f"r{i}")  # online
    engine.step()  # each online arrival takes one slot under the cap back from the batch lane
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.batch_running) == (3, 0, 1)
    assert stats.batch_preemptions_total == 3
    while engine.step():
        pass
    assert got.tokens == reference and len(got.final) == len(reqs)
    assert max(got.final[f"r{i}"].metrics.num_preemptions for i in range(4, 7)) == 0
    assert sum(got.final[f"r{i}"].metrics.num_preemptions > 0 for i in range(4)) >= 3
    with pytest.raises(InvalidRequestError, match="lane"):
        engine.add_request([1], SamplingParams(), on_output=got, lane="bulk")  # type: ignore[arg-type]
