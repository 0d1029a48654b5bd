"""Quantities the policy derives from any ``PerfModel`` (fitted or oracle).

All vectorised: arguments broadcast like numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import ModelError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray, PerfModel


def power_w(
    model: PerfModel, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
) -> FloatArray:
    """Average power of the whole job, ``P = E_iter / T_iter`` (paper §5.2):
    what the power budget is checked against."""
    return model.energy_per_iter_j(n, r, bs, f) / model.step_time_s(n, r, bs, f)


def remaining_jct_s(
    model: PerfModel, iterations: ArrayLike, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
) -> FloatArray:
    """Time to run the remaining ``iterations`` at this configuration."""
    return np.asarray(iterations, dtype=np.float64) * model.step_time_s(n, r, bs, f)


def remaining_energy_j(
    model: PerfModel, iterations: ArrayLike, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
) -> FloatArray:
    """Energy to run the remaining ``iterations`` at this configuration."""
    return np.asarray(iterations, dtype=np.float64) * model.energy_per_iter_j(n, r, bs, f)


def most_efficient_clock_mhz(
    model: PerfModel, gpu: GpuSpec, n: ArrayLike, r: ArrayLike, bs: ArrayLike
) -> FloatArray:
    """The supported clock with the least energy per iteration, per configuration.

    Energy is not monotone in the clock: too high wastes dynamic power, too
    low stretches the iteration so static power dominates (paper §5.2). The
    result has the broadcast shape of ``n, r, bs``.
    """
    na, ra, bsa = np.broadcast_arrays(
        np.asarray(n, dtype=np.float64),
        np.asarray(r, dtype=np.float64),
        np.asarray(bs, dtype=np.float64),
    )
    clocks = np.asarray(gpu.clocks_mhz, dtype=np.float64)
    e = model.energy_per_iter_j(na[..., None], ra[..., None], bsa[..., None], clocks)
    return np.asarray(clocks[np.argmin(e, axis=-1)], dtype=np.float64)


@dataclass(frozen=True)
class Frontier:
    """Pareto-optimal configurations, fastest first (paper Fig. 7)."""

    n: FloatArray
    frequency_mhz: FloatArray
    step_time_s: FloatArray
    energy_j: FloatArray


def pareto_frontier(
    model: PerfModel,
    gpu: GpuSpec,
    global_batch_size: int,
    gpu_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    gpus_per_node: int = 8,
) -> Frontier:
    """Configurations ``(n, f)`` that no other beats on both step time and energy.

    ``n`` GPUs are packed ``min(n, gpus_per_node)`` per node and share the
    global batch (``bs = global_batch_size / n``); GPU counts that would give
    a local batch below one sample are skipped.
    """
    counts = np.array([c for c in gpu_counts if c <= global_batch_size], dtype=np.float64)
    if counts.size == 0:
        raise ModelError(f"no GPU count fits a global batch of {global_batch_size}")
    clocks = np.asarray(gpu.clocks_mhz, dtype=np.float64)
    n, f = (a.ravel() for a in np.meshgrid(counts, clocks, indexing="ij"))
    r = np.minimum(n, gpus_per_node)
    bs = global_batch_size / n
    t = model.step_time_s(n, r, bs, f)
    e = model.energy_per_iter_j(n, r, bs, f)
    order = np.lexsort((e, t))
    t, e, n, f = t[order], e[order], n[order], f[order]
    # Keep a point only if it uses strictly less energy than every faster one.
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(e)[:-1]])
    keep = e < best_before
    return Frontier(n=n[keep], frequency_mhz=f[keep], step_time_s=t[keep], energy_j=e[keep])
