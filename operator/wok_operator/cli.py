"""Operator-side commands of the `wok` CLI (filled in below as the parts land)."""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    del commands
