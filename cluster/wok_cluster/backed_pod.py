"""One backed pod: its containers as local processes (or, for a pod labelled
`wok.dev/container=true`, as podman containers from their images: podman_container.py) and the
pod status the kubelet would report."""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from wok_cluster.container import Container, LaunchSpec, now_rfc3339
from wok_cluster.expand import expand, field_ref, resource_field_ref
from wok_cluster.images import ImageError
from wok_cluster.kubeapi import KubeApi, KubeError
from wok_cluster.podman_container import (
    PodmanContainer,
    container_launch,
    container_name,
    wants_containers,
)
from wok_cluster.process import RUN_MARKER
from wok_cluster.vllm_process import is_vllm, vllm_argv, vllm_env
from wok_cluster.vllm_sim import sim_vllm_argv
from wok_cluster.volumes import VolumeError, materialize, mount_table, rewrite

# host variables a pod process inherits: enough to find programs and caches, nothing cluster-ish
# (no KUBERNETES_SERVICE_HOST: that would point clients at a ClusterIP)
PASSTHROUGH_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "HF_HOME",
    "TORCH_HOME",
    "XDG_CACHE_HOME",
    "HF_HUB_OFFLINE",
    RUN_MARKER,
)


RETRY_SECONDS = 1.0  # a missing Secret or ConfigMap is looked up again this often


def map_program(program: str) -> str:
    """`wok` and `python` mean this environment's (the image would ship both)."""
    bin_dir = Path(sys.executable).parent
    if program == "wok":
        return str(bin_dir / "wok")
    if program in ("python", "python3"):
        return sys.executable
    return program


#: The emulated GPU nodes have no GPU: a runtime pod rendered with `--device=cuda` runs its
#: model on the host CPU instead. The one place where the CPU stands in for a GPU, named here;
#: the runtime itself refuses `--device cuda` when CUDA is not available.
EMULATED_DEVICE = "cpu"


