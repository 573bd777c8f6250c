"""The control loop end to end: real runtime pods under real load, scraped by a real Prometheus,
moved by the real operator. A burst raises the batch first and replicas once the batch is at its
cap; a quiet period lowers them only after the window; an SLO breach lowers the batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml
from operator_harness import OperatorProcess, condition, get_json, install_crds, kubectl, wait_for

pytestmark = pytest.mark.e2e

SPEC = {
    "model": {"source": "builtin:tiny", "dtype": "float32"},
    "runtime": {"gpuMemory": "256Mi", "cpu": "1", "memory": "1Gi", "drainSeconds": 5},
    "memory": {"maxModelLen": 512, "reserve": "16Mi"},
    "batching": {"minBatchSize": 1, "initialBatchSize": 2, "maxBatchSize": 6, "step": 2},
    "queue": {"maxLength": 512, "timeoutSeconds": 300},
    "scaling": {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetQueuePerReplica": 2,
        "deadband": 0.5,
        "scaleUpStabilizationSeconds": 2,
        "scaleDownStabilizationSeconds": 20,
        "intervalSeconds": 2,
    },
    "slo": {"p99LatencySeconds": 600, "windowSeconds": 10},
}


@dataclass(frozen=True)
class Sample:
    t: float
    batch: int | None
    replicas: int | None
    mem_cap: int | None
    reason: str


class StatusRecorder:
    """Polls the InferenceService's status in the background: the loop's timeline."""

    def __init__(self, api, namespace: str, name: str) -> None:
        self.api, self.path = (
            api,
            f"/apis/wok.dev/v1alpha1/namespaces/{namespace}/inferenceservices/{name}",
        )
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                status = self.api.get(self.path).get("status", {})
            except Exception:
                continue
            self.samples.append(
                Sample(
                    time.monotonic(),
                    status.get("batchSize"),
                    status.get("replicas"),
                    status.get("memory", {}).get("maxBatchByMemory"),
                    status.get("lastDecision", {}).get("reason", ""),
                )
            )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def first(self, predicate) -> Sample | None:
        return next((s for s in self.samples if predicate(s)), None)


class Load:
    """`workers` clients sending long completions to the ready pods until stopped (bounded)."""

    def __init__(self, pod_ips, workers: int, max_tokens: int, deadline_s: float = 120) -> None:
        self.pod_ips, self.max_tokens = pod_ips, max_tokens
        self.deadline = time.monotonic() + deadline_s
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, worker: int) -> None:
        with httpx.Client(timeout=300) as client:
            n = worker
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                ips = self.pod_ips()
                if not ips:
                    time.sleep(0.2)
                    continue
                n += 1
                try:
                    response = client.post(
                        f"http://{ips[n % len(ips)]}:8000/v1/completions",
                        json={
                            "model": "tiny",
                            "prompt": "wok " * 8,
                            "max_tokens": self.max_tokens,
                            "temperature": 0,
                            "ignore_eos": True,
                        },
                    )
                    if response.status_code == 200:
                        self.ok += 1
                    else:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))

    def stop(self) -> None:
        self.stopped_at = time.monotonic()  # no request is sent after this
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)


@pytest.fixture
def service(wok_cluster, wok_prometheus, wok_namespace, tmp_path) -> Iterator[tuple]:
    kc = wok_cluster.kubeconfig
    install_crds(kc)
    operator = OperatorProcess(
        kc,
        wok_namespace,
        wok_prometheus.url,
        tmp_path / "operator.log",
        run_marker=str(wok_cluster.run_dir),
    )
    operator.wait_live()
    doc = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "loop"},
        "spec": SPEC,
    }
    kubectl(kc, "apply", "-n", wok_namespace, "-f", "-", stdin=yaml.safe_dump(doc))
    with wok_cluster.api() as api:
        recorder = StatusRecorder(api, wok_namespace, "loop")
        try:
            yield kc, wok_namespace, operator, recorder
        finally:
            recorder.stop()
            kubectl(kc, "delete", "wis", "loop", "-n", wok_namespace, "--wait=true")
            assert operator.stop() == 0, operator.log_tail()


def ready_ips(kc, ns: str) -> list[str]:
    pods = get_json(kc, "pods", "-n", ns, "-l", "wok.dev/service=loop") or {"items": []}
    return [
        p["status"]["podIP"]
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    ]


def test_burst_then_quiet_then_slo_breach(service):
    kc, ns, operator, recorder = service
    wait_for(lambda: ready_ips(kc, ns), "first runtime pod ready", 120)
    wait_for(
        lambda: (
            (condition(get_json(kc, "wis", "loop", "-n", ns), "MetricsUnavailable") or {}).get(
                "status"
            )
            == "False"
        ),
        "metrics flowing",
        60,
    )

    # 1. A burst: the batch rises to its cap first, then a replica is added.
    load = Load(lambda: ready_ips(kc, ns), workers=20, max_tokens=300)
    try:
        wait_for(lambda: recorder.first(lambda s: s.replicas == 2), "scale-up to 2 replicas", 90)
        wait_for(lambda: len(ready_ips(kc, ns)) == 2, "second pod ready", 120)
    finally:
        load.stop()
    load_stopped = load.stopped_at
    first_batch_up = recorder.first(lambda s: (s.batch or 0) > 2)
    at_cap = recorder.first(lambda s: s.batch == 6)
    scaled = recorder.first(lambda s: s.replicas == 2)
    assert first_batch_up and at_cap and scaled
    assert first_batch_up.t <= at_cap.t <= scaled.t, "replicas moved before the batch hit its cap"
    assert "batch" in first_batch_up.reason and "queue" in first_batch_up.reason
    assert load.ok > 0 and not load.failures, load.failures[:5]
    # Every pod, the new one too, runs at the decided batch size (new pods read it at start).
    for ip in ready_ips(kc, ns):
        metrics = httpx.get(f"http://{ip}:8000/metrics", timeout=10).text
        assert any(
            line.startswith("wok_max_batch_size") and line.endswith(" 6.0")
            for line in metrics.splitlines()
        ), ip

    # 2. Quiet: nothing moves down before the scale-down window has passed.
    wait_for(
        lambda: recorder.first(lambda s: s.t > load_stopped and s.replicas == 1),
        "scale-down to 1 replica",
        120,
    )
    first_down = recorder.first(
        lambda s: s.t > load_stopped and ((s.replicas or 2) < 2 or (s.batch or 6) < 6)
    )
    assert first_down is not None and first_down.t - load_stopped >= 19, first_down
    assert "short" in first_down.reason

    # 3. An SLO breach lowers the batch (the service time itself is over the objective); a long
    # scale-down window rules out the short-queue rule as the cause.
    wait_for(lambda: len(ready_ips(kc, ns)) == 1, "back to one pod", 60)
    batch_before = recorder.samples[-1].batch
    kubectl(
        kc,
        "patch",
        "wis",
        "loop",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec": {"slo": {"p99LatencySeconds": 0.05},'
        ' "scaling": {"scaleDownStabilizationSeconds": 3600}}}',
    )
    breach_from = time.monotonic()
    load = Load(lambda: ready_ips(kc, ns), workers=2, max_tokens=64)
    try:
        lowered = wait_for(
            lambda: recorder.first(lambda s: s.t > breach_from and (s.batch or 99) < batch_before),
            "batch lowered on SLO breach",
            90,
        )
    finally:
        load.stop()
    assert "SLO" in lowered.reason or "P99" in lowered.reason
    wis = get_json(kc, "wis", "loop", "-n", ns)
    assert condition(wis, "SLOBreached")["status"] == "True"

    # Throughout: never above the memory cap; every step explained in an Event.
    assert all(s.batch is None or s.batch <= min(6, s.mem_cap or 6) for s in recorder.samples)
    events = kubectl(
        kc,
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "involvedObject.name=loop",
        "-o",
        "custom-columns=R:.reason,M:.message",
    )
    assert "BatchChanged" in events and "ReplicasChanged" in events
    decisions = operator.metrics()
    assert 'wok_operator_decisions_total{direction="up",knob="batch"}' in decisions
    assert 'wok_operator_decisions_total{direction="up",knob="replicas"}' in decisions
