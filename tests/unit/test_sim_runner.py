"""The simulated accelerator on the real engine: the step time of a planned batch is the profile's,
outputs have exactly `max_tokens` tokens, seeded requests replay, and nothing on the path imports
torch. The real server process is tested in tests/integration/test_sim_device.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from wok_contracts.profile import load_profile
from wok_runtime.core.builtin import SPECIAL_TOKENS, ensure_builtin, ensure_builtin_tokenizer
from wok_runtime.core.engine import EngineConfig, LLMEngine, RequestOutput
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.scheduler import ScheduledSeq, SchedulerOutput
from wok_runtime.core.sequence import Sequence
from wok_runtime.core.sim_runner import FIRST_PLAIN_TOKEN, SimModelRunner
from wok_runtime.core.step import StepExecutor

PROFILE = "sim:llama-3-8b-80g"


class FakeTime:
    """The runner's clock and sleep for the unit tests: a sleep is recorded and moves the clock,
    and nothing else does (the engine's host work takes no time unless a test says so)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def sim_runner(*, seed: int = 0, fake: FakeTime | None = None) -> SimModelRunner:
    base = SimModelRunner.from_profile(PROFILE, seed=seed)
    if fake is None:
        return base
    return SimModelRunner(
        base.profile,
        base.tokenizer,
        config=base.config,
        seed=seed,
        clock=fake.clock,
        sleep=fake.sleep,
    )


def run_all(
    engine: LLMEngine, reqs: list[tuple[list[int], SamplingParams]]
) -> dict[str, list[int]]:
    """Submits everything, then steps the engine synchronously until every request finished."""
    tokens: dict[str, list[int]] = {}
    finished: dict[str, RequestOutput] = {}

    def on_output(out: RequestOutput) -> None:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            finished[out.request_id] = out

    for i, (prompt, params) in enumerate(reqs):
        engine.add_request(prompt, params, on_output=on_output, request_id=f"r{i}")
    for _ in range(10_000):
        if len(finished) == len(reqs):
            break
        engine.step()
    assert {out.finish_reason for out in finished.values()} == {"length"}
    return tokens


def test_the_runner_is_a_step_executor_sized_by_its_profile() -> None:
    runner = sim_runner()
    profile = load_profile(PROFILE)
    assert isinstance(runner, StepExecutor)
    assert runner.num_blocks == profile.kv_capacity_tokens // profile.block_size
    assert runner.max_model_len == profile.max_model_len
    engine = LLMEngine(runner, EngineConfig(max_batch_size=8))
    assert engine.get_batching().capacity == runner.num_blocks
    assert engine.max_num_batched_tokens == profile.step_token_budget


def test_a_known_batch_sleeps_the_profiles_step_time() -> None:
    fake = FakeTime()
    runner = sim_runner(fake=fake)
    p = runner.profile
    steps = []
    engine = LLMEngine(runner, EngineConfig(max_batch_size=4), on_step=steps.append)
    # Four prompts of 100 tokens, 3 output tokens each: one prefill step, then two decode steps.
    reqs = [([10 + i] * 100, SamplingParams(max_tokens=3, ignore_eos=True)) for i in range(4)]
    run_all(engine, reqs)
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in steps] == [
        (400, 0),
        (0, 4),
        (0, 4),
    ]
    expected = [
        p.step_seconds(0, 400, 4 * 100),
        p.step_seconds(4, 0, 4 * 101),  # each decode reads its 100 + 1 cached and new tokens
        p.step_seconds(4, 0, 4 * 102),
    ]
    assert fake.slept == pytest.approx(expected)


def test_host_time_between_steps_is_inside_the_profiled_step() -> None:
    fake = FakeTime()
    runner = sim_runner(fake=fake)

    def decode_step(*request_ids: str) -> SchedulerOutput:
        seqs = [Sequence(rid, [1, 2, 3], SamplingParams(), arrival_time=0.0) for rid in request_ids]
        items = [ScheduledSeq(seq, start_pos=2, num_tokens=1) for seq in seqs]
        return SchedulerOutput(scheduled=items, num_decode_tokens=len(items))

    t = runner.step_seconds(decode_step("a"))
    runner.execute(decode_step("a"))
    fake.now += 0.002  # the engine's host work: outputs of that step, scheduling of the next
    runner.execute(decode_step("a"))  # continues "a": began when the last step ended
    fake.now += 0.002
    runner.execute(decode_step("b"))  # nothing continues: the engine may have been idle
    fake.now += 1.0
    runner.execute(decode_step("b"))  # more than a step behind: forgiven, not made up
    assert fake.slept == pytest.approx([t, t - 0.002, t, t])


def test_outputs_have_exactly_max_tokens_and_never_a_special_token() -> None:
    runner = sim_runner(fake=FakeTime())
    engine = LLMEngine(runner, EngineConfig(max_batch_size=16))
    reqs = [
        ([5, 6, 7], SamplingParams(max_tokens=n, ignore_eos=ignore))
        for n in (1, 50, 333)
        for ignore in (True, False)
    ]
    tokens = run_all(engine, reqs)
    assert [len(tokens[f"r{i}"]) for i in range(len(reqs))] == [p.max_tokens for _, p in reqs]
    special = {runner.tokenizer.backend.token_to_id(t) for t in SPECIAL_TOKENS}
    assert max(special) < FIRST_PLAIN_TOKEN
    assert all(t >= FIRST_PLAIN_TOKEN for out in tokens.values() for t in out)


