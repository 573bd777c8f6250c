"""Real controllers and a real scheduler place GPU workloads on KWOK's emulated GPU nodes."""

from __future__ import annotations

import ipaddress
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from wok_cluster.waiting import wait_until

pytestmark = pytest.mark.integration

PAUSE = "registry.k8s.io/pause:3.10"  # never pulled: KWOK pods have no container runtime


def _gpu_container(gpus: int) -> dict:
    return {
        "name": "main",
        "image": PAUSE,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }


def _gpu_deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [_gpu_container(1)]},
            },
        },
    }


def test_gpu_deployment_runs_one_pod_per_gpu_request(wok_cluster, wok_namespace):
    ns = wok_namespace
    with wok_cluster.api() as api:
        api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", _gpu_deployment("gpu-3", 3))

        def running_pods() -> list[dict] | None:
            pods = api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=gpu-3")["items"]
            running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            return running if len(running) == 3 else None

        pods = wait_until(running_pods, timeout=60, what="3 Running pods of gpu-3")
        for pod in pods:
            assert pod["spec"]["nodeName"] in wok_cluster.node_names
            ip = ipaddress.ip_address(pod["status"]["podIP"])
            assert ip in ipaddress.ip_network(wok_cluster.pod_network), ip
        assert len({p["status"]["podIP"] for p in pods}) == 3
        wait_until(
            lambda: (
                api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/gpu-3")["status"].get(
                    "readyReplicas"
                )
                == 3
            ),
            timeout=60,
            what="deployment gpu-3 readyReplicas == 3",
        )


def test_pod_wanting_more_gpus_than_any_node_stays_pending(wok_cluster, wok_namespace):
    ns = wok_namespace
    too_many = wok_cluster.gpus_per_node + 1
    with wok_cluster.api() as api:
        api.create(
            f"/api/v1/namespaces/{ns}/pods",
            {"metadata": {"name": "greedy"}, "spec": {"containers": [_gpu_container(too_many)]}},
        )

        def unschedulable() -> dict | None:
            pod = api.get(f"/api/v1/namespaces/{ns}/pods/greedy")
            for condition in pod.get("status", {}).get("conditions", []):
                if condition["type"] == "PodScheduled" and condition["status"] == "False":
                    return condition
            return None

        condition = wait_until(unschedulable, timeout=60, what="PodScheduled=False for greedy")
        assert condition["reason"] == "Unschedulable"
        assert "Insufficient nvidia.com/gpu" in condition["message"]
        pod = api.get(f"/api/v1/namespaces/{ns}/pods/greedy")
        assert pod["status"]["phase"] == "Pending"
        assert "nodeName" not in pod["spec"]
        events = wait_until(
            lambda: [
                e
                for e in api.get(f"/api/v1/namespaces/{ns}/events")["items"]
                if e["involvedObject"]["name"] == "greedy" and e["reason"] == "FailedScheduling"
            ],
            timeout=30,
            what="a FailedScheduling event for greedy",
        )
        assert "Insufficient nvidia.com/gpu" in events[0]["message"]


def test_a_service_over_ready_pods_makes_the_controllers_no_work(wok_cluster, wok_namespace):
    # Pod IPs here are loopback, which no EndpointSlice may hold: the endpoint controllers are off
    # (with them, every Service over a ready pod failed and retried, a Warning event each time).
    ns, labels = wok_namespace, {"app": "served"}
    with wok_cluster.api() as api:
        api.create(
            f"/api/v1/namespaces/{ns}/services",
            {"metadata": {"name": "served"}, "spec": {"selector": labels, "ports": [{"port": 80}]}},
        )
        api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", _gpu_deployment("served", 1))
        wait_until(
            lambda: (
                api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/served")["status"].get(
                    "readyReplicas"
                )
                == 1
            ),
            timeout=60,
            what="deployment served readyReplicas == 1",
        )
        slices = api.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            labelSelector="kubernetes.io/service-name=served",
        )["items"]
        assert slices == []
        reasons = {e["reason"] for e in api.get(f"/api/v1/namespaces/{ns}/events")["items"]}
        assert "FailedToUpdateEndpointSlices" not in reasons, reasons


def _rate_limiter_wait_s(cluster) -> float:
    """Seconds the controller-manager's and the scheduler's clients have waited in their own
    rate limiters (client-go's `rest_client_rate_limiter_duration_seconds`), all told."""
    waited = 0.0
    for name in ("kube-controller-manager", "kube-scheduler"):
        for family in text_string_to_metric_families(cluster.component_metrics(name)):
            if family.name == "rest_client_rate_limiter_duration_seconds":
                waited += sum(s.value for s in family.samples if s.name.endswith("_sum"))
    return waited


def test_many_deployments_become_ready_without_the_controllers_throttling_themselves(
    wok_cluster, wok_namespace
):
    # Each Deployment costs the controllers a ReplicaSet, a pod, status updates and Events: with
    # client-go's default limits (20 queries/s for the controller-manager) 150 of them wait tens
    # of seconds in the clients' own limiters, however idle the apiserver.
    ns, count = wok_namespace, 150
    waited_before = _rate_limiter_wait_s(wok_cluster)
    started = time.monotonic()
    with wok_cluster.api() as api:
        for i in range(count):
            deployment = _gpu_deployment(f"many-{i:03d}", 1)
            deployment["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
            deployment["spec"]["template"]["metadata"]["labels"]["batch"] = "many"
            api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)

        def all_ready() -> bool:
            pods = api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="batch=many")["items"]
            return sum(1 for p in pods if p.get("status", {}).get("phase") == "Running") == count

        wait_until(all_ready, timeout=240, what=f"{count} Running pods", interval=1.0)
    elapsed = time.monotonic() - started
    waited = _rate_limiter_wait_s(wok_cluster) - waited_before
    assert waited < 5.0, f"the controllers' clients waited {waited:.1f} s in their rate limiters"
    assert elapsed < 120, f"{count} pods took {elapsed:.0f} s"
