"""Backed pods are real processes on their loopback pod IP: reachable over HTTP, Ready only when
their readinessProbe passes, scraped by Prometheus through Kubernetes SD, stopped on deletion."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import httpx
import pytest

from wok_cluster.kubeapi import KubeError
from wok_cluster.process import command_line
from wok_cluster.waiting import wait_until

pytestmark = pytest.mark.integration

PODSERVER = Path(__file__).resolve().parent / "testdata" / "podserver.py"
TOKEN = "s3cret-admin-token"


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _backed_pod(name: str, *, restart_policy: str = "Always") -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"wok.dev/backed": "true", "wok.dev/service": "demo"},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8000",
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "server",
                    "image": "wok-runtime:test",
                    "command": ["python", str(PODSERVER)],
                    "args": [
                        "--host=$(POD_IP)",
                        "--port=8000",
                        "--token-file=/etc/wok/admin/token",
                        "--name",
                        "$(POD_NAMESPACE)/$(POD_NAME)",
                    ],
                    "env": [
                        _field_env("POD_IP", "status.podIP"),
                        _field_env("POD_NAME", "metadata.name"),
                        _field_env("POD_NAMESPACE", "metadata.namespace"),
                    ],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": "http"},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": "admin", "mountPath": "/etc/wok/admin"}],
                }
            ],
            "volumes": [{"name": "admin", "secret": {"secretName": "admin-token"}}],
        },
    }


def _ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _pid(pod: dict) -> int:
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    return int(container_id.removeprefix("wok-backer://"))


def test_backed_pod_is_a_live_process_scraped_by_prometheus(
    wok_cluster, wok_prometheus, wok_namespace
):
    ns = wok_namespace
    with wok_cluster.api() as api:
        api.create(
            f"/api/v1/namespaces/{ns}/secrets",
            {
                "metadata": {"name": "admin-token"},
                "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
            },
        )
        api.create(f"/api/v1/namespaces/{ns}/pods", _backed_pod("server-0"))
        path = f"/api/v1/namespaces/{ns}/pods/server-0"

        def running() -> dict | None:
            pod = api.get(path)
            state = pod.get("status", {}).get("containerStatuses", [{}])[0].get("state", {})
            return pod if "running" in state else None

        pod = wait_until(running, timeout=60, what="server-0 container running")
        ip = pod["status"]["podIP"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(wok_cluster.pod_network)
        assert pod["status"]["phase"] == "Running"

        # the process answers on the pod IP, and knows its name from the downward API
        metrics = wait_until(
            lambda: httpx.get(f"http://{ip}:8000/metrics", timeout=2.0),
            timeout=30,
            what="server-0 /metrics",
        )
        assert f'wok_test_up{{served_by="{ns}/server-0"}} 1' in metrics.text

        # Ready follows the real probe: not ready until the server says so
        assert not _ready(api.get(path))
        wrong = httpx.post(f"http://{ip}:8000/admin/ready", headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401
        # the Secret volume reached the process: the token it read is the Secret's
        right = httpx.post(
            f"http://{ip}:8000/admin/ready", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert right.status_code == 200
        wait_until(lambda: _ready(api.get(path)), timeout=30, what="server-0 Ready")

        # Prometheus found the pod through the apiserver and scraped it, labels relabelled
        series = wait_until(
            lambda: wok_prometheus.query(f'wok_test_up{{namespace="{ns}", pod="server-0"}}'),
            timeout=60,
            what="Prometheus scraping server-0",
            interval=0.5,
        )
        assert series[0]["metric"]["service"] == "demo"
        assert series[0]["metric"]["instance"] == f"{ip}:8000"
        assert series[0]["value"][1] == "1"

        pid = _pid(api.get(path))
        assert command_line(pid) is not None
        api.delete(path)

        def gone() -> bool:
            try:
                api.get(path)
            except KubeError as error:
                return error.status == 404
            return False

        wait_until(gone, timeout=30, what="server-0 deleted")
        assert command_line(pid) is None, "the pod's process outlived the pod"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{ip}:8000/metrics", timeout=2.0)


def _crashing_pod(name: str, restart_policy: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"wok.dev/backed": "true"}},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [
                {
                    "name": "main",
                    "image": "none",
                    "command": ["python", "-c", "import sys; sys.exit(3)"],
                }
            ],
        },
    }


def test_process_exit_fails_the_pod(wok_cluster, wok_namespace):
    ns = wok_namespace
    with wok_cluster.api() as api:
        api.create(f"/api/v1/namespaces/{ns}/pods", _crashing_pod("once", "Never"))
        api.create(f"/api/v1/namespaces/{ns}/pods", _crashing_pod("again", "Always"))

        def phase_failed() -> dict | None:
            pod = api.get(f"/api/v1/namespaces/{ns}/pods/once")
            return pod if pod["status"].get("phase") == "Failed" else None

        pod = wait_until(phase_failed, timeout=60, what="pod `once` Failed")
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")

        def restarted() -> dict | None:
            pod = api.get(f"/api/v1/namespaces/{ns}/pods/again")
            statuses = pod["status"].get("containerStatuses", [])
            return statuses[0] if statuses and statuses[0]["restartCount"] >= 1 else None

        status = wait_until(restarted, timeout=60, what="pod `again` restarted")
        assert status["lastState"]["terminated"]["exitCode"] == 3


def _initialized_pod(name: str, init_exit: int) -> dict:
    """An init container writes a file into an emptyDir; the container exits 0 only if it
    finds it (what the vLLM pods' model export relies on)."""
    mount = [{"name": "work", "mountPath": "/data"}]
    # The path is an argument, as a real container's would be: the backer maps arguments under a
    # mountPath to the volume's directory (a path inside the code string would be the host's).
    write = f"import sys; open(sys.argv[1], 'w').write('exported'); raise SystemExit({init_exit})"
    check = "import sys; raise SystemExit(0 if open(sys.argv[1]).read() == 'exported' else 4)"
    return {
        "metadata": {"name": name, "labels": {"wok.dev/backed": "true"}},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "export",
                    "image": "none",
                    "command": ["python", "-c", write, "/data/model"],
                    "volumeMounts": mount,
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "none",
                    "command": ["python", "-c", check, "/data/model"],
                    "volumeMounts": mount,
                }
            ],
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    }


def test_init_containers_run_to_success_before_the_containers(wok_cluster, wok_namespace):
    ns = wok_namespace
    with wok_cluster.api() as api:
        api.create(f"/api/v1/namespaces/{ns}/pods", _initialized_pod("ok", 0))
        api.create(f"/api/v1/namespaces/{ns}/pods", _initialized_pod("broken", 5))

        def phase(name: str, want: str) -> dict | None:
            pod = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            return pod if pod["status"].get("phase") == want else None

        done = wait_until(lambda: phase("ok", "Succeeded"), timeout=60, what="pod `ok` done")
        init = done["status"]["initContainerStatuses"][0]["state"]["terminated"]
        assert init["exitCode"] == 0
        failed = wait_until(lambda: phase("broken", "Failed"), timeout=60, what="`broken` fails")
        status = failed["status"]
        assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 5
        assert "waiting" in status["containerStatuses"][0]["state"]  # never started
        initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
        assert initialized["status"] == "False"
