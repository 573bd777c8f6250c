"""Kubeconfig files the harness writes (token users, CA embedded) and reads back.

Files are self-contained (the CA is embedded), so a kubeconfig can be handed to kubectl, helm,
Prometheus or the operator alone. Only the shape written here is read back: a token user.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_pem: bytes
    token: str


def write_kubeconfig(path: Path, *, server: str, ca_pem: bytes, token: str, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "wok",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": f"{user}@wok", "context": {"cluster": "wok", "user": user}}],
        "current-context": f"{user}@wok",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def read_kubeconfig(path: Path) -> Credentials:
    config = yaml.safe_load(path.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    user = next(u for u in config["users"] if u["name"] == context["context"]["user"])
    return Credentials(
        server=cluster["cluster"]["server"],
        ca_pem=base64.b64decode(cluster["cluster"]["certificate-authority-data"]),
        token=user["user"]["token"],
    )
