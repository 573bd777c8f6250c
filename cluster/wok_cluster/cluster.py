"""The emulated cluster: a ControlPlane plus controller-manager, scheduler, KWOK GPU nodes and the
pod backer, i.e. everything between `kubectl apply -f deployment.yaml` and a live process per pod.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from wok_cluster.apiserver import ControlPlane
from wok_cluster.kubeapi import KubeApi, KubeError
from wok_cluster.netutil import claim_pod_octet, free_port
from wok_cluster.nodes import KWOK_ANNOTATION, gpu_node
from wok_cluster.process import Supervisor
from wok_cluster.waiting import wait_until

KWOK_STAGES = Path(__file__).resolve().parent / "kwok_stages.yaml"

#: The controller-manager's and the scheduler's client rate limits (queries/s, burst). Their
#: defaults (20/30 and 50/100) throttle the controllers to a few Deployments a second: each one
#: takes a ReplicaSet, a pod, status updates and Events, so 1,000 services waited minutes in the
#: clients' own limiters while the apiserver had room. kwokctl lifts them the same way
#: (`disableQPSLimits`); the apiserver's priority and fairness still protects it.
CLIENT_QPS = 1000
CLIENT_BURST = 2000


def wok_executable() -> str:
    """The `wok` script of the running interpreter's environment (the venv's)."""
    return str(Path(sys.executable).parent / "wok")


class Cluster:
    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        nodes: int = 2,
        gpus_per_node: int = 8,
        backer: bool = True,
        hpa_sync_seconds: float | None = None,
        vllm_sim_profile: str | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.run_dir = control_plane.run_dir
        self.node_count = nodes
        self.gpus_per_node = gpus_per_node
        self.with_backer = backer
        # None: the HPA controller's upstream sync period (15 s), as a real cluster has it
        self.hpa_sync_seconds = hpa_sync_seconds
        # a simulated accelerator's profile: vLLM pods run as fakes on it (vllm_sim.py)
        self.vllm_sim_profile = vllm_sim_profile
        self.supervisor = Supervisor(run_marker=str(self.run_dir))
        self.backer_dir = self.run_dir / "backer"
        self.pod_octet, self._pod_network_claim = claim_pod_octet()
        # every pod IP of this cluster is in here; nodes get /24s of it
        self.pod_network = f"127.{self.pod_octet}.0.0/16"
        self.ready_seconds: float | None = None
        # The controllers' secure ports (their /metrics, with the admin token), once started.
        self.ports: dict[str, int] = {}

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def node_names(self) -> list[str]:
        return [gpu_node(i, gpus=0, octet=0)["metadata"]["name"] for i in range(self.node_count)]

    def api(self) -> KubeApi:
        return self.control_plane.api()

    def start(self, *, timeout: float = 90.0) -> Cluster:
        started = time.monotonic()
        deadline = started + timeout
        cm_port, scheduler_port = free_port(), free_port()
        self.ports = {"kube-controller-manager": cm_port, "kube-scheduler": scheduler_port}
        cm = self._start_controller_manager(cm_port)
        scheduler = self._start_scheduler(scheduler_port)
        kwok = self._start_kwok()
        with self.api() as api:
            self._create_nodes(api)
            for popen, port in ((cm, cm_port), (scheduler, scheduler_port)):
                wait_until(
                    lambda popen=popen, port=port: (
                        self.supervisor.check_alive(popen) or _healthz(port)
                    ),
                    timeout=deadline - time.monotonic(),
                    what=f"{popen.args[0]} /healthz",
                    interval=0.2,
                )
            wait_until(
                lambda: self.supervisor.check_alive(kwok) or self._nodes_ready(api),
                timeout=deadline - time.monotonic(),
                what="KWOK nodes Ready",
                interval=0.2,
            )
            # pods cannot be admitted before the ServiceAccount controller made `default`
            wait_until(
                lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout=deadline - time.monotonic(),
                what="ServiceAccount default/default",
                interval=0.2,
            )
        if self.with_backer:
            self._start_backer(deadline)
        self.ready_seconds = time.monotonic() - started
        return self

    def _start_controller_manager(self, port: int) -> subprocess.Popen[bytes]:
        """kube-controller-manager on `port`, its controllers as ServiceAccounts, without the
        ones that only fail on this cluster."""
        kubeconfig = self.control_plane.kubeconfigs["controller-manager"]
        return self.supervisor.start(
            "kube-controller-manager",
            [
                self.control_plane.binaries["kube-controller-manager"],
                *_component_flags(kubeconfig, port, self.run_dir / "cm"),
                # each controller acts as its own ServiceAccount with the bootstrap RBAC roles
                "--use-service-account-credentials=true",
                f"--root-ca-file={self.control_plane.pki.ca_cert}",
                f"--service-account-private-key-file={self.control_plane.pki.sa_key}",
                "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle,"
                # Pods here have loopback IPs, which no Endpoints or EndpointSlice may hold: these
                # controllers only fail and retry, a Warning event each time (1,638 events in 3
                # minutes with 300 Services), loading the apiserver everything else waits on.
                "-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller",
                # KWOK is every node's kubelet, starved of CPU when tests load the machine: a
                # late heartbeat must not mark nodes NotReady and their pods unready
                "--node-monitor-grace-period=2m",
                *(
                    [f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_seconds:g}s"]
                    if self.hpa_sync_seconds
                    else []
                ),
            ],
            log=self.run_dir / "kube-controller-manager.log",
        )

    def _start_scheduler(self, port: int) -> subprocess.Popen[bytes]:
        kubeconfig = self.control_plane.kubeconfigs["scheduler"]
        return self.supervisor.start(
            "kube-scheduler",
            [
                self.control_plane.binaries["kube-scheduler"],
                *_component_flags(kubeconfig, port, self.run_dir / "sched"),
            ],
            log=self.run_dir / "kube-scheduler.log",
        )

    def _start_kwok(self) -> subprocess.Popen[bytes]:
        """KWOK, the kubelet of the nodes annotated as its own (`_create_nodes`)."""
        return self.supervisor.start(
            "kwok",
            [
                self.control_plane.binaries["kwok"],
                f"--kubeconfig={self.kubeconfig}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--node-ip=127.0.0.1",
                # node health by Lease renewals, as kubelets do: cheap enough to keep up with on
                # a loaded machine, unlike full node-status heartbeats
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
            log=self.run_dir / "kwok.log",
        )

    def _create_nodes(self, api: KubeApi) -> None:
        """The GPU nodes; one that already exists (409) is left as it is."""
        for index in range(self.node_count):
            try:
                node = gpu_node(index, gpus=self.gpus_per_node, octet=self.pod_octet)
                api.create("/api/v1/nodes", node)
            except KubeError as error:
                if error.status != 409:
                    raise

    def stop(self) -> None:
        self.supervisor.stop_all()
        if self.with_backer:
            from wok_cluster.backer import kill_leftover_pods

            kill_leftover_pods(self.backer_dir)
        self._pod_network_claim.close()

    def component_metrics(self, name: str) -> str:
        """The /metrics page of a controller (`self.ports`), read with the admin token."""
        response = httpx.get(
            f"https://127.0.0.1:{self.ports[name]}/metrics",
            headers={"Authorization": f"Bearer {self.control_plane.tokens['admin']}"},
            verify=False,  # the component's self-signed serving cert, on loopback
            timeout=10.0,
        )
        response.raise_for_status()
        return response.text

    def _start_backer(self, deadline: float) -> None:
        ready_file = self.backer_dir / "ready"
        ready_file.unlink(missing_ok=True)
        backer = self.supervisor.start(
            "pod-backer",
            [
                wok_executable(),
                "dev",
                "backer",
                f"--kubeconfig={self.kubeconfig}",
                f"--state-dir={self.backer_dir}",
                *([f"--vllm-sim-profile={self.vllm_sim_profile}"] if self.vllm_sim_profile else []),
            ],
            log=self.run_dir / "pod-backer.log",
        )
        wait_until(
            lambda: self.supervisor.check_alive(backer) or ready_file.exists(),
            timeout=deadline - time.monotonic(),
            what="pod backer watching",
        )

    def _nodes_ready(self, api: KubeApi) -> bool:
        nodes = api.get("/api/v1/nodes", labelSelector="type=kwok")["items"]
        ready = [
            n
            for n in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) >= self.node_count


def _component_flags(kubeconfig: Path, port: int, cert_dir: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--kube-api-qps={CLIENT_QPS}",
        f"--kube-api-burst={CLIENT_BURST}",
    ]


def _healthz(port: int) -> bool:
    # the component's self-signed serving cert, on loopback: nothing to verify it against
    return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2.0).is_success
