"""The cluster benchmark's objects per policy: the InferenceService and KEDA's ScaledObject
(bench/autoscaling/autoscale_cluster.py)."""

from __future__ import annotations

from typing import Any

from autoscale_settings import (
    CONCURRENCY_TARGET,
    EXTERNAL,
    FIXED_BATCH,
    MODEL,
    NAME,
    VLLM_MODEL_CLAIM,
    VLLM_MODEL_PATH,
    Settings,
)

from wok_sim.baselines import WAITING_TARGET


def service_spec(
    policy: str, s: Settings, initial: int, fixed_batch: int | None, *, engine: str = "wok"
) -> dict:
    """The InferenceService of a run: the same pods for every policy; who owns which knob."""
    if engine == "vllm":
        return vllm_service_spec(policy, s, initial, fixed_batch)
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


def vllm_service_spec(policy: str, s: Settings, initial: int, batch: int | None) -> dict:
    """`engine: vllm`: the same service on vLLM pods (fakes on the cluster: wok_cluster/
    vllm_sim.py), every policy's pods at `--max-num-seqs` `batch` (vLLM cannot change it live);
    wok's law may still count a smaller batch per pod (its TPOT rule), KEDA's runs never do."""
    if batch is None:
        raise ValueError("engine vllm: the pods' --max-num-seqs must be given")
    spec = service_spec(policy, s, initial, batch)
    spec["engine"] = "vllm"
    spec["model"] = {
        "source": VLLM_MODEL_PATH,
        "servedName": MODEL,
        "preset": "llama-3-8b",
        "dtype": "bfloat16",
    }
    spec["model"]["volume"] = {"claimName": VLLM_MODEL_CLAIM}
    del spec["runtime"]["simLoadSeconds"]  # the fake's load is its profile's (`--load-seconds`)
    if policy not in FIXED_BATCH:
        spec["batching"]["minBatchSize"] = 1
    return spec


def model_volume(namespace: str) -> tuple[dict, dict]:
    """The PersistentVolume and its claim that `engine: vllm` pods mount the model from (the fake
    vLLM pod reads nothing from it; a real cluster's claim would hold the weights). Bound to
    each other up front, so kube-controller-manager's binder marks them Bound at once."""
    volume = f"{namespace}-model"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "20Gi"},
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "hostPath": {"path": VLLM_MODEL_PATH},
            "claimRef": {"namespace": namespace, "name": VLLM_MODEL_CLAIM},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": VLLM_MODEL_CLAIM, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": "20Gi"}},
        },
    }
    return pv, pvc


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
