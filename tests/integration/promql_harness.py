"""Operator queries evaluated by Prometheus' own engine: a promtool rules test with no rules, only
`promql_expr_test`s over given input series."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml


def assert_promql(
    tmp_path: Path, series: list[dict], tests: list[dict], *, interval: str = "1m"
) -> None:
    """promtool evaluates each test's `expr` over `series` (one sample per `interval`) and
    compares."""
    assert shutil.which("promtool"), "promtool is needed (Debian's prometheus): make tools"
    path = tmp_path / "promql_test.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [],
                "evaluation_interval": interval,
                "tests": [
                    {"interval": interval, "input_series": series, "promql_expr_test": tests}
                ],
            }
        )
    )
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
