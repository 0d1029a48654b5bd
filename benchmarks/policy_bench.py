"""Time ``PowerFlowPolicy.plan`` and measure how close the greedy gets to optimal.

Targets (issue 3): decision latency on one core, p50 and p99, for 64 GPUs /
32 jobs < 5 ms, 512 / 256 < 50 ms, 4,096 / 2,048 < 1 s; memory
O(jobs + GPUs). The process pins itself to one CPU. A decision includes
validation, the model tables, allocation, clock configuration and placement.

Models: ``SyntheticModel`` (``powerflow/policy/synthetic.py``), a cheap
analytic model with the paper's shapes, not the ground truth. Two cases:

- ``shared``: 6 model objects shared by all jobs (the trace simulator: one
  ground-truth model per network), so one model call per network;
- ``per-job``: every job its own model object (the operator: one fitted model
  per job), so one model call per job.

Two states: ``fresh`` (nothing runs) and ``replan`` (the previous plan runs,
one minute later: the common event). The policy keeps model predictions
across calls (``powerflow/policy/tablecache.py``), so both rows time a warm
table cache (same model objects as the warm-up call); ``replan, cold cache``
times each decision on a copy with an empty cache (e.g. after every model was
refitted). ``tables`` is the part spent building the model tables without the
cache (model calls included). Then the optimality check: the
greedy against exhaustive search on small random instances (``scenarios.py``,
<= 4 jobs, <= 8 GPUs, 4 clocks), same objective (average predicted JCT) and a
power cap equal to the larger of the limit and the greedy's predicted power.

    python -m benchmarks.policy_bench [--repeat 1.0] [--instances 200]
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from dataclasses import replace

import numpy as np
from rich.console import Console
from rich.table import Table

from powerflow.policy.curves import curves_of
from powerflow.policy.exhaustive import optimal_average_jct, plan_average_jct
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.scenarios import small_instance, synthetic_snapshot
from powerflow.policy.snapshot import Snapshot
from powerflow.policy.tables import build_tables
from powerflow.policy.validate import cluster_of

CASES = ((64, 32, 5e-3, 60), (512, 256, 50e-3, 30), (4096, 2048, 1.0, 8))
"""(GPUs, jobs, p99 target in s, repetitions)."""


def replanned(snapshot: Snapshot, policy: PowerFlowPolicy) -> Snapshot:
    plan = policy.plan(snapshot)
    jobs = tuple(
        replace(j, placement=plan.job(j.id).placement, frequency_mhz=plan.job(j.id).frequency_mhz)
        for j in snapshot.jobs
    )
    return replace(snapshot, jobs=jobs, now_s=snapshot.now_s + 60.0)


def timings(
    snapshot: Snapshot, policy: PowerFlowPolicy, reps: int, cold: bool = False
) -> tuple[list[float], list[float], float]:
    """Wall and CPU seconds per decision, and the median wall time of the tables alone.

    ``cold``: every decision on a policy copy with an empty table cache.
    """
    wall, cpu, tables = [], [], []
    cluster = cluster_of(snapshot)
    clocks = policy.clocks(cluster.gpu)
    for _ in range(reps):
        planner = replace(policy) if cold else policy
        start, start_cpu = time.perf_counter(), time.process_time()
        planner.plan(snapshot)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        start = time.perf_counter()
        curves_of(build_tables(snapshot.jobs, cluster, clocks, True), snapshot.jobs, 0.0)
        tables.append(time.perf_counter() - start)
    return wall, cpu, float(np.median(tables))


def peak_memory_mb(snapshot: Snapshot, policy: PowerFlowPolicy) -> float:
    tracemalloc.start()
    policy.plan(snapshot)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def latency_table(repeat: float) -> Table:
    policy = PowerFlowPolicy()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    table = Table(
        title="PowerFlowPolicy.plan decision latency (one core, SyntheticModel)",
        caption=f"wall: perf_counter; cpu: process_time; load average at start {load:.1f}",
    )
    cols = ("GPUs", "jobs", "models", "state", "p50 ms", "p99 ms", "cpu p50", "cpu p99")
    for col in (*cols, "tables ms", "target (p99)"):
        table.add_column(col, justify="right")
    table.add_column("peak MiB", justify="right")
    for gpus, jobs, target, reps in CASES:
        for label, distinct in (("shared", 6), ("per-job", None)):
            base = synthetic_snapshot(gpus, jobs, seed=1, eta=0.6, distinct_models=distinct)
            again = replanned(base, policy)
            for state, snap, cold in (
                ("fresh", base, False),
                ("replan", again, False),
                ("replan, cold cache", again, True),
            ):
                policy.plan(snap)  # warm caches and imports
                wall, cpu, tables = timings(snap, policy, max(3, int(reps * repeat)), cold)
                p50, p99 = np.quantile(wall, [0.5, 0.99])
                c50, c99 = np.quantile(cpu, [0.5, 0.99])
                ok = "ok" if p99 < target else "missed"
                table.add_row(
                    str(gpus),
                    str(jobs),
                    label,
                    state,
                    f"{p50 * 1e3:.1f}",
                    f"{p99 * 1e3:.1f}",
                    f"{c50 * 1e3:.1f}",
                    f"{c99 * 1e3:.1f}",
                    f"{tables * 1e3:.1f}",
                    f"< {target * 1e3:.0f} {ok}",
                    f"{peak_memory_mb(snap, policy):.1f}" if state == "fresh" else "",
                )
    return table


def optimality_table(instances: int) -> Table:
    rng = np.random.default_rng(2024)
    policy = PowerFlowPolicy()
    ratios = []
    for _ in range(instances):
        snapshot = small_instance(rng)
        plan = policy.plan(snapshot)
        cap = max(plan.limit_watts, plan.predicted_watts)
        ratios.append(plan_average_jct(snapshot, plan) / optimal_average_jct(snapshot, cap))
    r = np.asarray(ratios)
    table = Table(title=f"greedy / exhaustive average JCT, {instances} small instances")
    cols = ("mean", "p50", "p90", "p99", "max", "optimal")
    for col in cols:
        table.add_column(col, justify="right")
    q = np.quantile(r, [0.5, 0.9, 0.99])
    table.add_row(
        f"{r.mean():.3f}",
        *(f"{v:.3f}" for v in q),
        f"{r.max():.3f}",
        f"{np.mean(r < 1 + 1e-9):.0%}",
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=float, default=1.0, help="scale the repetitions")
    parser.add_argument("--instances", type=int, default=200, help="small instances")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    console = Console(width=max(Console().width, 130))
    console.print(latency_table(args.repeat))
    console.print(optimality_table(args.instances))


if __name__ == "__main__":
    main()
