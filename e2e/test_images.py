"""wok's two OCI images, built here (`make image`) and run for real with podman.

The build is the real one with the layer cache (seconds when warm, `make test` runs `make image`
first). Without podman these tests fail, never skip: containers can run on these machines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from wok_cluster import images
from wok_cluster.netutil import free_port
from wok_cluster.waiting import GiveUp, wait_until

RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} 1\.0$", re.M)

# serial: image builds and exports take both cores, and the SIGTERM check is timed
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.timeout(1800),
]


@pytest.fixture(scope="session")
def built_images() -> dict[str, float]:
    """Both images current with the checkout (a warm rebuild), and the operator's oci-archive
    (the runtime's, 3 GB, takes a minute to write after any change: `make image` writes it)."""
    try:
        return images.build_all(archives=(images.OPERATOR,))
    except images.ImageError as error:
        pytest.fail(f"the images cannot be built here: {error}")


def skopeo_config(reference: str) -> dict:
    done = subprocess.run(
        ["skopeo", "inspect", "--config", reference],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("image", "user"), [(images.OPERATOR, "65532:65532"), (images.RUNTIME, "1000:1000")]
)
def test_the_images_carry_the_labels_and_a_non_root_user(built_images, image, user):
    config = skopeo_config(f"containers-storage:{image.tag}")["config"]
    assert config["User"] == user
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == images.version()
    assert labels["org.opencontainers.image.revision"] == images.revision()
    assert labels["org.opencontainers.image.title"] == image.name
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "wok"]


def test_the_archive_is_the_image_for_skopeo_copy(built_images):
    archive = images.OPERATOR.archive
    assert archive == images.OUT / f"wok-operator-{images.version()}.oci.tar"
    stored = skopeo_config(f"containers-storage:{images.OPERATOR.tag}")
    assert skopeo_config(f"oci-archive:{archive}") == stored


def test_an_archive_with_no_room_for_it_stops_before_writing(built_images, monkeypatch, tmp_path):
    """podman save stages every blob before it writes the archive: with less than twice the
    image's size free, a clear error and nothing half-written (CI once ran the disk full here)."""
    image = images.RUNTIME
    monkeypatch.setattr(images, "OUT", tmp_path)
    one_gib_free = shutil.disk_usage(tmp_path)._replace(free=2**30)
    monkeypatch.setattr(images.shutil, "disk_usage", lambda _: one_gib_free)
    with pytest.raises(
        images.ImageError, match=r"wok-runtime-.*\.oci\.tar needs about .* GiB free"
    ):
        images.export(image)
    assert list(tmp_path.iterdir()) == []


def test_the_operator_image_has_no_torch(built_images):
    done = images.podman(
        "run",
        "--rm",
        "--entrypoint=python3",
        images.OPERATOR.tag,
        "-c",
        "import torch",
        check=False,
    )
    assert done.returncode != 0 and "No module named 'torch'" in done.stderr
    version = images.podman("run", "--rm", images.OPERATOR.tag, "--help").stdout
    assert "operator" in version


@pytest.mark.parametrize("image", images.IMAGES, ids=lambda image: image.name)
def test_the_build_secret_is_not_left_in_the_image(built_images, image):
    history = images.podman("history", "--no-trunc", "--format={{.CreatedBy}}", image.tag).stdout
    assert "--mount=type=secret,id=hostca" in history  # pip did read it during the build
    done = images.podman(
        "run", "--rm", "--entrypoint=ls", image.tag, "/run/secrets/hostca", check=False
    )
    assert done.returncode != 0 and "No such file" in done.stderr


def test_chart_and_crd_defaults_are_the_tags_make_image_produces():
    from wok_operator.api import RuntimeSpec

    chart = images.ROOT / "charts" / "wok"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    tag = values["image"]["tag"] or app_version
    assert f"{values['image']['repository']}:{tag}" == images.OPERATOR.tag
    assert RuntimeSpec().image == images.RUNTIME.tag


