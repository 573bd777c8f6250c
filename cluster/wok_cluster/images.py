"""`make image`: wok's two OCI images built here from Debian and PyPI alone, and podman set up.

No registry image can be pulled on these machines, so the base is a Debian bookworm root
filesystem made from Debian's packages (mmdebstrap) and imported into the local store. torch and
its CUDA wheels come from a wheelhouse under ~/.cache/wok/wheels (downloaded once, bind-mounted
into the build, never in a layer); buildah's layer cache makes a warm rebuild take seconds. Each
image is also written as an oci-archive under build/images/ (for `skopeo copy` to a registry).

podman runs with runc (crun refuses this VM's hybrid cgroups), cgroupfs, file events, and
ulimits rootful podman can set here: one containers.conf, named by CONTAINERS_CONF, for the build
and for the pod backer's container mode.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wok_cluster.binaries import cache_dir

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "images"
REGISTRY = "ghcr.io/wok-dev"
BASE = "localhost/wok-base:bookworm"
BASE_PACKAGES = "python3,python3-venv,ca-certificates,tini"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# what the code layer copies: the distribution's sources, nothing else of the checkout
SOURCES = (
    "pyproject.toml",
    "README.md",
    "wok",
    "contracts/wok_contracts",
    "operator/wok_operator",
    "runtime/wok_runtime",
    "cluster/wok_cluster",
    "sim/wok_sim",
    "batch/wok_batch",
)
CONTAINERS_CONF = """\
# written by wok_cluster.images: podman as it works on these machines
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class ImageError(RuntimeError):
    """podman, buildah or mmdebstrap is missing or failed."""


@dataclass(frozen=True)
class Image:
    name: str  # wok-operator | wok-runtime
    extra: str  # the pyproject extra it installs

    @property
    def tag(self) -> str:
        return f"{REGISTRY}/{self.name}:{version()}"

    @property
    def archive(self) -> Path:
        return OUT / f"{self.name}-{version()}.oci.tar"

    @property
    def containerfile(self) -> Path:
        return ROOT / self.extra / "Containerfile"


OPERATOR = Image("wok-operator", "operator")
RUNTIME = Image("wok-runtime", "runtime")
IMAGES = (OPERATOR, RUNTIME)


def pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def version() -> str:
    return str(pyproject()["project"]["version"])


def containers_conf() -> Path:
    path = cache_dir() / "containers.conf"
    if not path.exists() or path.read_text() != CONTAINERS_CONF:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CONTAINERS_CONF)
    return path


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(containers_conf())}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Runs `podman args…` with wok's containers.conf; raises ImageError on failure if `check`."""
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed (apt-get install podman buildah runc ...)")
    done = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise ImageError(f"podman {' '.join(args[:3])}…: {done.stderr.strip()[-2000:]}")
    return done


def image_id(ref: str) -> str | None:
    done = podman("image", "inspect", "--format={{.Id}}", ref, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def image_size(ref: str) -> int:
    """Bytes, as podman's local store counts them."""
    return int(podman("image", "inspect", "--format={{.Size}}", ref).stdout.strip())


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> None:
    """A heavy step, niced: it shares the machine with benchmarks."""
    niced = ["nice", "-n", "19", "ionice", "-c3", *argv]
    done = subprocess.run(niced, env=env or podman_env(), timeout=timeout, check=False)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv[:3])}… exited {done.returncode}")


def ensure_base() -> None:
    """The Debian bookworm base, from Debian's packages: mmdebstrap once, then imported."""
    if image_id(BASE):
        return
    rootfs = OUT / "rootfs.tar"
    if not rootfs.exists():
        if shutil.which("mmdebstrap") is None:
            raise ImageError("mmdebstrap is not installed (apt-get install mmdebstrap)")
        partial = rootfs.with_suffix(".partial")
        _run(
            [
                "mmdebstrap",
                "--variant=apt",
                "--format=tar",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(partial),
            ],
            timeout=1800,
        )
        partial.rename(rootfs)
    podman("import", str(rootfs), BASE, timeout=600)


def torch_requirement() -> str:
    """The torch the project's environment runs (what the tests ran against), else the floor."""
    try:
        return f"torch=={importlib.metadata.version('torch').split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        runtime = pyproject()["project"]["optional-dependencies"]["runtime"]
        return next(r for r in runtime if r.startswith("torch"))


