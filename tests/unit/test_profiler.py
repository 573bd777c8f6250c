"""`wok profile`: the fit recovers known step costs, profiles round-trip, and the command writes a
valid profile of the real engine on builtin:tiny."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from wok import cli
from wok_contracts.profile import StepProfile, load_profile
from wok_runtime.tools.profiler import (
    StepSample,
    StepShape,
    context_tokens,
    decode_lengths,
    fit_step_costs,
    grid_shapes,
    pick_clock,
    step_inputs,
)

TRUE = (4e-3, 2e-4, 5e-5, 3e-8)  # a, b, c, d: a small GPU-like step


def _synthetic(costs: tuple[float, float, float, float], noise: float = 0.0) -> list[StepSample]:
    """Timings of a grid of shapes under `costs`, with a deterministic ±noise pattern."""
    a, b, c, d = costs
    samples = []
    for i, (decodes, context, prefill) in enumerate(
        (dec, ctx, pre)
        for dec in (0, 1, 4, 16, 64)
        for ctx in (128, 1024, 4096)
        for pre in (0, 64, 512)
        if dec + pre > 0
    ):
        ctx_tokens = decodes * context + prefill
        t = a + b * decodes + c * prefill + d * ctx_tokens
        wobble = noise * (1 if i % 2 else -1) * (1 + i % 3) / 3
        samples.append(StepSample(decodes, prefill, ctx_tokens, seconds=t * (1 + wobble)))
    return samples


def test_fit_recovers_known_costs_exactly() -> None:
    fit = fit_step_costs(_synthetic(TRUE))
    got = (fit.a_s, fit.b_s_per_seq, fit.c_s_per_prefill_token, fit.d_s_per_context_token)
    assert got == pytest.approx(TRUE, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.max_abs_rel_error < 1e-6


def test_fit_stays_close_under_noise() -> None:
    fit = fit_step_costs(_synthetic(TRUE, noise=0.03))
    got = (fit.a_s, fit.b_s_per_seq, fit.c_s_per_prefill_token, fit.d_s_per_context_token)
    assert got == pytest.approx(TRUE, rel=0.15)
    assert 0.01 < fit.median_abs_rel_error < 0.05
    assert fit.r2 > 0.99


def test_fit_never_returns_a_negative_cost() -> None:
    # Timings that fall with the batch: unconstrained least squares would give b < 0.
    samples = [
        StepSample(decodes=n, prefill_tokens=0, context_tokens=100 * n, seconds=0.010 - 0.0001 * n)
        for n in (1, 4, 16, 32)
    ]
    fit = fit_step_costs(samples)
    assert fit.a_s > 0
    assert min(fit.b_s_per_seq, fit.c_s_per_prefill_token, fit.d_s_per_context_token) >= 0


def test_fit_refuses_what_it_cannot_fit() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        fit_step_costs(_synthetic(TRUE)[:1])
    with pytest.raises(ValueError, match="positive time"):
        fit_step_costs([StepSample(1, 0, 10, seconds=0.0), StepSample(2, 0, 20, seconds=0.1)])


def test_grid_skips_what_the_budget_or_the_pool_cannot_hold() -> None:
    keep, skipped = grid_shapes(
        (0, 4, 64),
        (128, 512),
        (0, 1024),
        max_model_len=2048,
        token_budget=1024,
        kv_blocks=1000,
        block_size=16,
    )
    # No empty step; without decodes the context is moot, so (0, ·, 1024) appears once.
    assert set(keep) == {
        StepShape(0, 0, 1024),
        StepShape(4, 128, 0),
        StepShape(4, 512, 0),
        StepShape(64, 128, 0),
    }
    # Over the 1024-token step budget, or (64 × 512 tokens) over the 1000-block pool.
    assert set(skipped) == {
        StepShape(4, 128, 1024),
        StepShape(4, 512, 1024),
        StepShape(64, 128, 1024),
        StepShape(64, 512, 0),
        StepShape(64, 512, 1024),
    }


def test_step_inputs_spread_lengths_and_use_their_own_blocks() -> None:
    shape = StepShape(decodes=4, context=100, prefill=40)
    assert decode_lengths(shape, max_model_len=1000) == [62, 88, 112, 138]  # mean 100
    inputs = step_inputs(shape, block_size=16, max_model_len=1000)
    blocks = [b for x in inputs for b in x.block_table]
    assert len(blocks) == len(set(blocks)) == max(blocks) + 1  # distinct, consecutive from 0
    assert all(len(x.block_table) * 16 >= x.start_pos + len(x.token_ids) for x in inputs)
    assert [len(x.token_ids) for x in inputs] == [1, 1, 1, 1, 40]
    assert context_tokens(inputs) == 62 + 88 + 112 + 138 + 40


def _profile() -> StepProfile:
    return StepProfile(
        name="t",
        kind="measured",
        device="cpu: test",
        a_s=0.004,
        b_s_per_seq=2e-4,
        c_s_per_prefill_token=5e-5,
        d_s_per_context_token=3e-8,
        step_token_budget=2048,
        kv_capacity_tokens=4096,
        fit={"r2": 0.99, "grid": [{"decodes": 1, "seconds": 0.004}]},
    )


def test_profile_json_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_profile().to_json())
    assert load_profile(path) == _profile()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"name": "x"}', "not a wok step profile"),
        ("[1, 2]", "not a wok step profile"),
    ],
)
def test_load_profile_refuses_malformed_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_load_profile_refuses_negative_costs(tmp_path: Path) -> None:
    data = json.loads(_profile().to_json())
    data["b_s_per_seq"] = -1.0
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="costs must be >= 0"):
        load_profile(path)


def test_a_profile_without_a_request_overhead_has_none_and_a_negative_one_is_refused(
    tmp_path: Path,
) -> None:
    data = json.loads(_profile().to_json())
    del data["request_overhead_s"]  # a profile written before the field
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert load_profile(path).request_overhead_s == 0.0
    path.write_text(json.dumps(data | {"request_overhead_s": -0.01}))
    with pytest.raises(ValueError, match="costs must be >= 0"):
        load_profile(path)


def test_wok_profile_quick_writes_a_valid_profile(tmp_path: Path, one_torch_thread: None) -> None:
    out = tmp_path / "tiny.json"
    argv = ["profile", "--model", "builtin:tiny", "--quick", "--no-progress", "--threads", "1"]
    assert cli.main([*argv, "--max-model-len", "512", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.kind == "measured" and profile.device.startswith("cpu: ")
    assert profile.name == "tiny-cpu" and profile.max_model_len == 512
    assert profile.a_s > 0 and profile.load_seconds > 0
    # Default CPU pool: the largest quick decode batch (8) × max_model_len, in whole blocks.
    assert profile.kv_capacity_tokens == 8 * 512 and profile.step_token_budget == 2048
    grid = profile.fit["grid"]
    assert len(grid) == 8 and all(row["seconds"] > 0 and row["passes"] == 2 for row in grid)
    assert 0 <= profile.fit["median_abs_rel_error"] <= profile.fit["max_abs_rel_error"]


def test_wok_profile_refuses_bad_grids(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profile", "--decodes", "1,x", "--out", "/tmp/never.json"]) == 2
    assert "--decodes expects comma-separated integers" in capsys.readouterr().err


def test_the_clock_is_cpu_time_only_where_one_thread_does_all_the_work() -> None:
    import time

    assert pick_clock("auto", device_type="cpu", threads=1)[0] is time.thread_time
    assert pick_clock("auto", device_type="cpu", threads=2)[0] is time.perf_counter
    assert pick_clock("auto", device_type="cuda", threads=1)[0] is time.perf_counter
    with pytest.raises(ValueError, match="--threads 1"):
        pick_clock("cpu", device_type="cpu", threads=4)


def test_the_fit_predicts_what_the_profile_made_from_it_charges() -> None:
    """One step-cost model: the profiler's residuals and the simulator's step times agree."""
    fit = fit_step_costs(_synthetic(TRUE))
    costs = ("a_s", "b_s_per_seq", "c_s_per_prefill_token", "d_s_per_context_token")
    profile = replace(load_profile("sim:tiny-cpu"), **{k: getattr(fit, k) for k in costs})
    for shape in ((0, 0, 0), (8, 0, 4096), (1, 512, 700), (32, 64, 65536)):
        assert fit.step_seconds(*shape) == profile.step_seconds(*shape)
    expected = TRUE[0] + TRUE[1] * 8 + TRUE[3] * 4096
    assert profile.step_seconds(8, 0, 4096) == pytest.approx(expected, rel=1e-6)
