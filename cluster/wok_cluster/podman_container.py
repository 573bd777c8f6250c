"""The backer's container mode: one container of a backed pod run from its image with podman.

A pod labelled `wok.dev/container=true` (opt-in: the rest of the suite keeps the faster process
mode) runs each container from its image in the local store (`make image`), as a kubelet with a
container runtime would: `--network host` on the pod's loopback IP, the pod's env (an env file),
its volumes bind-mounted at their mountPaths (owned by the pod's user, as fsGroup does), its
securityContext (user, read-only root, dropped capabilities) and its limits (memory, cpu)
enforced by the container runtime, so a memory limit too small for the model is an OOM kill
that the pod status reports (`OOMKilled`). `command` replaces the image's entrypoint and `args`
its cmd. A missing image is `ErrImageNeverPull` (nothing is pulled here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wok_cluster.container import Container, LaunchSpec
from wok_cluster.images import ImageError, podman, podman_env

CONTAINER_LABEL = "wok.dev/container"
#: every container the backer starts carries this label (its state dir), for leftover removal
OWNER_LABEL = "wok.dev/backer"

_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?|[kmun]?)$")
_FACTORS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_FACTORS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 10**-3}


def quantity(text: str) -> float:
    """A Kubernetes quantity (`512Mi`, `1G`, `500m`, `2`) as a number."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _FACTORS:
        raise ValueError(f"unsupported quantity {text!r}")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def wants_containers(pod: Mapping[str, Any]) -> bool:
    return pod["metadata"].get("labels", {}).get(CONTAINER_LABEL) == "true"


def image_present(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def container_name(pod: Mapping[str, Any], container: str) -> str:
    meta = pod["metadata"]
    return f"wok-{meta['namespace']}-{meta['name']}-{container}-{meta['uid'][:8]}"[:200]


def _security(pod: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[list[str], int, int]:
    """podman flags for the securityContext, and the uid/gid that owns the volumes."""
    pod_context = pod["spec"].get("securityContext", {})
    context = {**pod_context, **spec.get("securityContext", {})}
    flags: list[str] = []
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if uid is not None:
        flags.append(f"--user={uid}:{gid if gid is not None else uid}")
    fs_group = pod_context.get("fsGroup")
    if fs_group is not None:
        flags.append(f"--group-add={fs_group}")
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if context.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    for cap in context.get("capabilities", {}).get("drop", []):
        flags.append(f"--cap-drop={cap}")
    owner_gid = fs_group if fs_group is not None else gid
    return flags, int(uid or 0), int(owner_gid if owner_gid is not None else uid or 0)


def _limits(spec: Mapping[str, Any]) -> list[str]:
    limits = spec.get("resources", {}).get("limits", {})
    flags = []
    if "memory" in limits:
        memory = int(quantity(limits["memory"]))
        flags += [f"--memory={memory}", f"--memory-swap={memory}"]  # no swap: an OOM kill
    if "cpu" in limits:
        flags.append(f"--cpus={quantity(limits['cpu']):g}")
    return flags


def _chown(directory: Path, uid: int, gid: int) -> None:
    for path in [directory, *directory.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def container_launch(
    *,
    pod: Mapping[str, Any],
    spec: Mapping[str, Any],
    env: Mapping[str, str],
    command: Sequence[str],
    args: Sequence[str],
    volume_dirs: Mapping[str, Path],
    directory: Path,
    owner: str,
) -> LaunchSpec:
    """The `podman run` of one container (`env`, `command`, `args` already expanded)."""
    image = spec.get("image", "")
    if not image_present(image):
        raise ImageError(f"image {image!r} is not in the local store (`make image` builds wok's)")
    name = spec["name"]
    env_file = directory / f"{name}.env"
    if any("\n" in f"{k}{v}" for k, v in env.items()):
        raise ValueError("an env value with a newline cannot go into podman's env file")
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    env_file.chmod(0o600)
    security, uid, gid = _security(pod, spec)
    argv = ["podman", "run", "--replace", f"--name={container_name(pod, name)}"]
    argv += ["--network=host", f"--env-file={env_file}", f"--label={OWNER_LABEL}={owner}"]
    argv += ["--pull=never", *security, *_limits(spec)]
    for mount in spec.get("volumeMounts", []):
        local = volume_dirs[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
        _chown(local, uid, gid)
        flag = f"--volume={local}:{mount['mountPath']}"
        argv.append(flag + (":ro" if mount.get("readOnly") else ""))
    if spec.get("workingDir"):
        argv.append(f"--workdir={spec['workingDir']}")
    if command:
        argv.append(f"--entrypoint={json.dumps(list(command))}")
    return LaunchSpec(
        argv=[*argv, image, *args],
        env=podman_env(),  # the client's: the container gets only the env file
        cwd=directory / "work" / name,
        log=directory / f"{name}.log",
        pid_file=directory / f"{name}.pid",
    )


def oom_killed(container_id: str) -> bool:
    """Whether the kernel logged an OOM kill in the container's memory cgroup, which is how the
    kubelet (cadvisor's oomparser) knows: conmon misses it under this VM's hybrid cgroups."""
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    return any(
        line.startswith("oom-kill:") and "oom_memcg=" in line and f"libpod-{container_id}" in line
        for line in (entry.partition("] ")[2] for entry in log.splitlines())
    )


class PodmanContainer(Container):
    """A Container whose process is `podman run` (attached): its exit is the container's. Stops
    go through `podman stop` (SIGTERM, SIGKILL after the grace period), not the client."""

    def __init__(self, spec: Mapping[str, Any], restart_policy: str, *, name: str) -> None:
        super().__init__(spec, restart_policy)
        self.container_name = name

    def _record_exit(self, code: int, reason: str, message: str) -> None:
        if self.popen is not None:
            state = podman(
                "inspect", "--format={{.Id}} {{.State.OOMKilled}}", self.container_name, check=False
            ).stdout.split()
            if len(state) == 2 and (state[1] == "true" or oom_killed(state[0])):
                reason, message = "OOMKilled", message or "the memory limit was reached"
            podman("rm", "--force", "--time=0", self.container_name, check=False)
        super()._record_exit(code, reason, message)

    def stop(self, grace: float) -> None:
        if self.popen is not None:
            podman(
                "stop",
                f"--time={max(0, round(grace))}",
                self.container_name,
                timeout=grace + 60,
                check=False,
            )
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        super().stop(grace)

    def status(self) -> dict[str, Any]:
        status = super().status()
        if "containerID" in status:
            status["containerID"] = f"podman://{self.container_name}"
        return status


def remove_leftovers(owner: str) -> list[str]:
    """Removes containers a previous backer with this state dir started and did not stop."""
    try:
        listed = podman(
            "ps", "--all", f"--filter=label={OWNER_LABEL}={owner}", "--format={{.Names}}"
        )
    except ImageError:
        return []  # no podman: there can be no containers
    names = listed.stdout.split()
    if names:
        podman("rm", "--force", "--time=5", *names, timeout=120, check=False)
    return names
