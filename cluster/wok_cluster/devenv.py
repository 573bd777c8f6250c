"""`wok dev`: the emulated cluster started detached, recorded in a state file, stopped by pid.

Everything lives under one state directory (default ~/.cache/wok/dev, or $WOK_DEV_DIR):
`state.json` (pids, ports, paths), the kubeconfigs, logs and data. `down` stops exactly the
process groups `up` recorded, and only while each pid still runs the program that was started.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wok_cluster.backer import SELECTOR, kill_leftover_pods
from wok_cluster.binaries import BUILT, KEDA, cache_dir, ensure_built
from wok_cluster.netutil import release_host_address
from wok_cluster.process import ProcessRecord, Supervisor, is_ours


def operator_argv(
    state: dict[str, Any], *, namespace: str, liveness_port: int, extra: Sequence[str] = ()
) -> list[str]:
    """`wok operator run` against the dev cluster: its Prometheus, only pods the backer runs
    (the harness-only label), no leader election, no metrics port, its liveness endpoint on a
    loopback port (the default, 0.0.0.0:8080, is often taken on a workstation), plain logs;
    `extra` last, so a flag given there wins."""
    return [
        "operator",
        "run",
        f"--namespace={namespace}",
        f"--prometheus-url={state['prometheus']}",
        f"--pod-label={SELECTOR}",
        "--standalone",
        "--metrics-port=0",
        f"--liveness=http://127.0.0.1:{liveness_port}/healthz",
        "--log-format=plain",
        *extra,
    ]


def default_state_dir() -> Path:
    return Path(os.environ.get("WOK_DEV_DIR", cache_dir() / "dev"))


class DevEnvironment:
    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir or default_state_dir()
        self.state_file = self.state_dir / "state.json"
        self.run_dir = self.state_dir / "run"

    def load(self) -> dict[str, Any] | None:
        if not self.state_file.exists():
            return None
        return dict(json.loads(self.state_file.read_text()))

    def records(self) -> list[ProcessRecord]:
        state = self.load() or {}
        return [ProcessRecord(**r) for r in state.get("processes", [])]

    def is_up(self) -> bool:
        return any(is_ours(r) for r in self.records())

    def up(self, *, nodes: int, gpus_per_node: int, keda: bool = False) -> dict[str, Any]:
        from wok_cluster.apiserver import ControlPlane
        from wok_cluster.cluster import Cluster
        from wok_cluster.keda import Keda
        from wok_cluster.prometheus import Prometheus

        if self.is_up():
            raise RuntimeError(f"already up (state {self.state_file}); run `wok dev down` first")
        self.down()  # clears what a crashed run left behind
        shutil.rmtree(self.run_dir, ignore_errors=True)
        binaries = ensure_built(BUILT + KEDA) if keda else ensure_built()
        started = time.monotonic()
        control_plane = ControlPlane(self.run_dir, binaries)
        cluster = Cluster(control_plane, nodes=nodes, gpus_per_node=gpus_per_node)
        prometheus = Prometheus(control_plane, self.run_dir / "prometheus")
        autoscaler = Keda(control_plane, self.run_dir / "keda") if keda else None
        parts: list[Any] = [
            control_plane,
            cluster,
            prometheus,
            *([autoscaler] if autoscaler else []),
        ]
        try:
            for part in parts:
                part.start()
        except BaseException:
            for part in reversed(parts):
                part.stop()
            raise
        state = {
            "kubeconfig": str(control_plane.kubeconfig),
            "server": control_plane.server,
            "prometheus": prometheus.url,
            "nodes": cluster.node_names,
            "run_dir": str(self.run_dir),
            "backer_dir": str(cluster.backer_dir),
            "seconds": {
                "apiserver_ready": round(control_plane.ready_seconds or 0, 1),
                "cluster_ready": round(time.monotonic() - started, 1),
                **({"keda_ready": round(autoscaler.ready_seconds or 0, 1)} if autoscaler else {}),
            },
            # KEDA's address on `lo`, which `down` removes
            "keda": autoscaler and {"version": autoscaler.version, "address": autoscaler.address},
            "processes": [
                asdict(r)
                for part in parts
                for r in part.supervisor.records  # start order; `down` reverses it
            ],
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2))
        return state

    def down(self) -> list[str]:
        state = self.load()
        if state is None:
            return []
        supervisor = Supervisor()
        records = self.records()
        supervisor.adopt(records)
        alive = [r.name for r in records if is_ours(r)]
        supervisor.stop_all()
        kill_leftover_pods(Path(state["backer_dir"]))
        if state.get("keda"):
            release_host_address(state["keda"]["address"])
        self.state_file.unlink(missing_ok=True)
        return alive

    def status(self) -> dict[str, Any]:
        state = self.load()
        if state is None:
            return {"up": False}
        processes = {r.name: ("running" if is_ours(r) else "gone") for r in self.records()}
        return {
            "up": all(v == "running" for v in processes.values()),
            "kubeconfig": state["kubeconfig"],
            "prometheus": state["prometheus"],
            "processes": processes,
        }
