"""A small Kubernetes REST client for the harness itself (start-up, nodes, tokens, the pod backer).

The harness needs a handful of verbs and one watch; a thin httpx wrapper keeps every request
visible (and loopback-checked) and keeps the official client's import cost out of `wok dev`.
Tests are free to use kubernetes/kopf clients against the same kubeconfig.
"""

from __future__ import annotations

import json
import ssl
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from wok_cluster.kubeconfig import Credentials, read_kubeconfig
from wok_cluster.netutil import require_loopback
from wok_cluster.waiting import wait_until

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        self.status = status
        self.body = body
        try:
            self.message = str(json.loads(body).get("message", body))
        except ValueError:
            self.message = body
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


class KubeApi:
    def __init__(self, credentials: Credentials, *, timeout: float = 30.0) -> None:
        require_loopback(urlsplit(credentials.server).hostname or "")
        with tempfile.NamedTemporaryFile(suffix=".crt") as ca:
            ca.write(credentials.ca_pem)
            ca.flush()
            context = ssl.create_default_context(cafile=ca.name)
        self.server = credentials.server
        self._client = httpx.Client(
            base_url=credentials.server,
            verify=context,
            headers={"Authorization": f"Bearer {credentials.token}"},
            timeout=timeout,
        )

    @classmethod
    def from_kubeconfig(cls, path: Path, *, timeout: float = 30.0) -> KubeApi:
        return cls(read_kubeconfig(path), timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        response = self._client.request(
            method,
            path,
            params=params,
            content=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type},
        )
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text, method, path)
        return response.json() if response.content else {}

    def get(self, path: str, **params: str) -> dict[str, Any]:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=body)

    def patch(
        self, path: str, body: dict[str, Any], *, content_type: str = MERGE_PATCH
    ) -> dict[str, Any]:
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("DELETE", path, body=body)

    def watch(
        self, path: str, *, resource_version: str, timeout_seconds: int = 60, **params: str
    ) -> Iterator[dict[str, Any]]:
        """Yields watch events until the server ends the watch (after `timeout_seconds`)."""
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        with self._client.stream(
            "GET", path, params=query, timeout=httpx.Timeout(10.0, read=timeout_seconds + 30.0)
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise KubeError(response.status_code, response.text, "WATCH", path)
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)

    def healthy(self, path: str) -> bool:
        """True when a health endpoint (/readyz, /livez) answers 200."""
        return self._client.get(path, timeout=5.0).status_code == 200

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd_established(crd: Mapping[str, Any]) -> bool:
    """Whether the apiserver serves a CRD's resource: its Established condition is True.

    A CRD just created has no conditions yet; `kubectl wait --for=condition=Established` fails
    on that at once instead of waiting (seen on a loaded machine), so this is polled instead."""
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def wait_established(api: KubeApi, names: Iterable[str], *, timeout: float) -> None:
    for name in names:
        wait_until(
            lambda name=name: crd_established(api.get(f"{CRDS}/{name}")),
            timeout=timeout,
            what=f"the CRD {name} Established",
        )
