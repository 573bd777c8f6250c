"""The operator's KV-budget queries evaluated by Prometheus' own engine (promtool's PromQL tests):
the measured ÷ budget division matches each pod's two series, the CPU pod's figures stay out, and
`Round.signals` then picks the pod farthest from 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from promql_harness import assert_promql

from wok_operator.signals import Round, kv_budget_queries, parse_vector

pytestmark = pytest.mark.integration

# (pod, device, budget bytes, measured bytes); what the runtime exports, with the labels the
# PodMonitor's relabelling adds.
PODS = [
    ("a", "cuda", 1000, 1200),
    ("b", "cuda", 1000, 850),
    ("c", "cpu", 1000, 99_000),  # a CPU pod measures host memory: never compared
]
EXPECTED = {"kv_budget_bytes": 1000.0, "kv_measured_ratio_min": 0.85, "kv_measured_ratio_max": 1.2}


def test_prometheus_evaluates_the_kv_budget_queries(tmp_path: Path) -> None:
    series = []
    for pod, device, budget, measured in PODS:
        labels = f'namespace="ns",service="llm",pod="{pod}",device="{device}",model_name="m"'
        series.append({"series": f"wok_kv_cache_budget_bytes{{{labels}}}", "values": f"{budget}x3"})
        series.append(
            {"series": f"wok_kv_cache_measured_bytes{{{labels}}}", "values": f"{measured}x3"}
        )
    queries = kv_budget_queries()
    assert set(queries) == set(EXPECTED)
    tests = [
        {
            "expr": queries[name],
            "eval_time": "1m",
            "exp_samples": [{"labels": '{namespace="ns",service="llm"}', "value": value}],
        }
        for name, value in EXPECTED.items()
    ]
    assert_promql(tmp_path, series, tests)
    # The same samples through the operator's parser: the worst pod is a (1.2 is 0.2 from 1, b's
    # 0.85 only 0.15).
    vectors = {
        name: parse_vector([{"metric": {"namespace": "ns", "service": "llm"}, "value": [0, v]}])
        for name, v in EXPECTED.items()
    }
    signals = Round(fetched_at=0, vectors=vectors).signals(("ns", "llm"), 60)
    assert (signals.kv_budget_bytes, signals.kv_measured_ratio) == (1000.0, 1.2)
