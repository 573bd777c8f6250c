"""Operator queries evaluated by Prometheus' own engine: a promtool rules test over given input
series (`assert_promql`), or a real Prometheus process (`running_prometheus`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml


def assert_promql(
    tmp_path: Path,
    series: list[dict],
    tests: list[dict],
    rule_files: list[Path] = (),
    *,
    interval: str = "1m",
) -> None:
    """promtool evaluates each test's `expr` over `series` (one sample per `interval`), with
    `rule_files`' rules evaluated at the same interval, and compares."""
    assert shutil.which("promtool"), "promtool is needed (Debian's prometheus): make tools"
    path = tmp_path / "promql_test.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(path) for path in rule_files],
                "evaluation_interval": interval,
                "tests": [
                    {"interval": interval, "input_series": series, "promql_expr_test": tests}
                ],
            }
        )
    )
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@contextmanager
def running_prometheus(run_dir: Path, config: dict, *flags: str) -> Iterator[str]:
    """A real Prometheus (Debian's) with `config`, on a free port; yields its URL once ready."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is needed (Debian's prometheus): make tools"
    (run_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (run_dir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={run_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={run_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (run_dir / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus never became ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
