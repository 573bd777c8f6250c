"""Start-up stays fast, and `wok dev up`/`down` leave nothing running: not the control plane, not
the pod backer, not a pod's process nor the children that process spawned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wok_cluster.binaries import kubectl_path
from wok_cluster.kubeapi import KubeApi
from wok_cluster.process import command_line, processes_marked
from wok_cluster.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # times the cluster start: alone

WOK = str(Path(sys.executable).parent / "wok")


def test_start_times(wok_apiserver, wok_cluster):
    assert wok_apiserver.ready_seconds is not None and wok_cluster.ready_seconds is not None
    assert wok_apiserver.ready_seconds < 20
    assert wok_apiserver.ready_seconds + wok_cluster.ready_seconds < 45


def _wok_dev(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WOK, "dev", *args], env=env, capture_output=True, text=True, check=False, timeout=120
    )


@pytest.mark.slow
def test_wok_dev_up_and_down_leave_no_process(wok_binaries, tmp_path):
    env = {**os.environ, "WOK_DEV_DIR": str(tmp_path / "dev")}
    up = _wok_dev(env, "up", "--nodes", "1")
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = Path(_wok_dev(env, "kubeconfig").stdout.strip())
        assert up.stdout.strip() == f"export KUBECONFIG={kubeconfig}"
        assert _wok_dev(env, "status").returncode == 0
        nodes = subprocess.run(
            [kubectl_path(), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert nodes.stdout.split() == ["node/wok-gpu-0"]
        # a backed pod whose process forks a child into its process group
        spawner = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
        with KubeApi.from_kubeconfig(kubeconfig) as api:
            api.create(
                "/api/v1/namespaces/default/pods",
                {
                    "metadata": {"name": "sleeper", "labels": {"wok.dev/backed": "true"}},
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "none", "command": ["python", "-c", spawner]}
                        ]
                    },
                },
            )

            def pid() -> int | None:
                pod = api.get("/api/v1/namespaces/default/pods/sleeper")
                statuses = pod.get("status", {}).get("containerStatuses", [])
                cid = statuses[0].get("containerID", "") if statuses else ""
                return int(cid.removeprefix("wok-backer://")) if cid else None

            pod_pid = wait_until(pid, timeout=60, what="sleeper running")
        run_dir = str(tmp_path / "dev" / "run")

        # etcd, apiserver, cm, scheduler, kwok, backer, prometheus, the pod and its child
        def all_nine() -> set[int] | None:
            marked = {pid for pid, _ in processes_marked(run_dir)}
            return marked if len(marked) >= 9 else None

        marked = wait_until(all_nine, timeout=30, what="the pod's child process")
        assert pod_pid in marked
    finally:
        down = _wok_dev(env, "down")
    assert down.returncode == 0, down.stderr
    assert command_line(pod_pid) is None
    assert processes_marked(run_dir) == []
    assert _wok_dev(env, "status").returncode == 1
