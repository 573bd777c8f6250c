"""How a real `wok runtime serve` starts on this (CPU-only) machine: without `--kv-cache-bytes`
it sizes the KV pool from the available host memory and says so; with `--device cuda` and no
CUDA it refuses in one line with a non-zero exit, never falling back to the CPU."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from runtime_harness import KV_BYTES_PER_TOKEN, start_server

from wok_runtime.core.host_memory import CPU_KV_CAP_BYTES

pytestmark = pytest.mark.integration


def test_without_kv_cache_bytes_the_cpu_pool_is_sized_from_free_memory(tmp_path: Path):
    server = start_server(tmp_path, "--log-level", "info", kv_cache_bytes=None)
    try:
        match = re.search(r"KV cache on cpu: (\d+) bytes .* of available host memory", server.log())
        assert match, server.log()
        chosen = int(match.group(1))
        assert 0 < chosen <= CPU_KV_CAP_BYTES
        metrics = server.metrics()
        blocks = sum(v for k, v in metrics.items() if k.startswith("wok_kv_cache_blocks{"))
        assert blocks == chosen // (16 * KV_BYTES_PER_TOKEN)
        for gauge in ("wok_kv_cache_budget_bytes", "wok_kv_cache_measured_bytes"):
            assert metrics[f'{gauge}{{device="cpu",model_name="builtin:tiny"}}'] == chosen
        body = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200
    finally:
        assert server.stop() == 0, server.log()


def test_device_cuda_without_cuda_refuses_in_one_line():
    argv = [sys.executable, "-m", "wok.cli", "runtime", "serve", "--model", "builtin:tiny"]
    # No device visible, so the refusal is tested on a GPU machine as well.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [*argv, "--device", "cuda", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("wok runtime: error: device 'cuda' was asked for")
    assert "CUDA is not available" in line and "refusing to fall back to the CPU" in line


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--device", "tpu", "unknown device 'tpu': use cpu, cuda, cuda:N or sim"),
        ("--port", "70000", "'70000' is not a TCP port (0 to 65535)"),
    ],
)
def test_a_bad_device_or_port_is_one_line_of_error(flag: str, value: str, says: str):
    argv = [sys.executable, "-m", "wok.cli", "runtime", "serve", flag, value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].endswith(f"error: argument {flag}: {says}")


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "wok.cli", "runtime", "serve", "--device", "sim",
                "--profile", "sim:llama-3-8b-80g", "--port", str(port),
                "--log-level", "info"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "ready: serving" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"wok runtime: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
