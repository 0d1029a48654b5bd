"""Simulator at scale: fitted PowerFlow on 2,048 nodes with the ITP trace's arrival rate scaled.

The bundled ITP trace (1,901 jobs submitted over a day) contends on the
default 64 x 8 GPUs: 54,000 GPU-hours of work, 4.4 days of that cluster. On
``N`` nodes it is scaled ``k = N / 64`` times by arrival rate
(``powerflow.lab.sim.scaling.superpose``: ``k`` copies over the same day, each
shifted by up to an hour, every job as in the trace), so ``N`` nodes get the
load 64 did: at 2,048 nodes (16,384 GPUs) 60,832 jobs. One fitted PowerFlow
eta 0.6 run per cluster size, each in a process of its own (so its memory is
its own), on one core. Columns: wall and CPU time of the run (loading the
trace and the ground truth not counted), the CPU split as in ``sim_bench``
(``policy.plan`` calls, model fitting, the engine: the rest), CPU per policy
call, the process's peak resident memory (``ru_maxrss``: interpreter,
libraries, trace and run), and how loaded the cluster was: GPU utilisation
(computing GPU-seconds over all GPUs) over the makespan and over the
submission window (first to last submission), and the mean number of
waiting jobs in that window.

    python -m benchmarks scale                                # 2,048 nodes (about 12 min)
    python -m benchmarks.scale_bench --nodes 64,128,256,512   # how the time grows
    python -m benchmarks.scale_bench --nodes 2048 --seed 1    # other shifts of the copies
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.sim_bench import _TimedLearner, _TimedPolicy
from powerflow.core.learning import FittedLearner
from powerflow.core.models.priors import held_out_prior
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import DEFAULT_NODES, SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import TraceSpec, _world, load_jobs
from powerflow.lab.sim.scaling import superpose

NODES = (2048,)
ETA = 0.6


@dataclass(frozen=True)
class ScaledRun:
    nodes: int
    gpus: int
    copies: int
    jobs: int
    wall_s: float
    cpu_s: float
    policy_cpu_s: float
    fit_cpu_s: float
    policy_calls: int
    events: int
    max_rss_mib: float
    utilisation: float
    window_utilisation: float
    window_queued: float
    makespan_s: float


def window_means(series: Series, start_s: float, end_s: float, gpus: int) -> tuple[float, float]:
    """Mean busy fraction of ``gpus`` and mean number of waiting jobs over
    ``[start_s, end_s]`` (the series is a step function: each row holds until the next)."""
    t = series.t_s
    held = np.clip(t[1:], start_s, end_s) - np.clip(t[:-1], start_s, end_s)
    span = end_s - start_s
    busy = float(np.dot(series.busy_gpus[:-1], held)) / (gpus * span)
    return busy, float(np.dot(series.queued_jobs[:-1], held)) / span


def scaled_run(nodes: int, seed: int) -> ScaledRun:
    """One fitted PowerFlow run of the trace scaled for ``nodes`` (see the docstring)."""
    copies = max(1, round(nodes / DEFAULT_NODES))
    config = SimConfig(nodes=nodes)
    jobs = superpose(load_jobs(TraceSpec(), config), copies, seed=seed)
    configured = scheduler("powerflow").configure(ETA)
    policy = _TimedPolicy(configured.policy)
    learner = _TimedLearner(FittedLearner(config.gpu, prior=held_out_prior))
    sim = Simulation(
        jobs, dataclasses.replace(configured, policy=policy), config, _world(), learner
    )
    c0, w0 = time.process_time(), time.perf_counter()
    result = sim.run()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    metrics = summarise(result)
    first = min(j.submit_s for j in jobs)
    last = max(j.submit_s for j in jobs)
    busy, queued = window_means(result.series, first, last, config.total_gpus)
    return ScaledRun(
        nodes=nodes,
        gpus=config.total_gpus,
        copies=copies,
        jobs=len(jobs),
        wall_s=wall,
        cpu_s=cpu,
        policy_cpu_s=policy.cpu_s,
        fit_cpu_s=learner.cpu_s,
        policy_calls=result.policy_calls,
        events=result.events,
        max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10,
        utilisation=metrics["gpu_utilisation"],
        window_utilisation=busy,
        window_queued=queued,
        makespan_s=metrics["makespan_s"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes",
        default=",".join(map(str, NODES)),
        help="cluster sizes, comma-separated (8 GPUs each; the trace is scaled N / 64 times)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the copies' shifts")
    args = parser.parse_args()
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    table = Table(
        title=f"fitted PowerFlow eta {ETA:g}, ITP trace scaled k times by arrival rate",
        caption="CPU split: policy.plan, model fitting, engine (the rest); RSS: the run's "
        "process at its peak; busy: GPU utilisation over the makespan and over the "
        "submission window; waiting: mean waiting jobs in that window; days: makespan",
    )
    for col in (
        "nodes",
        "GPUs",
        "k",
        "jobs",
        "wall s",
        "CPU s",
        "policy s",
        "fit s",
        "engine s",
        "calls",
        "ms/call",
        "events",
        "RSS MiB",
        "busy",
        "busy window",
        "waiting",
        "days",
    ):
        table.add_column(col, justify="right")
    spawn = multiprocessing.get_context("spawn")
    for nodes in sizes:
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            r = pool.submit(scaled_run, nodes, args.seed).result()
        engine = r.cpu_s - r.policy_cpu_s - r.fit_cpu_s
        table.add_row(
            str(r.nodes),
            str(r.gpus),
            str(r.copies),
            str(r.jobs),
            f"{r.wall_s:.0f}",
            f"{r.cpu_s:.0f}",
            f"{r.policy_cpu_s:.0f}",
            f"{r.fit_cpu_s:.0f}",
            f"{engine:.0f}",
            str(r.policy_calls),
            f"{r.policy_cpu_s / max(r.policy_calls, 1) * 1e3:.0f}",
            str(r.events),
            f"{r.max_rss_mib:.0f}",
            f"{r.utilisation:.0%}",
            f"{r.window_utilisation:.0%}",
            f"{r.window_queued:.0f}",
            f"{r.makespan_s / 86400:.1f}",
        )
        print(f"{nodes} nodes done: {r.wall_s:.0f} s wall", flush=True)
    Console(width=max(Console().width, 160)).print(table)


if __name__ == "__main__":
    main()
