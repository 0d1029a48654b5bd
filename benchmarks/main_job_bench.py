"""The main job's speed: ``powerflow simulate`` as a user runs it, one run and the comparison.

Every row starts ``powerflow`` in a process of its own, as a user's shell
does (start-up, trace and ground truth included), and reports its wall time
and the CPU time of it and its children (``getrusage(RUSAGE_CHILDREN)``:
the comparison's worker processes too). Targets:

- one run of the whole default trace (the 24-hour ITP window, 64 x 8 A100):
  fitted PowerFlow or PowerFlow+ at most 5 s of CPU, every baseline at most 3 s;
- ``powerflow simulate`` (the default comparison, every run it needs, spread
  over the machine's cores) at most 60 s wall on 2 cores, ``--quick`` at most 10 s.

CPU time is the number to compare on a shared machine; the comparison's wall
time counts whatever else the machine runs, so measure it on a quiet one.

    python -m benchmarks main_job                 # all rows (the comparison takes minutes)
    python benchmarks/main_job_bench.py --no-comparison
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

from rich.table import Table

import powerflow
from powerflow.lab.sim.output import stdout_console

RUN_CPU_S = {"powerflow": 5.0, "powerflow+": 5.0}
"""CPU targets of one run per scheduler; every other (a baseline) gets ``BASELINE_CPU_S``."""
BASELINE_CPU_S = 3.0
COMPARISON_WALL_S = 60.0
QUICK_WALL_S = 10.0

RUNS: tuple[tuple[str, ...], ...] = (
    ("--scheduler", "powerflow", "--eta", "0.6"),
    ("--scheduler", "powerflow+", "--eta", "0.6"),
    ("--scheduler", "powerflow", "--eta", "0.6", "--oracle"),
    ("--scheduler", "gandiva", "--frequency", "1410"),
    ("--scheduler", "tiresias", "--frequency", "1410"),
    ("--scheduler", "afs", "--frequency", "1410"),
    ("--scheduler", "gandiva+zeus"),
    ("--scheduler", "tiresias+zeus"),
)


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float


def timed(args: list[str]) -> Measured:
    """Run ``powerflow ARGS`` to the end; its wall time and its (and its children's) CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "powerflow", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"powerflow {' '.join(args)} failed:\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(wall, cpu)


def compile_bytecode() -> None:
    """Write the bytecode of the package and of the environment it runs in before timing,
    as a user's runs have it: an installed package's first import writes it (pip also
    compiles at install, uv does not). Where ``PYTHONDONTWRITEBYTECODE`` is set (this
    project's shells have it) nothing writes it, and every run would compile from source
    again every module it imports: 1.0-1.2 s of CPU a run (numba's modules most) that no
    user pays (``/usr/bin/time -f %U+%S powerflow simulate --scheduler tiresias
    --frequency 1410 --json``, once with ``PYTHONPYCACHEPREFIX`` set to an empty folder,
    once as it is). Files that do not compile under this Python (a test module of some
    package written for a newer one) are left alone, as their import would leave them."""
    compileall.compile_dir(os.path.dirname(powerflow.__file__), quiet=1)
    for folder in {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}:
        compileall.compile_dir(folder, quiet=2, workers=0)


def verdict(value: float, target: float) -> str:
    return f"<= {target:g} s: {'met' if value <= target else 'MISSED'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-comparison", action="store_true", help="skip the default comparison (minutes)"
    )
    args = parser.parse_args()
    compile_bytecode()
    table = Table(title=f"powerflow simulate, as a user runs it ({os.cpu_count()} cores)")
    for col in ("command", "wall (s)", "CPU (s)", "target"):
        table.add_column(col, justify="right" if col != "command" else "left")
    for run in RUNS:
        measured = timed(["simulate", *run, "--json"])
        target = None if "--oracle" in run else RUN_CPU_S.get(run[1], BASELINE_CPU_S)
        table.add_row(
            "simulate " + " ".join(run),
            f"{measured.wall_s:.1f}",
            f"{measured.cpu_s:.1f}",
            "CPU " + verdict(measured.cpu_s, target) if target is not None else "",
        )
    with tempfile.TemporaryDirectory() as out:
        comparisons = [("--quick",), ()] if not args.no_comparison else [("--quick",)]
        for extra in comparisons:
            folder = os.path.join(out, "quick" if extra else "full")
            measured = timed(["simulate", *extra, "--out", folder])
            limit = QUICK_WALL_S if extra else COMPARISON_WALL_S
            table.add_row(
                " ".join(["simulate", *extra]) + " (the comparison)",
                f"{measured.wall_s:.1f}",
                f"{measured.cpu_s:.1f}",
                "wall " + verdict(measured.wall_s, limit),
            )
    stdout_console().print(table)


if __name__ == "__main__":
    main()
