"""The KV budget against the room a GPU pod measured: the round's queries, the worst
pod's ratio in ServiceSignals, and the KVBudgetMatched condition of the record step."""

from wok_contracts.profile import load_profile
from wok_contracts.signals import ServiceSignals
from wok_operator import conditions as cond
from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_operator.control import LoopState
from wok_operator.loop import control_tick, decision_status, with_kv_budget
from wok_operator.signals import (
    KV_DEVICE_SELECTOR,
    Round,
    farthest_from_one,
    kv_budget_queries,
    round_queries,
)
from wok_sim.prometheus import EmulatedPrometheus
from wok_sim.replica import SimReplica

SPEC = InferenceServiceSpec.model_validate(
    {"runtime": {"gpuMemory": "256Mi"}, "memory": {"maxModelLen": 512, "reserve": "16Mi"}}
)
KEY = ("ns", "llm")
GIB = 2**30


def kv_condition(signals: ServiceSignals, previous: list | None = None, now: str = "t1") -> dict:
    result = control_tick(
        SPEC,
        LoopState(batch=8, replicas=1),
        signals,
        [],
        batch_mem=plan_for_spec(SPEC).max_batch_size,
        now=0.0,
    )
    assert result.signals is signals  # what the record step reads
    patch = decision_status(
        result.decision, result.observation, previous_conditions=previous, generation=2, now=now
    )
    patch = with_kv_budget(patch, signals, generation=2, now=now)
    return next(c for c in patch["conditions"] if c["type"] == cond.KV_BUDGET_MATCHED)


def test_the_round_reads_the_gpu_pods_budget_and_ratio_at_both_ends():
    queries = kv_budget_queries()
    assert set(queries) <= set(round_queries([60]))
    for query in queries.values():
        assert "by (namespace, service)" in query
        # A CPU pod's "measured" figure is a share of host memory: only CUDA series are read.
        assert query.count("wok_kv_cache_") == query.count(KV_DEVICE_SELECTOR) > 0
    assert queries["kv_measured_ratio_min"].startswith("min by")
    assert queries["kv_measured_ratio_max"].startswith("max by")


def test_the_worst_pod_is_the_one_farthest_from_one():
    assert farthest_from_one(0.85, 1.2) == 1.2
    assert farthest_from_one(0.7, 1.2) == 0.7
    assert farthest_from_one(None, 1.05) == 1.05
    assert farthest_from_one(None, None) is None
    vectors = {
        "kv_budget_bytes": {KEY: 10.0 * GIB},
        "kv_measured_ratio_min": {KEY: 0.8},
        "kv_measured_ratio_max": {KEY: 1.05},
    }
    s = Round(fetched_at=0, vectors=vectors).signals(KEY, 60)
    assert (s.kv_budget_bytes, s.kv_measured_ratio) == (10.0 * GIB, 0.8)
    assert Round(fetched_at=0, vectors={}).signals(KEY, 60).kv_measured_ratio is None


def test_more_than_ten_percent_apart_is_a_false_condition_with_both_figures():
    differs = kv_condition(ServiceSignals(kv_budget_bytes=10 * GIB, kv_measured_ratio=0.85))
    assert (differs["status"], differs["reason"]) == ("False", "MeasuredRoomDiffers")
    assert "8.50 GiB" in differs["message"] and "10.00 GiB" in differs["message"]
    assert str(10 * GIB) in differs["message"] and "0.85x" in differs["message"]
    assert differs["observedGeneration"] == 2
    for ratio in (0.9, 1.0, 1.1):  # the runtime's own bound: more than 10 % differs
        matched = kv_condition(ServiceSignals(kv_budget_bytes=10 * GIB, kv_measured_ratio=ratio))
        assert (matched["status"], matched["reason"]) == ("True", "MeasuredRoomMatches")
    assert kv_condition(ServiceSignals(kv_budget_bytes=GIB, kv_measured_ratio=1.11))["status"] == (
        "False"
    )


def test_no_gpu_pod_reporting_is_unknown_and_the_transition_time_moves_on_change_only():
    unknown = kv_condition(ServiceSignals(), now="t1")
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "NotMeasured")
    again = kv_condition(ServiceSignals(), previous=[unknown], now="t2")
    assert again["lastTransitionTime"] == "t1"
    differs = ServiceSignals(kv_budget_bytes=GIB, kv_measured_ratio=1.5)
    assert kv_condition(differs, previous=[again], now="t3")["lastTransitionTime"] == "t3"


def test_the_simulated_fleet_answers_the_queries_with_no_mismatch():
    pod = SimReplica(load_profile("sim:llama-3-8b-80g"), pod=0, batch_cap=8)
    prom = EmulatedPrometheus(windows=(60,))
    prom.scrape(0.0, [pod])
    signals = prom.signals(0.0, 60)
    assert signals.kv_measured_ratio == 1.0 and signals.kv_budget_bytes
    assert kv_condition(signals)["status"] == "True"
