"""wok beside KEDA: KEDA scales an InferenceService through its scale subresource
while wok moves its batch, and neither fights the other.

One InferenceService with `scaling.replicas: external` on simulated GPUs, the real operator, KEDA
from upstream with a ScaledObject on the InferenceService itself (the production-stack recipe:
`sum(vllm:num_requests_waiting)`, threshold 5), so kube-controller-manager's HPA writes the
service's spec.replicas and the operator carries it to the Deployment. An audited run:

1. a burst: wok's batch is at its cap (it rests there), the HPA scales the service 1 → 3;
2. quiet: the HPA scales it back down after its window;
3. a burst under a TPOT SLO that no batch meets: wok lowers the batch while the HPA scales up
   again on the longer queue that follows;
4. quiet again, for half a minute at rest (six HPA syncs): nobody writes anything.

The audit watches both objects from before they exist (a watch delivers every version, so no
write can hide between two polls) and names the writer of every change of spec.replicas: the field
manager owning `f:spec.f:replicas` in the object's managedFields after the change (the harness's
apiserver has no audit log; managedFields record the same manager name, operation and
subresource). Versions are ordered by resourceVersion, which is etcd's revision, one counter for
both objects, so "the service's replicas when the Deployment was written" is exact, not timed."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import yaml
from operator_harness import ROOT, OperatorProcess, install_crds, kubectl, wait_for
from replica_audit import Audit, Version
from test_keda import CLIENTS, MAX_REPLICAS, SCALE_DOWN_WINDOW_S, Load, _scaled_object
from test_operator_control import distinct, pod_batch_size, ready_ips

from wok_cluster.kubeapi import KubeError
from wok_operator.resources import FIELD_MANAGER

pytestmark = [pytest.mark.e2e, pytest.mark.slow(minutes=3)]  # started first

NAME = "loop"  # the service name test_operator_control's ready_ips knows
REST_S = 30  # at rest: six of the HPA's 5 s syncs and fifteen operator ticks write nothing
CAP = 4  # the batch's cap: 24 clients queue 20 on one pod at the cap, 12 on three
INITIAL_BATCH = 2
PING_PONG_S = 10  # a value written back within this long by another manager is a fight
PROPAGATE_S = 20  # the operator carries the service's count to the Deployment within this
HPA_MANAGER = "kube-controller-manager"  # the HPA controller runs in it (its user agent)
OPERATOR_MANAGERS = {FIELD_MANAGER, "wok-autoscaler"}  # the reconcile's apply, the tick's scale
SPEC = {
    "model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b", "dtype": "bfloat16"},
    # the real runtime on the simulated accelerator: ready in about a second, little CPU
    "runtime": {
        "gpuMemory": "80Gi",
        "cpu": "250m",
        "memory": "256Mi",
        "simLoadSeconds": 1,
        "drainSeconds": 1,
    },
    "memory": {"maxModelLen": 2048},
    # From 2 the batch goes to its cap in one step; η_B 1 on the way down
    "batching": {
        "minBatchSize": 1,
        "initialBatchSize": INITIAL_BATCH,
        "maxBatchSize": CAP,
        "step": 1,
    },
    "queue": {"maxLength": 512, "timeoutSeconds": 120},  # a long queue is KEDA's signal
    "replicas": 1,
    "scaling": {
        "replicas": "external",
        "targetQueuePerReplica": 2,
        "deadband": 0.5,
        "intervalSeconds": 2,
    },
    "slo": {"ttftP99Seconds": 600, "tpotP99Seconds": 5, "windowSeconds": 10},
}


def ping_pongs(changes: list[Version]) -> list[tuple[Version, Version, Version]]:
    """A → B → A where B was written back to A within PING_PONG_S by another manager."""
    return [
        (a, b, c)
        for a, b, c in zip(changes, changes[1:], changes[2:], strict=False)
        if a.replicas == c.replicas and c.t - b.t <= PING_PONG_S and b.writer != c.writer
    ]


def service_replicas_at(service: list[Version], rv: int) -> int | None:
    """The service's spec.replicas as of etcd revision `rv` (its last version before it)."""
    before = [v for v in service if v.rv < rv]
    return before[-1].replicas if before else None


def trail(changes: list[Version], t0: float) -> list[str]:
    return [f"{v.t - t0:+7.1f}s rv {v.rv} replicas={v.replicas} by {v.owners}" for v in changes]


