"""Contracts between the operator and the runtime, which cannot import each other: the metric
names it queries and the shapes of the built-in models it sizes."""

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from wok_contracts.metrics import METRICS, VLLM_SERIES, series_names
from wok_operator import signals

EXPORTED = {name for spec in METRICS.values() for name in series_names(spec)}


def named_series(promql: str) -> set[str]:
    """The wok and vLLM series a PromQL expression reads (test_alerts.py checks rules with it)."""
    return set(re.findall(r"(?:vllm:|wok_)[a-z0-9_:]+", promql))


def test_every_promql_query_names_exported_series():
    for window in (60, 300):
        for name, query in signals.round_queries([window]).items():
            named = named_series(query)
            assert named, name
            unknown = named - EXPORTED - VLLM_SERIES
            assert not unknown, f"{name}: {unknown} exported by neither wok's runtime nor vLLM"


#: The signals the law holds without (`control._hold_reason`, `loop.observe`): each must come
#: from a vLLM pod's own series too.
LAW_INPUTS = ("waiting", "running", "kv_usage", "reporting", "finished_rate", "rejected_rate")


def test_a_vllm_pod_answers_every_query_the_law_cannot_do_without():
    queries = signals.round_queries([60])
    for name in (*LAW_INPUTS, "p99:60", "p99_ttft:60", "p99_tpot:60", "p99_service:60"):
        name = name if ":" in name or name in queries else f"{name}:60"
        named = named_series(queries[name])
        assert named & VLLM_SERIES, f"{name} reads nothing a vLLM pod exports: {named}"
        # Every series of a sum is there: a `+` or `/` of a missing one is empty.
        wok_only = named - VLLM_SERIES
        assert wok_only <= {signals.REJECTED}, f"{name} needs {wok_only} from a vLLM pod"
    assert signals.VLLM_REJECTED in VLLM_SERIES
    rejected = queries["rejected_rate:60"]
    assert f"rate({signals.REJECTED}[60s]) or rate({signals.VLLM_REJECTED}[60s])" in rejected


def test_the_operator_and_runtime_spell_the_names_alike():
    for constant in (signals.WAITING, signals.RUNNING, signals.KV_USAGE):
        assert constant in METRICS
    for histogram in (signals.E2E_LATENCY, signals.INFERENCE_TIME):
        assert METRICS[histogram].kind == "histogram"


def test_budget_presets_of_builtin_models_match_the_runtime(tmp_path):
    # One table (wok_contracts.builtin_models); this checks the runtime's config.json of each,
    # read back the way the operator reads a model's, is the operator's preset.
    import json

    from wok_operator.budget import architecture_from_hf_config, preset
    from wok_runtime.core.builtin import BUILTINS

    for name, spec in BUILTINS.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(spec.config.to_hf_dict()))
        runtime, budget = architecture_from_hf_config(path), preset(name)

        def resolved(arch):
            return arch.model_copy(update={"head_dim": arch.resolved_head_dim})

        assert resolved(runtime) == resolved(budget), name


def test_the_kv_budget_check_reads_the_runtimes_gauges_with_its_tolerance():
    from wok_runtime.core.kv_memory import KV_BUDGET_TOLERANCE

    assert signals.KV_BUDGET_TOLERANCE == KV_BUDGET_TOLERANCE
    for constant in (signals.KV_BUDGET_BYTES, signals.KV_MEASURED_BYTES):
        assert METRICS[constant].kind == "gauge" and "device" in METRICS[constant].labels


#: vLLM 0.32's own exposition (tests/data/README.md says how it was made).
VLLM_EXPOSITION = Path(__file__).resolve().parents[1] / "data" / "vllm_0.32_metrics.txt"


def test_every_vllm_series_wok_reads_is_in_vllms_own_exposition():
    text = VLLM_EXPOSITION.read_text()
    exported = {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
    missing = VLLM_SERIES - exported
    assert not missing, f"vLLM 0.32 does not export {sorted(missing)}"
    # What it lacks of wok's runtime, the round reads elsewhere (docs/vllm.md).
    assert not {signals.REJECTED, signals.KV_BUDGET_BYTES, signals.BATCH_LANE_WAITING} & exported
