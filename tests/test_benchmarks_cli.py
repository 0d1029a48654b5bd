"""``python -m benchmarks``: its help lists every benchmark; a name matching none is one
line and exit 2 (the benchmarks themselves are never run by the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_help_lists_every_benchmark_with_what_it_measures() -> None:
    done = benchmarks("--help")
    assert done.returncode == 0, done.stderr
    modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("*_bench.py"))
    assert modules
    for name in modules:
        (line,) = [x for x in done.stdout.splitlines() if x.split()[:1] == [name[:-6]]]
        assert len(line.split()) > 2, line  # a summary follows the name


def test_an_unknown_name_is_one_line_and_exit_2() -> None:
    done = benchmarks("no-such-thing")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "no benchmark matches no-such-thing; have " in done.stderr
