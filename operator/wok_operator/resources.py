"""The objects an InferenceService owns, rendered as plain dicts: pure functions, no I/O.

The operator applies them with server-side apply; tests call these functions directly. Names are
deterministic (`<service>-runtime`, …) so a restarted operator finds, never duplicates, its work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import MemoryBudget, mebibytes, pod_memory_bytes
from wok_operator.vllm_pod import vllm_pod_parts

RUNTIME_PORT = 8000
ADMIN_TOKEN_KEY = "token"
ADMIN_TOKEN_DIR = "/etc/wok/admin"
BATCH_SIZE_KEY = "maxBatchSize"
CACHE_DIR = "/var/cache/wok"  # the runtime's WOK_CACHE_DIR
COMPILE_CACHE_DIR = f"{CACHE_DIR}/compile"  # where compile_cache keeps a directory per CPU
RUNTIME_USER = 1000
SERVICE_LABEL = "wok.dev/service"
MANAGED_BY = "wok-operator"
FIELD_MANAGER = "wok-operator"


def runtime_name(service: str) -> str:
    return f"{service}-runtime"


def admin_secret_name(service: str) -> str:
    return f"{service}-admin"


def batching_configmap_name(service: str) -> str:
    return f"{service}-batching"


def selector_labels(service: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "wok-runtime", "app.kubernetes.io/instance": service}


def selector_text(service: str) -> str:
    """The pods' selector as the scale subresource reports it (for an HPA or KEDA)."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(service).items())


def common_labels(service: str) -> dict[str, str]:
    return {
        **selector_labels(service),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": "wok",
        SERVICE_LABEL: service,
    }


def served_model_name(spec: InferenceServiceSpec) -> str:
    source = spec.model.source
    return spec.model.served_name or source.removeprefix("builtin:").removeprefix("sim:")


def accelerator_args(spec: InferenceServiceSpec, budget: MemoryBudget) -> list[str]:
    """How the pod's accelerator is chosen and sized. Every pod has a GPU (`gpusPerPod` ≥ 1) and
    runs on CUDA, named: a node without a working GPU fails the pod loudly (the runtime exits
    non-zero) instead of serving from the CPU; the KV pool comes from the budget. A `sim:`
    source runs the simulated accelerator, sized by its profile (the budget still sets the
    batch cap)."""
    if spec.model.source.startswith("sim:"):
        load = spec.runtime.sim_load_seconds
        return [
            "--device=sim",
            f"--profile={spec.model.source}",
            *([] if load is None else [f"--sim-load-seconds={load:g}"]),
        ]
    gpus = spec.runtime.gpus_per_pod
    return [
        "--device=cuda",
        f"--kv-cache-bytes={budget.kv_budget_bytes}",  # the pod's: the ranks split it
        f"--gpu-memory-utilization={spec.memory.gpu_memory_utilization:g}",
        *([f"--tensor-parallel-size={gpus}"] if gpus > 1 else []),
    ]


def cpu_threads(cpu: str) -> int:
    """Threads for a CPU request such as `2` or `1500m`: at least one."""
    return max(1, int(parse_quantity(cpu)))


def batch_lane_args(spec: InferenceServiceSpec) -> list[str]:
    """The batch lane's cap when the spec sets one; else the runtime's own default, the memory
    cap it computes from the KV pool it really has (a `sim:` profile's, too). A spec edit rolls
    the pods: the runtime's admin API moves only the online batch live."""
    cap = spec.batching.batch_lane_max_batch_size
    return [] if cap is None else [f"--batch-lane-max-batch-size={cap}"]


def runtime_args(spec: InferenceServiceSpec, budget: MemoryBudget) -> list[str]:
    """`wok runtime serve` flags derived from the spec; the batch size comes from the ConfigMap."""
    b, q, m = spec.batching, spec.queue, spec.memory
    classes = ",".join(f"{c.name}={c.priority}" for c in q.priority_classes)
    return [
        "runtime",
        "serve",
        f"--model={spec.model.source}",
        f"--served-model-name={served_model_name(spec)}",
        "--host=$(POD_IP)",
        f"--port={RUNTIME_PORT}",
        f"--admin-token-file={ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}",
        f"--mode={b.mode}",
        "--max-batch-size=$(WOK_MAX_BATCH_SIZE)",
        f"--max-wait-ms={b.max_wait_ms}",
        f"--max-num-batched-tokens={b.max_num_batched_tokens}",
        *batch_lane_args(spec),
        f"--max-queue={q.max_length}",
        f"--queue-timeout={q.timeout_seconds:g}",
        f"--priority-classes={classes}",
        f"--aging-seconds={q.aging_seconds:g}",
        f"--max-model-len={m.max_model_len}",
        f"--dtype={spec.model.dtype}",
        *accelerator_args(spec, budget),
        *(["--compile"] if spec.runtime.compile else []),
        f"--drain-seconds={spec.runtime.drain_seconds}",
    ]


