"""The one entry point, `wok <command>`.

Each part registers its own commands and imports its heavy dependencies only when one of them
runs, so an operator image without torch and a runtime image without kopf share this CLI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from wok import demo
    from wok_batch import cli as batch_cli
    from wok_cluster import cli as cluster_cli
    from wok_operator import cli as operator_cli
    from wok_runtime import cli as runtime_cli
    from wok_sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="wok", description="Batching-aware autoscaling for LLM inference on Kubernetes."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for part in (operator_cli, runtime_cli, sim_cli, cluster_cli, batch_cli, demo):
        part.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        # Bad user input is one clear line and a non-zero exit, never a traceback.
        print(f"wok {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
