"""Pod volumes materialized into a per-pod directory, and container paths rewritten to point there.

There is no container filesystem here, so a volumeMount cannot appear at its mountPath (e.g. the
operator's admin-token Secret at /etc/wok/admin). Instead each volume becomes a directory under the
pod's directory, and every arg, env value and workingDir that names a path under a mountPath (as
the whole value, or after the `=` of `--flag=value`) is rewritten to the materialized path.
Supported: secret, configMap, emptyDir, downwardAPI, projected (secret, configMap, downwardAPI,
serviceAccountToken); other volume types become empty directories.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wok_cluster.expand import field_ref
from wok_cluster.kubeapi import KubeApi, KubeError


class VolumeError(Exception):
    """A volume cannot be materialized yet (missing Secret or ConfigMap): the kubelet retries."""


def _write(directory: Path, files: Mapping[str, bytes], mode: int = 0o644) -> None:
    for relative, content in files.items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)


def _keyed(api: KubeApi, namespace: str, kind: str, source: Mapping[str, Any]) -> dict[str, bytes]:
    name = source.get("secretName") or source.get("name")
    resource = "secrets" if kind == "secret" else "configmaps"
    try:
        obj = api.get(f"/api/v1/namespaces/{namespace}/{resource}/{name}")
    except KubeError as error:
        if error.status == 404 and source.get("optional"):
            return {}
        raise VolumeError(f"{kind} {namespace}/{name}: {error.message}") from error
    if kind == "secret":
        data = {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
    else:
        data = {k: v.encode() for k, v in obj.get("data", {}).items()}
        data |= {k: base64.b64decode(v) for k, v in obj.get("binaryData", {}).items()}
    items = source.get("items")
    if not items:
        return data
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def _downward(pod: Mapping[str, Any], items: list[dict[str, Any]]) -> dict[str, bytes]:
    return {
        item["path"]: field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        for item in items
        if "fieldRef" in item
    }


def _sa_token(api: KubeApi, pod: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, bytes]:
    meta = pod["metadata"]
    account = pod["spec"].get("serviceAccountName", "default")
    spec: dict[str, Any] = {
        "expirationSeconds": int(source.get("expirationSeconds", 3600)),
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    if source.get("audience"):
        spec["audiences"] = [source["audience"]]
    response = api.create(
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return {source["path"]: response["status"]["token"].encode()}


def materialize(api: KubeApi, pod: Mapping[str, Any], root: Path) -> dict[str, Path]:
    """Writes every volume of `pod` under `root`; returns volume name -> directory."""
    namespace = pod["metadata"]["namespace"]
    dirs: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes", []):
        directory = root / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            _write(directory, _keyed(api, namespace, "secret", volume["secret"]), 0o600)
        elif "configMap" in volume:
            _write(directory, _keyed(api, namespace, "configMap", volume["configMap"]))
        elif "downwardAPI" in volume:
            _write(directory, _downward(pod, volume["downwardAPI"].get("items", [])))
        elif "projected" in volume:
            for source in volume["projected"].get("sources", []):
                if "secret" in source:
                    files = _keyed(api, namespace, "secret", source["secret"])
                elif "configMap" in source:
                    files = _keyed(api, namespace, "configMap", source["configMap"])
                elif "downwardAPI" in source:
                    files = _downward(pod, source["downwardAPI"].get("items", []))
                elif "serviceAccountToken" in source:
                    files = _sa_token(api, pod, source["serviceAccountToken"])
                else:
                    files = {}
                _write(directory, files, 0o600)
        dirs[volume["name"]] = directory
    return dirs


def mount_table(container: Mapping[str, Any], volume_dirs: Mapping[str, Path]) -> dict[str, Path]:
    """mountPath -> local path for one container (subPath honoured)."""
    table = {}
    for mount in container.get("volumeMounts", []):
        local = volume_dirs[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
        table[mount["mountPath"].rstrip("/") or "/"] = local
    return table


def rewrite(value: str, mounts: Mapping[str, Path]) -> str:
    """Maps a path under a mountPath (whole value or `--flag=<path>`) to its local directory."""
    head, sep, tail = value.partition("=")
    if sep and not value.startswith("/"):
        return head + sep + rewrite(tail, mounts)
    for mount_path in sorted(mounts, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(mounts[mount_path]) + value[len(mount_path) :]
    return value
