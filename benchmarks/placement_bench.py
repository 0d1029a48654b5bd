"""Time ``place()``: p50 and p99 over seeded random clusters and demands.

The policy has a 1 s decision budget at 4,096 GPUs / 2,048 jobs and places
once per decision, so placement should take a small part of it (< 100 ms).
Demands are random powers of two (mostly 1 GPU, some up to 4 nodes), halved
largest-first until they fit the cluster, as the allocation policy's output
would. Two cases per size:

- ``fresh``: nothing runs yet, every job is new;
- ``reschedule``: the previous placement runs, then 10 % of the jobs double
  or halve, 5 % finish and as many new ones arrive (the common event).

    python -m benchmarks.placement_bench [--repeat 30]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

import numpy as np

from powerflow.core.gpus import A100
from powerflow.core.policy.placement import PlacementRequest, place
from powerflow.core.policy.snapshot import Node

PER_NODE = 8
SIZES = (1, 2, 4, 8, 16, 32)
WEIGHTS = (50, 20, 15, 10, 4, 1)
CASES = ((64, 32), (512, 256), (4096, 2048))


def demands(rng: random.Random, gpus: int, jobs: int) -> list[int]:
    sizes = rng.choices(SIZES, WEIGHTS, k=jobs)
    while sum(sizes) > gpus:
        i = max(range(jobs), key=lambda k: (sizes[k], -k))
        sizes[i] //= 2
    return sizes


def fresh(seed: int, gpus: int, jobs: int) -> tuple[list[Node], list[PlacementRequest]]:
    rng = random.Random(seed)
    nodes = [Node(f"n{i:04d}", PER_NODE, A100) for i in range(gpus // PER_NODE)]
    return nodes, [PlacementRequest(f"j{i}", s) for i, s in enumerate(demands(rng, gpus, jobs))]


def reschedule(seed: int, gpus: int, jobs: int) -> tuple[list[Node], list[PlacementRequest]]:
    nodes, first = fresh(seed, gpus, jobs)
    now = place(nodes, first).assignments
    rng = random.Random(seed + 1)
    out: list[PlacementRequest] = []
    left = gpus
    for r in first:
        u = rng.random()
        if u < 0.05:
            continue  # finished
        size = r.gpus
        if u < 0.10:
            size = max(1, size // 2)
        elif u < 0.15 and 2 * size <= left:
            size *= 2
        left -= size
        out.append(PlacementRequest(r.job_id, size, now.get(r.job_id, ())))
    arrivals = [PlacementRequest(f"new{i}", 1) for i in range(jobs - len(out)) if i < left]
    return nodes, out + arrivals


def timings(case: str, gpus: int, jobs: int, repeat: int) -> tuple[float, float, float]:
    """p50 and p99 of one ``place`` call in CPU ms, and the mean migrations per call.

    CPU time of this process (one core), so other load on the machine does
    not inflate the numbers; ``place`` is single-threaded.
    """
    build = fresh if case == "fresh" else reschedule
    inputs = [build(seed, gpus, jobs) for seed in range(repeat)]
    times, moved = [], []
    for nodes, requests in inputs:
        t0 = time.process_time()
        result = place(nodes, requests)
        times.append(time.process_time() - t0)
        moved.append(len(result.migrations))
    p50, p99 = np.percentile(np.array(times) * 1e3, [50, 99])
    return float(p50), float(p99), float(np.mean(moved))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=30, help="seeded inputs per case")
    args = ap.parse_args([] if argv is None else argv)
    print(f"place(): {PER_NODE} GPUs per node, {args.repeat} seeded inputs per row, CPU time")
    print(f"{'GPUs':>6}{'jobs':>6}  {'case':<11}{'p50 ms':>9}{'p99 ms':>9}{'migrations':>12}")
    for gpus, jobs in CASES:
        for case in ("fresh", "reschedule"):
            p50, p99, moved = timings(case, gpus, jobs, args.repeat)
            print(f"{gpus:>6}{jobs:>6}  {case:<11}{p50:>9.2f}{p99:>9.2f}{moved:>12.1f}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
