"""The layers of docs/architecture.md hold: `lint-imports` checks every contract in pyproject.toml,
and ruff keeps the code as the style asks, so `make test` fails where `make lint` would."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_no_import_crosses_the_layers():
    result = run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_contract_ignores_an_import():
    """An ignored import is a seam the layers do not tell: the layers must be true as written."""
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    ignored = {c["name"]: c["ignore_imports"] for c in linter["contracts"] if "ignore_imports" in c}
    assert ignored == {}


def test_ruff_finds_nothing():
    check = run(str(BIN / "ruff"), "check", ".")
    assert check.returncode == 0, check.stdout[-4000:]
    formatted = run(str(BIN / "ruff"), "format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout[-4000:]