def ensure_wheels(requirement: str) -> Path:
    """torch's wheels (several GB with CUDA) downloaded once into the wheelhouse."""
    wheels = cache_dir() / "wheels"
    marker = wheels / f".{requirement}"
    if not marker.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
        _run([*pip, f"--dest={wheels}", requirement], timeout=3600)
        marker.touch()
    return wheels


def stage_context() -> Path:
    """The build context: the distribution's sources and one requirements file per image.
    Copies keep mtimes, so an unchanged tree leaves the code layer cached."""
    context = OUT / "context"
    shutil.rmtree(context, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source in SOURCES:
        path, target = ROOT / source, context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, target, ignore=ignore)
        else:
            shutil.copy2(path, target)
    project = pyproject()
    build_requires = project["build-system"]["requires"]
    for image in IMAGES:
        extra = project["project"]["optional-dependencies"][image.extra]
        lines = [*build_requires, *project["project"]["dependencies"], *extra]
        requirements = context / "requirements" / f"{image.extra}.txt"
        requirements.parent.mkdir(exist_ok=True)
        requirements.write_text("".join(f"{line}\n" for line in lines))
    return context


def revision() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def build(image: Image, context: Path, *, wheels: Path, torch: str) -> None:
    if not HOST_CA.exists():
        raise ImageError(f"no host CA bundle at {HOST_CA}")
    argv = ["podman", "build", "--layers", f"--file={image.containerfile}", f"--tag={image.tag}"]
    argv += [f"--secret=id=hostca,src={HOST_CA}", f"--build-arg=BASE={BASE}"]
    # labels that change with each commit: given here, not as ARGs (see the Containerfiles)
    argv += [f"--label=org.opencontainers.image.version={version()}"]
    argv += [f"--label=org.opencontainers.image.revision={revision()}"]
    if image is RUNTIME:
        argv += [f"--volume={wheels}:/wheels:ro", f"--build-arg=TORCH={torch}"]
    _run([*argv, str(context)], timeout=3600)


def export(image: Image) -> bool:
    """Writes the oci-archive unless the one there holds this very image; True if written."""
    current = image_id(image.tag)
    stamp = image.archive.with_suffix(".id")
    if image.archive.exists() and stamp.exists() and stamp.read_text() == current:
        return False
    partial = image.archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    # podman save stages every blob in TMPDIR before it writes the archive: about twice the
    # image's size, both kept under OUT so that one check of one disk covers it
    size = image_size(image.tag)
    free = shutil.disk_usage(OUT).free
    if free < 2 * size:
        raise ImageError(
            f"writing {image.archive.name} needs about {2 * size / 2**30:.1f} GiB free under "
            f"{OUT}, and {free / 2**30:.1f} GiB are: free some, or build with --no-archive"
        )
    staging = OUT / "tmp"
    staging.mkdir(exist_ok=True)
    save = ["podman", "save", "--format=oci-archive", f"--output={partial}", image.tag]
    try:
        _run(save, 1800, env={**podman_env(), "TMPDIR": str(staging)})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    partial.rename(image.archive)
    stamp.write_text(current or "")
    return True


def build_all(*, archives: Sequence[Image] = IMAGES) -> dict[str, float]:
    """Builds both images (and the base and wheelhouse if missing) and writes the archives of
    `archives`; seconds per step."""
    OUT.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    ensure_base()
    torch = torch_requirement()
    wheels = ensure_wheels(torch)
    context = stage_context()
    seconds["base+wheels"] = time.monotonic() - started
    for image in IMAGES:
        started = time.monotonic()
        build(image, context, wheels=wheels, torch=torch)
        if image in archives:
            export(image)
        seconds[image.name] = time.monotonic() - started
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wok_cluster.images", description=__doc__)
    parser.add_argument(
        "--no-archive", action="store_true", help="only the local image store, no oci-archive"
    )
    args = parser.parse_args(argv)
    try:
        seconds = build_all(archives=() if args.no_archive else IMAGES)
    except ImageError as error:
        print(f"make image: {error}", file=sys.stderr)
        return 1
    for image in IMAGES:
        size = image_size(image.tag)
        where = f" and {image.archive.relative_to(ROOT)}" if not args.no_archive else ""
        print(f"{image.tag} ({size / 2**30:.2f} GiB){where}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
