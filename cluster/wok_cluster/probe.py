"""The readinessProbe, run for real: an HTTP GET against the pod IP, as the kubelet would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from wok_cluster.netutil import require_loopback


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"probe port {port!r} is not a named port of container {container['name']}")


def http_get_ok(probe: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str) -> bool:
    """True for a 2xx/3xx answer within the probe's timeout; any error is a failed probe."""
    get = probe["httpGet"]
    host = require_loopback(get.get("host") or pod_ip)
    scheme = str(get.get("scheme", "HTTP")).lower()
    url = f"{scheme}://{host}:{resolve_port(get['port'], container)}{get.get('path', '/')}"
    headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
    try:
        response = httpx.get(
            url,
            headers=headers,
            timeout=float(probe.get("timeoutSeconds", 1)),
            verify=False,  # the kubelet does not verify probe certificates either
        )
    except httpx.HTTPError:
        return False
    return 200 <= response.status_code < 400
