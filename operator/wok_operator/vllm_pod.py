"""The pod of an `engine: vllm` InferenceService: vLLM's OpenAI server, rendered as plain dicts.

Pure functions, no I/O (like `resources`, which wraps this pod in the same Deployment, Service
and PodMonitor as the runtime's). The container's arguments are the whole interface: whatever
runs the pod (the kubelet, the dev cluster's pod backer) starts `vllm serve` with them.

What vLLM 0.32 does that the rendering leans on (vllm/entrypoints/launchers/launcher.py,
vllm/config/scheduler.py, vllm/entrypoints/serve/instrumentator/health.py):

- SIGTERM: the API server stops the engine client with `--shutdown-timeout` seconds to finish the
  requests in flight, then aborts the rest and exits (0, vLLM's default, aborts at once). The pod
  therefore waits `PRESTOP_SECONDS` in preStop first (the Service's endpoints drop the pod while
  it still serves), then vLLM drains for `runtime.drainSeconds`, and the grace period covers both
  plus `TEARDOWN_SECONDS` for the engine process to release the device.
- `/health` answers 200 once the server listens (after the model loaded) and 503 once the engine
  died: it is the readiness, liveness and startup probe alike (vLLM has no separate readiness).
- `--max-num-queued-reqs` bounds the requests in flight (waiting + running) and answers 503 past
  it, counted in `vllm:admission_rejections_total`: the batch cap plus `queue.maxLength` is
  wok's queue bound.
- `--max-num-batched-tokens` must be at least `--max-num-seqs` (the CRD refuses a spec that
  breaks it).
"""

from __future__ import annotations

from typing import Any

from wok_operator.api import InferenceServiceSpec, VllmSpec
from wok_operator.budget import plan_for_spec

VLLM_PORT = 8000
#: A builtin model is written by the runtime image's `wok model export` into this volume.
MODEL_DIR = "/models"
#: preStop: the Service's endpoints drop a terminating pod while it still serves.
PRESTOP_SECONDS = 5
#: After the drain: the engine process releases the device before the kubelet's SIGKILL.
TEARDOWN_SECONDS = 10
HEALTH_PATH = "/health"


def vllm_settings(spec: InferenceServiceSpec) -> VllmSpec:
    return spec.vllm or VllmSpec()


def spec_batch_cap(spec: InferenceServiceSpec) -> int:
    """min(B_max, B_mem) from the spec alone (B_mem at the spec's plan, no observed length): the
    cap `applyToEngine: never` pods run, so that neither a new operator process nor an observed
    mean moves it (either would roll the pods)."""
    return max(1, min(spec.batching.max_batch_size, plan_for_spec(spec).max_batch_size))


def engine_batch_size(spec: InferenceServiceSpec, law_batch: int) -> int:
    """The --max-num-seqs the pods run: the law's batch with `applyToEngine: restart`, else the
    cap the spec implies."""
    if spec.batching.apply_to_engine == "restart":
        return law_batch
    return spec_batch_cap(spec)


def model_path(spec: InferenceServiceSpec) -> str:
    """What `vllm serve` loads: the volume's path, or the directory a builtin is exported to."""
    source = spec.model.source
    if source.startswith("builtin:"):
        return f"{MODEL_DIR}/{source.removeprefix('builtin:')}"
    return source


def vllm_args(spec: InferenceServiceSpec, *, max_num_seqs: int, served_name: str) -> list[str]:
    """`vllm serve` arguments: the model, then one `--flag=value` per setting the spec implies
    (vLLM sizes its KV pool itself, from the GPU memory utilization)."""
    b, m = spec.batching, spec.memory
    prefix = "--enable-prefix-caching"
    return [
        model_path(spec),
        f"--served-model-name={served_name}",
        "--host=0.0.0.0",
        f"--port={VLLM_PORT}",
        f"--max-num-seqs={max_num_seqs}",
        f"--max-num-batched-tokens={b.max_num_batched_tokens}",
        f"--max-num-queued-reqs={max_num_seqs + spec.queue.max_length}",
        f"--max-model-len={m.max_model_len}",
        f"--gpu-memory-utilization={m.gpu_memory_utilization:g}",
        f"--tensor-parallel-size={spec.runtime.gpus_per_pod}",
        f"--dtype={spec.model.dtype}",
        prefix if vllm_settings(spec).enable_prefix_caching else "--no-" + prefix[2:],
        f"--shutdown-timeout={spec.runtime.drain_seconds}",
    ]


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    return PRESTOP_SECONDS + spec.runtime.drain_seconds + TEARDOWN_SECONDS


def model_export_init_container(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    """A builtin model has no files in vLLM's image: the runtime image writes it into the model
    volume first (`wok model export`). A path source is the claim's, mounted as it is."""
    source = spec.model.source
    if not source.startswith("builtin:"):
        return None
    return {
        "name": "model-export",
        "image": spec.runtime.image,
        "command": ["wok"],
        "args": ["model", "export", source, model_path(spec)],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "model", "mountPath": MODEL_DIR}],
    }


def vllm_container(
    spec: InferenceServiceSpec,
    *,
    max_num_seqs: int,
    served_name: str,
    resources: dict[str, Any],
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    def probe(period_s: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": HEALTH_PATH, "port": "http"},
            "periodSeconds": period_s,
            "failureThreshold": failures,
        }

    return {
        "name": "vllm",
        "image": vllm_settings(spec).image,
        "command": ["vllm", "serve"],
        "args": vllm_args(spec, max_num_seqs=max_num_seqs, served_name=served_name),
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "resources": resources,
        "readinessProbe": probe(2, 2),
        "livenessProbe": probe(10, 6),
        # Loading (and compiling) a large model takes minutes: up to 20 of them.
        "startupProbe": probe(2, 600),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }


def vllm_pod_parts(
    spec: InferenceServiceSpec,
    *,
    max_num_seqs: int,
    served_name: str,
    resources: dict[str, Any],
) -> dict[str, Any]:
    """The pod spec's engine-specific fields: containers, init containers, volumes, grace."""
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        # vLLM's workers and NCCL share tensors through /dev/shm (64Mi in a container).
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    init = model_export_init_container(spec)
    volume = spec.model.volume
    if volume is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {
                    "claimName": volume.claim_name,
                    "readOnly": volume.read_only,
                },
            }
        )
        mounts.append({"name": "model", "mountPath": volume.mount_path, "readOnly": True})
    elif init is not None:
        volumes.append({"name": "model", "emptyDir": {}})
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    container = vllm_container(
        spec,
        max_num_seqs=max_num_seqs,
        served_name=served_name,
        resources=resources,
        mounts=mounts,
    )
    return {
        **({"initContainers": [init]} if init is not None else {}),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
    }
