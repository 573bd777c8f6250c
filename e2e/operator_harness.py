"""Running the real operator (`wok operator run`) against the emulated cluster, for the e2e tests.

The operator is a separate process, as in production: the tests talk to it only through the
apiserver (kubectl), Prometheus and the runtime pods, and check that it exits cleanly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from wok_cluster.binaries import kubectl_path
from wok_cluster.kubeapi import KubeApi, wait_established
from wok_cluster.netutil import free_port
from wok_cluster.process import RUN_MARKER
from wok_cluster.waiting import GiveUp, wait_until
from wok_operator.resources import runtime_name

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "wok.dev_inferenceservices.yaml"
WOK = str(Path(sys.executable).parent / "wok")


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result.stdout if check else result.stdout + result.stderr


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    return wait_until(probe, timeout=timeout, what=what, interval=0.5)


NO_PROMETHEUS = "http://127.0.0.1:9"


def service(name: str, initial_batch: int = 4) -> str:
    """A small builtin:tiny InferenceService that ticks every second."""
    return yaml.safe_dump(
        {
            "apiVersion": "wok.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {
                "model": {"source": "builtin:tiny", "dtype": "float32"},
                "runtime": {"gpuMemory": "256Mi", "cpu": "1", "memory": "1Gi"},
                "memory": {"maxModelLen": 512, "reserve": "16Mi"},
                "batching": {"initialBatchSize": initial_batch, "maxBatchSize": 32},
                "scaling": {"minReplicas": 1, "maxReplicas": 2, "intervalSeconds": 1},
            },
        }
    )


def reconciled(kc: Path, ns: str, name: str) -> bool:
    wis = get_json(kc, "wis", name, "-n", ns) or {}
    return (
        wis.get("status", {}).get("observedGeneration") == wis.get("metadata", {}).get("generation")
        and get_json(kc, "deployment", f"{name}-runtime", "-n", ns) is not None
    )


# An RBAC refusal as the API client or Kopf logs it; a bare "403" would also match host names
# and timestamps ("vm_53e4030d").
_DENIED = re.compile(r"Forbidden|forbidden|\(403\)|\b(?:status|code|HTTP)[ =:]*403\b")


def access_denials(log: str) -> list[str]:
    """The log's lines that report a request the apiserver refused."""
    return [line for line in log.splitlines() if _DENIED.search(line)]


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return None


class OperatorProcess:
    """One `wok operator run` process with its own log, metrics and liveness ports."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        prometheus_url: str,
        log: Path,
        *,
        run_marker: str,
        standalone: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.log = log
        args = [
            WOK,
            "operator",
            "run",
            f"--namespace={namespace}",
            f"--prometheus-url={prometheus_url}",
            "--pod-label=wok.dev/backed=true",
            f"--metrics-port={self.metrics_port}",
            "--metrics-host=127.0.0.1",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            "--log-format=plain",
        ]
        args += ["--standalone", *extra_args] if standalone else list(extra_args)
        environ = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
        environ[RUN_MARKER] = run_marker
        with log.open("ab") as out:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def wait_live(self, timeout: float = 60.0) -> None:
        def live() -> bool:
            if not self.alive():
                raise GiveUp(f"operator exited early:\n{self.log_tail()}")
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            return httpx.get(url, timeout=2).status_code == 200

        try:
            wait_for(live, "operator liveness", timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> int:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            raise AssertionError(f"operator ignored SIGTERM:\n{self.log_tail()}") from None

    def kill9(self) -> None:
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def stored_deployment(service: str, replicas: int) -> dict[str, Any]:
    """A runtime Deployment as the operator would name it, only stored (no controller runs it)."""
    labels = {"app": service}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": runtime_name(service)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "runtime", "image": "wok-runtime"}]},
            },
        },
    }


def adopt_crds(kubeconfig: Path, release: str, namespace: str) -> None:
    """What docs/gitops.md tells a user whose CRD Helm does not own (applied with kubectl, or by a
    chart that shipped it in crds/): mark it as the release's, so the chart's template takes it
    over instead of refusing to install. Another module of this cluster may have applied it."""
    crd = "crd/inferenceservices.wok.dev"
    if get_json(kubeconfig, crd) is None:
        return
    kubectl(kubeconfig, "label", "--overwrite", crd, "app.kubernetes.io/managed-by=Helm")
    kubectl(
        kubeconfig,
        "annotate",
        "--overwrite",
        crd,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
    )


def install_crds(kubeconfig: Path) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(CRD))
    with KubeApi.from_kubeconfig(kubeconfig) as api:
        wait_established(api, ["inferenceservices.wok.dev"], timeout=60)
