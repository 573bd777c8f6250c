"""pytest fixtures for the real control plane, the emulated cluster and Prometheus.

Import them into a conftest (`from wok_cluster.pytest_plugin import *`). Everything is
session-scoped and started at most once per pytest process even when several conftests import
these fixtures (a module-level registry shares the running objects). Missing binaries are built
(build.sh), never skipped. Teardown stops every process of the run and fails if any is left.

    wok_apiserver   ControlPlane: .kubeconfig (admin Path), .server, .api(),
                    .service_account_kubeconfig(namespace, name) -> Path
    wok_cluster     Cluster on top of it: controller-manager (its HPA syncing every
                    HPA_SYNC_S), scheduler, KWOK GPU nodes (.node_names), pod backer (label pods
                    wok.dev/backed=true)
    wok_prometheus  Prometheus scraping backed pods via kubernetes_sd: .url, .query(), .targets()
    wok_keda        Keda: KEDA's operator and metrics adapter (the external.metrics.k8s.io
                    APIService, Available), the release's CRDs and RBAC applied
    wok_kubeconfig  the admin kubeconfig Path
    wok_namespace   a fresh namespace per test (deleted afterwards)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from wok_cluster.apiserver import ControlPlane
from wok_cluster.binaries import BUILT, KEDA, Binaries, ensure_built, missing
from wok_cluster.cluster import Cluster
from wok_cluster.keda import Keda
from wok_cluster.kubeapi import KubeError
from wok_cluster.process import processes_marked
from wok_cluster.prometheus import Prometheus

__all__ = [
    "pytest_collection_finish",
    "wok_apiserver",
    "wok_binaries",
    "wok_cluster",
    "wok_keda",
    "wok_kubeconfig",
    "wok_namespace",
    "wok_prometheus",
]


class _Startable(Protocol):
    def start(self) -> Any: ...


T = TypeVar("T", bound=_Startable)
# The tests' HPA controller syncs every 5 s, not every 15 s: each HPA step of a test waits for the
# next sync, and the tests' scale-down windows (15 s) still span three syncs, so they decide.
# `wok dev` and the benchmarks keep the upstream period (their KEDA baseline is a real one).
HPA_SYNC_S = 5.0
_running: dict[str, Any] = {}


def _once(key: str, make: Callable[[], T], stop: Callable[[T], None]) -> Iterator[T]:
    """Starts `make()` at most once per pytest process; a failed start is stopped, then raised."""
    if key in _running:
        yield _running[key]
        return
    obj = make()
    try:
        obj.start()
    except BaseException:
        stop(obj)
        raise
    _running[key] = obj
    try:
        yield obj
    finally:
        del _running[key]
        stop(obj)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds missing binaries before any test runs: a cold build takes far longer than the
    per-test timeout, which would otherwise kill the first fixture that needs them."""
    used = {name for item in session.items for name in item.fixturenames}
    wanted = BUILT + KEDA if "wok_keda" in used else BUILT
    if "wok_binaries" in used and missing(wanted):
        ensure_built(wanted, required=BUILT)


@pytest.fixture(scope="session")
def wok_binaries() -> Binaries:
    return ensure_built()


@pytest.fixture(scope="session")
def wok_apiserver(
    wok_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    def make() -> ControlPlane:
        return ControlPlane(tmp_path_factory.mktemp("wok-cluster"), wok_binaries)

    def stop(plane: ControlPlane) -> None:
        plane.stop()
        left = processes_marked(str(plane.run_dir))
        assert not left, f"processes outlived the cluster teardown: {left}"

    yield from _once("apiserver", make, stop)


@pytest.fixture(scope="session")
def wok_cluster(wok_apiserver: ControlPlane) -> Iterator[Cluster]:
    def make() -> Cluster:
        return Cluster(wok_apiserver, hpa_sync_seconds=HPA_SYNC_S)

    yield from _once("cluster", make, Cluster.stop)


@pytest.fixture(scope="session")
def wok_prometheus(wok_apiserver: ControlPlane) -> Iterator[Prometheus]:
    def make() -> Prometheus:
        return Prometheus(wok_apiserver, wok_apiserver.run_dir / "prometheus")

    yield from _once("prometheus", make, Prometheus.stop)


@pytest.fixture(scope="session")
def wok_keda(wok_apiserver: ControlPlane) -> Iterator[Keda]:
    def make() -> Keda:
        ensure_built(KEDA)
        return Keda(wok_apiserver, wok_apiserver.run_dir / "keda")

    yield from _once("keda", make, Keda.stop)


@pytest.fixture(scope="session")
def wok_kubeconfig(wok_apiserver: ControlPlane) -> Path:
    return wok_apiserver.kubeconfig


@pytest.fixture
def wok_namespace(wok_apiserver: ControlPlane) -> Iterator[str]:
    name = f"t-{secrets.token_hex(4)}"
    with wok_apiserver.api() as api:
        api.create("/api/v1/namespaces", {"metadata": {"name": name}})
        try:
            yield name
        finally:
            try:
                api.delete(f"/api/v1/namespaces/{name}")
            except KubeError as error:
                if error.status != 404:
                    raise
