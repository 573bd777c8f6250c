"""The InferenceService API and its generated CRD: valid and invalid specs, and no drift."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from wok_operator import api, budget
from wok_operator.crd import inference_service_crd, render_crd_yaml
from wok_runtime.core.model_config import MODEL_TYPES

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "wok.dev_inferenceservices.yaml"
ARCH = {
    "numHiddenLayers": 2,
    "hiddenSize": 64,
    "intermediateSize": 128,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 2,
    "vocabSize": 512,
}


def test_a_two_line_spec_gets_safe_defaults():
    spec = api.InferenceServiceSpec.model_validate({"model": {"source": "builtin:tiny"}})
    assert spec.batching.min_batch_size <= spec.batching.initial_batch_size
    assert spec.batching.initial_batch_size <= spec.batching.max_batch_size
    assert 0 < spec.memory.gpu_memory_utilization <= 0.98
    assert spec.scaling.min_replicas >= 1
    assert [c.name for c in spec.queue.priority_classes] == ["interactive", "standard", "batch"]


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path):
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == api.KIND:
            api.InferenceService.model_validate(document)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"batching": {"minBatchSize": 8, "maxBatchSize": 4}}, "minBatchSize <= initialBatchSize"),
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
        ({"memory": {"gpuMemoryUtilization": 1.5}}, "less than or equal to 0.98"),
        ({"memory": {"gpuMemoryUtilization": 0}}, "greater than 0"),
        ({"model": {"source": "s3://bucket/model"}}, "String should match pattern"),
        ({"model": {"source": "/models/llama", "preset": "llama-3-8b"}}, "needs model.volume"),
        ({"model": {"source": "/models/llama", "volume": {"claimName": "m"}}}, "model.preset"),
        ({"batching": {"mode": "static", "maxNumBatchedTokens": 512}}, "cannot chunk"),
        ({"runtime": {"gpuMemory": "lots"}}, "String should match pattern"),
        ({"runtime": {"gpuMemory": "80"}}, "String should match pattern"),
        ({"runtime": {"gpuMemory": "80000m"}}, "String should match pattern"),
        ({"batching": {"maxBatchSize": 64, "typo": 1}}, "Extra inputs are not permitted"),
        ({"queue": {"priorityClasses": [{"name": "a", "priority": 0}] * 2}}, "must be unique"),
        ({"replicas": 3}, "one owner at a time"),
        ({"model": {"source": "sim:llama-3-8b-80g"}}, "a path or sim: source needs model.preset"),
        ({"runtime": {"simLoadSeconds": 5}}, "applies to sim: sources only"),
        ({"scaling": {"replicas": "external"}}, "needs spec.replicas"),
        ({"scaling": {"replicas": "keda"}}, "Input should be 'wok' or 'external'"),
        ({"model": {"architecture": {**ARCH, "modelType": "gemma"}}}, "'llama', 'mistral'"),
    ],
)
def test_invalid_specs_are_rejected_with_a_readable_message(spec, message):
    with pytest.raises(ValidationError, match=message):
        api.InferenceServiceSpec.model_validate(spec)


def test_committed_crd_matches_the_models():
    assert CRD_PATH.read_text() == render_crd_yaml(), "CRD drift: run `make crds`"


def walk(schema: dict, path: str = ""):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")


def test_crd_schema_is_structural():
    root = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(root):
        assert "type" in node, f"{path} has no type"
        for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "additionalProperties", "title"):
            assert forbidden not in node, f"{path} has {forbidden}"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node


def test_every_status_field_is_declared_so_none_is_pruned():
    status = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["status"]
    example = api.InferenceServiceStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllReplicasReady",
                    "lastTransitionTime": "2026-11-29T00:00:00Z",
                    "observedGeneration": 3,
                }
            ],
            "replicas": 2,
            "readyReplicas": 2,
            "batchSize": 16,
            "memory": {
                "weightsBytes": 1,
                "activationBytes": 2,
                "kvCacheBytes": 3,
                "reserveBytes": 4,
                "kvBytesPerToken": 5,
                "maxBatchByMemory": 6,
            },
            "lastDecision": {
                "time": "2026-11-29T00:00:00Z",
                "inputs": {
                    "queuePerReplica": 1.0,
                    "p99Seconds": 0.5,
                    "kvUsage": 0.3,
                    "readyReplicas": 2,
                    "pendingReplicas": 0,
                    "batchLaneRequests": 40,
                    "batchLanePendingTokens": 1000,
                    "batchLaneReplicas": 4,
                },
                "batch": {"from": 8, "to": 12},
                "replicas": {"from": 2, "to": 2},
                "reason": "batch 8→12",
            },
            "batchLane": {
                "requests": 40,
                "pendingTokens": 1000,
                "tokensPerSecond": 10.0,
                "estimatedSeconds": 100.0,
                "estimatedCompletionTime": "2026-11-29T00:01:40Z",
                "completeWithinSeconds": 50.0,
                "neededReplicas": 4,
            },
        }
    ).model_dump(by_alias=True, exclude_none=True)

    def declared(value: object, schema: dict, path: str) -> None:
        if isinstance(value, dict):
            if schema.get("x-kubernetes-preserve-unknown-fields"):
                return
            for key, item in value.items():
                assert key in schema.get("properties", {}), f"status{path}.{key} would be pruned"
                declared(item, schema["properties"][key], f"{path}.{key}")
        elif isinstance(value, list):
            for item in value:
                declared(item, schema["items"], f"{path}[]")

    declared(example, status, "")
    assert status["properties"]["memory"]["properties"]["weightsBytes"]["format"] == "int64"


def test_cel_rules_have_messages_and_match_the_python_checks():
    spec = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]
    rules = spec["x-kubernetes-validations"]
    assert len(rules) >= 4
    for rule in rules:
        assert rule["rule"] and rule["message"]
    assert any("minBatchSize <= initialBatchSize" in r["message"] for r in rules)


def test_the_scale_subresource_lets_an_hpa_or_keda_own_the_replicas():
    version = inference_service_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    external = api.InferenceServiceSpec.model_validate(
        {"replicas": 0, "scaling": {"replicas": "external"}}
    )
    assert external.replicas == 0


def test_printer_columns():
    columns = inference_service_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == ["Ready", "Replicas", "Batch", "Queue", "P99", "Age"]


def test_the_crd_refuses_a_model_the_runtime_cannot_serve():
    """`kubectl apply` refuses a family or a preset the runtime has no answer for (the
    apiserver checks the enums), before any pod is made."""
    model = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    model = model["properties"]["spec"]["properties"]["model"]["properties"]
    assert model["preset"]["enum"] == list(budget.PRESETS)
    families = model["architecture"]["properties"]["modelType"]["enum"]
    assert tuple(families) == MODEL_TYPES  # the operator's list is the runtime's
    assert {budget.preset(name).model_type for name in budget.PRESETS} <= set(families)
