"""What the kubelet does to a container's env and args before exec, as pure functions.

`$(VAR)` references expand from the container's env (earlier entries only, for env values);
`$$` escapes a dollar; an undefined reference stays as written. Downward-API `fieldRef`s resolve
against the Pod object. Kept identical to the kubelet so a pod spec means the same here as on a
real node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """The value of a downward-API fieldRef (`status.podIP`, `metadata.labels['x']`, ...)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    if path in simple:
        return str(simple[path])
    match = _LABEL_REF.match(path)
    if match:
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ValueError(f"unsupported fieldRef {path!r}")


def resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """`limits.nvidia.com/gpu` and friends; the divisor is not applied (quantities as written)."""
    kind, _, name = str(ref["resource"]).partition(".")
    resources = container.get("resources", {})
    return str(resources.get(kind, {}).get(name, "0"))