def test_a_seeded_request_replays_whatever_shares_its_batch() -> None:
    seeded = ([1, 2, 3], SamplingParams(max_tokens=20, seed=7, ignore_eos=True))
    crowd = [([9] * n, SamplingParams(max_tokens=n, ignore_eos=True)) for n in (5, 30)]

    def first(reqs: list[tuple[list[int], SamplingParams]], run_seed: int) -> list[int]:
        runner = sim_runner(seed=run_seed, fake=FakeTime())
        return run_all(LLMEngine(runner, EngineConfig()), reqs)["r0"]

    alone = first([seeded], 0)
    assert first([seeded, *crowd], 1) == alone
    other = (seeded[0], replace(seeded[1], seed=8))
    assert first([other], 0) != alone
    # Unseeded requests replay from the runner's seed.
    assert first(crowd, 3) == first(crowd, 3) != first(crowd, 4)


def test_a_final_only_request_gets_one_output_with_every_token() -> None:
    engine = LLMEngine(sim_runner(fake=FakeTime()), EngineConfig())
    outputs: dict[bool, list[RequestOutput]] = {True: [], False: []}
    for incremental in (True, False):
        engine.add_request(
            [3, 4],
            SamplingParams(max_tokens=5, ignore_eos=True),
            on_output=outputs[incremental].append,
            incremental=incremental,
        )
    while engine.step():
        pass
    assert [len(o.new_token_ids) for o in outputs[True]] == [1, 1, 1, 1, 1]
    (final,) = outputs[False]
    assert final.finished and len(final.new_token_ids) == 5


def test_a_stream_interval_sends_the_first_token_alone_then_chunks() -> None:
    engine = LLMEngine(sim_runner(fake=FakeTime()), EngineConfig(stream_interval=4))
    outputs: list[RequestOutput] = []
    engine.add_request(
        [3, 4], SamplingParams(max_tokens=10, ignore_eos=True), on_output=outputs.append
    )
    while engine.step():
        pass
    assert [len(o.new_token_ids) for o in outputs] == [1, 4, 4, 1]
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    with pytest.raises(ValueError, match="stream_interval"):
        EngineConfig(stream_interval=0)


def test_the_live_cap_bounds_the_running_batch() -> None:
    runner = sim_runner(fake=FakeTime())
    steps = []
    engine = LLMEngine(runner, EngineConfig(max_batch_size=3), on_step=steps.append)
    reqs = [([4, 5], SamplingParams(max_tokens=6, ignore_eos=True)) for _ in range(10)]
    run_all(engine, reqs)
    assert max(s.batch_size for s in steps) == 3
    engine.set_batching(max_batch_size=8)
    steps.clear()
    run_all(engine, reqs)
    assert max(s.batch_size for s in steps) == 8


def test_the_engine_thread_runs_at_the_profiles_pace() -> None:
    """Real sleeps: 20 decode steps of one sequence take about 20 profiled steps of wall time."""
    profile = replace(load_profile(PROFILE), a_s=0.01)
    base = sim_runner()
    runner = SimModelRunner(profile, base.tokenizer, config=base.config)
    engine = LLMEngine(runner, EngineConfig())
    done = threading.Event()
    engine.start()
    try:
        started = time.perf_counter()
        engine.add_request(
            [1, 2],
            SamplingParams(max_tokens=21, ignore_eos=True),
            on_output=lambda out: out.finished and done.set(),
        )
        assert done.wait(10)
        elapsed = time.perf_counter() - started
    finally:
        engine.shutdown(drain_timeout_s=1)
    # One prefill of the 2 prompt tokens, then 20 decodes, each reading 2 + n tokens.
    predicted = profile.step_seconds(0, 2, 2) + sum(
        profile.step_seconds(1, 0, 2 + n) for n in range(1, 21)
    )
    assert predicted <= elapsed < predicted * 1.5 + 0.05


def test_the_sim_tokenizer_is_builtin_tiny_s_without_its_weights() -> None:
    alone = ensure_builtin_tokenizer("tiny")
    model = ensure_builtin("tiny")
    assert (alone / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert not list(alone.glob("*.safetensors"))


def test_the_sim_path_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from wok.cli import build_parser\n"
        "build_parser()\n"
        "import wok_runtime.http.serve, wok_runtime.core.engine\n"
        "from wok_runtime.core.sim_runner import SimModelRunner\n"
        "from wok_runtime.core.engine import EngineConfig, LLMEngine\n"
        f"LLMEngine(SimModelRunner.from_profile({PROFILE!r}), EngineConfig())\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "sim"], "needs --profile"),
        (["--device", "sim", "--profile", "sim:nope"], "unknown builtin profile 'sim:nope'"),
        (["--device", "sim", "--profile", "/nonexistent.json"], "not found"),
        (["--device", "sim", "--profile", PROFILE, "--kv-cache-bytes", "9"], "does not apply"),
        (["--profile", PROFILE], "need --device sim"),
    ],
)
def test_bad_sim_flags_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from wok.cli import main as wok_main

    assert wok_main(["runtime", "serve", "--log-level", "error", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
