"""A fitted model behind the ``PerfModel`` interface the policy consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.gpus import GpuSpec, gpu_spec
from powerflow.models import energy, throughput
from powerflow.models.params import ModelParams
from powerflow.models.protocol import ArrayLike, FloatArray

BLOCK = 8192
"""Configurations per block of a large prediction (64 KiB per temporary)."""


def _arrays(
    n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    return (
        np.asarray(n, dtype=np.float64),
        np.asarray(r, dtype=np.float64),
        np.asarray(bs, dtype=np.float64),
        np.asarray(f, dtype=np.float64),
    )


@dataclass(frozen=True)
class FittedModel:
    """Predictions of the paper's model with fixed parameters.

    Satisfies ``PerfModel``; every method broadcasts its arguments like numpy.
    """

    params: ModelParams

    @property
    def gpu(self) -> GpuSpec:
        return gpu_spec(self.params.gpu)

    @property
    def _f0_mhz(self) -> float:
        return float(self.gpu.f0_mhz)

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        return self.predict(n, r, bs, f)[0]

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        return self.predict(n, r, bs, f)[1]

    def predict(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Step time and energy together, sharing the step-time terms.

        Large inputs go through in blocks of ``BLOCK`` configurations: the
        temporaries then stay in cache and below malloc's mmap threshold,
        which makes 100k predictions several times faster than one pass.
        """
        na, ra, bsa, fa = np.broadcast_arrays(*_arrays(n, r, bs, f))
        shape = na.shape
        flat = [a.ravel() for a in (na, ra, bsa, fa)]
        size = flat[0].size
        if size <= BLOCK:
            t, e = predict_flat(self.params, self._f0_mhz, *flat)
            return t.reshape(shape), e.reshape(shape)
        t_out = np.empty(size)
        e_out = np.empty(size)
        for start in range(0, size, BLOCK):
            block = slice(start, start + BLOCK)
            t_out[block], e_out[block] = predict_flat(
                self.params, self._f0_mhz, *(a[block] for a in flat)
            )
        return t_out.reshape(shape), e_out.reshape(shape)


def predict_flat(
    params: ModelParams, f0_mhz: float, n: FloatArray, r: FloatArray, bs: FloatArray, f: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Step time and energy of equal-length 1-D columns: ``FittedModel.predict``
    without its broadcasting, blocking and GPU lookup, for callers (the
    fitting code) that predict a few hundred samples thousands of times."""
    tp = params.throughput
    grad = throughput.t_grad(tp, bs, f)
    sync = throughput.t_sync(tp, n, r, f)
    it = throughput.combine(tp, throughput.t_io(tp, r, bs), grad, sync)
    e = energy.energy_per_iter(params.energy, n, bs, f / f0_mhz, grad, sync, it)
    return it, e
