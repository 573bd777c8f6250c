"""`wok bench engine`: workloads are built as documented and a short run reports every key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import pytest

from wok import cli
from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_engine import (
    parse_range,
    percentile,
    prompt_token_ids,
    run_engine_bench,
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


def test_prompts_have_each_request_s_length_seeded_ids_and_no_eos() -> None:
    reqs = [TraceRequest(0.0, 3, 1), TraceRequest(1.0, 50, 2), TraceRequest(2.0, 1, 9)]
    prompts = prompt_token_ids(reqs, vocab_size=7, seed=3)
    assert [len(p) for p in prompts] == [3, 50, 1]
    assert {i for p in prompts for i in p} == set(range(1, 7))  # token 0 (EOS) never
    assert prompts == prompt_token_ids(reqs, vocab_size=7, seed=3)
    assert prompts != prompt_token_ids(reqs, vocab_size=7, seed=4)
    # A prompt of another length than its request says is refused before any engine starts.
    with pytest.raises(ValueError, match="prompt_tokens"):
        run_engine_bench(cast(Any, None), cast(Any, None), reqs, [prompts[0], prompts[0], [1]])


def test_trace_is_scaled_to_fit_and_keeps_or_compresses_arrivals(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4000,10\n"
        "2023-11-16 18:17:05.9799600,1000,500\n"
        "2023-11-16 18:17:07.9799600,8000,3\n"
    )
    reqs = trace_workload(trace, num_requests=10, max_model_len=256, speedup=2.0)
    assert [r.prompt_tokens for r in reqs] == [64, 16, 128]  # longest prompt: half of 256
    assert [r.output_tokens for r in reqs] == [10, 240, 3]  # 500 clipped to what fits
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.0, 2.0])
    assert all(r.prompt_tokens + r.output_tokens <= 256 for r in reqs)
    clipped = trace_workload(
        trace, num_requests=10, max_model_len=256, speedup=2.0, max_output_len=8
    )
    assert [r.output_tokens for r in clipped] == [8, 8, 3]
    with pytest.raises(ValueError, match="Azure"):
        bad = tmp_path / "bad.csv"
        bad.write_text("a,b\n1,2\n")
        trace_workload(bad, num_requests=1, max_model_len=64, speedup=1.0)


def test_the_real_azure_trace_parses() -> None:
    reqs = trace_workload(TRACE, num_requests=200, max_model_len=512, speedup=math.inf)
    assert len(reqs) == 200 and all(r.arrival_s == 0.0 for r in reqs)
    assert max(r.prompt_tokens for r in reqs) == 256


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
