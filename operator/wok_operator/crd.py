"""The CRD, generated from the pydantic models in `api.py` so the two can never drift.

Kubernetes wants a *structural* OpenAPI v3 schema: no `$ref`, no `anyOf` for optionals, a `type`
on every node, OpenAPI 3.0's boolean `exclusiveMinimum`. This module rewrites pydantic's JSON
Schema into that shape and wraps it in a CustomResourceDefinition.
"""

from __future__ import annotations

from typing import Any

import yaml

from wok_operator import api
from wok_operator.budget import PRESETS

# JSON Schema keywords that mean nothing to the apiserver (and would make the schema unstructural).
DROPPED_KEYS = {"title", "$defs"}

PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Batch", "type": "integer", "jsonPath": ".status.batchSize"},
    {"name": "Queue", "type": "number", "jsonPath": ".status.lastDecision.inputs.queuePerReplica"},
    {"name": "P99", "type": "number", "jsonPath": ".status.lastDecision.inputs.p99Seconds"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """pydantic JSON Schema → a Kubernetes structural schema, recursively."""
    if isinstance(node, list):
        return [structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        # `X | None` is how pydantic spells optional; in a CRD, optional is simply "not required".
        concrete = [option for option in any_of if option.get("type") != "null"]
        if len(concrete) != 1:
            raise ValueError(f"unions are not structural: {any_of}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]
        return structural({**concrete[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROPPED_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
            out.setdefault("type", "string")
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: structural(prop, defs) for name, prop in value.items()}
        elif key == "additionalProperties":
            # Unknown fields are pruned (and refused by kubectl's strict field validation).
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
        else:
            out[key] = structural(value, defs)
    if out.get("type") == "integer" and out.get("maximum", 0) > 2**31:
        out["format"] = "int64"
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    return out


def openapi_schema(model: type[api.ApiModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    return structural(schema, schema.get("$defs", {}))


def _bytes_are_int64(schema: dict[str, Any]) -> None:
    # Memory figures exceed 2^31; say so, or clients may decode them into int32.
    for prop in schema.get("properties", {}).values():
        if prop.get("type") == "integer":
            prop["format"] = "int64"


def inference_service_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(api.InferenceServiceSpec)
    # A preset the operator does not know is refused by `kubectl apply`. The presets live in
    # budget.py, which imports api.py, so their names join the schema here.
    spec_schema["properties"]["model"]["properties"]["preset"]["enum"] = list(PRESETS)
    status_schema = openapi_schema(api.InferenceServiceStatus)
    _bytes_are_int64(status_schema["properties"]["memory"])
    root = {
        "type": "object",
        "description": "A model served by wok runtime pods, batched and scaled by the operator.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "required": ["spec"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": ["wok"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        # kubectl scale, an HPA or a KEDA ScaledObject may own the replica count
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `wok crds` from wok_operator/api.py. Do not edit; run `make crds`.\n"
    return header + yaml.safe_dump(inference_service_crd(), sort_keys=False, width=100)
