"""Argo CD's health check for InferenceService (deploy/argocd/health.lua), run in Lua 5.1 (the
language of Argo CD's gopher-lua) on the status the operator's own functions write: the
reconcile's patch, then the loop's ticks over real pod views."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from lupa.lua51 import LuaRuntime

from wok_contracts.signals import ServiceSignals
from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_operator.conditions import ISO_SECONDS
from wok_operator.control import LawParams, decide
from wok_operator.handlers import invalid_spec_status, reconciled_status, validated
from wok_operator.loop import (
    decision_status,
    observe,
    pod_view,
    state_from_status,
    with_pod_failures,
)

ROOT = Path(__file__).resolve().parents[2]
HEALTH_LUA = ROOT / "deploy" / "argocd" / "health.lua"
ARGOCD_CM = ROOT / "deploy" / "argocd" / "argocd-cm.yaml"
HEALTH_KEY = "resource.customizations.health.wok.dev_InferenceService"

SPEC = {"runtime": {"gpuMemory": "256Mi"}, "memory": {"maxModelLen": 512, "reserve": "16Mi"}}
NOW = 1_000_000.0
STALLED_AFTER_S = 300.0


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Runs the script as Argo CD does: `obj` a global, the chunk returns {status, message}. A
    fresh runtime without io, os or require, as Argo CD's sandbox lacks them."""
    lua = LuaRuntime()
    for unsafe in ("io", "os", "require", "dofile", "loadfile"):
        lua.globals()[unsafe] = None
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA.read_text())
    return {"status": result["status"], "message": result["message"]}


