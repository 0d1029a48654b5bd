"""A cheap analytic ``PerfModel`` with the paper's shapes, for policy tests and benchmarks.

The policy only sees the ``PerfModel`` protocol, so its speed and its
properties can be measured without fitting or the ground truth. This model
keeps the structure of paper §4 (step time = I/O + gradient + sync, sync zero
on one GPU and dearer across nodes; GPU power flat-ish below the knee ``f0``
and steep above it), so the trade-offs the policy weighs are realistic: an
interior energy-optimal clock, sub-linear scaling, and a per-GPU power below
the board limit. It is not a model of any real network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray


@dataclass(frozen=True)
class SyntheticModel:
    """Step time and energy of an imaginary job on ``gpu``.

    ``compute_s_per_sample`` is the gradient time per sample at the highest
    clock; ``memory_fraction`` the part of it that does not speed up with the
    core clock; ``sync_s`` the all-reduce time within a node (``cross_node``
    times more across nodes); ``active_power_w`` the dynamic power per GPU at
    the highest clock.
    """

    compute_s_per_sample: float = 2e-3
    memory_fraction: float = 0.3
    io_s: float = 0.01
    sync_s: float = 0.02
    cross_node: float = 2.5
    active_power_w: float = 250.0
    gpu: GpuSpec = A100

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        n_ = np.asarray(n, dtype=np.float64)
        slow = self.gpu.max_clock_mhz / np.asarray(f, dtype=np.float64)
        mem = self.memory_fraction
        compute = (self.compute_s_per_sample * np.asarray(bs, dtype=np.float64)) * (
            mem + (1.0 - mem) * slow
        )
        # log2(n) is zero on one GPU; crossing nodes multiplies the all-reduce cost.
        hops = 1.0 + (self.cross_node - 1.0) * (np.asarray(r, dtype=np.float64) < n_)
        sync = (self.sync_s * np.log2(n_)) * hops * (1.0 + 0.5 * slow)
        out: FloatArray = self.io_s + compute + sync
        return out

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        return self.predict(n, r, bs, f)[1]

    def predict(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Step time and energy per iteration in one pass (as ``FittedModel.predict``)."""
        x = np.asarray(f, dtype=np.float64) / self.gpu.max_clock_mhz
        knee = self.gpu.f0_mhz / self.gpu.max_clock_mhz
        # Linear below the voltage knee, cubic above it (paper §4.2).
        shape = np.maximum(x * knee**2, x * x * x)
        power = self.gpu.idle_power_w + self.active_power_w * shape
        step = self.step_time_s(n, r, bs, f)
        energy: FloatArray = np.asarray(n, dtype=np.float64) * power * step
        return step, energy


def synthetic_zoo(count: int, seed: int = 0, gpu: GpuSpec = A100) -> tuple[SyntheticModel, ...]:
    """``count`` different synthetic models drawn from a seeded generator."""
    rng = np.random.default_rng(seed)
    return tuple(
        SyntheticModel(
            compute_s_per_sample=float(rng.uniform(5e-4, 5e-3)),
            memory_fraction=float(rng.uniform(0.1, 0.6)),
            io_s=float(rng.uniform(0.002, 0.03)),
            sync_s=float(rng.uniform(0.005, 0.08)),
            cross_node=float(rng.uniform(1.5, 4.0)),
            active_power_w=float(rng.uniform(150.0, gpu.max_power_w - gpu.idle_power_w)),
            gpu=gpu,
        )
        for _ in range(count)
    )
