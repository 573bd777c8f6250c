"""The operator's Kubernetes client holds as many connections as it has threads to call it from:
with fewer, the status writes and heartbeat reads of many services queue behind each other."""

from __future__ import annotations

import yaml
from kubernetes.config import kube_config

from wok_operator.startup import KUBE_THREADS, load_kube_config


def test_the_kube_client_keeps_a_connection_per_thread(tmp_path, monkeypatch):
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = load_kube_config()
    try:
        assert api.configuration.host == "https://127.0.0.1:6443"
        assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == KUBE_THREADS
        assert KUBE_THREADS > 6  # more than the loop's default executor on two cores
    finally:
        api.close()
