"""The InferenceService CRD installs on a real apiserver; schema and CEL rules reject bad specs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from wok_cluster.kubeapi import KubeError
from wok_cluster.waiting import wait_until

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "wok.dev_inferenceservices.yaml"


def _established(api, name: str) -> bool:
    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = crd.get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def crd_installed(wok_apiserver):
    result = subprocess.run(
        [
            "kubectl",
            f"--kubeconfig={wok_apiserver.kubeconfig}",
            "apply",
            "--server-side",
            "-f",
            str(CRD),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    name = yaml.safe_load(CRD.read_text())["metadata"]["name"]
    with wok_apiserver.api() as api:
        wait_until(lambda: _established(api, name), timeout=30, what=f"CRD {name} Established")
    return name


def _service(name: str, spec: dict) -> dict:
    return {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def _create(api, namespace: str, body: dict) -> dict:
    return api.create(f"/apis/wok.dev/v1alpha1/namespaces/{namespace}/inferenceservices", body)


def test_valid_inference_service_is_accepted(crd_installed, wok_apiserver, wok_namespace):
    with wok_apiserver.api() as api:
        tiny = _service("tiny", {"model": {"source": "builtin:tiny"}})
        created = _create(api, wok_namespace, tiny)
        assert created["spec"]["model"]["source"] == "builtin:tiny"
        fetched = api.get(
            f"/apis/wok.dev/v1alpha1/namespaces/{wok_namespace}/inferenceservices/tiny"
        )
        assert fetched["metadata"]["uid"] == created["metadata"]["uid"]


def test_cel_rule_rejects_inverted_batch_bounds(crd_installed, wok_apiserver, wok_namespace):
    spec = {
        "model": {"source": "builtin:tiny"},
        "batching": {"minBatchSize": 8, "maxBatchSize": 4},
    }
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("inverted", spec))
    assert rejected.value.status == 422
    assert "batching: minBatchSize <= initialBatchSize <= maxBatchSize must hold" in (
        rejected.value.message
    )


def test_schema_rejects_memory_utilization_above_one(crd_installed, wok_apiserver, wok_namespace):
    spec = {"model": {"source": "builtin:tiny"}, "memory": {"gpuMemoryUtilization": 1.5}}
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("greedy", spec))
    assert rejected.value.status == 422
    assert "spec.memory.gpuMemoryUtilization" in rejected.value.message
    assert "should be less than or equal to 0.98" in rejected.value.message
