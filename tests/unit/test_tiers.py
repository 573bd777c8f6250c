"""Every test of the suite carries exactly one tier (unit, integration or e2e): the Makefile's
tier targets and make test's two passes select by them, so a test without one would never run
in `make test-unit`, `test-integration` or `test-e2e`, and one with two would run twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_TIER_OR_TWO = (
    "not unit and not integration and not e2e"
    " or unit and integration or unit and e2e or integration and e2e"
)


def collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_every_test_has_exactly_one_tier():
    result = collect("-m", NO_TIER_OR_TWO)
    # 5: pytest's "no tests collected", here every test deselected
    assert result.returncode == 5, result.stdout[-3000:] + result.stderr[-3000:]
    assert "deselected" in result.stdout, result.stdout[-3000:]


def test_a_test_outside_the_tier_directories_has_none(tmp_path):
    # the check above can fail: a test file that neither marks itself nor sits in a tier's
    # directory is caught by the same selection
    stray = tmp_path / "test_stray.py"
    stray.write_text("def test_stray():\n    pass\n")
    result = collect("-c", str(ROOT / "pyproject.toml"), "-m", NO_TIER_OR_TWO, str(stray))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 test collected" in result.stdout, result.stdout[-3000:]
