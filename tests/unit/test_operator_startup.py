"""Kopf posts only warnings (and the law's decisions) as Events; INFO stays in the log. The
operator's Kubernetes client keeps a connection for every thread that may call the apiserver at
once (Kopf's reconcile workers and the writers' threads): with the client's default
of 10, every call past the tenth opened, and then dropped, a TLS connection of its own. The pods'
client lets a push wait for a connection instead of failing it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kopf
import pytest
import yaml
from kopf._core.actions.loggers import ObjectLogger
from kopf._core.engines import posting
from kopf._core.engines.posting import K8sPoster
from kubernetes import client
from kubernetes.config import kube_config

from wok_operator.actuate import push_batch_size
from wok_operator.resources import RUNTIME_PORT
from wok_operator.startup import KUBE_CONNECTIONS, configure_kopf, load_kube_config, pods_client


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


class SlowAdmin(BaseHTTPRequestHandler):
    """A pod's admin endpoint that answers a batch PUT after 1.2 s."""

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(1.2)
        body = b'{"max_batch_size": 8}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


class Backlogged(ThreadingHTTPServer):
    request_queue_size = 1024  # every push connects at once


async def test_pushes_past_the_clients_connections_wait_for_one_instead_of_failing():
    # 1,000 services pushed their first batch at once through 100 connections: a push that waited
    # longer than the call's timeout for one failed (PoolTimeout) and was pushed again every tick.
    # Five rounds of 1.2 s through the 100 connections: the last pushes wait 4.8 s for one, past
    # the 4 s a call may take, which leaves a call itself room on a loaded machine.
    pod = Backlogged(("127.0.0.215", RUNTIME_PORT), SlowAdmin)
    threading.Thread(target=pod.serve_forever, daemon=True).start()
    try:
        async with pods_client(timeout_s=4.0) as http:
            pushes = [push_batch_size(http, ["127.0.0.215"], "t0ken", 8) for _ in range(500)]
            results = await asyncio.gather(*pushes)
    finally:
        pod.shutdown()
        pod.server_close()
    assert [r["127.0.0.215"] for r in results] == [8] * 500, {str(r) for r in results}
