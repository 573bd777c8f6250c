"""etcd + kube-apiserver on 127.0.0.1: the real API, RBAC and admission that wok is tested against.

Authentication is by static tokens (one per component, the admin in system:masters) and by
ServiceAccount tokens from the TokenRequest API, so a test can act as the restricted identity the
operator will run as. Authorization is Node,RBAC, as on a real cluster. The Service CIDR exists
only because the apiserver requires one: nothing here ever connects to a ClusterIP, and
`--endpoint-reconciler-type=none` keeps the `kubernetes` Service without endpoints.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx

from wok_cluster.binaries import Binaries
from wok_cluster.kubeapi import KubeApi
from wok_cluster.kubeconfig import write_kubeconfig
from wok_cluster.netutil import free_port
from wok_cluster.pki import FRONT_PROXY_CLIENT, Pki, make_pki
from wok_cluster.process import Supervisor
from wok_cluster.waiting import wait_until

# Never routed to, never connected to; required by the apiserver for Service allocation.
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "wok-admin"
# (user, groups) of each component that gets its own token and kubeconfig
COMPONENT_USERS = {
    "admin": (ADMIN_USER, "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
}


class ControlPlane:
    """etcd and kube-apiserver with their own ports, PKI and data under `run_dir`."""

    def __init__(self, run_dir: Path, binaries: Binaries) -> None:
        self.run_dir = run_dir
        self.binaries = binaries
        self.supervisor = Supervisor(run_marker=str(run_dir))
        self.etcd_port = free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.pki: Pki = make_pki(run_dir / "pki")
        self.tokens = {component: secrets.token_hex(24) for component in COMPONENT_USERS}
        self.kubeconfigs = {
            component: write_kubeconfig(
                run_dir / f"{component}.kubeconfig",
                server=self.server,
                ca_pem=self.pki.ca_cert.read_bytes(),
                token=self.tokens[component],
                user=user,
            )
            for component, (user, _) in COMPONENT_USERS.items()
        }
        self.ready_seconds: float | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self.kubeconfigs["admin"]

    def api(self) -> KubeApi:
        return KubeApi.from_kubeconfig(self.kubeconfig)

    def start(self, *, timeout: float = 60.0) -> ControlPlane:
        started = time.monotonic()
        etcd = self.supervisor.start("etcd", self._etcd_argv(), log=self.run_dir / "etcd.log")
        wait_until(
            lambda: self.supervisor.check_alive(etcd) or self._etcd_healthy(),
            timeout=timeout,
            what="etcd health",
        )
        apiserver = self.supervisor.start(
            "kube-apiserver", self._apiserver_argv(), log=self.run_dir / "kube-apiserver.log"
        )
        with self.api() as api:
            wait_until(
                lambda: self.supervisor.check_alive(apiserver) or api.healthy("/readyz"),
                timeout=timeout - (time.monotonic() - started),
                what="kube-apiserver /readyz",
                interval=0.2,
            )
        self.ready_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        self.supervisor.stop_all()

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 3600,
        path: Path | None = None,
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name` (TokenRequest API).

        The ServiceAccount must exist; its permissions are whatever RBAC grants it.
        """
        with self.api() as api:
            response = api.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": expiration_seconds},
                },
            )
        return write_kubeconfig(
            path or self.run_dir / "sa" / f"{namespace}.{name}.kubeconfig",
            server=self.server,
            ca_pem=self.pki.ca_cert.read_bytes(),
            token=response["status"]["token"],
            user=f"system:serviceaccount:{namespace}:{name}",
        )

    def _etcd_healthy(self) -> bool:
        response = httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2.0)
        return response.status_code == 200 and response.json().get("health") == "true"

    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{free_port()}"
        return [
            self.binaries["etcd"],
            "--name=wok",
            f"--data-dir={self.run_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=wok={peer}",
            # a throw-away test store: durability costs seconds of fsync per start on small disks
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        tokens = self.run_dir / "tokens.csv"
        tokens.write_text(
            "".join(
                f'{self.tokens[component]},{user},{user},"{groups}"\n'
                for component, (user, groups) in COMPONENT_USERS.items()
            )
        )
        tokens.chmod(0o600)
        pki = self.pki
        return [
            self.binaries["kube-apiserver"],
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={tokens}",
            # the aggregation layer, set up as kubeadm does: the apiserver proxies
            # /apis/<group> of an APIService to its extension apiserver (KEDA's metrics
            # adapter) with a front-proxy client certificate and X-Remote-* identity headers,
            # which the extension trusts because the front-proxy CA is published in
            # kube-system/extension-apiserver-authentication
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            # dial an APIService's endpoint (EndpointSlice), not its ClusterIP: no ClusterIP is
            # routed here (see docs/cluster.md, "The network")
            "--enable-aggregator-routing=true",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
        ]
