"""`wok simulate`: the JSON contract, the plots, and bad input as one line and exit 2."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from wok.cli import build_parser, main
from wok_sim.cli import POLICIES, rate_scale_of
from wok_sim.columns import COLUMNS
from wok_sim.policies import load_registry

JSON_KEYS = {
    "slo_attainment",
    "ttft_attainment",
    "tpot_attainment",
    "e2e_attainment",
    "gpu_hours",
    "p99_ttft_s",
    "p99_tpot_s",
    "p99_e2e_s",
    "scale_events",
    "flips",
    "rejected",
    "batch_size",
}
SHORT = ["simulate", "--trace", "poisson:4:90", "--policy", "wok", "--jobs", "1"]


def test_json_output_has_the_contracts_keys(capsys):
    assert main([*SHORT, "--json", "--slo-e2e", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    result = out["policies"]["wok"]
    assert set(result) >= JSON_KEYS
    assert 0.0 <= result["slo_attainment"] <= 1.0
    assert result["gpu_hours"] > 0
    assert result["batch_size"] is None


def test_table_and_plots(capsys, tmp_path):
    assert main([*SHORT, "--plot", str(tmp_path)]) == 0
    assert "wok" in capsys.readouterr().out
    assert (tmp_path / "simulate-wok.png").stat().st_size > 0
    # One policy compares with nothing: no comparison chart.
    assert not (tmp_path / "simulate-comparison.png").exists()


def test_the_ticks_say_what_the_law_decided_and_why(capsys, tmp_path):
    assert main([*SHORT, "--ticks", str(tmp_path)]) == 0
    lines = (tmp_path / "ticks-wok.jsonl").read_text().splitlines()
    ticks = [json.loads(line) for line in lines]
    assert len(ticks) >= 90 // 5 - 1  # one a control interval over the 90 s trace
    assert [t["time_s"] for t in ticks] == sorted(t["time_s"] for t in ticks)
    assert all(t["reason"] and t["desired"] >= 1 for t in ticks)
    assert "ticks-wok.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        ["--trace", "/nonexistent/trace.csv"],
        ["--rate-scale", "0"],
        ["--policy", "no-such-policy"],
        ["--profile", "sim:no-such-profile"],
        ["--slo-ttft", "-1"],
        ["--trace", "poisson:x"],
        ["--jobs", "0"],
        ["--splice", "poisson:1:60@60"],
        ["--splice", "poisson:1:60@60-30"],
        ["--splice", "/nonexistent/trace.jsonl@0-60"],
        ["--score-from", "-1"],
        ["--score-from", "90"],  # past the last arrival: nothing to score
        ["--engine", "vllm", "--max-num-seqs", "0"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, flags):
    assert main([*SHORT, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("wok simulate: error:") and "\n" not in err


def test_score_from_counts_only_the_requests_and_gpu_time_from_then_on(capsys):
    from wok_contracts.traces import load_trace

    scored = {}
    for start in ("0", "45"):
        assert main([*SHORT, "--json", "--score-from", start]) == 0
        out, err = capsys.readouterr()
        scored[start] = (json.loads(out)["policies"]["wok"], int(err.split()[0]))
    arrivals = [r.arrival_s for r in load_trace("poisson:4:90")]
    assert scored["0"][1] == len(arrivals)  # the default scores everything, as before
    assert scored["45"][1] == sum(1 for t in arrivals if t >= 45.0)
    assert scored["45"][0]["gpu_hours"] < scored["0"][0]["gpu_hours"]


def test_simulate_runs_a_spliced_trace(capsys):
    assert main([*SHORT, "--json", "--splice", "poisson:1:60@30-90"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]["wok"]["gpu_hours"] > 0


def test_vllm_pods_queue_what_wok_pods_refuse(capsys):
    # one pod under a burst beyond wok's queue bound: wok's runtime answers 429s, vLLM (cap 2,
    # whatever the law's batch) queues every request
    burst = [*SHORT[:2], "poisson:40:20", *SHORT[3:], "--json", "--max-replicas", "1"]
    assert main(burst) == 0
    wok = json.loads(capsys.readouterr().out)["policies"]["wok"]
    assert main([*burst, "--engine", "vllm", "--max-num-seqs", "2"]) == 0
    vllm = json.loads(capsys.readouterr().out)["policies"]["wok"]
    assert wok["rejected"] > 0
    assert vllm["rejected"] == 0


def test_a_bad_choice_is_an_argparse_error():
    with pytest.raises(SystemExit) as exit_info:
        main([*SHORT, "--routing", "round-robin"])
    assert exit_info.value.code == 2


def test_the_default_run_is_the_documented_headline_run():
    args = build_parser().parse_args(["simulate"])
    assert (args.rate_mode, args.cold_start, args.policy) == ("overlay", 90.0, "all")
    assert (args.slo_ttft, args.slo_tpot, args.slo_e2e) == (2.0, 0.1, 5.0)
    assert rate_scale_of(args.trace, args.rate_scale) == 3.0
    # A trace of one's own runs at its own rate unless asked.
    assert rate_scale_of("poisson:4:90", None) == 1.0
    assert rate_scale_of(args.trace, 2.0) == 2.0


def test_the_table_is_aligned_and_stderr_has_no_long_line(capsys):
    assert main([*SHORT[:-4], "--policy", "wok,sign-step", "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    sentence, table = captured.out.strip().split("\n\n")
    # The sentence comes first, wrapped for a terminal, and speaks of the first policy.
    assert sentence.startswith("wok served ") and "sign-step" not in sentence
    assert max(len(line) for line in sentence.splitlines()) <= 100
    lines = table.splitlines()
    assert lines[0].split() == [header for header, _ in COLUMNS]
    assert set(lines[1]) == {"-"}
    assert [line.split()[0] for line in lines[2:]] == ["wok", "sign-step"]
    # Every column ends where its header ends.
    ends = [m.end() for m in re.finditer(r"\S+", lines[0])]
    for line in lines[2:]:
        assert [m.end() for m in re.finditer(r"\S+", line)][1:] == ends[1:]
    assert max(len(line) for line in captured.err.splitlines()) < 200


def test_help_explains_every_column_and_every_policy(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    epilog = text[text.index("columns (") :]
    for header, meaning in COLUMNS:
        assert re.search(rf"^  {re.escape(header)} +{re.escape(meaning[:30])}", epilog, re.M)
    for name in load_registry():
        family = re.sub(r"\d+$", "N", name)
        assert family in POLICIES, f"policy {name} is not explained in POLICIES"
        assert re.search(rf"^  {re.escape(family)} ", epilog, re.M)
    assert not [line for line in text.splitlines() if len(line) > 100]


def test_the_sign_step_policy_no_longer_shares_a_word_with_seed():
    registry = load_registry()
    assert "sign-step" in registry and "seed" not in registry
    assert main([*SHORT[:-4], "--policy", "seed", "--jobs", "1"]) == 2


class Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws its bar only there."""

    def isatty(self) -> bool:
        return True


def test_a_progress_bar_counts_the_simulations_on_stderr(monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([*SHORT[:-4], "--policy", "wok,sign-step", "--jobs", "1"]) == 0
    assert "simulations: 100%" in terminal.getvalue() and "2/2" in terminal.getvalue()
    assert "simulations" not in capsys.readouterr().out
