"""Where the cluster's upstream binaries live, and building them (build.sh) when they are missing.

The version directory comes from cluster/go/kubernetes/go.mod, the one place it is pinned.
kubectl is built at the control plane's release, so nothing depends on the kubectl a machine
happens to have. Prometheus is built too: Debian's package (`make tools`, still the source of
promtool) is compiled without Kubernetes service discovery, which the harness needs. So is KEDA
(operator and metrics adapter), whose release manifests (CRDs, RBAC) build.sh copies next to the
binaries.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CLUSTER_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = CLUSTER_DIR / "build.sh"
KUBERNETES_GO_MOD = CLUSTER_DIR / "go" / "kubernetes" / "go.mod"
BUILT = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    "prometheus",
)
# Built last, needed only by the KEDA fixture: a failure to build them does not stop the rest.
KEDA = ("keda-operator", "keda-adapter")


def kubernetes_version() -> str:
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", KUBERNETES_GO_MOD.read_text(), re.M)
    if not match:
        raise RuntimeError(f"no k8s.io/kubernetes requirement in {KUBERNETES_GO_MOD}")
    return match.group(1)


def cache_dir() -> Path:
    return Path(os.environ.get("WOK_CACHE", Path.home() / ".cache" / "wok"))


def bin_dir() -> Path:
    return cache_dir() / "bin" / kubernetes_version()


@dataclass(frozen=True)
class Binaries:
    directory: Path

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)

    @property
    def prometheus(self) -> str:
        return self["prometheus"]

    @property
    def keda_config(self) -> Path:
        """The `config/` directory of the KEDA release the binaries were built from."""
        return self.directory / "keda-config"


def kubectl(
    kubeconfig: str | Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the cluster's kubectl against `kubeconfig`; the caller checks the result."""
    return subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def kubectl_path() -> str:
    """The kubectl built with the control plane (the same release), else the one on PATH."""
    built = bin_dir() / "kubectl"
    return str(built) if os.access(built, os.X_OK) else _on_path("kubectl")


def _on_path(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed (run `make tools`)")
    return found


def missing(names: tuple[str, ...] = BUILT + KEDA) -> list[str]:
    return [name for name in names if not os.access(bin_dir() / name, os.X_OK)]


def build(*, quiet: bool = False) -> None:
    """Runs build.sh; its progress lines go to stderr unless `quiet` (then only on failure)."""
    result = subprocess.run(
        [str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE if quiet else sys.stderr,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {result.returncode}):\n{result.stdout}")


def ensure_built(
    names: tuple[str, ...] = BUILT, *, required: tuple[str, ...] | None = None
) -> Binaries:
    """The binaries, building them first when any of `names` is missing (a cold build takes many
    minutes). Fails only when one of `required` (default: `names`) is still missing: the cluster's
    tests run even when KEDA does not build, its own fixture failing with the build log."""
    required = names if required is None else required
    if missing(names):
        try:
            build()
        except RuntimeError as error:
            if missing(required):
                raise
            print(f"warning: {error}", file=sys.stderr)
    still_missing = missing(required)
    if still_missing:
        raise RuntimeError(f"build.sh did not produce {still_missing} in {bin_dir()}")
    return Binaries(bin_dir())
