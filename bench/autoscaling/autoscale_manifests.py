"""The cluster benchmark's objects per policy: the InferenceService and KEDA's ScaledObject
(bench/autoscaling/autoscale_cluster.py)."""

from __future__ import annotations

from typing import Any

from autoscale_settings import (
    CONCURRENCY_TARGET,
    EXTERNAL,
    NAME,
    Settings,
)

from wok_sim.baselines import WAITING_TARGET


def service_spec(policy: str, s: Settings, initial: int, fixed_batch: int | None) -> dict:
    """The InferenceService of a run: the same pods for every policy; who owns which knob."""
    spec: dict[str, Any] = {
        "model": {"source": s.profile, "preset": "llama-3-8b", "dtype": "bfloat16"},
        # the defaults otherwise (queue 256 / 30 s, drain 30 s), as the simulator's
        "runtime": {
            "gpuMemory": "80Gi",
            "cpu": "250m",
            "memory": "256Mi",
            "simLoadSeconds": s.load_seconds,
        },
        # the profile's context: the code trace's prompts run to 7,437 tokens
        "memory": {"maxModelLen": 8192},
        "scaling": {
            "minReplicas": initial,
            "maxReplicas": s.max_replicas,
            "podStartSeconds": round(s.load_seconds),
        },
        "slo": {
            "ttftP99Seconds": s.slo_ttft_s,
            "tpotP99Seconds": s.slo_tpot_s,
            "e2eP99Seconds": s.slo_e2e_s,
        },
    }
    if policy in EXTERNAL:
        spec["replicas"] = initial
        spec["scaling"] = {**spec["scaling"], "replicas": "external", "minReplicas": 1}
    if fixed_batch is not None:
        b = fixed_batch
        spec["batching"] = {"minBatchSize": b, "initialBatchSize": b, "maxBatchSize": b}
    return spec


def scaled_object(policy: str, namespace: str, prometheus_url: str, s: Settings) -> dict:
    """KEDA's ScaledObject on the InferenceService's scale subresource; HPA default behaviour."""
    selector = f'{{namespace="{namespace}"}}'
    if policy == "hpa-concurrency":
        trigger = {
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": prometheus_url,
                "query": f"sum(vllm:num_requests_running{selector})"
                f" + sum(vllm:num_requests_waiting{selector})",
                "threshold": str(CONCURRENCY_TARGET),
            },
        }
        polling = 15
    else:
        trigger = {
            "type": "prometheus",
            "metricType": "AverageValue",
            "useCachedMetrics": True,
            "metadata": {
                "serverAddress": prometheus_url,
                "query": f"sum(vllm:num_requests_waiting{selector})",
                "threshold": f"{WAITING_TARGET:g}",
            },
        }
        polling = 30
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "wok.dev/v1alpha1",
                "kind": "InferenceService",
                "name": NAME,
            },
            "pollingInterval": polling,
            "minReplicaCount": 1,
            "maxReplicaCount": s.max_replicas,
            "triggers": [trigger],
        },
    }
