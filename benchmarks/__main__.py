"""Run every ``*_bench`` module's ``main()`` in name order.

``python -m benchmarks [NAME ...]`` runs only the modules whose name contains one
of the words (e.g. ``python -m benchmarks models``); ``--help`` lists them, each
with the first line of its docstring.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
import sys
import time
from pathlib import Path

import benchmarks


def bench_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.endswith("_bench")
    )


def summary(name: str) -> str:
    """The first line of a benchmark module's docstring, read without importing it (the
    modules import the whole stack)."""
    path = Path(benchmarks.__path__[0]) / f"{name}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.splitlines()[0] if doc else ""


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {n.removesuffix('_bench'):<16} {summary(n)}" for n in bench_modules())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Speed and accuracy benchmarks: each prints a table.",
        epilog=f"benchmarks:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="run the benchmarks whose name "
                   "contains one of these words (default: all)")  # fmt: skip
    return p


def run(filters: list[str]) -> int:
    names = [n for n in bench_modules() if not filters or any(f in n for f in filters)]
    if not names:
        have = ", ".join(n.removesuffix("_bench") for n in bench_modules())
        print(f"no benchmark matches {' '.join(filters)}; have {have}", file=sys.stderr)
        return 2
    for name in names:
        print(f"== benchmarks.{name}", flush=True)
        module = importlib.import_module(f"benchmarks.{name}")
        start = time.perf_counter()
        argv, sys.argv = sys.argv, [f"benchmarks.{name}"]  # each main() sees no arguments
        try:
            module.main()
        finally:
            sys.argv = argv
        print(f"== {name}: {time.perf_counter() - start:.1f} s\n", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run(args.names)


if __name__ == "__main__":
    sys.exit(main())
