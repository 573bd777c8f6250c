"""The control loop end to end: real runtime pods under real load, scraped by a real Prometheus,
moved by the real operator. The batch goes to its cap in one step (it rests there while TPOT is
within its SLO), and a burst raises the replicas (on measured demand); a quiet period brings the
replicas down only after the window, the batch staying put; a P99 TPOT breach while the cap binds
lowers the batch to its floor, where the SLO is reported unattainable."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml
from operator_harness import OperatorProcess, condition, get_json, install_crds, kubectl, wait_for
from prometheus_client.parser import text_string_to_metric_families
from replica_audit import Audit

# started first; its pods decode for 20 clients on the CPU, so it never runs
# beside the other module that loads runtime pods for minutes (docs/testing.md)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow(minutes=3),
    pytest.mark.xdist_group("runtime-load"),
]

SCALE_DOWN_WINDOW_S = 10  # five ticks: long enough to show it holds, short enough to wait out
TTFT_SLO_S = 600.0  # far off: phase 1 must scale on demand, not on a TTFT breach
SPEC = {
    "model": {"source": "builtin:tiny", "dtype": "float32"},
    "runtime": {"gpuMemory": "256Mi", "cpu": "1", "memory": "1Gi", "drainSeconds": 5},
    "memory": {"maxModelLen": 512, "reserve": "16Mi"},
    # From 2 the batch goes to its cap, 6, in one step; η_B 1 makes the walk down visible.
    "batching": {"minBatchSize": 1, "initialBatchSize": 2, "maxBatchSize": 6, "step": 1},
    "queue": {"maxLength": 512, "timeoutSeconds": 300},
    "scaling": {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetQueuePerReplica": 2,
        "deadband": 0.5,
        "targetUtilization": 0.7,
        "scaleUpStabilizationSeconds": 2,
        "scaleDownStabilizationSeconds": SCALE_DOWN_WINDOW_S,
        "intervalSeconds": 2,
    },
    "slo": {"ttftP99Seconds": TTFT_SLO_S, "tpotP99Seconds": 5, "windowSeconds": 10},
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


# kubectl scale (standing in for an HPA or KEDA) owns the replicas; wok moves only the batch.
EXTERNAL_SPEC = {**SPEC, "replicas": 1, "scaling": {**SPEC["scaling"], "replicas": "external"}}


@pytest.fixture
def service(request, wok_cluster, wok_prometheus, wok_namespace, tmp_path) -> Iterator[tuple]:
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
        "spec": getattr(request, "param", SPEC),
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


def pod_batch_size(ip: str) -> float | None:
    """The batch size a runtime pod runs at, from its own /metrics."""
    metrics = httpx.get(f"http://{ip}:8000/metrics", timeout=10).text
    return next(
        (
            sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "wok_max_batch_size"
        ),
        None,
    )


def slo_targets(operator_metrics: str) -> dict[str, float]:
    """wok_operator_slo_p99_seconds of the service `loop`, by its `slo` label."""
    return {
        sample.labels["slo"]: sample.value
        for family in text_string_to_metric_families(operator_metrics)
        if family.name == "wok_operator_slo_p99_seconds"
        for sample in family.samples
        if sample.labels.get("inferenceservice") == "loop"
    }


def distinct(values: list[int | None]) -> list[int]:
    """The values in order, repeats and unknowns dropped: the steps a knob took."""
    steps: list[int] = []
    for value in values:
        if value is not None and (not steps or steps[-1] != value):
            steps.append(value)
    return steps


@pytest.mark.timeout(600)
def test_burst_then_quiet_then_tpot_breach(service):
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

    # 1. A burst: 20 clients queue far past Q* + deadband. The batch is at its cap (it went there
    # from 2 once metrics flowed), and demand (20 sequences, 6 a pod at ρ 0.7) asks for more pods.
    load_from = time.monotonic()
    load = Load(lambda: ready_ips(kc, ns), workers=20, max_tokens=300)
    try:
        wait_for(lambda: recorder.first(lambda s: s.replicas == 2), "scale-up to 2 replicas", 90)
        wait_for(lambda: recorder.first(lambda s: s.batch == 6), "batch at its cap", 60)
        wait_for(lambda: len(ready_ips(kc, ns)) == 2, "second pod ready", 120)
    finally:
        load.stop()
    load_stopped = load.stopped_at
    assert load.ok > 0 and not load.failures, load.failures[:5]
    burst = [s for s in recorder.samples if load_from <= s.t <= load_stopped]
    assert set(distinct([s.batch for s in burst])) <= {2, 6}, distinct([s.batch for s in burst])
    first_batch_up = recorder.first(lambda s: (s.batch or 0) > 2)
    assert "batch 2→6" in first_batch_up.reason and "rests at its cap" in first_batch_up.reason
    scaled = recorder.first(lambda s: s.replicas == 2)
    assert "replicas 1→2 (R* 2 > 1" in scaled.reason, scaled.reason
    # Every pod, the new one too, runs at the decided batch size (new pods read it at start).
    for ip in ready_ips(kc, ns):
        assert pod_batch_size(ip) == 6, ip

    # 2. Quiet: demand falls to nothing, but the replicas come down only once R* < R has held for
    # the whole window (it cannot start before the load stopped), and the batch stays at its cap.
    down = wait_for(
        lambda: recorder.first(lambda s: s.t > load_stopped and s.replicas == 1),
        "scale-down to 1 replica",
        120,
    )
    assert down.t - load_stopped >= SCALE_DOWN_WINDOW_S, (down.t - load_stopped, down)
    assert f"replicas 2→1 (R* ≤ 1 < 2 for {SCALE_DOWN_WINDOW_S}s" in down.reason, down.reason
    quiet = [s for s in recorder.samples if load_stopped <= s.t <= down.t]
    assert all(s.batch == 6 for s in quiet), distinct([s.batch for s in quiet])

    # 3. A TPOT breach lowers the batch. No batch meets a 0.1 ms TPOT, so the batch walks down to
    # its floor and the SLO is reported unattainable there. Eight clients on one pod keep the cap
    # binding (running >= 0.8 · batch): only then is the batch what sets the step time. One
    # replica at most: no pod can be tried first, so the batch is what is left.
    wait_for(lambda: len(ready_ips(kc, ns)) == 1, "back to one pod", 60)
    tpot_slo_s = 0.0001
    kubectl(
        kc,
        "patch",
        "wis",
        "loop",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps(
            {"spec": {"slo": {"tpotP99Seconds": tpot_slo_s}, "scaling": {"maxReplicas": 1}}}
        ),
    )
    breach_from = time.monotonic()
    load = Load(lambda: ready_ips(kc, ns), workers=8, max_tokens=64)
    try:
        lowered = wait_for(
            lambda: recorder.first(lambda s: s.t > breach_from and (s.batch or 99) < 6),
            "batch lowered on a TPOT breach",
            90,
        )
        wait_for(
            lambda: (
                (condition(get_json(kc, "wis", "loop", "-n", ns), "SLOUnattainable") or {}).get(
                    "status"
                )
                == "True"
            ),
            "SLOUnattainable at the batch floor",
            90,
        )
        wis = get_json(kc, "wis", "loop", "-n", ns)
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
    assert "batch 6→5" in lowered.reason and "TPOT" in lowered.reason, lowered.reason
    assert "at the cap" in lowered.reason, lowered.reason
    assert wis["status"]["batchSize"] == 1
    assert condition(wis, "SLOBreached")["status"] == "True"
    unattainable = condition(wis, "SLOUnattainable")
    assert "TPOT" in unattainable["message"] and "smallest batch 1" in unattainable["message"]
    # Down steps stay η_B (each waits for the windowed P99): 6 → 5 → 4 → 3 → 2 → 1.
    breach = [s for s in recorder.samples if s.t >= breach_from]
    assert distinct([s.batch for s in breach]) == [6, 5, 4, 3, 2, 1]

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
    for knob in ("batch", "replicas"):
        for direction in ("up", "down"):
            sample = f'wok_operator_decisions_total{{direction="{direction}",knob="{knob}"}}'
            assert sample in decisions, sample
    assert slo_targets(decisions) == {"ttft": TTFT_SLO_S, "tpot": tpot_slo_s}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("service", [EXTERNAL_SPEC], indirect=True)
def test_an_external_owner_scales_while_wok_moves_only_the_batch(service, wok_cluster):
    kc, ns, operator, recorder = service
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    writes = Audit(wok_cluster, deployments, "loop-runtime")
    try:
        wait_for(lambda: ready_ips(kc, ns), "first runtime pod ready", 120)
        # A burst that the law would meet with a second pod (see the test above): here the
        # batch climbs to its cap and the replicas stay where their owner put them.
        load = Load(lambda: ready_ips(kc, ns), workers=20, max_tokens=300, deadline_s=180)
        try:
            wait_for(lambda: recorder.first(lambda s: s.batch == 6), "batch at its cap", 90)
            assert all(s.replicas in (None, 1) for s in recorder.samples)
            # The owner scales the InferenceService; the operator carries it to the
            # Deployment and the batch holds at its cap on both pods.
            kubectl(kc, "scale", "wis", "loop", "-n", ns, "--replicas=2")
            wait_for(lambda: len(ready_ips(kc, ns)) == 2, "second pod ready", 120)
            scaled_at = time.monotonic()
        finally:
            load.stop()
        assert load.ok > 0 and not load.failures, load.failures[:5]
        # Quiet for longer than the scale-down window: the law would go back to one pod.
        time.sleep(SCALE_DOWN_WINDOW_S + 10)
        for ip in ready_ips(kc, ns):
            assert pod_batch_size(ip) == 6, ip
    finally:
        writes.stop()
    after = [s for s in recorder.samples if s.t > scaled_at]
    assert after and all(s.replicas == 2 for s in after), distinct([s.replicas for s in after])
    # One write per owner decision, none back: no ping-pong between wok and the owner.
    changes = writes.changes()
    assert [v.replicas for v in changes] == [1, 2], changes
    assert changes[-1].owners[0][0] in ("wok-operator", "wok-autoscaler"), changes
    assert 'knob="replicas"' not in "\n".join(
        line
        for line in operator.metrics().splitlines()
        if line.startswith("wok_operator_decisions_total")
    )
