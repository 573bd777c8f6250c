"""The operator against the real control plane: an InferenceService becomes running runtime pods,
updates reconcile in place, invalid specs are reported, and deletion removes everything."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from operator_harness import (
    ROOT,
    OperatorProcess,
    condition,
    get_json,
    install_crds,
    kubectl,
    wait_for,
)

from wok_cluster.binaries import kubectl_path

pytestmark = pytest.mark.e2e

MINIMAL = ROOT / "examples" / "minimal.yaml"
# Reconciling needs no metrics: a closed loopback port stands for an unreachable Prometheus.
NO_PROMETHEUS = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def crds(wok_cluster) -> Path:
    install_crds(wok_cluster.kubeconfig)
    return wok_cluster.kubeconfig


@pytest.fixture
def operator(
    crds, wok_cluster, wok_prometheus, wok_namespace, tmp_path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        crds,
        wok_namespace,
        NO_PROMETHEUS,
        tmp_path / "operator.log",
        run_marker=str(wok_cluster.run_dir),
    )
    process.wait_live()
    yield process
    assert process.stop() == 0, f"operator did not exit cleanly:\n{process.log_tail()}"


def owned_by(obj: dict, kind: str = "InferenceService") -> bool:
    return any(ref["kind"] == kind for ref in obj["metadata"].get("ownerReferences", []))


def runtime_pods(kubeconfig: Path, namespace: str, service: str) -> list[dict]:
    pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", f"wok.dev/service={service}")
    return [p for p in (pods or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def test_minimal_example_lifecycle(operator, crds, wok_namespace):
    kc, ns = crds, wok_namespace
    kubectl(kc, "apply", "-n", ns, "-f", str(MINIMAL))

    for kind, name in [
        ("deployment", "tiny-runtime"),
        ("service", "tiny-runtime"),
        ("secret", "tiny-admin"),
        ("configmap", "tiny-batching"),
        ("poddisruptionbudget", "tiny-runtime"),
    ]:
        obj = wait_for(lambda k=kind, n=name: get_json(kc, k, n, "-n", ns), f"{kind} {name}")
        assert owned_by(obj), f"{kind} {name} has no owner reference"

    pods = wait_for(
        lambda: [p for p in runtime_pods(kc, ns, "tiny") if ready(p)], "a ready runtime pod", 120
    )
    ip = pods[0]["status"]["podIP"]
    assert ip.startswith("127.")
    # The pod is a real runtime process: it completes a request on its pod IP.
    reply = httpx.post(
        f"http://{ip}:8000/v1/completions",
        timeout=30,
        json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4

    wis = wait_for(
        lambda: (
            (w := get_json(kc, "wis", "tiny", "-n", ns))
            and (condition(w, "Ready") or {}).get("status") == "True"
            and w
        ),
        "Ready=True",
        60,
    )
    assert wis["status"]["memory"]["maxBatchByMemory"] > 0
    assert wis["status"]["batchSize"] == 4
    table = kubectl(kc, "get", "wis", "-n", ns)
    header = table.splitlines()[0].split()
    assert header == ["NAME", "READY", "REPLICAS", "BATCH", "QUEUE", "P99", "AGE"]
    assert table.splitlines()[1].split()[:4] == ["tiny", "True", "1", "4"]

    # A spec change that needs no new pods keeps the pods.
    uids = {p["metadata"]["uid"] for p in runtime_pods(kc, ns, "tiny")}
    kubectl(
        kc,
        "patch",
        "wis",
        "tiny",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec": {"slo": {"ttftP99Seconds": 9}}}',
    )
    wait_for(
        lambda: (
            (get_json(kc, "wis", "tiny", "-n", ns) or {})["status"].get("observedGeneration") == 2
        ),
        "generation 2 reconciled",
    )
    assert {p["metadata"]["uid"] for p in runtime_pods(kc, ns, "tiny")} == uids

    kubectl(kc, "delete", "wis", "tiny", "-n", ns, "--wait=true", "--timeout=60s")
    for kind in ("deployment", "service", "secret", "configmap", "poddisruptionbudget"):
        wait_for(
            lambda k=kind: (
                not (get_json(kc, k, "-n", ns, "-l", "wok.dev/service=tiny") or {}).get("items")
            ),
            f"{kind} garbage-collected",
            60,
        )
    wait_for(lambda: not runtime_pods(kc, ns, "tiny"), "pods gone", 60)


def test_an_inference_service_on_simulated_gpus(operator, crds, wok_namespace):
    """`sim:llama-3-8b-80g`: the real runtime on the simulated accelerator (the profile's step
    times, no model), budgeted as the Llama-3-8B on an 80 GB GPU it stands for."""
    kc, ns = crds, wok_namespace
    doc = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "simulated"},
        "spec": {
            "model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b", "dtype": "bfloat16"},
            "runtime": {"gpuMemory": "80Gi", "cpu": "1", "memory": "512Mi", "simLoadSeconds": 3},
        },
    }
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
    pods = wait_for(
        lambda: [p for p in runtime_pods(kc, ns, "simulated") if ready(p)], "a ready sim pod", 120
    )
    ip = pods[0]["status"]["podIP"]
    reply = httpx.post(
        f"http://{ip}:8000/v1/completions",
        timeout=30,
        json={"model": "llama-3-8b-80g", "prompt": "hello", "max_tokens": 50, "ignore_eos": True},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 50
    wis = wait_for(
        lambda: (
            (w := get_json(kc, "wis", "simulated", "-n", ns))
            and (condition(w, "Ready") or {}).get("status") == "True"
            and w
        ),
        "Ready=True",
        60,
    )
    # Budgeted as the 8B on 80 GB: 221 sequences of 2,048 tokens, as `wok budget` says.
    assert wis["status"]["memory"]["maxBatchByMemory"] == 221
    assert wis["status"]["batchSize"] == 32
    kubectl(kc, "delete", "wis", "simulated", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(lambda: not runtime_pods(kc, ns, "simulated"), "pods gone", 60)


def test_a_model_that_cannot_fit_is_degraded_and_creates_nothing(operator, crds, wok_namespace):
    kc, ns = crds, wok_namespace
    doc = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "huge"},
        "spec": {"model": {"source": "builtin:smollm2-135m"}, "runtime": {"gpuMemory": "64Mi"}},
    }
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
    degraded = wait_for(
        lambda: (
            (c := condition(get_json(kc, "wis", "huge", "-n", ns), "Degraded"))
            and c["status"] == "True"
            and c
        ),
        "Degraded=True",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "does not fit" in degraded["message"] and "add GPUs or memory" in degraded["message"]
    assert get_json(kc, "deployment", "huge-runtime", "-n", ns) is None
    events = kubectl(kc, "get", "events", "-n", ns, "--field-selector", "involvedObject.name=huge")
    assert "InvalidSpec" in events


def test_schema_rejects_bad_specs_with_the_cel_message(crds, wok_namespace):
    doc = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "bad"},
        "spec": {"batching": {"minBatchSize": 8, "maxBatchSize": 4, "initialBatchSize": 4}},
    }
    result = subprocess.run(
        [kubectl_path(), f"--kubeconfig={crds}", "apply", "-n", wok_namespace, "-f", "-"],
        input=yaml.safe_dump(doc),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "minBatchSize <= initialBatchSize <= maxBatchSize must hold" in result.stderr