def pod_resources(spec: InferenceServiceSpec, budget: MemoryBudget) -> dict[str, Any]:
    """The runtime container's requests and limits: the spec's CPU and GPUs, the budget's memory."""
    gpus = str(spec.runtime.gpus_per_pod)
    memory = mebibytes(pod_memory_bytes(spec, budget))
    return {
        "requests": {"cpu": spec.runtime.cpu, "memory": memory, "nvidia.com/gpu": gpus},
        "limits": {"memory": memory, "nvidia.com/gpu": gpus},
    }


def engine_pod_parts(
    name: str,
    spec: InferenceServiceSpec,
    budget: MemoryBudget,
    resources: dict[str, Any],
    engine_batch: int | None,
) -> dict[str, Any]:
    """The pod spec's engine-specific fields: wok's runtime, or vLLM's server at `engine_batch`."""
    if spec.engine != "vllm":
        return runtime_pod_parts(name, spec, budget, resources)
    if engine_batch is None:
        raise ValueError("engine: vllm pods need their --max-num-seqs (engine_batch)")
    return vllm_pod_parts(
        spec,
        max_num_seqs=engine_batch,
        served_name=served_model_name(spec),
        resources=resources,
    )


def pod_template(
    name: str, pod: dict[str, Any], extra_pod_labels: Mapping[str, str] | None
) -> dict[str, Any]:
    """The Deployment's pod template: the engine's `pod` parts, scraped by Prometheus, with no
    service account token or service links, on GPU nodes."""
    return {
        "metadata": {
            "labels": {**common_labels(name), **(extra_pod_labels or {})},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(RUNTIME_PORT),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": {
            **pod,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "fsGroup": RUNTIME_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    }


def desired_deployment(
    name: str,
    namespace: str,
    spec: InferenceServiceSpec,
    *,
    budget: MemoryBudget,
    replicas: int,
    extra_pod_labels: Mapping[str, str] | None = None,
    engine_batch: int | None = None,
) -> dict[str, Any]:
    """The runtime Deployment: GPU pods running `wok runtime serve` (or, with `engine: vllm`,
    vLLM's server started with `--max-num-seqs=engine_batch`), probed, locked down."""
    pod = engine_pod_parts(name, spec, budget, pod_resources(spec, budget), engine_batch)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": runtime_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": pod_template(name, pod, extra_pod_labels),
        },
    }


