"""The InferenceService CRD installs on a real apiserver; schema and CEL rules reject bad specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from wok_cluster.binaries import kubectl
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
    result = kubectl(wok_apiserver.kubeconfig, "apply", "--server-side", "-f", str(CRD))
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


def test_a_pod_of_several_gpus_is_accepted(crd_installed, wok_apiserver, wok_namespace):
    """Tensor parallelism: the CEL rule that held gpusPerPod at 1 is gone."""
    spec = {"model": {"source": "builtin:tiny"}, "runtime": {"gpusPerPod": 4}}
    with wok_apiserver.api() as api:
        created = _create(api, wok_namespace, _service("four-gpus", spec))
    assert created["spec"]["runtime"]["gpusPerPod"] == 4


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


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"source": "sim:h100", "preset": "gemma-2b"}, "spec.model.preset"),
        (
            {"source": "sim:h100", "architecture": {"modelType": "gemma"}},
            "spec.model.architecture.modelType",
        ),
    ],
)
def test_a_model_the_runtime_cannot_serve_is_refused_at_apply(
    crd_installed, wok_apiserver, wok_namespace, model, field
):
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("gemma", {"model": model}))
    assert rejected.value.status == 422
    assert field in rejected.value.message and '"gemma' in rejected.value.message


def test_schema_rejects_memory_utilization_above_one(crd_installed, wok_apiserver, wok_namespace):
    spec = {"model": {"source": "builtin:tiny"}, "memory": {"gpuMemoryUtilization": 1.5}}
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("greedy", spec))
    assert rejected.value.status == 422
    assert "spec.memory.gpuMemoryUtilization" in rejected.value.message
    assert "should be less than or equal to 0.98" in rejected.value.message


def test_kubectl_scale_moves_an_external_owners_replicas(
    crd_installed, wok_apiserver, wok_namespace
):
    spec = {"model": {"source": "builtin:tiny"}, "replicas": 1, "scaling": {"replicas": "external"}}
    with wok_apiserver.api() as api:
        _create(api, wok_namespace, _service("hpa-owned", spec))
        path = f"/apis/wok.dev/v1alpha1/namespaces/{wok_namespace}/inferenceservices/hpa-owned"
        # What an HPA or KEDA reads and writes: the scale subresource.
        scale = api.get(f"{path}/scale")
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
        scaled = kubectl(
            wok_apiserver.kubeconfig, "scale", "wis/hpa-owned", "-n", wok_namespace, "--replicas=3"
        )
        assert scaled.returncode == 0, scaled.stderr
        assert api.get(path)["spec"]["replicas"] == 3


def test_kubectl_scale_is_refused_while_wok_owns_the_replicas(
    crd_installed, wok_apiserver, wok_namespace
):
    with wok_apiserver.api() as api:
        _create(api, wok_namespace, _service("wok-owned", {"model": {"source": "builtin:tiny"}}))
    scaled = kubectl(
        wok_apiserver.kubeconfig, "scale", "wis/wok-owned", "-n", wok_namespace, "--replicas=3"
    )
    assert scaled.returncode != 0
    assert "set scaling.replicas: external to hand it over" in scaled.stderr, scaled.stderr
    # Both owners in one spec are refused at create, with the same message.
    both = {"model": {"source": "builtin:tiny"}, "replicas": 2}
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("two-owners", both))
    assert rejected.value.status == 422
    assert "one owner at a time" in rejected.value.message


VLLM_TINY = {
    "engine": "vllm",
    "model": {"source": "builtin:tiny", "dtype": "float32"},
    "runtime": {"gpuMemory": "256Mi"},
    "memory": {"maxModelLen": 512, "reserve": "16Mi"},
    "batching": {"maxBatchSize": 32},
}


def test_a_vllm_service_is_accepted_with_its_defaults(crd_installed, wok_apiserver, wok_namespace):
    """Defaults the apiserver fills in (queue timeout, aging, priority classes, batch wait) are
    not taken for fields a vLLM spec set."""
    spec = {**VLLM_TINY, "batching": {"maxBatchSize": 32, "applyToEngine": "restart"}}
    with wok_apiserver.api() as api:
        created = _create(api, wok_namespace, _service("on-vllm", {**spec, "vllm": {}}))
    assert created["spec"]["engine"] == "vllm"
    assert created["spec"]["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert created["spec"]["batching"]["applyToEngine"] == "restart"


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("static", {"batching": {"mode": "static", "maxNumBatchedTokens": 4096}}, "continuously"),
        (
            "sim",
            {"model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b"}},
            "a sim: source runs on wok's runtime only",
        ),
        ("lane", {"batchLane": {"completeWithinSeconds": 60}}, "has no batch lane"),
        ("tokens", {"batching": {"maxBatchSize": 512, "maxNumBatchedTokens": 256}}, "at least"),
        ("timeout", {"queue": {"timeoutSeconds": 5}}, "has no queue timeout"),
        ("whole-timeout", {"queue": {"timeoutSeconds": 31}}, "has no queue timeout"),
        ("classes", {"queue": {"priorityClasses": [{"name": "a", "priority": 0}]}}, "priority"),
    ],
)
def test_cel_refuses_what_vllm_has_not(
    crd_installed, wok_apiserver, wok_namespace, name, overrides, message
):
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service(f"vllm-{name}", {**VLLM_TINY, **overrides}))
    assert rejected.value.status == 422
    assert message in rejected.value.message, rejected.value.message


@pytest.mark.parametrize(
    "overrides", [{"vllm": {}}, {"batching": {"applyToEngine": "restart"}}], ids=["vllm", "restart"]
)
def test_cel_refuses_vllm_fields_on_wok(crd_installed, wok_apiserver, wok_namespace, overrides):
    spec = {"model": {"source": "builtin:tiny"}, **overrides}
    with wok_apiserver.api() as api, pytest.raises(KubeError) as rejected:
        _create(api, wok_namespace, _service("wok-with-vllm", spec))
    assert rejected.value.status == 422
    assert "apply to engine: vllm only" in rejected.value.message
