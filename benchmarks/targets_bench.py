"""The headline speed targets in one table: what was measured, the limit, met or missed.

Each row is measured the way its own benchmark measures it, by that
benchmark's code (the last column names it: ``python -m benchmarks NAME`` runs
it alone, with its full table):

- ``powerflow simulate`` as a user runs it (``main_job``): one fitted
  PowerFlow or PowerFlow+ run of the whole default trace at most 5 s of CPU,
  each baseline at most 3 s; ``--quick`` at most 10 s wall and the default
  comparison at most 60 s wall on 2 cores;
- one ``PowerFlowPolicy.plan`` of a fresh queue (``policy``), p50 of the
  CPU time: at most 100 ms at 16,384 GPUs / 8,192 jobs and 1 s at 65,536 /
  32,768, with shared and with per-job models (each case in a process of its own);
- the operator's allocation pass at 1,024 jobs / 4,096 GPUs (``operator``):
  at most 50 ms of CPU besides the policy, median, for a pass of running jobs
  and for a cold one (1,024 new jobs at once: every pod built);
- the scheduler extender at 5,000 nodes (``extender``): filter and prioritize
  at most 1 ms of CPU at p99 in process (through the ASGI app), and at least
  3,000 calls a second over HTTP with 8 clients.

CPU time is the figure that carries over between machines; wall time (the
comparisons, the HTTP rate) counts whatever else the machine runs, so measure
on a quiet one. The scale run (``python -m benchmarks scale``, 12 minutes) has
no target and is not repeated here, nor are the finer targets other benchmarks
print beside their own tables (the policy's p99 at 64 to 4,096 GPUs, the
operator's 256-job passes and reaction time, the ingest's samples a second, the
models' fit and prediction times, the node agent's). ``python -m benchmarks``
(every benchmark) runs this one too: its rows are measured a second time there.

    python -m benchmarks targets                              # 3-5 minutes
    python -m benchmarks.targets_bench --no-comparison        # without the 42-run comparison
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from rich.table import Table

from benchmarks import extender_bench, main_job_bench, operator_bench, policy_bench
from powerflow.lab.sim.output import stdout_console


@dataclass(frozen=True)
class Target:
    """One measured figure against its limit."""

    what: str
    measured: float
    limit: float
    unit: str
    bench: str
    """The benchmark that measures it (``python -m benchmarks NAME``)."""
    at_least: bool = False
    """The limit is a floor (a rate), not a ceiling."""
    failed: int = 0
    """Calls that were answered with an error (a fast error is no rate)."""

    @property
    def met(self) -> bool:
        if self.failed:
            return False
        return self.measured >= self.limit if self.at_least else self.measured <= self.limit


def main_job(comparison: bool) -> list[Target]:
    """The single runs' CPU and the comparisons' wall time (``main_job_bench``)."""
    main_job_bench.compile_bytecode()
    out = []
    bench = "main_job"
    for run in main_job_bench.RUNS:
        if "--oracle" in run:
            continue  # no target: the fitted run is the one users meet
        measured = main_job_bench.timed(["simulate", *run, "--json"])
        limit = main_job_bench.RUN_CPU_S.get(run[1], main_job_bench.BASELINE_CPU_S)
        out.append(Target(f"simulate {' '.join(run)}", measured.cpu_s, limit, "s", bench))
    runs = [("--quick",), ()] if comparison else [("--quick",)]
    with tempfile.TemporaryDirectory() as folder:
        for extra in runs:
            args = ["simulate", *extra, "--out", os.path.join(folder, "quick" if extra else "all")]
            measured = main_job_bench.timed(args)
            limit = main_job_bench.QUICK_WALL_S if extra else main_job_bench.COMPARISON_WALL_S
            what = " ".join(["simulate", *extra]) + " (the comparison): wall"
            out.append(Target(what, measured.wall_s, limit, "s", bench))
    return out


def decisions(sizes: Sequence[int]) -> list[Target]:
    """p50 CPU of one ``plan`` of a fresh queue per size and kind of models (``policy_bench``)."""
    out = []
    spawn = multiprocessing.get_context("spawn")
    # One core, as ``policy_bench`` runs its cases (the comparison and the HTTP rows
    # need both, so only the cases' processes are pinned).
    core = {min(os.sched_getaffinity(0))}
    for gpus in sizes:
        jobs, limit, reps = policy_bench.SCALE_CASES[gpus]
        assert limit is not None, gpus
        for label, distinct in policy_bench.MODELS:
            with ProcessPoolExecutor(
                max_workers=1,
                mp_context=spawn,
                initializer=os.sched_setaffinity,
                initargs=(0, core),
            ) as pool:
                row = pool.submit(policy_bench.scale_case, gpus, jobs, distinct, reps).result()
            what = f"plan {gpus:,} GPUs/{jobs:,} jobs, {label}: p50 (first {row.first_s:.1f} s)"
            p50 = float(np.median(row.repeated_s)) * 1e3
            out.append(Target(what, p50, limit * 1e3, "ms", "policy"))
    return out


def operator_pass(repeat: int) -> list[Target]:
    """Median operator CPU (the pass's CPU less the policy's) per pass (``operator_bench``)."""
    out = []
    jobs, nodes = 1024, 512
    for label, (_wall, cpu, plan) in operator_bench.loop_times(repeat, jobs, nodes).items():
        share = float(np.median(np.asarray(cpu) - np.asarray(plan))) * 1e3
        kind = label.removeprefix(f"{jobs} ")
        what = f"operator pass, {jobs:,} {kind} / {nodes * 8:,} GPUs, less the policy"
        out.append(Target(what, share, 50.0, "ms", "operator"))
    return out


def extender(nodes: int, pods: int, repeat: int, http: bool) -> list[Target]:
    """In-process p99 CPU of filter and prioritize through the ASGI app, and the HTTP
    rate (``extender_bench``)."""
    bench = "extender"
    out = []
    for name, _n, _wall_p50, _wall_p99, _cpu_p50, cpu_p99 in asyncio.run(
        extender_bench.verbs(nodes, pods, repeat)
    ):
        for verb in ("filter", "prioritize"):  # a worker's call, not a gang's first
            if name.startswith(f"{verb} (NodeNames") and name.endswith("ASGI"):
                what = f"extender {verb}, {nodes:,} nodes, in process: p99"
                out.append(Target(what, cpu_p99, 1.0, "ms", bench))
    if http:
        for r in extender_bench.over_http(nodes, pods, 8, 5.0):
            what = f"extender {r['call'].split()[0]}, {nodes:,} nodes, HTTP, 8 clients"
            out.append(
                Target(what, r["per_s"], 3000.0, "/s", bench, at_least=True, failed=r["failed"])
            )
    return out


def table(targets: Sequence[Target]) -> Table:
    out = Table(
        title=f"Speed targets ({os.cpu_count()} cores; CPU time but for wall and calls/s)",
        caption=f"{extender_bench.machine()}; `python -m benchmarks NAME` runs one benchmark"
        " alone, with its full table",
    )
    for column in ("measure", "measured", "limit", "", "NAME"):
        out.add_column(column, justify="left" if column in ("measure", "NAME") else "right")
    for t in targets:
        value = f"{t.measured:,.0f}" if t.measured >= 100 else f"{t.measured:.2f}"
        limit = f"{'>=' if t.at_least else '<='} {t.limit:,g} {t.unit}"
        verdict = "met" if t.met else f"MISSED ({t.failed} failed)" if t.failed else "MISSED"
        out.add_row(t.what, f"{value} {t.unit}", limit, verdict, t.bench)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-comparison", action="store_true", help="skip the default comparison (minutes)"
    )
    parser.add_argument("--no-http", action="store_true", help="skip the extender's HTTP rows")
    parser.add_argument("--repeat", type=int, default=20, help="operator passes per row (20)")
    args = parser.parse_args(argv)
    targets = [
        *main_job(not args.no_comparison),
        *decisions(sorted(g for g, case in policy_bench.SCALE_CASES.items() if case[1])),
        *operator_pass(args.repeat),
        *extender(5000, 25000, 1000, not args.no_http),
    ]
    stdout_console().print(table(targets))


if __name__ == "__main__":
    main()
