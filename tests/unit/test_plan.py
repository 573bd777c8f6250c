"""The capacity planner: hand-computed values on a tiny profile, `wok plan` end to end, and
steady-state agreement with the simulator's replica (`replica.run_single`)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from wok.cli import main
from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.slos import Slos
from wok_contracts.traces import TraceRequest, poisson
from wok_operator.api import StepProfileSpec
from wok_operator.plan import LengthMix, batch_point, plan, replica_capacity
from wok_sim.replica import run_single
from wok_sim.report import p99

TINY = StepProfile(
    name="tiny-plan",
    kind="model",
    device="test",
    a_s=0.01,
    b_s_per_seq=0.001,
    c_s_per_prefill_token=0.0001,
    d_s_per_context_token=1e-6,
    step_token_budget=100,
    kv_capacity_tokens=10_000,
    max_model_len=1000,
)
MIX = LengthMix.of_means(prompt_tokens=50, output_tokens=11)
LOOSE = Slos(ttft_s=10.0, tpot_s=1.0)


def test_steady_state_by_hand() -> None:
    point = batch_point(TINY, MIX, 10, Slos(ttft_s=10.0, tpot_s=0.03))
    # room 100 − 10 = 90 ≥ 50: one prefill step, then 10 decodes: 11 steps in the batch
    x = 10 / 11  # requests entering per step
    context = 50 * (1 + 1) / 2 + 10 * 50 + 10 * 11 / 2  # 605 tokens read over a life
    step = 0.01 + 0.001 * x * 10 + 0.0001 * x * 50 + 1e-6 * x * context
    assert point.step_s == pytest.approx(step)  # 0.024186
    assert point.requests_per_s == pytest.approx(x / step)  # 37.59
    assert point.time_in_batch_s == pytest.approx(11 * step)
    assert point.p99_ttft_s == pytest.approx(step)
    assert point.p99_e2e_s == pytest.approx(11 * step)
    assert point.output_tokens_per_s == pytest.approx(11 * x / step)
    assert point.token_load == pytest.approx(x * 60 / 100)
    assert point.kv_load == pytest.approx(x * context / 10_000)
    # TPOT spreads by c·sqrt(x·P²/(O − 1)) = 0.0015 around 0.0242: 0.03 is 3.9 spreads away
    spread = 0.0001 * math.sqrt(x * 50**2 / 10)
    assert point.attainment == pytest.approx(
        0.5 * (1 + math.erf((0.03 - step) / (spread * math.sqrt(2))))
    )
    assert point.p99_tpot_s == pytest.approx(step + 2.3263 * spread, rel=1e-4)


def test_b_opt_is_the_largest_batch_within_the_e2e_slo() -> None:
    # t(B) = 0.01 + B·(0.001·10 + 0.0001·50 + 1e-6·605)/11 and E2E = 11·t(B) ≤ 0.2 → B ≤ 5.77
    per_seq = (0.001 * 10 + 0.0001 * 50 + 1e-6 * 605) / 11
    result = plan(TINY, MIX, Slos(ttft_s=10.0, tpot_s=1.0, e2e_s=0.2), qps=100.0)
    step = 0.01 + 5 * per_seq
    assert result.b_opt == 5
    assert result.batch_limit == 18  # B·60/11 tokens per step ≤ 100
    assert result.qps_max == pytest.approx(5 / (11 * step))  # B_opt / t_batch = 26.59
    assert result.at_b_opt.time_in_batch_s == pytest.approx(11 * step)
    assert result.replicas == math.ceil(100 / result.qps_max) == 4
    assert result.gpu_seconds_per_output_token == pytest.approx(11 * step / (5 * 11))
    assert result.gpu_hours_per_1k_output_tokens == pytest.approx(
        1000 * result.gpu_seconds_per_output_token / 3600
    )
    assert result.b_opt in [p.batch for p in result.curve]


def test_without_an_slo_bound_the_step_budget_sets_b_opt() -> None:
    result = plan(TINY, MIX, LOOSE)
    assert result.b_opt == result.batch_limit == 18
    assert replica_capacity(TINY, MIX, 64, LOOSE) == pytest.approx(result.qps_max)


def test_an_slo_no_batch_meets_is_an_error() -> None:
    with pytest.raises(ValueError, match="no batch size meets the SLOs"):
        plan(TINY, MIX, Slos(ttft_s=10.0, tpot_s=1.0, e2e_s=0.05))  # 11 steps > 0.05 s at B = 1


def test_a_trace_mix_is_clipped_like_the_simulator() -> None:
    mix = LengthMix.of_requests([TraceRequest(0.0, 5000, 10), TraceRequest(1.0, 20, 7)], 1000)
    assert mix.prompts == (999, 20)
    assert mix.outputs == (1, 7)
    with pytest.raises(ValueError):
        LengthMix((), ())


def test_wok_plan_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    plot = tmp_path / "plan.png"
    argv = ["plan", "--prompt-tokens", "512", "--output-tokens", "128", "--slo-ttft", "2"]
    argv += ["--slo-tpot", "0.05", "--qps", "40", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(out[: out.rindex("}") + 1])
    assert data["b_opt"] >= 1 and data["qps_max"] > 0
    assert data["replicas"] == math.ceil(40 / data["qps_max"])
    assert plot.stat().st_size > 0
    # The profile as an InferenceService carries it, for the law's μ.
    spec = StepProfileSpec.model_validate(data["step_profile"])
    assert spec == StepProfileSpec.of(load_profile("sim:llama-3-8b-80g"))


def test_wok_plan_table_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--slo-ttft", "2", "--slo-tpot", "0.05"]
    assert main([*base, "--prompt-tokens", "512", "--output-tokens", "128"]) == 0
    out = capsys.readouterr().out
    assert "B_opt" in out
    block = yaml.safe_load(out[out.index("stepProfile:") :])
    assert StepProfileSpec.model_validate(block["stepProfile"]).fixed_seconds == 0.006
    assert main([*base, "--prompt-tokens", "512"]) == 2
    assert "--prompt-tokens needs --output-tokens" in capsys.readouterr().err
    assert main([*base, "--prompt-tokens", "512", "--output-tokens", "128", "--qps", "-1"]) == 2
    tight = ["plan", "--slo-ttft", "2", "--slo-tpot", "0.001"]
    assert main([*tight, "--prompt-tokens", "512", "--output-tokens", "128"]) == 2
    assert "no batch size meets" in capsys.readouterr().err


def test_the_simulated_replica_agrees_with_the_plan() -> None:
    profile = load_profile("sim:llama-3-8b-80g")
    slos = Slos(ttft_s=2.0, tpot_s=0.03)
    lengths = {"mean_prompt": 256, "mean_output": 64}
    mix = LengthMix.of_requests(poisson(2.0, 1000, seed=1, **lengths), profile.max_model_len)
    result = plan(profile, mix, slos)
    unbounded = {"batch_cap": result.b_opt, "queue_timeout_s": 1e9, "max_queue": 10**9}

    # Overloaded, the replica runs full batches: its throughput is QPS_max.
    seconds = 120
    overload = poisson(1.5 * result.qps_max, seconds, seed=2, **lengths)
    done = run_single(profile, overload, **unbounded)
    served = sum(1 for r in done if r.outcome == "ok" and 30 <= r.finish_s <= seconds)
    assert served / (seconds - 30) == pytest.approx(result.qps_max, rel=0.05)

    # At 0.9 × QPS_max it keeps up, and TPOT holds about as planned. B_opt sits where 99 % of
    # requests meet the TPOT SLO; the simulated share is 98.2–98.8 % and P99 1.04–1.18 × the SLO
    # over seeds 2–9: arrivals that queue are admitted together, so prompts land in lumps a little
    # larger than the plan's Poisson model of them.
    seconds = 240
    load = poisson(0.9 * result.qps_max, seconds, seed=3, **lengths)
    done = run_single(profile, load, **unbounded)
    assert all(r.outcome == "ok" for r in done)
    served = sum(1 for r in done if 30 <= r.finish_s <= seconds)
    assert served / (seconds - 30) == pytest.approx(0.9 * result.qps_max, rel=0.05)
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    assert sum(t <= slos.tpot_s for t in tpots) / len(tpots) >= 0.98
    tail = p99(tpots)
    assert tail is not None and tail <= 1.2 * slos.tpot_s


def test_wok_plan_help_says_output_tokens_go_with_prompt_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--prompt-tokens N --output-tokens N" in out.splitlines()[0]
    assert "required with --prompt-tokens" in out


def test_wok_plan_refuses_a_request_longer_than_the_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["plan", "--slo-ttft", "60", "--slo-tpot", "1"]
    # sim:llama-3-8b-80g holds 8192 tokens: 8000 + 500 never runs, whatever the SLOs.
    assert main([*base, "--prompt-tokens", "8000", "--output-tokens", "500"]) == 2
    err = capsys.readouterr().err
    assert "need 8500 tokens of context" in err and "holds 8192" in err
    assert main([*base, "--prompt-tokens", "8000", "--output-tokens", "192"]) == 0
