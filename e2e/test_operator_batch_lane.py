"""The batch lane end to end: the Job of examples/batch-job.yaml runs `wok batch run`
with a 200-line file against a runtime pod while online clients send a burst. Without the
deadline opt-in the operator shows the backlog in status and adds no replica for it; patched
with `spec.batchLane.completeWithinSeconds`, it adds one, saying why; the Job completes with
every line answered once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import OperatorProcess, condition, get_json, install_crds, kubectl, wait_for
from test_operator_control import Load, ready_ips

# started first; its pods decode a 200-line batch on the CPU, so it never runs
# beside the other module that loads runtime pods for minutes (docs/testing.md)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow(minutes=1.5),
    pytest.mark.xdist_group("runtime-load"),
]

ROOT = Path(__file__).resolve().parents[1]
NAME = "loop"  # the service name the control test's helpers (ready_ips) know
LINES = 200
SPEC = {
    "model": {"source": "builtin:tiny", "dtype": "float32"},
    "runtime": {"gpuMemory": "256Mi", "cpu": "1", "memory": "1Gi", "drainSeconds": 5},
    "memory": {"maxModelLen": 512, "reserve": "16Mi"},
    "batching": {"initialBatchSize": 6, "maxBatchSize": 6, "batchLaneMaxBatchSize": 16},
    "queue": {"maxLength": 512, "timeoutSeconds": 300},
    "scaling": {
        "minReplicas": 1,
        "maxReplicas": 2,
        "scaleUpStabilizationSeconds": 2,
        "scaleDownStabilizationSeconds": 600,  # nothing comes down within the test
        "podStartSeconds": 5,
        "intervalSeconds": 1,
    },
    # Far-off latency SLOs: the online burst alone must not ask for a pod.
    "slo": {"ttftP99Seconds": 600, "tpotP99Seconds": 5, "windowSeconds": 10},
}


def input_file() -> str:
    line = {
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "tiny", "prompt": "wok " * 8, "max_tokens": 128, "ignore_eos": True},
    }
    return "".join(json.dumps({"custom_id": f"q-{i}", **line}) + "\n" for i in range(LINES))


def batch_job(url: str) -> dict[str, Any]:
    """The example's Job, as the emulated cluster can run it: a backed pod (a local process),
    the input from a ConfigMap and the output on an emptyDir (no storage provisioner here), and
    a pod's address for the Service's (no cluster DNS or ClusterIP routing)."""
    docs = list(yaml.safe_load_all((ROOT / "examples" / "batch-job.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]
    pod["metadata"]["labels"]["wok.dev/backed"] = "true"
    container = pod["spec"]["containers"][0]
    values = {"--input": "/input/input.jsonl", "--url": url}
    args = []
    for arg in container["args"]:
        flag = arg.partition("=")[0]
        args.append(f"{flag}={values[flag]}" if flag in values else arg)
    container["args"] = [*args, "--json"]
    container["volumeMounts"].append({"name": "input", "mountPath": "/input"})
    pod["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}},
        {"name": "input", "configMap": {"name": "batch-input"}},
    ]
    return job


def status(kc: Path, ns: str) -> dict[str, Any]:
    return (get_json(kc, "wis", NAME, "-n", ns) or {}).get("status", {})


@pytest.mark.timeout(300)
def test_a_batch_job_drains_beside_online_traffic_and_scales_only_on_its_deadline(
    wok_cluster, wok_prometheus, wok_namespace, tmp_path
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    install_crds(kc)
    operator = OperatorProcess(
        kc, ns, wok_prometheus.url, tmp_path / "operator.log", run_marker=str(wok_cluster.run_dir)
    )
    operator.wait_live()
    doc = {"apiVersion": "wok.dev/v1alpha1", "kind": "InferenceService"}
    doc |= {"metadata": {"name": NAME}, "spec": SPEC}
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
    load = None
    try:
        ip = wait_for(lambda: (ready_ips(kc, ns) or [None])[0], "runtime pod ready", 120)
        wait_for(
            lambda: (
                (condition({"status": status(kc, ns)}, "MetricsUnavailable") or {}).get("status")
                == "False"
            ),
            "metrics flowing",
            60,
        )
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "batch-input"},
            "data": {"input.jsonl": input_file()},
        }
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(configmap))
        job = batch_job(f"http://{ip}:8000")
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(job))
        job_name = job["metadata"]["name"]
        load = Load(lambda: ready_ips(kc, ns), workers=3, max_tokens=32, deadline_s=60)

        # 1. No opt-in: the backlog and its drain rate show in status, and no replica is added
        # for it, however long it would take; the SLO condition stays clear.
        def measured() -> dict[str, Any] | None:
            lane = status(kc, ns).get("batchLane") or {}
            busy = (lane.get("requests") or 0) > 0 and (lane.get("tokensPerSecond") or 0) > 0
            return lane if busy and lane.get("estimatedSeconds") is not None else None

        lane = wait_for(measured, "the batch lane's backlog in status", 90)
        assert lane.get("neededReplicas") is None and lane.get("estimatedCompletionTime")
        watched_until = time.monotonic() + 10
        while time.monotonic() < watched_until:
            current = status(kc, ns)
            assert current["replicas"] == 1, current["lastDecision"]["reason"]
            assert "batch lane" not in current["lastDecision"]["reason"]
            time.sleep(1)
        wis = get_json(kc, "wis", NAME, "-n", ns)
        assert condition(wis, "SLOBreached")["status"] == "False", condition(wis, "SLOBreached")
        assert (status(kc, ns).get("batchLane") or {}).get("requests"), "the backlog ran out"
        load.stop()
        assert load.ok > 0 and not load.failures, load.failures[:5]

        # 2. A deadline the backlog cannot meet on one pod: the loop adds a replica for it.
        patch = {"spec": {"batchLane": {"completeWithinSeconds": 2}}}
        kubectl(kc, "patch", "wis", NAME, "-n", ns, "--type=merge", "-p", json.dumps(patch))
        scaled = wait_for(
            lambda: (s := status(kc, ns)).get("replicas") == 2 and s, "scale-up for the batch", 60
        )

        # The decision that scaled is its ReplicasChanged Event: a later tick may already have
        # replaced lastDecision with a hold while the new pod starts.
        def scale_up_event() -> str | None:
            events = get_json(
                kc, "events", "-n", ns, f"--field-selector=involvedObject.name={NAME}"
            )["items"]
            messages = [e["message"] for e in events if e["reason"] == "ReplicasChanged"]
            return next((m for m in messages if "replicas 1→2" in m), None)

        reason = wait_for(scale_up_event, "the scale-up's Event", 30)
        assert "replicas 1→2 for the batch lane" in reason, reason
        assert scaled["batchLane"]["neededReplicas"] >= 2
        deployment = get_json(kc, "deployment", f"{NAME}-runtime", "-n", ns)
        assert deployment["spec"]["replicas"] == 2

        # 3. The Job completes: every line answered exactly once.
        wait_for(
            lambda: (
                (get_json(kc, "job", job_name, "-n", ns) or {}).get("status", {}).get("succeeded")
            ),
            "the batch Job completed",
            150,
        )
        pods = get_json(kc, "pods", "-n", ns, "-l", f"job-name={job_name}")["items"]
        done = [p for p in pods if p["status"].get("phase") == "Succeeded"]
        assert len(done) == 1, [p["status"].get("phase") for p in pods]
        meta = done[0]["metadata"]
        pod_dir = wok_cluster.backer_dir / "pods" / f"{ns}_{meta['name']}_{meta['uid'][:8]}"
        results = [
            json.loads(line)
            for line in (pod_dir / "volumes" / "data" / "output.jsonl").read_text().splitlines()
        ]
        assert sorted(r["custom_id"] for r in results) == sorted(f"q-{i}" for i in range(LINES))
        assert {r["response"]["status_code"] for r in results} == {200}
    finally:
        if load is not None:
            load.stop()
        kubectl(kc, "delete", "wis", NAME, "-n", ns, "--wait=true")
        assert operator.stop() == 0, operator.log_tail()
