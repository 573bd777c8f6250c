"""promtool (Debian's prometheus package, `make tools`) checks the alert rules and runs their
unit tests (charts/wok/files/alerts_test.yaml: each alert just before its `for:` expires and at
expiry). In this tier, not the unit tier, so `make test-fast` needs nothing but the venv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FILES = Path(__file__).resolve().parents[2] / "charts" / "wok" / "files"


@pytest.mark.parametrize(
    "command",
    [
        ["check", "rules", FILES / "alerts.yaml"],
        ["test", "rules", FILES / "alerts_test.yaml"],
        ["check", "rules", FILES / "recording_rules.yaml"],
    ],
)
def test_promtool_accepts_the_rules_and_their_tests(command: list[object]) -> None:
    assert shutil.which("promtool"), "promtool is needed (Debian's prometheus): make tools"
    run = subprocess.run(["promtool", *map(str, command)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
