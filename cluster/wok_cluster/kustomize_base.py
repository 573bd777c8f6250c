"""The kustomize base (deploy/kustomize) is the Helm chart rendered once with its defaults, so the
two never drift: `make kustomize` writes it, and a test renders the chart again and compares.

Rendered with `crds.keep=false`: the keep annotation is an instruction to Helm alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from wok_cluster.binaries import bin_dir, kubernetes_version

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "wok"
BASE = ROOT / "deploy" / "kustomize"
RENDERED = BASE / "wok.yaml"
RELEASE = "wok"
NAMESPACE = "wok-system"  # the base's; an overlay's `namespace:` moves every object
VALUES = ("crds.keep=false",)
HEADER = (
    "# Rendered from charts/wok by `make kustomize` (helm template wok charts/wok\n"
    f"# --namespace={NAMESPACE} --include-crds{''.join(f' --set={v}' for v in VALUES)}).\n"
    "# Do not edit: change the chart and render again (a test compares the two).\n"
)


def render(helm: str | Path | None = None) -> str:
    """The chart as the base's wok.yaml: the header, then `helm template`'s output."""
    args = [str(helm or bin_dir() / "helm"), "template", RELEASE, str(CHART)]
    args += [f"--namespace={NAMESPACE}", "--include-crds", f"--kube-version={kubernetes_version()}"]
    args += [f"--set={value}" for value in VALUES]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    return HEADER + result.stdout


def main() -> int:
    RENDERED.write_text(render())
    print(f"wrote {RENDERED.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
