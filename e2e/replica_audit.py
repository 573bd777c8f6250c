"""A watch on one named object that keeps every version of it and who owns its spec.replicas:
the e2e tests' audit of replica writes (a poll could miss a write undone within its period)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from wok_cluster.cluster import Cluster
from wok_cluster.kubeapi import KubeError


@dataclass(frozen=True)
class Version:
    """One version of an object as the watch delivered it."""

    rv: int
    t: float  # time.monotonic() when it arrived
    replicas: int | None
    batch: int | None  # status.batchSize (the InferenceService's)
    owners: tuple[tuple[str, str, str], ...]  # (manager, operation, subresource) of spec.replicas

    @property
    def writer(self) -> str:
        """The manager that owns spec.replicas: after a change, the one that made it (an update
        takes the field from every other manager, a forced apply too)."""
        return "+".join(sorted({manager for manager, _, _ in self.owners})) or "?"


def replica_owners(obj: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (entry["manager"], entry.get("operation", ""), entry.get("subresource", ""))
        for entry in obj["metadata"].get("managedFields") or []
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    )


class Audit:
    """Every version of one named object, from a watch opened before it exists: a relist (410
    Gone) could skip versions, so it is counted as a gap and the test fails on one."""

    def __init__(self, cluster: Cluster, path: str, name: str) -> None:
        self.api, self.path, self.name = cluster.api(), path, name
        self.versions: list[Version] = []
        self.gaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _record(self, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        if self.versions and rv <= self.versions[-1].rv:
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        self.versions.append(
            Version(
                rv,
                time.monotonic(),
                spec.get("replicas"),
                status.get("batchSize"),
                replica_owners(obj),
            )
        )

    def _run(self) -> None:
        selector = {"fieldSelector": f"metadata.name={self.name}"}
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.api.get(self.path, **selector)
                    for item in listed["items"]:
                        self._record(item)
                    version = listed["metadata"]["resourceVersion"]
                for event in self.api.watch(
                    self.path, resource_version=version, timeout_seconds=5, **selector
                ):
                    if event["type"] == "ERROR":  # 410 Gone: the history is compacted
                        self.gaps, version = self.gaps + 1, None
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"])
            except KubeError as error:
                if error.status == 410:
                    self.gaps, version = self.gaps + 1, None
                self._stop.wait(0.5)
            except httpx.HTTPError:
                self._stop.wait(0.5)  # the watch resumes from the last version it saw

    def latest(self) -> Version | None:
        return self.versions[-1] if self.versions else None

    def since(self, t: float) -> list[Version]:
        return [v for v in self.versions if v.t >= t]

    def changes(self) -> list[Version]:
        """The versions that changed spec.replicas, the creation first."""
        out: list[Version] = []
        for v in self.versions:
            if not out or v.replicas != out[-1].replicas:
                out.append(v)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=20)
        self.api.close()
