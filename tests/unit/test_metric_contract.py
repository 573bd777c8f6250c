"""The metric contract: every series the operator queries is one the runtime really exports."""

import re

from wok_operator import signals
from wok_runtime.metrics import METRICS, series_names

EXPORTED = {name for spec in METRICS.values() for name in series_names(spec)}


def test_every_promql_query_names_exported_series():
    for window in (60, 300):
        for name, query in signals.round_queries([window]).items():
            named = set(re.findall(r"(?:vllm:|wok_)[a-z0-9_:]+", query))
            assert named, name
            assert named <= EXPORTED, f"{name}: {named - EXPORTED} not exported by the runtime"


def test_the_operator_and_runtime_spell_the_names_alike():
    for constant in (signals.WAITING, signals.RUNNING, signals.KV_USAGE):
        assert constant in METRICS
    for histogram in (signals.E2E_LATENCY, signals.INFERENCE_TIME):
        assert METRICS[histogram].kind == "histogram"
