"""One place that configures Kopf and builds the shared clients (kept in memo, not globals)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import kopf
from kubernetes import client, config

from wok_operator.actuate import Kube
from wok_operator.handlers import OperatorConfig, Shared

#: Connections kept to the apiserver: one per thread that may call it at once (Kopf's 16 for the
#: reconciles, the loop's default executor for the writers). With the client's default of 10,
#: every call past the tenth opened and closed a TLS connection of its own.
KUBE_CONNECTIONS = 32


#: A pod's admin call: connect, send and answer within this.
POD_CALL_TIMEOUT_S = 3.0


def pods_client(timeout_s: float = POD_CALL_TIMEOUT_S) -> httpx.AsyncClient:
    """The client of the pods' admin calls. A push waits for one of its connections (httpx's
    100) as long as it takes: it runs in its service's writer, off the tick. With the pool wait
    inside the call's timeout, 1,000 services pushing their first batch failed with PoolTimeout
    and pushed again at every tick: 6,761 misses in one run, 53 pushes/s, 0.7 operator cores."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, pool=None))


def load_kube_config() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = KUBE_CONNECTIONS
    return client.ApiClient(configuration)


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """Kopf's settings (pure: the startup handler applies them)."""
    settings.persistence.finalizer = "wok.dev/finalizer"
    # Status holds only what the CRD declares; Kopf's own bookkeeping goes to annotations.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="wok.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="wok.dev", key="last-handled-configuration"
    )
    # Only warnings and errors become Kubernetes Events; INFO stays in the log. Each reconcile
    # logs about three INFO lines: as Events, 3,000 apiserver writes for 1,000 services at start.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.batching.error_delays = [1, 2, 5, 10, 30]
    settings.execution.max_workers = 16


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings)
    operator_config: OperatorConfig = memo.get("config") or OperatorConfig()
    memo.wok = Shared(
        kube=Kube.from_api_client(load_kube_config()),
        config=operator_config,
        http=pods_client(),
        leadership=memo.get("leadership"),
    )


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    wok: Shared | None = memo.get("wok")
    if wok is not None:
        await wok.hub.close()
    if wok is not None and wok.http is not None:
        await wok.http.aclose()
