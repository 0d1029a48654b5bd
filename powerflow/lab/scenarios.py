"""Seeded synthetic snapshots for the policy's benchmark, optimality check and tests.

Two kinds: cluster-sized queues (``synthetic_snapshot``) to time decisions,
and small instances (``small_instance``: at most 4 jobs, 8 GPUs and 4 clock
levels) that exhaustive search can solve exactly. Both use ``SyntheticModel``;
neither is a workload from the paper.
"""

from __future__ import annotations

import numpy as np

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot
from powerflow.lab.synthetic import SyntheticModel, synthetic_zoo

SMALL_GPU = GpuSpec(
    name="A100-4clk",
    clocks_mhz=(810, 1020, 1215, 1410),
    default_clock_mhz=1410,
    idle_power_w=A100.idle_power_w,
    max_power_w=A100.max_power_w,
    f0_mhz=A100.f0_mhz,
)
"""An A100 that exposes only four clocks, so exhaustive search stays small."""


def synthetic_snapshot(
    gpus: int,
    jobs: int,
    *,
    seed: int = 0,
    eta: float = 0.6,
    gpus_per_node: int = 8,
    distinct_models: int | None = None,
) -> Snapshot:
    """A cluster of ``gpus`` GPUs and ``jobs`` queued jobs with varied sizes and models.

    ``distinct_models`` of ``None`` gives every job its own model object (the
    operator's case: one fitted model per job, one model call each); a number
    shares that many models among the jobs (the trace simulator's case).
    """
    rng = np.random.default_rng(seed)
    zoo = synthetic_zoo(distinct_models or jobs, seed=seed)
    nodes = tuple(Node(f"node-{i:04d}", gpus_per_node, A100) for i in range(gpus // gpus_per_node))
    queue = tuple(
        Job(
            id=f"job-{i:05d}",
            model=zoo[i % len(zoo)],
            remaining_iterations=float(rng.integers(1_000, 200_000)),
            global_batch_size=int(2 ** rng.integers(5, 11)),
            requested_gpus=int(2 ** rng.integers(0, 4)),
            arrival_s=float(rng.uniform(0.0, 3600.0)),
            max_local_batch_size=int(2 ** rng.integers(6, 10)),
        )
        for i in range(jobs)
    )
    return Snapshot(nodes=nodes, jobs=queue, budget=Budget(eta=eta), now_s=3600.0)


def small_instance(rng: np.random.Generator) -> Snapshot:
    """At most 4 jobs on at most 8 GPUs of ``SMALL_GPU``, with an absolute power limit.

    The limit is drawn between the power of every job on one GPU at its most
    energy-efficient clock (plus one node of idle GPUs) and the whole cluster
    at board power, so that the greedy starts every job and the budget binds
    in most instances.
    """
    layout = [(1, 4), (2, 2), (1, 8), (2, 4), (4, 2)][int(rng.integers(0, 5))]
    nodes = tuple(Node(f"n{i}", layout[1], SMALL_GPU) for i in range(layout[0]))
    count = int(rng.integers(1, 5))
    jobs = tuple(
        Job(
            id=f"j{i}",
            model=SyntheticModel(
                compute_s_per_sample=float(rng.uniform(5e-4, 5e-3)),
                memory_fraction=float(rng.uniform(0.1, 0.6)),
                io_s=float(rng.uniform(0.002, 0.03)),
                sync_s=float(rng.uniform(0.005, 0.08)),
                cross_node=float(rng.uniform(1.5, 4.0)),
                active_power_w=float(rng.uniform(150.0, 340.0)),
                gpu=SMALL_GPU,
            ),
            remaining_iterations=float(rng.integers(1_000, 50_000)),
            global_batch_size=int(2 ** rng.integers(4, 9)),
            requested_gpus=1,
            arrival_s=float(rng.uniform(0.0, 600.0)),
        )
        for i in range(count)
    )
    gpus = layout[0] * layout[1]
    clocks = np.asarray(SMALL_GPU.clocks_mhz, dtype=np.float64)
    low = 0.0
    for j in jobs:
        energy = j.model.energy_per_iter_j(1, 1, j.global_batch_size, clocks)
        best = int(np.argmin(energy))
        low += float(energy[best] / j.model.step_time_s(1, 1, j.global_batch_size, clocks[best]))
    high = gpus * SMALL_GPU.max_power_w
    limit = float(rng.uniform(low + layout[1] * SMALL_GPU.idle_power_w, high))
    return Snapshot(nodes=nodes, jobs=jobs, budget=Budget(limit_w=limit), now_s=600.0)
