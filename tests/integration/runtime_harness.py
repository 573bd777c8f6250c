"""Starts real `wok runtime serve` processes on loopback for the integration tests.

A helper module, not a conftest: the runtime's tests import it by name, so it never collides
with other parts' fixtures.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ADMIN_TOKEN = "integration-admin-token"
# 4 MB of float32 KV for builtin:tiny: a few dozen 16-token blocks, so queues and preemption
# happen with a handful of requests.
SMALL_KV = 4_000_000
# builtin:tiny's K and V per token in float32 (2 · layers · kv_heads · head_dim · 4 bytes).
KV_BYTES_PER_TOKEN = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RuntimeServer:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value} (one scrape)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start_server(
    log_dir: Path,
    *args: str,
    admin_token: str | None = ADMIN_TOKEN,
    ready_timeout: float = 120.0,
    launcher: Sequence[str] = ("-m", "wok.cli"),
    kv_cache_bytes: int | None = SMALL_KV,
    env: Mapping[str, str] | None = None,
) -> RuntimeServer:
    """`launcher`: what runs `wok` (a fault-injecting wrapper script, say); `env`: extra
    variables for the process; `kv_cache_bytes=None`: the runtime's own default."""
    port = free_port()
    argv = [
        sys.executable, *launcher, "runtime", "serve",
        "--model", "builtin:tiny", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "256", "--log-level", "warning",
        "--unready-seconds", "0",  # no endpoints in front of a test's server to drop it
    ]  # fmt: skip
    if kv_cache_bytes is not None:
        argv += ["--kv-cache-bytes", str(kv_cache_bytes)]
    env = {k: v for k, v in os.environ.items() if k != "WOK_ADMIN_TOKEN"} | dict(env or {})
    if admin_token is not None:
        token_file = log_dir / f"admin-token-{port}"
        token_file.write_text(admin_token + "\n")
        argv += ["--admin-token-file", str(token_file)]
    argv += list(args)
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RuntimeServer(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"the server was not ready within {ready_timeout} s:\n{server.log()}")
