"""The ``powerflow`` command line: one argparse parser, one module per subcommand.

Each module in ``powerflow.commands`` adds its subparser with
``register(subparsers)`` and sets ``func`` (returning the exit code). Bad input
is reported as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from powerflow import __version__
from powerflow.errors import PowerFlowError

# Subcommand modules under powerflow.commands, in help order.
COMMANDS: tuple[str, ...] = (
    "simulate",
    "sweep",
    "fit",
    "extender",
    "operator",
    "nodeagent",
    "plan",
    "budget",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="powerflow",
        description="Energy-aware scheduling of deep-learning training on GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"powerflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"powerflow.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except PowerFlowError as exc:
        print(f"powerflow {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
