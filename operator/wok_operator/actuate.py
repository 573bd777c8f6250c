"""The operator's hands: server-side apply of owned objects, scaling, and the runtime admin API.

All blocking Kubernetes calls live here and are run off the event loop by the callers; the admin
calls to pods are async (httpx), so one slow pod or service never delays the others.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from wok_operator.api import GROUP, PLURAL, VERSION
from wok_operator.resources import (
    ADMIN_TOKEN_KEY,
    BATCH_SIZE_KEY,
    FIELD_MANAGER,
    RUNTIME_PORT,
    admin_secret_name,
    batching_configmap_name,
    runtime_name,
)

APPLY = "application/apply-patch+yaml"
ADMIN_PATH = "/admin/v1/batching"


@dataclass(frozen=True)
class Kube:
    """The typed clients the operator uses, built once at startup and kept in Kopf's memo."""

    core: client.CoreV1Api
    apps: client.AppsV1Api
    custom: client.CustomObjectsApi
    policy: client.PolicyV1Api

    @classmethod
    def from_api_client(cls, api_client: client.ApiClient) -> Kube:
        return cls(
            core=client.CoreV1Api(api_client),
            apps=client.AppsV1Api(api_client),
            custom=client.CustomObjectsApi(api_client),
            policy=client.PolicyV1Api(api_client),
        )

    def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply with wok's field manager (idempotent; conflicts are forced)."""
        meta = obj["metadata"]
        args = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY}
        name, namespace = meta["name"], meta["namespace"]
        kind = obj["kind"]
        if kind == "Deployment":
            self.apps.patch_namespaced_deployment(name, namespace, obj, **args)
        elif kind == "Service":
            self.core.patch_namespaced_service(name, namespace, obj, **args)
        elif kind == "ConfigMap":
            self.core.patch_namespaced_config_map(name, namespace, obj, **args)
        elif kind == "PodDisruptionBudget":
            self.policy.patch_namespaced_pod_disruption_budget(name, namespace, obj, **args)
        elif kind == "PodMonitor":
            self.custom.patch_namespaced_custom_object(
                "monitoring.coreos.com", "v1", namespace, "podmonitors", name, obj, **args
            )
        else:
            raise ValueError(f"wok does not apply {kind}")

    def create_once(self, obj: dict[str, Any]) -> bool:
        """Create `obj` unless it exists (409 is success); True if this call created it."""
        try:
            self.core.create_namespaced_secret(obj["metadata"]["namespace"], obj)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def has_pod_monitors(self) -> bool:
        try:
            client.ApiextensionsV1Api(self.core.api_client).read_custom_resource_definition(
                "podmonitors.monitoring.coreos.com"
            )
        except ApiException as error:
            if error.status in (403, 404):
                return False
            raise
        return True

    def admin_token(self, service: str, namespace: str) -> str:
        secret = self.core.read_namespaced_secret(admin_secret_name(service), namespace)
        return base64.b64decode(secret.data[ADMIN_TOKEN_KEY]).decode()

    def service_replicas(self, service: str, namespace: str) -> int | None:
        """The InferenceService's spec.replicas, read through the scale subresource that
        kubectl scale, an HPA or KEDA write (None: the service is gone)."""
        try:
            scale = self.custom.get_namespaced_custom_object_scale(
                GROUP, VERSION, namespace, PLURAL, service
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return int(scale.get("spec", {}).get("replicas") or 0)

    def scale(self, service: str, namespace: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            runtime_name(service),
            namespace,
            {"spec": {"replicas": replicas}},
            field_manager="wok-autoscaler",
        )

    def scale_to_owner(self, service: str, namespace: str) -> None:
        """Beside an external owner (an HPA, KEDA, kubectl scale): the owner's count as it is now,
        read through the service's scale subresource, goes to the Deployment; never a count that
        a tick read before the owner's last write."""
        owned = self.service_replicas(service, namespace)
        if owned is not None:
            self.scale(service, namespace, owned)

    def set_batch_size(self, service: str, namespace: str, batch_size: int) -> None:
        """The ConfigMap new pods read at start, so a scale-up never resets the batch size."""
        self.core.patch_namespaced_config_map(
            batching_configmap_name(service),
            namespace,
            {"data": {BATCH_SIZE_KEY: str(batch_size)}},
            field_manager="wok-autoscaler",
        )

    def patch_status(self, service: str, namespace: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            service,
            {"status": status},
            field_manager=FIELD_MANAGER,
        )


async def push_batch_size(
    http: httpx.AsyncClient, pod_ips: Iterable[str], token: str, batch_size: int
) -> dict[str, int | str]:
    """PUT the batch size to every pod at once; per pod, the effective value or the error."""

    async def one(ip: str) -> int | str:
        try:
            response = await http.put(
                f"http://{ip}:{RUNTIME_PORT}{ADMIN_PATH}",
                json={"max_batch_size": batch_size},
                headers={"Authorization": f"Bearer {token}"},
            )
            response.raise_for_status()
            return int(response.json()["max_batch_size"])
        except (httpx.HTTPError, KeyError, ValueError) as error:
            return f"{type(error).__name__}: {error}"

    ips = list(pod_ips)
    results = await asyncio.gather(*(one(ip) for ip in ips))
    return dict(zip(ips, results, strict=True))
