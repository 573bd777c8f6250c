"""Kopf posts only warnings (and the law's decisions) as Events; INFO stays in the log. The
operator's Kubernetes client keeps a connection for every thread that may call the apiserver at
once (Kopf's reconcile workers and the writers' threads): with the client's default
of 10, every call past the tenth opened, and then dropped, a TLS connection of its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import kopf
import pytest
import yaml
from kopf._core.actions.loggers import ObjectLogger
from kopf._core.engines import posting
from kopf._core.engines.posting import K8sPoster
from kubernetes import client
from kubernetes.config import kube_config

from wok_operator.startup import KUBE_CONNECTIONS, configure_kopf, load_kube_config


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


def _posted(settings: kopf.OperatorSettings, post: Callable[[], None]) -> list[str]:
    """The Events `post` queues under `settings`, by reason."""
    queue: asyncio.Queue = asyncio.Queue()
    posting.settings_var.set(settings)
    posting.event_queue_var.set(queue)
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    post()
    return [queue.get_nowait().reason for _ in range(queue.qsize())]


async def test_only_warnings_and_decisions_become_events_and_info_stays_in_the_log() -> None:
    settings = kopf.OperatorSettings()
    configure_kopf(settings)
    settings.posting.loggers = True  # where Kopf posts handlers' log lines as Events too
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    records: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = records.append  # type: ignore[method-assign]
    logger = ObjectLogger(body=body, settings=settings)
    logger.logger.addHandler(capture)
    level = logger.logger.level
    logger.logger.setLevel(logging.INFO)  # as `wok operator run` logs
    try:
        logger.info("reconciled: batch 8")
        logger.warning("control tick failed")
    finally:
        logger.logger.removeHandler(capture)
        logger.logger.setLevel(level)
    # Both reach the log; Kopf's Event poster takes the warning only.
    assert [r.getMessage() for r in records] == ["reconciled: batch 8", "control tick failed"]
    assert [K8sPoster().filter(r) for r in records] == [False, True]
    posted = _posted(settings, lambda: kopf.info(body, reason="Reconciled"))
    assert posted == []
    posted = _posted(settings, lambda: kopf.warn(body, reason="InvalidSpec"))
    assert posted == ["InvalidSpec"]
    posted = _posted(
        settings, lambda: kopf.event(body, type="Normal", reason="BatchChanged", message="m")
    )
    assert posted == ["BatchChanged"]
