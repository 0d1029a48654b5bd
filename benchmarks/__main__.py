"""Run every ``*_bench`` module's ``main()`` in name order.

``python -m benchmarks [SUBSTRING ...]`` runs only the modules whose name
contains one of the substrings (e.g. ``python -m benchmarks models``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import benchmarks


def bench_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.endswith("_bench")
    )


def run(filters: list[str]) -> int:
    names = [n for n in bench_modules() if not filters or any(f in n for f in filters)]
    if not names:
        print(f"no benchmark matches {filters}; have {bench_modules()}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