def test_the_runtime_image_serves_tiny_read_only_and_drains_on_stop(built_images, tmp_path):
    """Locked down as the operator's pods are (read-only root, no capabilities, the cache an
    emptyDir); `podman stop` (SIGTERM) drains the request in flight and exits 0."""
    port = free_port()
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 1000, 1000)
    name = f"wok-test-runtime-{port}"
    log = tmp_path / "runtime.log"
    argv = ["podman", "run", "--rm", f"--name={name}", f"--publish=127.0.0.1:{port}:8000"]
    argv += ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"]
    argv += [f"--volume={cache}:/var/cache/wok", "--memory=2g", images.RUNTIME.tag]
    argv += ["runtime", "serve", "--model=builtin:tiny", "--host=0.0.0.0", "--port=8000"]
    # the pool given: in a cgroup v1 container the runtime's default misses the memory limit
    # (it reads the host's cgroup path, which the container's cgroup mount does not have)
    argv += ["--drain-seconds=20", f"--kv-cache-bytes={64 * 2**20}"]
    with log.open("wb") as out:
        client = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=images.podman_env()
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if client.poll() is not None:
                raise GiveUp(f"the container exited {client.returncode}:\n{log.read_text()}")
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200

        wait_until(ready, timeout=120, what="/readyz 200", interval=0.5)
        body = {"prompt": [11, 12, 13], "max_tokens": 8, "ignore_eos": True}
        response = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 8
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert "vllm:num_requests_waiting" in metrics

        # a long request in flight when SIGTERM arrives still completes
        results: list[httpx.Response] = []
        long = {"prompt": [11, 12, 13], "max_tokens": 1500, "ignore_eos": True}
        sender = threading.Thread(
            target=lambda: results.append(
                httpx.post(f"{base}/v1/completions", json=long, timeout=120)
            )
        )
        sender.start()
        wait_until(
            lambda: RUNNING.search(httpx.get(f"{base}/metrics").text),
            timeout=30,
            what="the long request running",
        )
        started = time.monotonic()
        images.podman("stop", "--time=30", name, timeout=90)
        assert client.wait(timeout=60) == 0, log.read_text()
        sender.join(timeout=60)
        assert results and results[0].status_code == 200, log.read_text()[-3000:]
        assert results[0].json()["usage"]["completion_tokens"] == 1500
        assert time.monotonic() - started < 30, "SIGTERM did not reach wok (stopped by SIGKILL)"
    finally:
        if client.poll() is None:
            images.podman("rm", "--force", "--time=0", name, check=False)
            client.wait(timeout=60)


COMPILED = "model compiled and warmed up"
FELL_BACK = re.compile(r"could not be built|compiling the model failed")


def start_compiled(cache: Path, log: Path) -> None:
    """One `--compile` start of the runtime image as a pod runs it (read-only root, a 64 MiB
    /tmp as the operator's emptyDir, `cache` as /var/cache/wok), stopped once ready."""
    port = free_port()
    name = f"wok-test-compile-{port}"
    argv = ["podman", "run", "--rm", f"--name={name}", f"--publish=127.0.0.1:{port}:8000"]
    argv += ["--read-only", "--tmpfs=/tmp:rw,size=64m", "--cap-drop=ALL"]
    argv += ["--security-opt=no-new-privileges", f"--volume={cache}:/var/cache/wok"]
    argv += [images.RUNTIME.tag, "runtime", "serve", "--model=builtin:tiny", "--host=0.0.0.0"]
    argv += ["--port=8000", "--dtype=bfloat16", "--compile", "--log-level=info"]
    argv += [f"--kv-cache-bytes={64 * 2**20}"]
    with log.open("wb") as out:
        client = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=images.podman_env()
        )
    try:

        def ready() -> bool:
            if client.poll() is not None:
                raise GiveUp(f"the container exited {client.returncode}:\n{log.read_text()}")
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200

        wait_until(ready, timeout=900, what="/readyz 200", interval=1)
    finally:
        images.podman("rm", "--force", "--time=0", name, check=False)
        client.wait(timeout=60)


def built_code(cache: Path) -> dict[Path, float]:
    """The shared objects under the cache (the CPU kernels, inductor's step): path → mtime."""
    return {path: path.stat().st_mtime for path in cache.glob("compile/*/**/*.so")}


def test_the_runtime_image_builds_compile_into_its_cache_and_the_next_start_reuses_it(
    built_images, tmp_path
):
    """The image has the toolchain `--compile` needs (g++, Python's headers, ninja): the first
    start builds the CPU kernel and the compiled step into the cache volume, under the CPU's
    key; a second start on the same volume serves compiled without building anything again."""
    which = images.podman("run", "--rm", "--entrypoint=which", images.RUNTIME.tag, "g++", "ninja")
    assert which.stdout.split() == ["/usr/bin/g++", "/usr/bin/ninja"]
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 1000, 1000)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    start_compiled(cache, first)
    text = first.read_text()
    assert COMPILED in text and not FELL_BACK.search(text), text[-3000:]
    (key,) = (cache / "compile").iterdir()
    assert any((key / "torch_extensions").glob("*/*.so")), "no CPU kernel in the cache"
    assert any((key / "inductor").rglob("*.so")), "no compiled step in the cache"
    built = built_code(cache)
    start_compiled(cache, second)
    text = second.read_text()
    assert COMPILED in text and not FELL_BACK.search(text), text[-3000:]
    assert built_code(cache) == built, "the second start built again"


def test_podman_is_configured_as_these_machines_need():
    conf = Path(images.podman_env()["CONTAINERS_CONF"]).read_text()
    assert 'runtime = "runc"' in conf and "nofile=20000:20000" in conf
    info = json.loads(images.podman("info", "--format=json").stdout)
    assert info["host"]["ociRuntime"]["name"] == "runc"
