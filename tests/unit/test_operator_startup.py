"""The operator's Kubernetes client keeps a connection for every thread that may call the
apiserver at once (Kopf's reconcile workers and the writers' threads): with the client's default
of 10, every call past the tenth opened, and then dropped, a TLS connection of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.config import kube_config

from wok_operator.startup import KUBE_CONNECTIONS, load_kube_config


def test_the_kubernetes_client_keeps_a_connection_per_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    # The client reads $KUBECONFIG once, at import.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(client.Configuration, "_default", None)  # loading sets it: put it back
    api_client = load_kube_config()
    try:
        assert KUBE_CONNECTIONS >= 16 + 6  # Kopf's 16 workers, the loop's default executor here
        assert api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == KUBE_CONNECTIONS
    finally:
        api_client.close()