def audit_report(
    service: Audit, deployment: Audit, t0: float, marks: dict[str, float], rescales: list[str]
) -> dict[str, Any]:
    """The figures and the trail (also after a failure, to see what happened), out/ for a run."""
    wis_changes, dep_changes = service.changes(), deployment.changes()
    report = {
        "command": "pytest e2e/test_keda_beside_wok.py",
        "phases_s": {name: round(t - t0, 1) for name, t in marks.items()},
        # the service's creation is the test's, the Deployment's the operator's
        "service_replica_writes": dict(Counter(v.writer for v in wis_changes[1:])),
        "deployment_replica_writes": dict(Counter(v.writer for v in dep_changes)),
        "service_replicas": [v.replicas for v in wis_changes],
        "deployment_replicas": [v.replicas for v in dep_changes],
        "batch_steps": distinct([v.batch for v in service.versions]),
        "hpa_rescales": rescales,
        "versions_seen": {"service": len(service.versions), "deployment": len(deployment.versions)},
        "watch_gaps": {"service": service.gaps, "deployment": deployment.gaps},
        "service_trail": trail(wis_changes, t0),
        "deployment_trail": trail(dep_changes, t0),
    }
    out = ROOT / "out" / "keda_beside_wok.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


# the cluster and KEDA may start for this test alone: about 2 minutes beside the 5 of the run
@pytest.mark.timeout(720)
def test_keda_scales_the_service_while_wok_moves_the_batch(
    wok_cluster, wok_prometheus, wok_keda, wok_namespace, tmp_path
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    wis_path = f"/apis/wok.dev/v1alpha1/namespaces/{ns}/inferenceservices"
    so_path = f"/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects"
    hpa_name = f"keda-hpa-{NAME}"
    hpa_path = f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{hpa_name}"
    install_crds(kc)
    service = Audit(wok_cluster, wis_path, NAME)
    deployment = Audit(wok_cluster, f"/apis/apps/v1/namespaces/{ns}/deployments", f"{NAME}-runtime")
    operator = OperatorProcess(
        kc, ns, wok_prometheus.url, tmp_path / "operator.log", run_marker=str(wok_cluster.run_dir)
    )
    loads: list[Load] = []
    marks: dict[str, float] = {}
    api = wok_cluster.api()
    try:
        operator.wait_live()
        doc = {
            "apiVersion": "wok.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": NAME},
            "spec": SPEC,
        }
        # create, not apply: no last-applied annotation claims spec.replicas for the test
        kubectl(kc, "create", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
        wait_for(lambda: len(ready_ips(kc, ns)) == 1, "the first runtime pod ready", 120)
        wait_for(lambda: service.latest() and service.latest().batch, "reconciled", 30)

        # KEDA's ScaledObject of test_keda (threshold 5, HPA sync 5 s, down after a 15 s
        # window, 1..3 replicas), aimed at the InferenceService's scale subresource.
        scaled_object = _scaled_object(ns, wok_prometheus.url)
        scaled_object["metadata"]["name"] = NAME
        scaled_object["spec"]["scaleTargetRef"] = {
            "apiVersion": "wok.dev/v1alpha1",
            "kind": "InferenceService",
            "name": NAME,
        }
        api.create(so_path, scaled_object)
        # KEDA's metric reaches the HPA before the run starts (0 waiting: 1 replica)
        wait_for(
            lambda: api.get(hpa_path).get("status", {}).get("currentMetrics"),
            "KEDA's HPA reading its metric",
            90,
        )
        t0 = time.monotonic()
        marks["start"] = t0

        def pods() -> list[str]:
            return ready_ips(kc, ns)

        def latest_replicas() -> tuple[int | None, int | None]:
            wis, dep = service.latest(), deployment.latest()
            return (wis.replicas if wis else None, dep.replicas if dep else None)

        def settled(replicas: int) -> bool:
            return latest_replicas() == (replicas, replicas) and len(pods()) == replicas

        # 1. A burst: wok's batch is at its cap (2 → 4 in one step once metrics flow); the
        # waiting queue that remains at the cap (20 on one pod) makes the HPA scale to 3.
        loads.append(Load(pods, CLIENTS, deadline_s=150))
        wait_for(
            lambda: any((v.batch or 0) > INITIAL_BATCH for v in service.since(t0)),
            "the batch at its cap",
            60,
        )
        wait_for(lambda: settled(MAX_REPLICAS), f"the HPA's {MAX_REPLICAS} pods ready", 120)
        # the pods KEDA added run at the batch wok decided
        wait_for(
            lambda: {pod_batch_size(ip) for ip in pods()} == {service.latest().batch},
            "every pod at wok's batch",
            30,
        )
        loads[-1].stop()
        marks["quiet"] = time.monotonic()

        # 2. Quiet: the HPA scales the service down after its window; the operator follows.
        wait_for(lambda: settled(1), "the HPA's scale-down to 1", SCALE_DOWN_WINDOW_S + 90)

        # 3. A TPOT SLO that no batch meets: wok lowers the batch at the cap (one step per SLO
        # window) while the longer queue that follows makes the HPA scale up again.
        slo = {"spec": {"slo": {"tpotP99Seconds": 0.0001}}}
        kubectl(kc, "patch", "wis", NAME, "-n", ns, "--type=merge", "-p", json.dumps(slo))
        breach = marks["breach"] = time.monotonic()
        loads.append(Load(pods, CLIENTS, deadline_s=150))
        wait_for(
            lambda: any((v.batch or CAP) < CAP for v in service.since(breach)),
            "the batch lowered on the TPOT breach",
            90,
        )
        wait_for(lambda: settled(MAX_REPLICAS), "the HPA's second scale-up", 120)
        loads[-1].stop()
        marks["quiet again"] = time.monotonic()

        # 4. Quiet: down again, then nothing moves.
        wait_for(lambda: settled(1), "the second scale-down", SCALE_DOWN_WINDOW_S + 90)
        rest = marks["rest"] = time.monotonic()
        # the rest's length, not a wait for a condition: what happens in it is asserted
        time.sleep(REST_S)
        marks["end"] = time.monotonic()
        decisions = operator.metrics()
    finally:
        for load in loads:
            load.stop()
        service.stop()
        deployment.stop()
        try:
            events = api.get(
                f"/api/v1/namespaces/{ns}/events",
                fieldSelector=f"involvedObject.name={hpa_name},reason=SuccessfulRescale",
            )["items"]
        except (KubeError, httpx.HTTPError):
            events = []  # the report is written all the same; the assertion below says so
        rescales = [e["message"] for e in events]
        report = audit_report(service, deployment, marks.get("start", 0.0), marks, rescales)
        try:
            api.delete(f"{so_path}/{NAME}")
        except KubeError as error:
            if error.status != 404:
                raise
        api.close()
        kubectl(kc, "delete", "wis", NAME, "-n", ns, "--wait=true", "--timeout=60s", check=False)
        stopped = operator.stop()
    assert stopped == 0, operator.log_tail()
    for load in loads:
        assert load.ok > 0 and not load.failures, load.failures[:5]
    assert service.gaps == 0 and deployment.gaps == 0, "the watch lost versions"
    assert rescales, "no SuccessfulRescale event from KEDA's HPA"

    print(json.dumps({k: v for k, v in report.items() if not k.endswith("_trail")}))
    why = json.dumps(report, indent=2)
    wis_changes, dep_changes = service.changes(), deployment.changes()
    batches = report["batch_steps"]

    # (1) The only writers of replicas: the HPA on the service (through its scale subresource)
    # and the operator on the Deployment. Nobody else: not KEDA's operator, not kopf.
    assert wis_changes[0].writer == "kubectl-create", why
    assert all(v.owners == ((HPA_MANAGER, "Update", "scale"),) for v in wis_changes[1:]), why
    assert set(report["deployment_replica_writes"]) <= OPERATOR_MANAGERS, why
    # The operator writes no count of its own: every Deployment value is the service's
    # spec.replicas at that revision, and each of the HPA's counts reaches the Deployment.
    for v in dep_changes:
        assert v.replicas == service_replicas_at(service.versions, v.rv), (v, why)
    for w in wis_changes:
        assert any(
            d.rv > w.rv and d.replicas == w.replicas and d.t - w.t <= PROPAGATE_S
            for d in deployment.versions
        ), (w, why)
    assert latest_replicas() == (1, 1), why
    # No ping-pong: no value written back within seconds by another manager, on either object.
    assert not ping_pongs(wis_changes) and not ping_pongs(dep_changes), why
    # At rest nothing writes replicas.
    assert not [v for v in wis_changes + dep_changes if v.t > rest], why
    assert 'knob="replicas"' not in "\n".join(
        line for line in decisions.splitlines() if line.startswith("wok_operator_decisions_total")
    )

    # (2) wok moved the batch: up to its cap in one step, down on the TPOT breach.
    assert batches[:2] == [INITIAL_BATCH, CAP], why
    assert any(b < CAP for b in batches[2:]), why

    # (3) KEDA's HPA scaled the service, up and down twice, on its metric: every count it wrote
    # is one of its SuccessfulRescale events.
    assert [v.replicas for v in wis_changes].count(MAX_REPLICAS) >= 2, why
    assert any("above target" in m for m in rescales), why
    sizes = {int(m) for m in re.findall(r"New size: (\d+)", " ".join(rescales))}
    assert {v.replicas for v in wis_changes[1:]} <= sizes, why
