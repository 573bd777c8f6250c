"""Manifests of the emulated GPU nodes (pure): KWOK manages them, the scheduler places pods on them.

Each node gets a pod CIDR inside 127.0.0.0/8 (127.<X>.<i>.0/24, X chosen per cluster), so every
pod IP is a loopback address a real process can bind to on this machine.
"""

from __future__ import annotations

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NODE_PREFIX = "wok-gpu-"
MAX_NODES = 255


def pod_cidr(index: int, octet: int) -> str:
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} outside 0..{MAX_NODES - 1}")
    return f"127.{octet}.{index}.0/24"


def gpu_node(
    index: int, *, gpus: int, octet: int, cpu: str = "32", memory: str = "256Gi"
) -> dict[str, Any]:
    name = f"{NODE_PREFIX}{index}"
    resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
            },
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": pod_cidr(index, octet), "podCIDRs": [pod_cidr(index, octet)]},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }
