"""The ``powerflow`` command line: one argparse parser, one module per subcommand.

Each module in ``powerflow.commands`` adds its subparser with
``register(subparsers)`` and sets ``func`` (returning the exit code). Bad input
is reported as one line on stderr with exit code 2, and so is a file-system
error the checks before the work could not foresee.

The commands' descriptions are their module docstrings, written in
reStructuredText for the API docs; ``plain_help`` turns their inline literals
into the plain text a terminal shows, for every parser at once.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from powerflow import __version__
from powerflow.core.errors import PowerFlowError

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
    "demo",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, with ``only``, the parser with that subcommand alone: each
    subcommand module imports what its options need (``simulate`` the simulator,
    matplotlib, scipy, numba: about 2 s), and an operator, extender or node agent
    restarted in a crash loop should not pay for the others."""
    parser = argparse.ArgumentParser(
        prog="powerflow",
        description="Energy-aware scheduling of deep-learning training on GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"powerflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"powerflow.commands.{name}")
        except ModuleNotFoundError as exc:
            missing = lab_part(exc.name or "")
            if missing is None:
                raise
            _register_unavailable(subparsers, name, missing)
            continue
        module.register(subparsers)
    plain_help(parser)
    return parser


# What the ``lab`` extra adds (pyproject.toml): the image has the operator, extender
# and node agent without it, and a lab command there says so instead of a traceback.
LAB_PACKAGES = frozenset({"scipy", "matplotlib", "adjustText", "rich", "kmock"})
LAB_CODE = "powerflow.lab"
"""The lab's own code, which the image leaves out as well (docs/image.md)."""


def lab_needed(missing: str) -> str:
    """The one line a command that needs the lab answers without it."""
    return f"needs the lab extras ({missing} is not installed): pip install 'powerflow[lab]'"


def lab_part(module: str) -> str | None:
    """What of the lab a failed import of ``module`` lacks: an extra's package, or the
    lab's own code; None when ``module`` is no part of the lab (a real error)."""
    top = module.partition(".")[0]
    if top in LAB_PACKAGES:
        return top
    if module == LAB_CODE or module.startswith(LAB_CODE + "."):
        return LAB_CODE
    return None


def _register_unavailable(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, missing: str
) -> None:
    """A command whose module needs a lab package that is not installed: listed in the
    help, and run, one line saying what to install (exit 2)."""
    why = lab_needed(missing)
    # No option prefix: every word after the command, options included, is taken
    # and ignored, so the answer is the missing extra, not an unknown option.
    sub = subparsers.add_parser(
        name, help=f"(not installed: {why})", add_help=False, prefix_chars="\0"
    )
    sub.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def unavailable(args: argparse.Namespace) -> int:
        raise PowerFlowError(why)

    sub.set_defaults(func=unavailable)


_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`", re.DOTALL)


def plain(text: str | None) -> str | None:
    """``x`` and `x` (reStructuredText literals and references) as x."""
    return _LITERAL.sub(lambda m: m.group(1) or m.group(2), text) if text else text


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Every description and help string of ``parser`` and its subcommands in plain text."""
    parser.description = plain(parser.description)
    parser.epilog = plain(parser.epilog)
    for action in parser._actions:
        action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in dict.fromkeys(action.choices.values()):
                plain_help(sub)


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word not an option), if it is one and
    no option before it asks for the top-level help or version (``powerflow -h
    operator`` lists every command)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
        if word in ("-h", "--help", "--version"):
            return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=chosen_command(words))
    args = parser.parse_args(words)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except PowerFlowError as exc:
        print(f"powerflow {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a lab import inside a command, run without it
        missing = lab_part(exc.name or "")
        if missing is None:
            raise
        print(f"powerflow {args.command}: error: {lab_needed(missing)}", file=sys.stderr)
        return 2
    except OSError as exc:  # what the checks before the work cannot foresee (a full disk)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"powerflow {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
