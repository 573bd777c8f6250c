"""Commands of this part of wok, registered into the `wok` CLI (filled in by its issue)."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any) -> None:
    del commands


def _unused(args: argparse.Namespace) -> int:
    return 0