def emulate_gpu(argv: list[str]) -> list[str]:
    """`argv` with a CUDA device flag (`--device=cuda[:N]` or `--device cuda[:N]`) moved to
    the emulated node's device."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--device=cuda"):
            arg = f"--device={EMULATED_DEVICE}"
        elif out and out[-1] == "--device" and arg.startswith("cuda"):
            arg = EMULATED_DEVICE
        out.append(arg)
    return out


class BackedPod:
    def __init__(
        self, pod: Mapping[str, Any], directory: Path, *, vllm_sim_profile: str | None = None
    ) -> None:
        self.pod = pod
        # set: a vLLM container runs as the fake vLLM pod on this simulated accelerator
        self.vllm_sim_profile = vllm_sim_profile
        self.uid: str = pod["metadata"]["uid"]
        self.directory = directory
        policy = pod["spec"].get("restartPolicy", "Always")
        # container mode (podman_container.py) on request; else each container is a process
        self.in_containers = wants_containers(pod)
        self.containers = [
            PodmanContainer(spec, policy, name=container_name(pod, spec["name"]))
            if self.in_containers
            else Container(spec, policy)
            for spec in pod["spec"]["containers"]
        ]
        # Init containers run one at a time, each to success, before the containers start (as
        # the kubelet runs them; a failed one restarts unless the pod's policy is Never).
        init_policy = "Never" if policy == "Never" else "OnFailure"
        self.init_containers = [
            Container(spec, init_policy) for spec in pod["spec"].get("initContainers", [])
        ]
        self._launches: list[LaunchSpec] = []  # the containers', started once init is done
        self.started = False
        self.terminating = False
        self._transitions: dict[str, tuple[str, str]] = {}
        self.last_patch: dict[str, Any] | None = None
        self.last_patch_time = 0.0
        self._next_try = 0.0

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    @property
    def pod_ip(self) -> str:
        return str(self.pod.get("status", {}).get("podIP", ""))

    @property
    def grace_seconds(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))
        return float(30 if grace is None else grace)

    def try_start(self, api: KubeApi) -> None:
        """Materializes volumes and starts every container; retried while a volume is missing."""
        if time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + RETRY_SECONDS
        try:
            volume_dirs = materialize(api, self.pod, self.directory / "volumes")
            launch = self._container_launch if self.in_containers else self._launch
            launches = [launch(api, c.spec, volume_dirs) for c in self.containers]
            if self.init_containers and self.in_containers:
                raise ValueError("init containers run in process mode only")
            init_launches = [self._launch(api, c.spec, volume_dirs) for c in self.init_containers]
        except (VolumeError, KubeError, ValueError) as error:
            for container in self.containers:
                container.fail_config("CreateContainerConfigError", str(error))
            return
        except ImageError as error:
            for container in self.containers:
                container.fail_config("ErrImageNeverPull", str(error))
            return
        for container, init_launch in zip(self.init_containers, init_launches, strict=True):
            container.launch = init_launch  # started in turn by tick()
            container.waiting_reason = "PodInitializing"
        if self.init_containers:
            for container in self.containers:
                container.waiting_reason = "PodInitializing"
        self._launches = launches
        self.started = True
        if not self.init_containers:
            self._start_containers()

    def _start_containers(self) -> None:
        for container, launch in zip(self.containers, self._launches, strict=True):
            if launch.argv:
                container.start(launch)
            else:
                container.fail_config(
                    "CreateContainerError",
                    "no command: a process-mode container needs `command` (or label the pod "
                    "wok.dev/container=true to run its image)",
                )
        self._launches = []

    @property
    def initialized(self) -> bool:
        return all(_succeeded(c) for c in self.init_containers)

    def _tick_init(self) -> None:
        """Runs the first init container that has not succeeded; the containers after the last."""
        current = next((c for c in self.init_containers if not _succeeded(c)), None)
        if current is None:
            self._start_containers()
            return
        if current.done:
            return  # failed with restartPolicy Never: the pod has failed
        assert current.launch is not None
        if not current.launch.argv:
            current.fail_config("CreateContainerError", "no command: an init container needs one")
        elif not current.started_at:
            current.start(current.launch)
        else:
            current.tick(self.pod_ip)
        if self.initialized:
            self._start_containers()

    def tick(self) -> None:
        if self._launches:
            self._tick_init()
            return
        for container in self.containers:
            container.tick(self.pod_ip)

    def stop(self, grace: float) -> None:
        for container in [*self.init_containers, *self.containers]:
            container.stop(grace)

    def status(self) -> dict[str, Any]:
        statuses = [c.status() for c in self.containers]
        all_ready = all(s["ready"] for s in statuses)
        init_failed = any(c.done and not _succeeded(c) for c in self.init_containers)
        if init_failed:
            phase = "Failed"
        elif all(c.done for c in self.containers) and self.started:
            failed = any(s["state"]["terminated"]["exitCode"] != 0 for s in statuses)
            phase = "Failed" if failed else "Succeeded"
        elif self.started and any(
            c.running or c.restart_count or c.last_terminated for c in self.containers
        ):
            phase = "Running"
        else:
            phase = "Pending"
        ready = "True" if all_ready else "False"
        not_ready = [s["name"] for s in statuses if not s["ready"]]
        message = f"containers with unready status: [{' '.join(not_ready)}]" if not_ready else ""
        initialized = "True" if self.initialized else "False"
        conditions = [
            self._condition(
                "Initialized",
                initialized,
                "containers with incomplete status",
                reason="ContainersNotInitialized",
            ),
            self._condition("ContainersReady", ready, message),
            self._condition("Ready", ready, message),
        ]
        status = {"phase": phase, "conditions": conditions, "containerStatuses": statuses}
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status

    def _condition(
        self, kind: str, status: str, message: str, *, reason: str = "ContainersNotReady"
    ) -> dict[str, Any]:
        # lastTransitionTime moves only when the status does
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, now_rfc3339())
        condition = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self._transitions[kind][1],
        }
        if status == "True":
            # null deletes the field in a strategic merge patch: no stale "ContainersNotReady"
            condition |= {"reason": None, "message": None}
        else:
            condition |= {"reason": reason, "message": message}
        return condition

    def needs_report(self, status: Mapping[str, Any]) -> bool:
        """Whether the pod object disagrees with what the backer knows (someone else may have
        changed it, e.g. the node controller marking pods unready), or was never told."""
        if status != self.last_patch:
            return True
        observed = self.pod.get("status", {})
        if observed.get("phase") != status["phase"]:
            return True
        seen = {c["type"]: c["status"] for c in observed.get("conditions", [])}
        if any(seen.get(c["type"]) != c["status"] for c in status["conditions"]):
            return True
        return [_summary(c) for c in observed.get("containerStatuses", [])] != [
            _summary(c) for c in status["containerStatuses"]
        ]

    def _launch(
        self, api: KubeApi, spec: Mapping[str, Any], volume_dirs: Mapping[str, Path]
    ) -> LaunchSpec:
        mounts = mount_table(spec, volume_dirs)
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        env = self._env(api, spec, env, mounts)
        command = [rewrite(expand(arg, env), mounts) for arg in spec.get("command", [])]
        args = [rewrite(expand(arg, env), mounts) for arg in spec.get("args", [])]
        if is_vllm(spec) and self.vllm_sim_profile:  # the fake vLLM pod (vllm_sim.py)
            argv = sim_vllm_argv(command, args, pod_ip=self.pod_ip, profile=self.vllm_sim_profile)
            argv = [map_program(argv[0]), *argv[1:]]
        elif is_vllm(spec):  # vLLM's CPU build in its own venv (vllm_process.py)
            argv, env = vllm_argv(command, args, pod_ip=self.pod_ip), vllm_env(env)
        else:
            argv = [*command, *args]
            if argv:
                argv = [map_program(argv[0]), *emulate_gpu(argv[1:])]
        work = spec.get("workingDir")
        name = spec["name"]
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=Path(rewrite(work, mounts)) if work else self.directory / "work" / name,
            log=self.directory / f"{name}.log",
            pid_file=self.directory / f"{name}.pid",
        )

    def _container_launch(
        self, api: KubeApi, spec: Mapping[str, Any], volume_dirs: Mapping[str, Path]
    ) -> LaunchSpec:
        """Container mode: the pod's own env (no host variables), paths as the pod names them."""
        server = urlsplit(api.server)
        # what the kubelet injects: in-cluster clients find the apiserver (here its real address)
        env = {
            "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
        }
        env = self._env(api, spec, env, {})
        command = [expand(arg, env) for arg in spec.get("command", [])]
        args = [expand(arg, env) for arg in spec.get("args", [])]
        return container_launch(
            pod=self.pod,
            spec=spec,
            env=env,
            command=command[:1] + emulate_gpu(command[1:]),
            args=emulate_gpu(args),
            volume_dirs=volume_dirs,
            directory=self.directory,
            owner=str(self.directory.parent.parent),
        )

    def _env(
        self,
        api: KubeApi,
        spec: Mapping[str, Any],
        env: dict[str, str],
        mounts: Mapping[str, Path],
    ) -> dict[str, str]:
        """`env` with the pod's HOSTNAME, envFrom and env (values expanded, paths rewritten)."""
        env["HOSTNAME"] = self.pod["metadata"]["name"]
        for source in spec.get("envFrom", []):
            env |= {
                (source.get("prefix", "") + k): v for k, v in self._env_from(api, source).items()
            }
        for var in spec.get("env", []):
            env[var["name"]] = rewrite(self._env_value(api, spec, var, env), mounts)
        return env

    def _env_value(
        self, api: KubeApi, spec: Mapping[str, Any], var: Mapping[str, Any], env: Mapping[str, str]
    ) -> str:
        if "valueFrom" not in var:
            return expand(str(var.get("value", "")), env)
        source = var["valueFrom"]
        if "fieldRef" in source:
            return field_ref(self.pod, source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return resource_field_ref(spec, source["resourceFieldRef"])
        kind = "secrets" if "secretKeyRef" in source else "configmaps"
        ref = source.get("secretKeyRef") or source["configMapKeyRef"]
        data = self._get_data(api, kind, ref["name"], optional=bool(ref.get("optional")))
        if ref["key"] not in data and not ref.get("optional"):
            raise ValueError(f"key {ref['key']!r} not in {kind} {ref['name']}")
        return data.get(ref["key"], "")

    def _env_from(self, api: KubeApi, source: Mapping[str, Any]) -> dict[str, str]:
        kind = "secrets" if "secretRef" in source else "configmaps"
        ref = source.get("secretRef") or source["configMapRef"]
        return self._get_data(api, kind, ref["name"], optional=bool(ref.get("optional")))

    def _get_data(self, api: KubeApi, kind: str, name: str, *, optional: bool) -> dict[str, str]:
        namespace = self.pod["metadata"]["namespace"]
        try:
            obj = api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except KubeError as error:
            if error.status == 404 and optional:
                return {}
            raise
        data = obj.get("data", {})
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in data.items()}
        return dict(data)


def _summary(container_status: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        container_status.get("name"),
        container_status.get("ready"),
        container_status.get("restartCount"),
        tuple(container_status.get("state", {})),
        container_status.get("containerID"),
    )


def _succeeded(container: Container) -> bool:
    return container.terminated is not None and container.terminated["exitCode"] == 0
