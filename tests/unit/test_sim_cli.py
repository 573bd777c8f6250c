"""`wok simulate`: the JSON contract, the plots, and bad input as one line and exit 2."""

from __future__ import annotations

import json

import pytest

from wok.cli import main

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
    assert (tmp_path / "simulate-comparison.png").stat().st_size > 0


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
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, flags):
    assert main([*SHORT, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("wok simulate: error:") and "\n" not in err


def test_a_bad_choice_is_an_argparse_error():
    with pytest.raises(SystemExit) as exit_info:
        main([*SHORT, "--routing", "round-robin"])
    assert exit_info.value.code == 2
