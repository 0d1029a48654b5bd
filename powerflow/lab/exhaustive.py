"""Exact answers on small instances, to measure how far the greedy is from optimal.

The objective is the policy's own: average predicted JCT (``curves.py``) over
all jobs, every job running on one of its allowed power-of-two counts at any
clock, with the GPUs fitting the cluster and the predicted power (jobs plus
idle GPUs on packed nodes, as in ``allocation.py``) within a cap. Brute force
over every combination: only for a handful of jobs, GPUs and clocks.
"""

from __future__ import annotations

import math

import numpy as np

from powerflow.core.policy.curves import curves_of
from powerflow.core.policy.snapshot import Plan, Snapshot
from powerflow.core.policy.tables import build_tables
from powerflow.core.policy.validate import cluster_of

MAX_COMBINATIONS = 2_000_000


def plan_average_jct(snapshot: Snapshot, plan: Plan) -> float:
    """Average predicted JCT of a plan (infinite if any job waits)."""
    gpn = snapshot.nodes[0].gpus
    total = 0.0
    for job in snapshot.jobs:
        jp = plan.job(job.id)
        if jp.gpus == 0:
            return math.inf
        nodes = [node for node, _ in jp.placement] or ["?"] * jp.gpus
        r = max(nodes.count(n) for n in set(nodes)) if jp.placement else min(jp.gpus, gpn)
        step = float(job.model.step_time_s(jp.gpus, r, jp.local_batch_size, jp.frequency_mhz))
        total += max(0.0, snapshot.now_s - job.arrival_s) + job.remaining_iterations * step
    return total / max(1, len(snapshot.jobs))


def optimal_average_jct(snapshot: Snapshot, cap_w: float) -> float:
    """The least average predicted JCT with all jobs running, GPUs and power within bounds."""
    cluster = cluster_of(snapshot)
    clocks = cluster.gpu.clocks_mhz
    tables = build_tables(snapshot.jobs, cluster, clocks, elastic=True)
    curves = curves_of(tables, snapshot.jobs, snapshot.now_s)
    jobs = len(snapshot.jobs)
    options = [tables.levels(j) * len(clocks) for j in range(jobs)]
    if math.prod(options) > MAX_COMBINATIONS:
        raise ValueError(f"{math.prod(options)} combinations: too many for brute force")
    jct = np.zeros(())
    power = np.zeros(())
    gpus = np.zeros((), dtype=np.int64)
    for j in range(jobs):
        rows = tables.rows(j)
        shape = [1] * jobs
        shape[j] = -1
        counts = np.repeat(tables.counts[rows.start : rows.stop], len(clocks))
        job_jct, _, job_power = curves.matrices(np.arange(rows.start, rows.stop))
        jct = jct + job_jct.ravel().reshape(shape)
        power = power + job_power.ravel().reshape(shape)
        gpus = gpus + counts.reshape(shape)
    gpn = cluster.gpus_per_node
    idle = (-(-gpus // gpn) * gpn - gpus) * cluster.gpu.idle_power_w
    feasible = (gpus <= cluster.total_gpus) & (power + idle <= cap_w)
    if not feasible.any():
        return math.inf
    return float(np.min(np.where(feasible, jct, np.inf))) / max(1, jobs)
