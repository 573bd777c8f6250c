"""KEDA from upstream beside the emulated cluster: the operator and its metrics adapter.

Both run as host processes, like the control-plane components, with a kubeconfig for the
ServiceAccount `keda/keda-operator` that the release's own RBAC (config/rbac, config/metrics-server)
binds; the release's CRDs are applied first. The adapter is an extension apiserver: the
kube-apiserver's aggregation layer proxies `external.metrics.k8s.io` to it, which is how the real
HPA controller in kube-controller-manager reads KEDA's metrics.

The aggregator reaches an APIService through its Service's EndpointSlice, and EndpointSlices
refuse loopback addresses. So the adapter listens on a private address the harness puts on `lo`
(`netutil.claim_host_address`, 10.255.x.y/32: on this machine only, like 127/8), named by a
selector-less Service and an EndpointSlice of our own. The operator's gRPC metrics service and the
adapter speak mutual TLS with a certificate from the run's CA, which also backs the APIService's
caBundle; KEDA's own certificate rotation is off.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from wok_cluster.apiserver import ControlPlane
from wok_cluster.binaries import kubectl
from wok_cluster.kubeapi import KubeApi, KubeError, wait_established
from wok_cluster.netutil import claim_host_address, free_port, release_host_address
from wok_cluster.pki import serving_cert
from wok_cluster.process import Supervisor
from wok_cluster.waiting import wait_until

NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
# the Service the release's APIService names (config/metrics-server/api_service.yaml)
METRICS_SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
APISERVICE_PATH = f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"
# the release's manifests the harness applies, relative to its config/ (kustomize overlays
# and the Deployments are not used: the processes run on the host)
MANIFESTS = (
    "service_account/service_account.yaml",
    "rbac/role.yaml",
    "rbac/role_binding.yaml",
    "rbac/aggregate_cluster_roles.yaml",
    "metrics-server/role.yaml",
    "metrics-server/role_binding.yaml",
)
FIELD_MANAGER = "wok-cluster"
# long enough for any test session or `wok dev` day; KEDA does not refresh a kubeconfig token
TOKEN_SECONDS = 7 * 24 * 3600


class Keda:
    """keda-operator and keda-adapter for one control plane, files under `run_dir`."""

    def __init__(self, control_plane: ControlPlane, run_dir: Path) -> None:
        self.control_plane = control_plane
        self.run_dir = run_dir
        self.supervisor = Supervisor(run_marker=str(control_plane.run_dir))
        self.config_dir = control_plane.binaries.keda_config
        self.version = (self.config_dir / ".version").read_text().strip()
        self.certs = run_dir / "certs"
        self.operator_ports = {name: free_port() for name in ("metrics", "probe", "grpc")}
        self.adapter_port = free_port()
        self.address: str | None = None
        self.ready_seconds: float | None = None

    @property
    def crds(self) -> list[Path]:
        return sorted((self.config_dir / "crd" / "bases").glob("*.yaml"))

    def start(self, *, timeout: float = 120.0) -> Keda:
        started = time.monotonic()
        deadline = started + timeout
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.address = claim_host_address()
        self._install(deadline)
        kubeconfig = self.control_plane.service_account_kubeconfig(
            NAMESPACE,
            SERVICE_ACCOUNT,
            expiration_seconds=TOKEN_SECONDS,
            path=self.run_dir / "keda-operator.kubeconfig",
        )
        self._write_certs()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "WATCH_NAMESPACE": "",  # every namespace
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        }
        operator = self.supervisor.start(
            "keda-operator",
            self._operator_argv(kubeconfig),
            log=self.run_dir / "keda-operator.log",
            env=env,
        )
        probe = f"http://127.0.0.1:{self.operator_ports['probe']}/readyz"
        wait_until(
            lambda: (
                self.supervisor.check_alive(operator) or httpx.get(probe, timeout=2.0).is_success
            ),
            timeout=deadline - time.monotonic(),
            what="keda-operator /readyz",
            interval=0.2,
        )
        adapter = self.supervisor.start(
            "keda-adapter",
            self._adapter_argv(kubeconfig),
            log=self.run_dir / "keda-adapter.log",
            env=env,
        )
        with self.control_plane.api() as api:
            wait_until(
                lambda: self.supervisor.check_alive(adapter) or _available(api),
                timeout=deadline - time.monotonic(),
                what=f"APIService {APISERVICE} Available",
                interval=0.5,
            )
        self.ready_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        # unregister first: an APIService whose server is gone makes discovery fail for every
        # client of the apiserver (and blocks namespace deletion) for the rest of the run
        try:
            with self.control_plane.api() as api:
                api.delete(APISERVICE_PATH)
        except (KubeError, httpx.HTTPError):
            pass
        self.supervisor.stop_all()
        if self.address is not None:
            release_host_address(self.address)
            self.address = None

    def _install(self, deadline: float) -> None:
        """The release's CRDs and RBAC, then the adapter's Service, EndpointSlice and APIService."""
        kc = self.control_plane.kubeconfig
        with self.control_plane.api() as api:
            _create(api, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            # server-side: the CRDs are too big for client-side apply's last-applied annotation
            files = [*self.crds, *(self.config_dir / m for m in MANIFESTS)]
            args = [f"--filename={f}" for f in files]
            _kubectl(kc, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", *args)
            wait = max(1.0, deadline - time.monotonic())
            crds = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in self.crds]
            wait_established(api, crds, timeout=wait)
            for path, body in self._adapter_objects():
                _create(api, path, body)

    def _adapter_objects(self) -> list[tuple[str, dict[str, Any]]]:
        assert self.address is not None
        ns = f"/api/v1/namespaces/{NAMESPACE}"
        # selector-less: the harness, not the EndpointSlice controller, says where the adapter is
        service = {
            "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port}]},
        }
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{METRICS_SERVICE}-host",
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": METRICS_SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "wok.dev-cluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.adapter_port, "protocol": "TCP"}],
        }
        # the release's APIService, with the run's CA (KEDA's cert rotation would patch it in)
        apiservice = yaml.safe_load(
            (self.config_dir / "metrics-server/api_service.yaml").read_text()
        )
        ca = self.control_plane.pki.ca_cert.read_bytes()
        apiservice["spec"]["caBundle"] = base64.b64encode(ca).decode()
        apiservice["spec"]["service"]["port"] = 443
        return [
            (f"{ns}/services", service),
            (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", endpoints),
            ("/apis/apiregistration.k8s.io/v1/apiservices", apiservice),
        ]

    def _write_certs(self) -> None:
        """ca.crt, tls.crt, tls.key, the layout both binaries read from --cert-dir: one
        certificate for the operator's gRPC server (127.0.0.1), the adapter's HTTPS server (the
        Service's DNS name the aggregator verifies, and its address) and the adapter as the
        operator's gRPC client."""
        assert self.address is not None
        pki = self.control_plane.pki
        cert, key = serving_cert(
            pki,
            "keda",
            ips=["127.0.0.1", self.address],
            dns=[f"{METRICS_SERVICE}.{NAMESPACE}.svc", f"{SERVICE_ACCOUNT}.{NAMESPACE}.svc"],
        )
        self.certs.mkdir(parents=True, exist_ok=True)
        for source, name in ((pki.ca_cert, "ca.crt"), (cert, "tls.crt"), (key, "tls.key")):
            (self.certs / name).write_bytes(source.read_bytes())
        (self.certs / "tls.key").chmod(0o600)
        (self.run_dir / "ca").mkdir(exist_ok=True)

    def _operator_argv(self, kubeconfig: Path) -> list[str]:
        ports = self.operator_ports
        return [
            self.control_plane.binaries["keda-operator"],
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
            f"--metrics-service-bind-address=127.0.0.1:{ports['grpc']}",
            "--enable-cert-rotation=false",
            f"--cert-dir={self.certs}",
            # extra CAs for scalers' TLS: none (the default, /custom/ca, is a pod's mount)
            f"--ca-dir={self.run_dir / 'ca'}",
            "--zap-encoder=console",
            "--zap-log-level=info",
        ]

    def _adapter_argv(self, kubeconfig: Path) -> list[str]:
        assert self.address is not None
        certs = self.certs
        return [
            self.control_plane.binaries["keda-adapter"],
            f"--kubeconfig={kubeconfig}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={self.address}",
            f"--secure-port={self.adapter_port}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--client-ca-file={certs / 'ca.crt'}",
            f"--metrics-service-address=127.0.0.1:{self.operator_ports['grpc']}",
            # its own /metrics server; KEDA binds it on every interface (":port")
            f"--port={free_port()}",
            "--zap-encoder=console",
            "--zap-log-level=info",
        ]


def _available(api: KubeApi) -> bool:
    conditions = api.get(APISERVICE_PATH).get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def _create(api: KubeApi, path: str, body: dict[str, Any]) -> None:
    try:
        api.create(path, body)
    except KubeError as error:
        if error.status != 409:
            raise


def _kubectl(kubeconfig: Path, *args: str) -> str:
    result = kubectl(kubeconfig, *args)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout
