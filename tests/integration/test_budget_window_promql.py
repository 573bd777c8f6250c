"""The error budget's P99s evaluated by Prometheus' own engine (promtool's PromQL tests): a slow
stretch that the SLO window has forgotten still breaks the P99 over the budget window, and
`Round.signals` hands both to the law under their own names; and the P99.5 over the budget
window tells a budget with half of it left from one nearly spent."""

from __future__ import annotations

from pathlib import Path

import pytest
from promql_harness import assert_promql

from wok_operator.signals import (
    E2E_LATENCY,
    REJECTED,
    TPOT,
    TTFT,
    Round,
    parse_vector,
    round_queries,
)

pytestmark = pytest.mark.integration

RECORDING_RULES = Path(__file__).resolve().parents[2] / "charts/wok/files/recording_rules.yaml"

LABELS = 'namespace="ns",service="llm",pod="a",model_name="m"'
SLO_S = 2.0
# 100 requests a minute for 70 minutes; in the first 30, 5 a minute take 3 s to their first
# token, then every one is under 1 s. At 70 min the last hour (10–70 min) holds 100 slow of 6000
# (1.7 %: the P99 is past the SLO), the last minute none.
BUCKETS = {
    "1": "0+95x30 2950+100x40",
    "2": "0+95x30 2950+100x40",
    "5": "0+100x70",
    "+Inf": "0+100x70",
}


def test_a_slow_stretch_the_slo_window_forgot_still_breaks_the_budget_windows_p99(
    tmp_path: Path,
) -> None:
    series = [
        {"series": f'{TTFT}_bucket{{{LABELS},le="{le}"}}', "values": values}
        for le, values in BUCKETS.items()
    ]
    series.append({"series": f"{REJECTED}{{{LABELS}}}", "values": "0x70"})
    queries = round_queries([60], [3600])
    assert set(round_queries([60])) < set(queries)
    assert set(queries) - set(round_queries([60])) == {
        f"{name}:3600" for name in ("p99", "p99_ttft", "p99_tpot", "p995", "p995_ttft", "p995_tpot")
    }
    breached = {60: 0, 3600: 1}
    tests = [
        {
            "expr": f"({queries[f'p99_ttft:{window}']}) > bool {SLO_S}",
            "eval_time": "70m",
            "exp_samples": [{"labels": '{namespace="ns",service="llm"}', "value": value}],
        }
        for window, value in breached.items()
    ]
    assert_promql(tmp_path, series, tests)

    def vector(value: float) -> dict:
        return parse_vector(
            [{"metric": {"namespace": "ns", "service": "llm"}, "value": [0, value]}]
        )

    rnd = Round(fetched_at=0, vectors={"p99_ttft:60": vector(0.99), "p99_ttft:3600": vector(4.2)})
    signals = rnd.signals(("ns", "llm"), 60, 3600)
    assert (signals.p99_ttft_seconds, signals.budget_p99_ttft_seconds) == (0.99, 4.2)
    assert rnd.signals(("ns", "llm"), 60).budget_p99_ttft_seconds is None


def test_the_half_budget_quantile_reads_past_the_slo_while_under_1_percent_missed(
    tmp_path: Path,
) -> None:
    # 1000 requests a minute, 7 of them (0.7 %) take 3 s to their first token: the hour's P99 is
    # within the SLO, its P99.5 is not (under half the budget is left).
    series = [
        {"series": f'{TTFT}_bucket{{{LABELS},le="{le}"}}', "values": values}
        for le, values in {
            "1": "0+993x70",
            "2": "0+993x70",
            "5": "0+1000x70",
            "+Inf": "0+1000x70",
        }.items()
    ]
    series.append({"series": f"{REJECTED}{{{LABELS}}}", "values": "0x70"})
    queries = round_queries([60], [3600])
    tests = [
        {
            "expr": f"({queries[name]}) > bool {SLO_S}",
            "eval_time": "70m",
            "exp_samples": [{"labels": '{namespace="ns",service="llm"}', "value": value}],
        }
        for name, value in (("p99_ttft:3600", 0), ("p995_ttft:3600", 1))
    ]
    assert_promql(tmp_path, series, tests)
    rnd = Round(
        fetched_at=0,
        vectors={
            "p99_ttft:3600": parse_vector(
                [{"metric": {"namespace": "ns", "service": "llm"}, "value": [0, 1.0]}]
            ),
            "p995_ttft:3600": parse_vector(
                [{"metric": {"namespace": "ns", "service": "llm"}, "value": [0, 2.9]}]
            ),
        },
    )
    signals = rnd.signals(("ns", "llm"), 60, 3600)
    assert (signals.budget_p99_ttft_seconds, signals.budget_p995_ttft_seconds) == (1.0, 2.9)


def test_the_recorded_quantiles_read_what_the_raw_promql_reads(tmp_path: Path) -> None:
    """The recording rules over the same input: each recorded quantile the round reads equals
    its raw query, misses counted where the SLO counts them."""
    series = [
        {"series": f'{histogram}_bucket{{{LABELS},le="{le}"}}', "values": values}
        for histogram in (TTFT, TPOT, E2E_LATENCY)
        for le, values in BUCKETS.items()
    ]
    series.append({"series": f"{REJECTED}{{{LABELS}}}", "values": "0+3x70"})
    raw = round_queries([60], [3600])
    recorded = round_queries([60], [3600], recorded=True)
    tests = [
        {
            "expr": f"({recorded[name]}) - ({raw[name]})",
            "eval_time": "70m",
            "exp_samples": [{"labels": '{namespace="ns",service="llm"}', "value": 0}],
        }
        for name in raw
        if raw[name] != recorded[name]
    ]
    assert len(tests) == 6
    assert_promql(tmp_path, series, tests, rule_files=[RECORDING_RULES])