class Service:
    """An InferenceService whose status moves as the operator moves it: a reconcile per spec
    generation, then the loop's ticks (each a merge patch of the status)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "wok.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "llm", "generation": 1},
            "spec": spec,
        }

    @property
    def status(self) -> dict[str, Any]:
        return self.obj.get("status", {})

    def patch(self, status: dict[str, Any]) -> None:
        self.obj["status"] = {**self.status, **status}

    def edit(self, spec: dict[str, Any]) -> None:
        self.obj["spec"] = spec
        self.obj["metadata"]["generation"] += 1

    def reconcile(self) -> None:
        generation = self.obj["metadata"]["generation"]
        conditions = list(self.status.get("conditions") or [])
        try:
            parsed, plan = validated(self.obj["spec"])
        except ValueError as error:
            self.patch(invalid_spec_status(conditions, str(error), generation=generation))
            return
        params = LawParams.from_spec(parsed, batch_mem=plan.max_batch_size)
        state = state_from_status(self.status, parsed, params)
        replicas = params.clip_replicas(state.replicas)
        self.patch(
            reconciled_status(
                conditions,
                "chat",
                plan,
                batch=params.clip_batch(state.batch),
                replicas=replicas,
                generation=generation,
            )
        )

    def tick(self, *, ready: int, starting: int = 0, stalled: int = 0, crashing: int = 0) -> None:
        spec = InferenceServiceSpec.model_validate(self.obj["spec"])
        params = LawParams.from_spec(spec, batch_mem=plan_for_spec(spec).max_batch_size)
        pods = [runtime_pod(f"r{i}", ready=True, age_s=60) for i in range(ready)]
        pods += [runtime_pod(f"s{i}", ready=False, age_s=10) for i in range(starting)]
        pods += [
            runtime_pod(f"x{i}", ready=False, age_s=2 * STALLED_AFTER_S) for i in range(stalled)
        ]
        pods += [runtime_pod(f"c{i}", ready=False, age_s=60, crash=True) for i in range(crashing)]
        signals = ServiceSignals(waiting=0, running=2 * ready, p99_seconds=0.5, kv_usage=0.1)
        obs = observe(signals, pods, now=NOW, stalled_after_s=STALLED_AFTER_S)
        state = state_from_status(self.status, spec, params)
        decision = decide(state, obs, params, now=NOW)
        generation = self.obj["metadata"]["generation"]
        now = "2026-01-01T00:00:00Z"
        patch = decision_status(
            decision,
            obs,
            previous_conditions=self.status.get("conditions"),
            generation=generation,
            now=now,
        )
        self.patch(with_pod_failures(patch, pods, generation=generation, now=now))


def runtime_pod(name: str, *, ready: bool, age_s: float, crash: bool = False) -> Any:
    created = datetime.fromtimestamp(NOW - age_s, UTC).strftime(ISO_SECONDS)
    meta = {"uid": name, "creationTimestamp": created}
    status: dict[str, Any] = {
        "phase": "Running" if ready or crash else "Pending",
        "podIP": "10.0.0.1" if ready else None,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if crash:
        waiting = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}
        status["containerStatuses"] = [{"name": "runtime", "state": {"waiting": waiting}}]
    return pod_view(name, meta, status)


def test_a_service_goes_from_progressing_to_healthy_as_its_pods_become_ready():
    service = Service(SPEC)
    assert health(service.obj)["status"] == "Progressing"  # no status yet
    service.reconcile()
    assert health(service.obj) == {
        "status": "Progressing",
        "message": "runtime Deployment applied for generation 1",
    }
    service.tick(ready=0, starting=1)
    assert health(service.obj) == {
        "status": "Progressing",
        "message": "no runtime pod is ready yet",
    }
    service.tick(ready=1)
    assert health(service.obj) == {"status": "Healthy", "message": "1 replica(s) ready"}


def test_a_spec_change_is_progressing_until_the_operator_has_seen_it():
    service = Service(SPEC)
    service.reconcile()
    service.tick(ready=1)
    service.edit({**SPEC, "scaling": {"minReplicas": 2, "maxReplicas": 4}})
    assert health(service.obj) == {
        "status": "Progressing",
        "message": "Waiting for the wok operator to reconcile generation 2",
    }
    service.reconcile()
    service.tick(ready=1, starting=1)
    assert health(service.obj) == {"status": "Progressing", "message": "1 of 2 replica(s) ready"}
    service.tick(ready=2)
    assert health(service.obj)["status"] == "Healthy"


def test_a_refused_spec_is_degraded_with_the_operators_reason_until_fixed():
    service = Service(SPEC)
    service.reconcile()
    service.tick(ready=1)
    service.edit({**SPEC, "model": {"source": "builtin:gemma-2b"}})
    service.reconcile()
    verdict = health(service.obj)
    assert verdict["status"] == "Degraded"
    assert verdict["message"].startswith("InvalidSpec: ") and "gemma-2b" in verdict["message"]
    service.edit(SPEC)
    service.reconcile()
    service.tick(ready=1)
    assert health(service.obj)["status"] == "Healthy"


def test_pods_stuck_past_their_start_with_none_ready_are_degraded():
    service = Service(SPEC)
    service.reconcile()
    service.tick(ready=0, stalled=1)
    verdict = health(service.obj)
    assert verdict["status"] == "Degraded"
    assert "1 pod(s) pending past the pod start" in verdict["message"]
    # One pod still serves: the service is on its way, not failed.
    service.tick(ready=1, stalled=1)
    assert health(service.obj)["status"] != "Degraded"


def test_a_crash_looping_pod_is_degraded_with_the_operators_message_until_it_runs():
    service = Service(SPEC)
    service.reconcile()
    service.tick(ready=1, crashing=1)
    verdict = health(service.obj)
    assert verdict["status"] == "Degraded"
    assert "pod c0: runtime: CrashLoopBackOff" in verdict["message"]
    service.tick(ready=1)
    assert health(service.obj)["status"] != "Degraded"


def test_a_service_scaled_to_zero_is_healthy():
    external = {**SPEC, "replicas": 0, "scaling": {"replicas": "external", "minReplicas": 0}}
    service = Service(external)
    service.reconcile()
    service.tick(ready=0)
    assert service.status["replicas"] == 0
    assert health(service.obj) == {"status": "Healthy", "message": "Scaled to zero"}


def test_the_argocd_cm_snippet_carries_the_script_verbatim():
    config_map = yaml.safe_load(ARGOCD_CM.read_text())
    assert config_map["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    assert config_map["data"] == {HEALTH_KEY: HEALTH_LUA.read_text()}
