"""Time ``PowerFlowPolicy.plan`` (64 to 65,536 GPUs) and how close the greedy gets to optimal.

Targets: decision latency on one core, p99, for 64 GPUs / 32 jobs < 5 ms,
512 / 256 < 50 ms, 4,096 / 2,048 < 1 s; p50 of a fresh queue at 16,384 GPUs /
8,192 jobs <= 100 ms and at 65,536 / 32,768 <= 1 s; memory O(jobs + GPUs).
The process pins itself to one CPU. A decision includes validation, the
model tables, allocation, clock configuration and placement.

Models: ``SyntheticModel`` (``powerflow/lab/synthetic.py``), a cheap
analytic model with the paper's shapes, not the ground truth. Two cases:

- ``shared``: 6 model objects shared by all jobs (the trace simulator: one
  ground-truth model per network), so one model call per network;
- ``per-job``: every job its own model object (the operator: one fitted model
  per job), so one model call per job.

First table, up to 4,096 GPUs. Two states: ``fresh`` (nothing runs) and
``replan`` (the previous plan runs, one minute later: the common event). The
policy keeps model predictions across calls (``powerflow/core/policy/memo.py``),
so both rows time a warm memo (same model objects as the warm-up call);
``replan, cold cache`` times each decision on a copy with an empty memo (e.g.
after every model was refitted). ``tables`` is the part spent building the
model tables without the memo (model calls included).

Second table, at scale (4,096, 16,384 and 65,536 GPUs, a fresh queue: every
job waits, nothing placed), each case in a process of its own started for it
(``spawn``), CPU time: ``first call`` is a new ``PowerFlowPolicy`` planning a
snapshot built in that process, as a freshly started operator would (only a
64-GPU decision before it, which loads the compiled kernels); ``p50``/``p99``
repeat the same snapshot on that policy; ``replan`` plans the same snapshot
with one job's remaining iterations changed (another job each time);
``plan peak`` is tracemalloc's peak during another first call, after the
timed ones (new models, a new policy, nodes of other names: everything is
built again), ``max RSS`` the process's resident peak after the timed calls
(the interpreter and the libraries included).
The targets judge the fresh queue's p50. With fewer than 100 repetitions p99
is the slowest call.

Then the optimality check: the greedy against exhaustive search on small
random instances (``scenarios.py``, <= 4 jobs, <= 8 GPUs, 4 clocks), same
objective (average predicted JCT) and a power cap equal to the larger of the
limit and the greedy's predicted power.

    python -m benchmarks.policy_bench [--repeat 1.0] [--scale 4096,16384,65536] [--instances 200]
    python -m benchmarks.policy_bench --profile 16384 [--models per-job]

``--profile GPUS`` prints cProfile's top functions (by self time and by
cumulative time) of a first call, a repeated call and a replan at that size
(half as many jobs) instead of the tables; cProfile's cost per Python call
makes Python loops look dearer beside numpy and the compiled loops than
they are.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import resource
import sys
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
from rich.console import Console
from rich.table import Table

from powerflow.core.policy.curves import curves_of
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Snapshot
from powerflow.core.policy.tables import build_tables
from powerflow.core.policy.validate import cluster_of
from powerflow.lab.exhaustive import optimal_average_jct, plan_average_jct
from powerflow.lab.scenarios import small_instance, synthetic_snapshot

CASES = ((64, 32, 5e-3, 60), (512, 256, 50e-3, 30), (4096, 2048, 1.0, 8))
"""(GPUs, jobs, p99 target in s, repetitions)."""

SCALE_CASES: dict[int, tuple[int, float | None, int]] = {
    4096: (2048, None, 20),
    16384: (8192, 0.1, 10),
    65536: (32768, 1.0, 3),
}
"""GPUs: (jobs, fresh-queue p50 target in s or None, repetitions)."""

MODELS = (("shared", 6), ("per-job", None))
"""(label, ``distinct_models`` of ``synthetic_snapshot``)."""


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


@dataclass(frozen=True)
class ScaleRow:
    """One case of the scale table, CPU seconds."""

    first_s: float
    repeated_s: list[float]
    replan_s: list[float]
    peak_mib: float
    max_rss_mib: float


def progressed(snapshot: Snapshot, k: int) -> Snapshot:
    """``snapshot`` with the remaining iterations of one job (chosen by ``k``) 1% lower."""
    jobs = list(snapshot.jobs)
    i = (k * 7919) % len(jobs)
    jobs[i] = replace(jobs[i], remaining_iterations=jobs[i].remaining_iterations * 0.99)
    return replace(snapshot, jobs=tuple(jobs))


def cpu_of(policy: PowerFlowPolicy, snapshot: Snapshot) -> float:
    start = time.process_time()
    policy.plan(snapshot)
    return time.process_time() - start


def scale_case(gpus: int, jobs: int, distinct: int | None, reps: int) -> ScaleRow:
    """One row of the scale table; meant to run in a process of its own (see the docstring)."""
    PowerFlowPolicy().plan(synthetic_snapshot(64, 32, seed=2, distinct_models=distinct))
    snapshot = synthetic_snapshot(gpus, jobs, seed=1, eta=0.6, distinct_models=distinct)
    policy = PowerFlowPolicy()
    first = cpu_of(policy, snapshot)
    repeated = [cpu_of(policy, snapshot) for _ in range(reps)]
    replans = [cpu_of(policy, progressed(snapshot, k)) for k in range(reps)]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    # A first call again for the memory: new models, a new policy, and nodes of other
    # names, so that nothing the policy remembers per node tuple is reused either.
    again = synthetic_snapshot(gpus, jobs, seed=1, eta=0.6, distinct_models=distinct)
    again = replace(again, nodes=tuple(replace(n, name=f"m-{n.name}") for n in again.nodes))
    return ScaleRow(first, repeated, replans, peak_memory_mb(again, PowerFlowPolicy()), rss)


def scale_table(sizes: list[int], repeat: float) -> Table:
    table = Table(
        title="PowerFlowPolicy.plan at scale, fresh queue (one core, SyntheticModel, CPU time)",
        caption="each case in a new process; replan: one job's progress changed; "
        "plan peak: tracemalloc during a first call",
    )
    cols = ("GPUs", "jobs", "models", "first call ms", "p50 ms", "p99 ms", "replan p50 ms")
    for col in (*cols, "replan p99 ms", "plan peak MiB", "max RSS MiB", "p50 target"):
        table.add_column(col, justify="right")
    spawn = multiprocessing.get_context("spawn")
    for gpus in sizes:
        jobs, target, reps = SCALE_CASES.get(gpus, (gpus // 2, None, 3))
        reps = max(3, int(reps * repeat))
        for label, distinct in MODELS:
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                row = pool.submit(scale_case, gpus, jobs, distinct, reps).result()
            p50, p99 = np.quantile(row.repeated_s, [0.5, 0.99])
            r50, r99 = np.quantile(row.replan_s, [0.5, 0.99])
            ok = "" if target is None else "ok" if p50 <= target else "missed"
            table.add_row(
                str(gpus),
                str(jobs),
                label,
                f"{row.first_s * 1e3:.0f}",
                f"{p50 * 1e3:.0f}",
                f"{p99 * 1e3:.0f}",
                f"{r50 * 1e3:.0f}",
                f"{r99 * 1e3:.0f}",
                f"{row.peak_mib:.0f}",
                f"{row.max_rss_mib:.0f}",
                "" if target is None else f"{target * 1e3:.0f} {ok}",
            )
    return table


def profile(gpus: int, models: str) -> None:
    """cProfile's top functions of a first call, a repeated call and a replan at ``gpus``."""
    distinct = dict(MODELS)[models]
    PowerFlowPolicy().plan(synthetic_snapshot(64, 32, seed=2, distinct_models=distinct))
    snapshot = synthetic_snapshot(gpus, gpus // 2, seed=1, eta=0.6, distinct_models=distinct)
    policy = PowerFlowPolicy()
    for name, snap in (
        ("first call", snapshot),
        ("repeated call", snapshot),
        ("replan", progressed(snapshot, 1)),
    ):
        profiler = cProfile.Profile(time.process_time)
        profiler.runcall(policy.plan, snap)
        for order in ("tottime", "cumulative"):
            print(f"== {name}, {gpus} GPUs, {gpus // 2} jobs, {models} models, by {order}")
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.strip_dirs().sort_stats(order).print_stats(25)


def optimality_table(instances: int) -> Table:
    rng = np.random.default_rng(2024)
    policy = PowerFlowPolicy()
    ratios = []
    for _ in range(instances):
        snapshot = small_instance(rng)
        plan = policy.plan(snapshot)
        cap = max(plan.limit_w, plan.predicted_w)
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
    parser.add_argument(
        "--scale",
        default=",".join(map(str, SCALE_CASES)),
        help="GPU counts of the scale table, comma-separated (half as many jobs); '' for none",
    )
    parser.add_argument("--profile", type=int, metavar="GPUS", help="profile at GPUS instead")
    parser.add_argument("--models", choices=[m for m, _ in MODELS], default="shared")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.profile:
        profile(args.profile, args.models)
        return
    console = Console(width=max(Console().width, 130))
    console.print(latency_table(args.repeat))
    sizes = [int(x) for x in args.scale.split(",") if x.strip()]
    if sizes:
        console.print(scale_table(sizes, args.repeat))
    console.print(optimality_table(args.instances))


if __name__ == "__main__":
    main()
