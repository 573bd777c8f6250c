"""The SLO quantiles that count misses, evaluated by Prometheus' own engine: rejected requests
join the +Inf bucket, a service without a rejection counter keeps its plain histogram, and the
bucket `rate()` appears once in the query (it is the round's most expensive selector)."""

from __future__ import annotations

from pathlib import Path

import pytest
from promql_harness import assert_promql

from wok_operator.signals import E2E_LATENCY, REJECTED, VLLM_REJECTED, round_queries

pytestmark = pytest.mark.integration

# 100 requests a minute, all within 1 s.
BUCKETS = {"1": "0+100x10", "5": "0+100x10", "+Inf": "0+100x10"}


def histogram(service: str) -> list[dict]:
    labels = f'namespace="ns",service="{service}",pod="{service}-0"'
    return [
        {"series": f'{E2E_LATENCY}_bucket{{{labels},le="{le}"}}', "values": values}
        for le, values in BUCKETS.items()
    ]


def test_rejections_are_misses_and_a_service_without_the_counter_keeps_its_histogram(
    tmp_path: Path,
) -> None:
    # "busy" rejects 5 a minute for one reason and 1 for another (6 of 106: past the 1 % the
    # P99 allows, so its P99 is in the +Inf bucket); "plain" exports no rejection counter.
    series = histogram("busy") + histogram("plain")
    for reason, per_min in (("queue_full", 5), ("timeout", 1)):
        series.append(
            {
                "series": f'{REJECTED}{{namespace="ns",service="busy",pod="busy-0",'
                f'reason="{reason}"}}',
                "values": f"0+{per_min}x10",
            }
        )
    query = round_queries([60])["p99:60"]
    tests = [
        {
            "expr": f"({query}) > bool 1",
            "eval_time": "10m",
            "exp_samples": [
                {"labels": '{namespace="ns",service="busy"}', "value": 1},
                {"labels": '{namespace="ns",service="plain"}', "value": 0},
            ],
        }
    ]
    assert_promql(tmp_path, series, tests)


def test_each_bucket_rate_is_evaluated_once_per_query() -> None:
    for name, query in round_queries([60], [3600]).items():
        assert query.count("_bucket[") <= 1, (name, query)


def test_vllms_admission_rejections_count_as_misses_and_arrivals(tmp_path: Path) -> None:
    """An engine: vllm pod exports vLLM's own rejection counter, not wok's: the same round
    reads it, as a miss in the P99 and in the rejection rate the law adds to the arrivals."""
    labels = 'namespace="ns",service="on-vllm",pod="on-vllm-0",model_name="m"'
    series = [
        {"series": f'{E2E_LATENCY}_bucket{{{labels},engine="0",le="{le}"}}', "values": values}
        for le, values in BUCKETS.items()
    ]
    # 6 refused a minute by --max-num-queued-reqs (6 of 106: the P99 lands in +Inf).
    series.append(
        {
            "series": f'{VLLM_REJECTED}{{{labels},reason="max_num_queued_reqs"}}',
            "values": "0+6x10",
        }
    )
    queries = round_queries([60])
    tests = [
        {
            "expr": f"({queries['p99:60']}) > bool 1",
            "eval_time": "10m",
            "exp_samples": [{"labels": '{namespace="ns",service="on-vllm"}', "value": 1}],
        },
        {
            "expr": f"({queries['rejected_rate:60']}) * 60",
            "eval_time": "10m",
            "exp_samples": [{"labels": '{namespace="ns",service="on-vllm"}', "value": 6}],
        },
    ]
    assert_promql(tmp_path, series, tests)
