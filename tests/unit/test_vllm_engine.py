"""engine: vllm: the Deployment of vLLM's server the spec implies, and the specs refused for it."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from wok_operator import api
from wok_operator.budget import plan_for_spec
from wok_operator.resources import desired_deployment
from wok_operator.vllm_pod import (
    PRESTOP_SECONDS,
    TEARDOWN_SECONDS,
    engine_batch_size,
    spec_batch_cap,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm-tiny.yaml"


def vllm_spec(**overrides: object) -> api.InferenceServiceSpec:
    base = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return api.InferenceServiceSpec.model_validate({**base, **overrides})


def pod_of(spec: api.InferenceServiceSpec, batch: int = 4) -> dict:
    plan = plan_for_spec(spec)
    deployment = desired_deployment(
        "svc", "ns", spec, budget=plan, replicas=2, engine_batch=engine_batch_size(spec, batch)
    )
    assert deployment["spec"]["replicas"] == 2
    return deployment["spec"]["template"]["spec"]


def flags(container: dict) -> dict[str, str]:
    return dict(arg.removeprefix("--").partition("=")[::2] for arg in container["args"][1:])


def test_the_vllm_pod_runs_vllm_serve_with_the_settings_the_spec_implies():
    spec = vllm_spec()
    pod = pod_of(spec)
    (container,) = pod["containers"]
    assert container["image"] == api.VLLM_IMAGE
    assert container["command"] == ["vllm", "serve"]
    assert container["args"][0] == "/models/tiny"
    cap = min(spec.batching.max_batch_size, plan_for_spec(spec).max_batch_size)
    assert flags(container) == {
        "served-model-name": "tiny",
        "host": "0.0.0.0",
        "port": "8000",
        "max-num-seqs": str(cap),
        "max-num-batched-tokens": "2048",
        "max-num-queued-reqs": str(cap + spec.queue.max_length),
        "max-model-len": "512",
        "gpu-memory-utilization": "0.9",
        "tensor-parallel-size": "1",
        "dtype": "float32",
        "enable-prefix-caching": "",
        "shutdown-timeout": "30",
    }
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_cap_is_min_of_b_max_and_b_mem_and_the_law_batch_only_with_restart():
    roomy = vllm_spec(batching={"maxBatchSize": 32})
    assert spec_batch_cap(roomy) == 32 < plan_for_spec(roomy).max_batch_size
    tight = vllm_spec(batching={"maxBatchSize": 512, "maxNumBatchedTokens": 2048})
    assert spec_batch_cap(tight) == plan_for_spec(tight).max_batch_size < 512
    # `never` ignores the law's batch: the pods keep the spec's cap (no roll when it moves).
    assert engine_batch_size(roomy, 7) == 32
    restart = vllm_spec(batching={"maxBatchSize": 32, "applyToEngine": "restart"})
    assert engine_batch_size(restart, 7) == 7
    (container,) = pod_of(restart, batch=7)["containers"]
    assert flags(container)["max-num-seqs"] == "7"


def test_probes_drain_and_grace_follow_vllms_shutdown():
    spec = vllm_spec(runtime={"gpuMemory": "256Mi", "drainSeconds": 40})
    pod = pod_of(spec)
    (container,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_SECONDS)]
    assert flags(container)["shutdown-timeout"] == "40"
    assert pod["terminationGracePeriodSeconds"] == PRESTOP_SECONDS + 40 + TEARDOWN_SECONDS


def test_a_builtin_model_is_exported_by_the_runtime_image_before_vllm_starts():
    pod = pod_of(vllm_spec())
    (init,) = pod["initContainers"]
    assert init["command"] == ["wok"]
    assert init["args"] == ["model", "export", "builtin:tiny", "/models/tiny"]
    assert init["image"] == api.RuntimeSpec().image
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"] == {"name": "model", "emptyDir": {}}


def test_a_volume_model_is_mounted_and_served_from_its_path_without_an_export():
    spec = vllm_spec(
        model={
            "source": "/models/llama",
            "preset": "llama-3-8b",
            "volume": {"claimName": "weights"},
        },
        runtime={"gpuMemory": "80Gi", "gpusPerPod": 2},
        batching={"maxBatchSize": 64},
        vllm={"image": "registry.local/vllm:pinned", "enablePrefixCaching": False},
    )
    pod = pod_of(spec)
    assert "initContainers" not in pod
    (container,) = pod["containers"]
    assert container["image"] == "registry.local/vllm:pinned"
    assert container["args"][0] == "/models/llama"
    assert flags(container)["tensor-parallel-size"] == "2"
    assert "no-enable-prefix-caching" in flags(container)
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims[0]["persistentVolumeClaim"]["claimName"] == "weights"


def test_a_vllm_deployment_needs_its_batch():
    spec = vllm_spec()
    with pytest.raises(ValueError, match="--max-num-seqs"):
        desired_deployment("svc", "ns", spec, budget=plan_for_spec(spec), replicas=1)


def test_a_wok_pod_is_unchanged_by_the_engine_field():
    spec = api.InferenceServiceSpec.model_validate({"runtime": {"gpuMemory": "1Gi"}})
    assert spec.engine == "wok"
    pod = desired_deployment("svc", "ns", spec, budget=plan_for_spec(spec), replicas=1)
    assert pod["spec"]["template"]["spec"]["containers"][0]["command"] == ["wok"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batching": {"mode": "static", "maxNumBatchedTokens": 4096}}, "continuously only"),
        (
            {"model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b"}},
            "a sim: source runs on wok's runtime only",
        ),
        ({"batching": {"batchLaneMaxBatchSize": 8}}, "has no batch lane"),
        ({"batchLane": {"completeWithinSeconds": 60}}, "has no batch lane"),
        ({"batching": {"maxBatchSize": 512, "maxNumBatchedTokens": 256}}, "at least"),
        ({"queue": {"timeoutSeconds": 5}}, "no queue timeout"),
        ({"queue": {"agingSeconds": 1}}, "no queue timeout"),
        ({"batching": {"maxWaitMs": 50}}, "no queue timeout"),
        ({"queue": {"priorityClasses": [{"name": "gold", "priority": 0}]}}, "priority classes"),
    ],
)
def test_fields_only_wok_has_are_refused_for_vllm(overrides, message):
    with pytest.raises(ValidationError, match=message):
        vllm_spec(**overrides)


@pytest.mark.parametrize(
    "spec", [{"vllm": {}}, {"batching": {"applyToEngine": "restart"}}], ids=["vllm", "restart"]
)
def test_vllm_only_fields_are_refused_for_wok(spec):
    with pytest.raises(ValidationError, match="apply to engine: vllm only"):
        api.InferenceServiceSpec.model_validate(spec)


def test_the_crd_carries_the_same_rules_as_cel():
    from wok_operator.crd import inference_service_crd

    root = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = {r["message"] for r in root["properties"]["spec"]["x-kubernetes-validations"]}
    assert {r["message"] for r in api.vllm_rules()} <= rules
    assert root["properties"]["spec"]["properties"]["engine"]["enum"] == ["wok", "vllm"]
    assert "engineBatchSize" in root["properties"]["status"]["properties"]