def compile_cache_parts(spec: InferenceServiceSpec) -> dict[str, Any]:
    """The node's compile cache, when the spec names one for `--compile`: a hostPath over the
    cache emptyDir's `compile/` (the runtime keys a subdirectory by the CPU, so one directory
    serves a node's pods whatever its CPU), and an init container that gives it to the runtime's
    user (the kubelet creates a hostPath root's, and fsGroup does not apply to it). Empty lists
    otherwise: each pod builds into its own emptyDir."""
    path = spec.runtime.compile_cache_host_path
    if not spec.runtime.compile or path is None:
        return {"volumes": [], "mounts": [], "init_containers": []}
    owner = f"{RUNTIME_USER}:{RUNTIME_USER}"
    chown = {
        "name": "compile-cache-owner",
        "image": spec.runtime.image,
        "command": ["chown", owner, COMPILE_CACHE_DIR],
        "volumeMounts": [{"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR}],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        },
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "16Mi"}},
    }
    return {
        "volumes": [
            {"name": "compile-cache", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        ],
        "mounts": [{"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR}],
        "init_containers": [chown],
    }


def runtime_volumes(
    name: str, spec: InferenceServiceSpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runtime pod's volumes and the container's mounts of them: the admin token, a cache,
    a small /tmp in memory, shared memory for NCCL's ranks, the model's claim."""
    volumes: list[dict[str, Any]] = [
        {
            "name": "admin-token",
            "secret": {"secretName": admin_secret_name(name), "defaultMode": 0o400},
        },
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if spec.runtime.gpus_per_pod > 1 and not spec.model.source.startswith("sim:"):
        # NCCL passes data between the ranks through /dev/shm; a container's default is 64Mi.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    compile_cache = compile_cache_parts(spec)
    volumes += compile_cache["volumes"]
    mounts += compile_cache["mounts"]
    if spec.model.volume is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {
                    "claimName": spec.model.volume.claim_name,
                    "readOnly": spec.model.volume.read_only,
                },
            }
        )
        mounts.append(
            {"name": "model", "mountPath": spec.model.volume.mount_path, "readOnly": True}
        )
    return volumes, mounts


def runtime_env(name: str, spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The runtime container's environment: the pod's IP and the batch size from the ConfigMap
    (both read by its flags), a cache, a thread count sized to the pod's CPU."""
    return [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "WOK_MAX_BATCH_SIZE",
            "valueFrom": {
                "configMapKeyRef": {
                    "name": batching_configmap_name(name),
                    "key": BATCH_SIZE_KEY,
                }
            },
        },
        {"name": "WOK_CACHE_DIR", "value": CACHE_DIR},
        # torch sizes its thread pool from the node's cores, not the pod's CPU: oversubscribed
        # threads spin-wait on each other.
        {"name": "OMP_NUM_THREADS", "value": str(cpu_threads(spec.runtime.cpu))},
        {"name": "HOME", "value": "/tmp"},
    ]


def runtime_probes() -> dict[str, Any]:
    """Readiness from /readyz (a draining pod leaves the Service), liveness and a generous startup
    allowance (a model loads) from /healthz."""
    probe_port = {"port": "http"}
    return {
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **probe_port},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **probe_port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "startupProbe": {
            "httpGet": {"path": "/healthz", **probe_port},
            "periodSeconds": 2,
            "failureThreshold": 300,
        },
    }


def runtime_pod_parts(
    name: str, spec: InferenceServiceSpec, budget: MemoryBudget, resources: dict[str, Any]
) -> dict[str, Any]:
    """The pod spec's engine-specific fields for wok's runtime: its container (the batch size
    from the ConfigMap, the admin token from its Secret), volumes and grace period."""
    volumes, mounts = runtime_volumes(name, spec)
    container = {
        "name": "runtime",
        "image": spec.runtime.image,
        "command": ["wok"],
        "args": runtime_args(spec, budget),
        "env": runtime_env(name, spec),
        "ports": [{"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"}],
        "resources": resources,
        **runtime_probes(),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    init_containers = compile_cache_parts(spec)["init_containers"]
    return {
        **({"initContainers": init_containers} if init_containers else {}),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": spec.runtime.drain_seconds + 5,
    }


def desired_service(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": runtime_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "spec": {
            "selector": selector_labels(name),
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def desired_pod_disruption_budget(name: str, namespace: str) -> dict[str, Any]:
    """A node drain takes the runtime pods one at a time, each replacement loading its model and
    turning ready before the next pod goes, so a service of two or more replicas keeps serving.

    `maxUnavailable: 1`, not a `minAvailable` from `scaling.minReplicas`: a service sits at its
    floor whenever the load is low, and a floor-sized minAvailable would then allow no eviction
    at all, blocking every drain of its nodes for good. A pod that is not ready serves nothing,
    so it may always be evicted (a crash-looping pod never blocks a drain)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": runtime_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def desired_batching_configmap(name: str, namespace: str, batch_size: int) -> dict[str, Any]:
    """The decided batch size, read by new pods at start (so a scale-up never resets it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": batching_configmap_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "data": {BATCH_SIZE_KEY: str(batch_size)},
    }


def admin_secret(name: str, namespace: str, token: str) -> dict[str, Any]:
    """The runtime's admin token: created once (never applied again, so never rotated by
    accident) and never logged."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": admin_secret_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "stringData": {ADMIN_TOKEN_KEY: token},
    }


def desired_pod_monitor(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": runtime_name(name),
            "namespace": namespace,
            "labels": common_labels(name),
        },
        "spec": {
            "selector": {"matchLabels": selector_labels(name)},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": "5s",
                    # the operator's queries group by `service`, as in the emulated cluster
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_wok_dev_service"],
                            "targetLabel": "service",
                        }
                    ],
                }
            ],
        },
    }
