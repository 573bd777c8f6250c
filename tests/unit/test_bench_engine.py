"""`wok bench engine`: workloads are built as documented and a short run reports every key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from wok import cli
from wok_runtime.tools.bench_engine import (
    parse_range,
    percentile,
    synthetic_workload,
    trace_workload,
)

TRACE = Path(__file__).resolve().parents[1] / "data" / "azure_llm_2023_code_head.csv"
REQUIRED_KEYS = {
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "mean_batch_size",
    "useful_slot_fraction",
}


def test_synthetic_lengths_and_arrivals() -> None:
    reqs = synthetic_workload(
        num_requests=50, input_len=(3, 9), output_len=(2, 5), request_rate=10.0, vocab_size=100
    )
    assert all(3 <= len(r.prompt_token_ids) <= 9 and 2 <= r.max_tokens <= 5 for r in reqs)
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0 and arrivals[-1] > 0
    burst = synthetic_workload(
        num_requests=5, input_len=(1, 1), output_len=(1, 1), request_rate=math.inf, vocab_size=9
    )
    assert {r.arrival_s for r in burst} == {0.0}


def test_trace_is_scaled_to_fit_and_keeps_or_compresses_arrivals(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4000,10\n"
        "2023-11-16 18:17:05.9799600,1000,500\n"
        "2023-11-16 18:17:07.9799600,8000,3\n"
    )
    reqs = trace_workload(trace, num_requests=10, max_model_len=256, speedup=2.0, vocab_size=50)
    assert [len(r.prompt_token_ids) for r in reqs] == [64, 16, 128]  # longest prompt: half of 256
    assert [r.max_tokens for r in reqs] == [10, 240, 3]  # 500 clipped to what fits
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.0, 2.0])
    assert all(len(r.prompt_token_ids) + r.max_tokens <= 256 for r in reqs)
    with pytest.raises(ValueError, match="Azure"):
        bad = tmp_path / "bad.csv"
        bad.write_text("a,b\n1,2\n")
        trace_workload(bad, num_requests=1, max_model_len=64, speedup=1.0, vocab_size=9)


def test_the_real_azure_trace_parses() -> None:
    reqs = trace_workload(
        TRACE, num_requests=200, max_model_len=512, speedup=math.inf, vocab_size=99
    )
    assert len(reqs) == 200 and all(r.arrival_s == 0.0 for r in reqs)
    assert max(len(r.prompt_token_ids) for r in reqs) == 256


def test_ranges_and_percentiles() -> None:
    assert parse_range("16:64") == (16, 64) and parse_range("8") == (8, 8)
    for bad in ("0", "9:3", "x"):
        with pytest.raises(ValueError):
            parse_range(bad)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0 and math.isnan(percentile([], 50))


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_a_short_run_reports_every_key(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "engine", "--model", "builtin:tiny", "--mode", mode, "--num-requests", "6"]
    argv += ["--input-len", "4:8", "--output-len", "2:6", "--max-model-len", "64", "--json"]
    assert cli.main([*argv, "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result.keys() >= REQUIRED_KEYS
    assert result["num_requests"] == 6 and result["mode"] == mode
    assert 0 < result["useful_slot_fraction"] <= 1
    assert result["output_tokens"] >= 12


def test_bad_arguments_are_one_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "engine", "--input-len", "9:3", "--no-progress"]
    assert cli.main(argv) == 2
    assert "LOW <= HIGH" in capsys.readouterr().err
