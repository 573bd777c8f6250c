"""One container of a backed pod as a local process: start, restart with back-off, probe, stop.

The kubelet's container lifecycle, scaled to tests: restart back-off starts at 1 s and caps at
30 s (the kubelet's 10 s / 5 min would make crash tests slow); readiness comes from the real
readinessProbe, or from "the process is running" when the container has none.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wok_cluster.probe import http_get_ok
from wok_cluster.process import group_members, stop_group

BACKOFF_START = 1.0
BACKOFF_CAP = 30.0


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LaunchSpec:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log: Path
    pid_file: Path


class Container:
    def __init__(self, spec: Mapping[str, Any], restart_policy: str) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.restart_policy = restart_policy
        self.launch: LaunchSpec | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at = ""
        self.started_mono = 0.0
        self.restart_count = 0
        self.waiting_reason = "ContainerCreating"
        self.waiting_message = ""
        self.terminated: dict[str, Any] | None = None
        self.last_terminated: dict[str, Any] | None = None
        self.next_start = 0.0
        self.ready = False
        self._probe_due = 0.0
        self._successes = 0
        self._failures = 0
        self.done = False  # terminated for good (restart policy says so)

    def fail_config(self, reason: str, message: str) -> None:
        self.waiting_reason, self.waiting_message = reason, message

    def start(self, launch: LaunchSpec) -> None:
        self.launch = launch
        launch.log.parent.mkdir(parents=True, exist_ok=True)
        launch.cwd.mkdir(parents=True, exist_ok=True)
        with launch.log.open("ab") as out:
            try:
                self.popen = subprocess.Popen(
                    list(launch.argv),
                    env=dict(launch.env),
                    cwd=launch.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as error:
                self._record_exit(128, "StartError", str(error))
                return
        launch.pid_file.write_text(
            json.dumps({"pid": self.popen.pid, "executable": launch.argv[0]})
        )
        self.started_at, self.started_mono = now_rfc3339(), time.monotonic()
        self.terminated = None
        self.ready = False
        self._successes = self._failures = 0
        self._probe_due = self.started_mono + float(
            self.spec.get("readinessProbe", {}).get("initialDelaySeconds", 0)
        )

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tick(self, pod_ip: str) -> None:
        """Notices exits, restarts when the policy says so, runs the readiness probe when due."""
        now = time.monotonic()
        if self.popen is not None and self.popen.poll() is not None:
            code = self.popen.returncode
            self._record_exit(code, "Completed" if code == 0 else "Error", "")
        if (
            self.popen is None
            and self.launch is not None
            and not self.done
            and now >= self.next_start
        ):
            self.restart_count += 1
            self.start(self.launch)
        if self.running:
            self._probe(pod_ip, now)

    def _record_exit(self, code: int, reason: str, message: str) -> None:
        if self.popen is not None:
            if self.launch is not None:
                self.launch.pid_file.unlink(missing_ok=True)
            # the group may hold children of the exited process: they go with it
            if group_members(self.popen.pid):
                stop_group(self.popen.pid, grace=2.0)
        self.popen = None
        self.ready = False
        self.terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": self.started_at or now_rfc3339(),
            "finishedAt": now_rfc3339(),
        }
        if message:
            self.terminated["message"] = message
        restart = self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and code != 0
        )
        if restart:
            backoff = min(BACKOFF_CAP, BACKOFF_START * 2 ** min(self.restart_count, 10))
            self.next_start = time.monotonic() + backoff
            self.last_terminated = self.terminated
            self.terminated = None
            self.waiting_reason, self.waiting_message = (
                "CrashLoopBackOff",
                (f"back-off {backoff:.0f}s restarting failed container={self.name}"),
            )
        else:
            self.done = True

    def _probe(self, pod_ip: str, now: float) -> None:
        probe = self.spec.get("readinessProbe")
        if probe is None:
            self.ready = True
            return
        if "httpGet" not in probe:
            # exec/tcp/grpc probes: no container to exec in; treat as the process running
            self.ready = True
            return
        if now < self._probe_due:
            return
        self._probe_due = now + float(probe.get("periodSeconds", 10))
        if http_get_ok(probe, self.spec, pod_ip):
            self._successes, self._failures = self._successes + 1, 0
            if self._successes >= int(probe.get("successThreshold", 1)):
                self.ready = True
        else:
            self._failures, self._successes = self._failures + 1, 0
            if self._failures >= int(probe.get("failureThreshold", 3)):
                self.ready = False

    def stop(self, grace: float) -> None:
        if self.popen is not None:
            stop_group(self.popen.pid, grace=grace, reap=self.popen)
            code = self.popen.returncode if self.popen.returncode is not None else 137
            self._record_exit(code, "Completed" if code == 0 else "Error", "")
        self.done = True

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.running,
            "restartCount": self.restart_count,
        }
        if self.running:
            assert self.popen is not None
            status["containerID"] = f"wok-backer://{self.popen.pid}"
            status["state"] = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            status["state"] = {"terminated": self.terminated}
        else:
            waiting = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            status["state"] = {"waiting": waiting}
        if self.last_terminated is not None:
            status["lastState"] = {"terminated": self.last_terminated}
        return status
