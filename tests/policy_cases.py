"""Snapshots for the policy tests, and independent re-computations of what a plan must obey."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.core.policy.snapshot import Budget, Job, Node, Plan, Snapshot
from powerflow.lab.scenarios import SMALL_GPU
from powerflow.lab.synthetic import synthetic_zoo

ZOO = synthetic_zoo(4, seed=7)


@dataclass(frozen=True)
class ScaledModel:
    """Step time ``t1 * n**-a`` (faster with the clock), power ``watts`` per GPU.

    Lets a test choose each job's JCT and energy trade-off directly.
    """

    t1: float
    a: float
    watts: float
    clock_share: float = 0.5

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        n_, f_ = np.asarray(n, dtype=np.float64), np.asarray(f, dtype=np.float64)
        slow = 1.0 - self.clock_share + self.clock_share * A100.max_clock_mhz / f_
        out: FloatArray = self.t1 * n_ ** (-self.a) * slow + 0.0 * np.asarray(r) * np.asarray(bs)
        return out

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        f_ = np.asarray(f, dtype=np.float64)
        per_gpu = (
            A100.idle_power_w + (self.watts - A100.idle_power_w) * (f_ / A100.max_clock_mhz) ** 2
        )
        out: FloatArray = np.asarray(n) * per_gpu * self.step_time_s(n, r, bs, f)
        return out


def nodes(count: int, gpus: int, gpu: GpuSpec = A100) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", gpus, gpu) for i in range(count))


def job(name: str, **kw: object) -> Job:
    base: dict[str, object] = {
        "id": name,
        "model": ZOO[0],
        "remaining_iterations": 10_000.0,
        "global_batch_size": 128,
        "requested_gpus": 1,
        "arrival_s": 0.0,
    }
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    gpu = draw(st.sampled_from([A100, SMALL_GPU]))
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 4))
    cluster = tuple(Node(f"n{i}", gpn, gpu, powered_on=draw(st.booleans())) for i in range(count))
    total = gpn * count
    jobs = []
    for i in range(draw(st.integers(0, 6))):
        lo = draw(st.integers(1, min(4, total)))
        jobs.append(
            Job(
                id=f"j{i}",
                model=draw(st.sampled_from(ZOO)),
                remaining_iterations=float(draw(st.integers(0, 100_000))),
                global_batch_size=draw(st.integers(1, 512)),
                requested_gpus=draw(st.integers(1, 16)),
                arrival_s=float(draw(st.integers(0, 1000))),
                min_gpus=lo,
                max_gpus=draw(st.none() | st.integers(lo, 16)),
                max_local_batch_size=draw(st.none() | st.integers(1, 512)),
            )
        )
    budget = draw(
        st.builds(Budget, eta=st.floats(0.0, 1.0))
        | st.builds(Budget, limit_w=st.floats(0.0, total * gpu.max_power_w))
        | st.builds(Budget, eta=st.floats(0.0, 1.0), p_max_w=st.floats(50.0, 400.0))
    )
    return Snapshot(nodes=cluster, jobs=tuple(jobs), budget=budget, now_s=1000.0)


def allowed_counts(j: Job, total: int) -> list[int]:
    """Independent statement of the rules: powers of two within every cap."""
    out = []
    n = 1
    while n <= total:
        local = -(-j.global_batch_size // n)
        if (
            n >= j.min_gpus
            and (j.max_gpus is None or n <= j.max_gpus)
            and n <= j.global_batch_size
            and (j.max_local_batch_size is None or local <= j.max_local_batch_size)
        ):
            out.append(n)
        n *= 2
    return out


def job_power(j: Job, n: int, gpn: int, f: float | FloatArray) -> FloatArray:
    args = (n, min(n, gpn), -(-j.global_batch_size // n), f)
    return np.asarray(j.model.energy_per_iter_j(*args) / j.model.step_time_s(*args))


def efficient_clock(j: Job, n: int, gpn: int, clocks: tuple[int, ...]) -> int:
    f = np.asarray(clocks, dtype=np.float64)
    energy = j.model.energy_per_iter_j(n, min(n, gpn), -(-j.global_batch_size // n), f)
    return clocks[int(np.argmin(energy))]


def fill_slack_w(snapshot: Snapshot) -> float:
    """``(g - 1) * delta``: the most that unchecked in-node steps may add (see powerflow.py)."""
    gpu = snapshot.nodes[0].gpu
    gpn = snapshot.nodes[0].gpus
    total = gpn * len(snapshot.nodes)
    delta = 0.0
    for j in snapshot.jobs:
        counts = allowed_counts(j, total)

        def p(n: int, j: Job = j) -> float:
            return float(job_power(j, n, gpn, efficient_clock(j, n, gpn, gpu.clocks_mhz)))

        if counts and counts[0] < gpn:
            delta = max(delta, (p(counts[0]) - counts[0] * gpu.idle_power_w) / counts[0])
        for n, m in itertools.pairwise(counts):
            if m <= gpn:
                delta = max(delta, (p(m) - p(n) - n * gpu.idle_power_w) / n)
    return (gpn - 1) * delta


def raised_any(snapshot: Snapshot, plan: Plan) -> bool:
    gpu = snapshot.nodes[0].gpu
    gpn = snapshot.nodes[0].gpus
    for j in snapshot.jobs:
        jp = plan.job(j.id)
        if jp.gpus and jp.frequency_mhz != efficient_clock(j, jp.gpus, gpn, gpu.clocks_mhz):
            return True
    return False
