"""The Makefile's install step, as `make demo` runs it on a fresh machine: setuptools' warning
banner about editable installs ("Editable installation.") must not reach the user. The step's own
lines (`make -n`) run into a new venv, without the extras' dependencies (torch is gigabytes);
the same pip line without the Makefile's warning filter shows the banner, so the filter is what
hides it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BANNER = "Editable installation"


def install_lines(venv: Path) -> list[str]:
    """The demo stamp's recipe for a venv at `venv`, its editable install without dependencies."""
    # Under `make test` the outer make's flags would have this make print "Entering directory".
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    recipe = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", f"{venv}/.installed-demo", f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, check=True, env=env,
    ).stdout.splitlines()  # fmt: skip
    lines = [line for line in recipe if not line.startswith("touch ")]
    [editable] = [line for line in lines if " -e " in line]
    assert "'.[demo]'" in editable, editable
    return [line.replace("'.[demo]'", ". --no-deps") for line in lines]


def run(line: str) -> str:
    done = subprocess.run(
        ["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_install_step_prints_no_editable_install_banner(tmp_path):
    venv = tmp_path / "venv"
    lines = install_lines(venv)
    printed = "".join(run(line) for line in lines)
    assert BANNER not in printed, printed
    assert (venv / "bin" / "wok").exists()
    [editable] = [line for line in lines if " -e " in line]
    setting, *pip = shlex.split(editable)
    assert setting.startswith("PYTHONWARNINGS=")
    assert BANNER in run(shlex.join(pip))  # the same pip line without the filter
