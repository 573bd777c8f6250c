"""engine: vllm: the batch cap is fixed per pod. The law's cap never exceeds what `never` pods run,
status says when the law would run another batch, and only `restart` rolls the pods to it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import kopf
import pytest
import yaml
from kopf._core.engines.posting import event_queue_loop_var, event_queue_var, settings_var

from wok_contracts.signals import PodView
from wok_operator import api
from wok_operator import conditions as cond
from wok_operator.budget import plan_for_spec
from wok_operator.control import Decision, LoopState
from wok_operator.fixed_batch import (
    EngineBatch,
    engine_batch_after,
    law_batch_mem,
    with_engine_batch,
)
from wok_operator.handlers import LoopMemo, OperatorConfig, ServiceTick, Shared
from wok_operator.vllm_pod import spec_batch_cap

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm-tiny.yaml"
NOW = "2026-12-07T00:00:00Z"


def vllm_spec(apply: str = "never", **batching: object) -> api.InferenceServiceSpec:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["batching"] = {**spec["batching"], "applyToEngine": apply, **batching}
    return api.InferenceServiceSpec.model_validate(spec)


def test_never_pods_cap_the_laws_batch_at_what_they_run():
    spec = vllm_spec(maxBatchSize=128)
    at_model_len = plan_for_spec(spec)
    # An observed mean far below maxModelLen lets B_mem grow; the pods still run the spec's cap.
    observed = plan_for_spec(spec, sequence_length=64)
    assert observed.max_batch_size > spec_batch_cap(spec) == min(128, at_model_len.max_batch_size)
    assert law_batch_mem(spec, observed) == spec_batch_cap(spec)
    # With restart, or on wok's runtime, the law's cap is the budget's.
    assert law_batch_mem(vllm_spec("restart", maxBatchSize=128), observed) == (
        observed.max_batch_size
    )
    wok = api.InferenceServiceSpec.model_validate({"runtime": {"gpuMemory": "1Gi"}})
    assert law_batch_mem(wok, plan_for_spec(wok)) == plan_for_spec(wok).max_batch_size


@pytest.mark.parametrize(
    ("apply", "law", "running", "expected"),
    [
        ("never", 24, 32, EngineBatch(32, roll=False)),
        ("never", 32, 32, EngineBatch(32, roll=False)),
        ("restart", 24, 32, EngineBatch(24, roll=True)),
        ("restart", 32, 32, EngineBatch(32, roll=False)),
        ("restart", 24, None, EngineBatch(24, roll=False)),  # not reconciled yet: nothing to roll
    ],
)
def test_only_restart_rolls_the_pods_to_the_laws_batch(apply, law, running, expected):
    assert engine_batch_after(vllm_spec(apply), law, running) == expected


def condition(patch: dict) -> dict:
    (found,) = [c for c in patch["conditions"] if c["type"] == cond.BATCH_APPLIED]
    return found


def test_status_says_when_the_law_would_move_a_fixed_cap():
    spec = vllm_spec()
    held = with_engine_batch(
        {}, spec, law_batch=24, engine=EngineBatch(32, False), generation=3, now=NOW
    )
    assert held["engineBatchSize"] == 32
    applied = condition(held)
    assert (applied["status"], applied["reason"]) == ("False", "FixedPerPod")
    assert "the law would run batch 24" in applied["message"]
    assert "--max-num-seqs=32" in applied["message"]
    same = with_engine_batch(
        {}, spec, law_batch=32, engine=EngineBatch(32, False), generation=3, now=NOW
    )
    assert (condition(same)["status"], condition(same)["reason"]) == ("True", "EngineRunsLawBatch")
    rolling = with_engine_batch(
        {}, vllm_spec("restart"), law_batch=24, engine=EngineBatch(24, True), generation=3, now=NOW
    )
    assert (condition(rolling)["status"], condition(rolling)["reason"]) == ("True", "RollingPods")
    # The status schema keeps the field (an undeclared one would be pruned).
    api.InferenceServiceStatus.model_validate({"engineBatchSize": 32, **held})


def test_a_wok_service_gets_no_engine_batch_status():
    wok = api.InferenceServiceSpec.model_validate({"runtime": {"gpuMemory": "1Gi"}})
    assert with_engine_batch({}, wok, law_batch=8, engine=EngineBatch(8, False), generation=1,
                             now=NOW) == {}  # fmt: skip


class FakeKube:
    """Records what the tick applies (no apiserver runs in a unit test)."""

    def __init__(self) -> None:
        self.applied: list[dict] = []

    def apply(self, obj: dict) -> None:
        self.applied.append(obj)

    def set_batch_size(self, service: str, namespace: str, batch: int) -> None:
        self.applied.append({"kind": "ConfigMap", "batch": batch})


def kopf_events() -> asyncio.Queue:
    """Kopf's event queue, as the operator has it (call inside the test's event loop)."""
    settings_var.set(kopf.OperatorSettings())
    queue: asyncio.Queue = asyncio.Queue()
    event_queue_var.set(queue)
    event_queue_loop_var.set(asyncio.get_running_loop())
    return queue


def vllm_tick(kube: FakeKube) -> ServiceTick:
    body = {"metadata": {"name": "chat", "namespace": "team-a", "uid": "u1"}}
    return ServiceTick(
        Shared(kube=kube, config=OperatorConfig(), http=httpx.AsyncClient()),  # type: ignore[arg-type]
        LoopMemo(admin_token="t0ken"),
        "chat",
        "team-a",
        body,  # type: ignore[arg-type]
        logging.getLogger("test"),  # type: ignore[arg-type]
    )


def decision(batch_before: int, batch: int) -> Decision:
    return Decision(batch_before, batch, 2, 2, "test", LoopState(batch=batch, replicas=2))


async def test_a_vllm_pod_is_never_pushed_a_batch():
    tick = vllm_tick(FakeKube())
    pod = PodView("p1", "uid1", "127.0.0.9", ready=True, terminating=False)
    tick.act(decision(32, 24), [pod], deployed=2, engine=EngineBatch(32, roll=False))
    assert "pods" not in tick.memo.writer.pending
    tick.act(decision(32, 24), [pod], deployed=2)  # a wok runtime pod is
    assert "pods" in tick.memo.writer.pending


async def test_restart_applies_the_deployment_with_the_laws_batch():
    events = kopf_events()
    kube = FakeKube()
    tick = vllm_tick(kube)
    tick.memo.writer.start()
    spec = vllm_spec("restart")
    tick.roll(spec, plan_for_spec(spec), replicas=2, batch=24)
    assert await tick.memo.writer.flush(timeout=5.0)
    await tick.memo.writer.close(timeout=1.0)
    (deployment,) = kube.applied
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--max-num-seqs=24" in container["args"]
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert events.get_nowait().reason == "EngineBatchRolled"
