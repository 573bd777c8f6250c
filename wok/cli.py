"""The one entry point, `wok <command>`.

Each part registers its own commands and imports its heavy dependencies only when one of them
runs, so an operator image without torch and a runtime image without kopf share this CLI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, except None and False: an unset option or an off
    flag says nothing a reader needs."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not _has_default(action) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _has_default(action: argparse.Action) -> bool:
    return not any(action.default is unset for unset in (None, False, argparse.SUPPRESS))


class RawDefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The same, for a command whose description or epilog is laid out by hand."""


#: The formatter each part's parser gets in place of argparse's own, so that no command has to
#: remember to show its defaults.
_WITH_DEFAULTS: dict[type[argparse.HelpFormatter], type[argparse.HelpFormatter]] = {
    argparse.HelpFormatter: DefaultsHelpFormatter,
    argparse.RawDescriptionHelpFormatter: RawDefaultsHelpFormatter,
}


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _WITH_DEFAULTS.get(parser.formatter_class, parser.formatter_class)
    for action in parser._actions:
        if action.help is None and _has_default(action):
            action.help = (
                "default: %(default)s"  # argparse prints nothing for an option without help
            )
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _show_defaults(command)


def wok_version() -> str:
    try:
        return version("wok")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from wok import demo, dev
    from wok_batch import cli as batch_cli
    from wok_operator import cli as operator_cli
    from wok_runtime import cli as runtime_cli
    from wok_sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="wok", description="Batching-aware autoscaling for LLM inference on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"wok {wok_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for part in (operator_cli, runtime_cli, sim_cli, dev, batch_cli, demo):
        part.register(commands)
    _show_defaults(parser)
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
