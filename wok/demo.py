"""`wok demo`: the main job on an embedded default (grows with each part of wok)."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="run the demo on an embedded default")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    del args
    return 0
