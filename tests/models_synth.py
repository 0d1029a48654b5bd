"""Samples drawn from the paper's model itself, for the recovery tests.

The real check fits the ground truth (which is not of the model's form); this
is the sanity check that the fitting code finds parameters it was given.
"""

from __future__ import annotations

import numpy as np

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.core.models.samples import Samples

TRUE = ModelParams(
    gpu="A100",
    model="synthetic",
    throughput=ThroughputParams(
        a_io=0.004,
        b_io=5e-5,
        a_grad=0.01,
        b_grad=4e-4,
        k_grad=2.2e-3,
        sync_local_s=0.006,
        sync_node_s=0.02,
        sync_step_s=0.003,
        sync_clock_share=0.3,
        gamma1=2.0,
        gamma2=1.5,
    ),
    energy=EnergyParams(
        p_grad_w=180.0,
        grad_log_alpha=0.1,
        grad_log_theta=2.0,
        grad_low_slope=0.8,
        grad_high_c2=1.0,
        grad_high_c3=2.0,
        p_sync_w=90.0,
        sync_low_slope=0.5,
        sync_high_c2=0.5,
        sync_high_c3=0.5,
        p_static_w=60.0,
        static_high_slope=0.5,
    ),
)


def grid(
    gpu: GpuSpec = A100, global_batches: tuple[int, ...] = (64, 128, 256), clock_step: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A dense-profile-like grid: n = 1..64, one- and two-node placements."""
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        placements = {min(n, 8), max(n // 2, 1) if n <= 8 else 4}
        for r in placements:
            for gb in global_batches:
                if gb % n:
                    continue
                for f in gpu.clocks_mhz[::clock_step]:
                    rows.append((n, r, gb // n, f))
    a = np.array(rows, dtype=np.float64)
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3]


def sample(params: ModelParams, cols: tuple[np.ndarray, ...], noise: float, seed: int) -> Samples:
    n, r, bs, f = cols
    t, e = FittedModel(params).predict(n, r, bs, f)
    rng = np.random.default_rng(seed)
    t = t * (1 + noise * rng.standard_normal(len(t)))
    e = e * (1 + noise * rng.standard_normal(len(e)))
    return Samples(n, r, bs, f, t, e)
