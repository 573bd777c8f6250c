"""The pod backer: the kubelet of backed pods on KWOK nodes, running each as a local process.

A pod opts in with the label `wok.dev/backed=true` (KWOK's stages leave such pods to us once it
has assigned their loopback pod IP). For each one the backer runs the containers' command+args
with the pod's env, downward-API values and volumes (see volumes.py), reports status like the
kubelet (Running, Ready from the real readinessProbe, restarts, exit codes), and on deletion stops
the processes (SIGTERM, SIGKILL after the grace period) and then removes the pod.
A pod labelled `wok.dev/container=true` runs its images instead, with podman (container mode,
podman_container.py).

Runs as its own process (`wok dev backer`), so the pod processes are never children of pytest.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from wok_cluster.backed_pod import BackedPod
from wok_cluster.kubeapi import STRATEGIC_PATCH, KubeApi, KubeError
from wok_cluster.podman_container import remove_leftovers
from wok_cluster.process import ProcessRecord, stop_recorded

BACKED_LABEL = "wok.dev/backed"
SELECTOR = f"{BACKED_LABEL}=true"
TICK_SECONDS = 0.2

log = logging.getLogger("wok.backer")


class PodBacker:
    def __init__(
        self, kubeconfig: Path, state_dir: Path, *, vllm_sim_profile: str | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.vllm_sim_profile = vllm_sim_profile  # vllm_sim.py: vLLM pods as fakes on it
        self.state_dir = state_dir
        self.api = KubeApi.from_kubeconfig(kubeconfig)
        self._seen: dict[str, dict[str, Any]] = {}  # uid -> latest Pod object; written by watcher
        self._gone: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listed = threading.Event()
        self.pods: dict[str, BackedPod] = {}
        self._terminations: dict[str, threading.Thread] = {}

    def run(self) -> None:
        kill_leftover_pods(self.state_dir)
        remove_leftovers(str(self.state_dir))
        watcher = threading.Thread(target=self._watch, name="pod-watch", daemon=True)
        watcher.start()
        if not self._listed.wait(timeout=60):
            raise RuntimeError("could not list pods within 60s")
        (self.state_dir / "ready").write_text("watching\n")
        while not self._stopping.is_set():
            self._reconcile()
            self._stopping.wait(TICK_SECONDS)
        self._shutdown()

    def stop(self) -> None:
        self._stopping.set()

    # --- watching (its own thread: it only records what the API says) ---

    def _watch(self) -> None:
        api = KubeApi.from_kubeconfig(self.kubeconfig)
        version = ""
        while not self._stopping.is_set():
            try:
                if not version:
                    listing = api.get("/api/v1/pods", labelSelector=SELECTOR)
                    with self._lock:
                        current = {p["metadata"]["uid"]: p for p in listing["items"]}
                        self._gone |= set(self._seen) - set(current)
                        self._seen = current
                    version = listing["metadata"]["resourceVersion"]
                    self._listed.set()
                for event in api.watch(
                    "/api/v1/pods", resource_version=version, labelSelector=SELECTOR
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = ""  # 410 Gone: relist
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    uid = obj["metadata"]["uid"]
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._seen.pop(uid, None)
                            self._gone.add(uid)
                        else:
                            self._seen[uid] = obj
            except Exception as error:
                if self._stopping.is_set():
                    break
                log.warning("watch failed (%s); relisting", error)
                version = ""
                self._stopping.wait(1.0)

    # --- reconciling (main thread) ---

    def _reconcile(self) -> None:
        with self._lock:
            seen = dict(self._seen)
            gone, self._gone = self._gone, set()
        for uid in gone:
            backed = self.pods.pop(uid, None)
            if backed is not None and uid not in self._terminations:
                log.info("pod %s removed: stopping its processes", backed.key)
                backed.stop(grace=backed.grace_seconds)
        for uid, pod in seen.items():
            if not pod["spec"].get("nodeName"):
                continue
            backed = self.pods.get(uid)
            if backed is None:
                backed = self.pods[uid] = BackedPod(
                    pod, self._pod_dir(pod), vllm_sim_profile=self.vllm_sim_profile
                )
            backed.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(backed)
                continue
            if not backed.pod_ip:
                continue  # KWOK has not assigned the IP yet
            if not backed.started:
                backed.try_start(self.api)
                if backed.started:
                    log.info("pod %s started on %s", backed.key, backed.pod_ip)
            backed.tick()
            self._report(backed)
        for uid, thread in list(self._terminations.items()):
            if not thread.is_alive():
                del self._terminations[uid]
                self.pods.pop(uid, None)

    def _pod_dir(self, pod: dict[str, Any]) -> Path:
        meta = pod["metadata"]
        directory = (
            self.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        )
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _report(self, backed: BackedPod) -> None:
        status = backed.status()
        if not backed.needs_report(status):
            return
        now = time.monotonic()
        if status == backed.last_patch and now - backed.last_patch_time < 1.0:
            return  # the watch may not have delivered our own last patch yet
        meta = backed.pod["metadata"]
        try:
            self.api.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"metadata": {"uid": meta["uid"]}, "status": status},
                content_type=STRATEGIC_PATCH,
            )
            backed.last_patch, backed.last_patch_time = status, now
        except KubeError as error:
            if error.status not in (404, 409, 422):
                raise
            log.info("status of %s not written: %s", backed.key, error.message)

    def _terminate(self, backed: BackedPod) -> None:
        if backed.uid in self._terminations:
            return

        def run() -> None:
            meta = backed.pod["metadata"]
            backed.stop(grace=backed.grace_seconds)
            log.info("pod %s stopped; finishing its deletion", backed.key)
            try:
                self.api.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                )
            except KubeError as error:
                if error.status not in (404, 409):
                    log.warning("deleting %s: %s", backed.key, error)

        thread = threading.Thread(target=run, name=f"terminate-{backed.key}", daemon=True)
        self._terminations[backed.uid] = thread
        thread.start()

    def _shutdown(self) -> None:
        # like a kubelet stopping: processes end, pods stay (their status goes stale)
        for backed in self.pods.values():
            backed.stop(grace=min(backed.grace_seconds, 10.0))
        for thread in self._terminations.values():
            thread.join(timeout=35)
        kill_leftover_pods(self.state_dir)
        remove_leftovers(str(self.state_dir))


def kill_leftover_pods(state_dir: Path) -> list[int]:
    """Stops pod processes a previous backer recorded but did not stop (it was killed)."""
    stopped = []
    for pid_file in sorted((state_dir / "pods").glob("*/*.pid")):
        try:
            record = json.loads(pid_file.read_text())
        except (ValueError, FileNotFoundError):
            continue
        if stop_recorded(
            ProcessRecord(
                name=pid_file.stem, pid=record["pid"], executable=record["executable"], log=""
            ),
            grace=5.0,
        ):
            stopped.append(record["pid"])
        pid_file.unlink(missing_ok=True)
    return stopped


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    backer = PodBacker(
        Path(args.kubeconfig), state_dir, vllm_sim_profile=args.vllm_sim_profile or None
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: backer.stop())
    started = time.monotonic()
    backer.run()
    log.info("backer stopped after %.0fs", time.monotonic() - started)
    return 0
