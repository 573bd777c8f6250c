"""The chart's recording rules are the operator's own queries, recorded: the rules file is
`signals.recording_rules()`, and a round that finds them reads the recorded quantiles over the
windows they cover and the raw PromQL over the others."""

from __future__ import annotations

from pathlib import Path

import yaml

from wok_operator.signals import (
    HALF_BUDGET_QUANTILE,
    RECORDED_WINDOWS,
    SLO_QUANTILE,
    recorded_probe,
    recorded_quantile,
    recording_rules,
    round_queries,
)

RULES = Path(__file__).resolve().parents[2] / "charts/wok/files/recording_rules.yaml"


def test_the_shipped_rules_file_is_the_operators_recording_rules():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    operators = [g for g in groups if g["name"] in {r["name"] for r in recording_rules()["groups"]}]
    assert operators == recording_rules()["groups"], (
        "regenerate charts/wok/files/recording_rules.yaml's wok.slo-windows group from "
        "signals.recording_rules()"
    )
    # The other group is the alerts' inputs (tests/unit/test_alerts.py).
    assert [g["name"] for g in groups] == ["wok.slo-windows", "wok.alert-inputs"]


def test_a_round_reads_the_recorded_quantiles_where_the_rules_cover_the_window():
    raw = round_queries([60], [3600])
    recorded = round_queries([60], [3600], recorded=True)
    assert set(raw) == set(recorded)
    changed = {name for name in raw if raw[name] != recorded[name]}
    assert changed == {
        f"{name}:3600" for name in ("p99", "p99_ttft", "p99_tpot", "p995", "p995_ttft", "p995_tpot")
    }
    recorded_names = {rule["record"] for rule in recording_rules()["groups"][0]["rules"]}
    assert {recorded[name] for name in changed} <= recorded_names
    # No recorded series is read raw, and no window the rules do not cover is read recorded.
    assert all("_bucket[" not in recorded[name] for name in changed)
    assert round_queries([60], [7200], recorded=True) == round_queries([60], [7200])


def test_the_probe_asks_for_a_recorded_quantile_of_each_slo():
    probe = recorded_probe()
    for window in RECORDED_WINDOWS:
        for q in (SLO_QUANTILE,):
            assert recorded_quantile("vllm:time_to_first_token_seconds", window, q) in probe
    assert recorded_quantile("vllm:e2e_request_latency_seconds", 3600, HALF_BUDGET_QUANTILE) == (
        "namespace_service:vllm_e2e_request_latency_seconds:p995_1h"
    )
