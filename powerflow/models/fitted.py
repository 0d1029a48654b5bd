"""A fitted model behind the ``PerfModel`` interface the policy consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.gpus import GpuSpec, gpu_spec
from powerflow.models import energy, throughput
from powerflow.models.params import ModelParams
from powerflow.models.protocol import ArrayLike, FloatArray


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

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        return throughput.step_time(self.params.throughput, *_arrays(n, r, bs, f))

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        return self.predict(n, r, bs, f)[1]

    def predict(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Step time and energy together, sharing the step-time terms."""
        na, ra, bsa, fa = _arrays(n, r, bs, f)
        tp = self.params.throughput
        grad = throughput.t_grad(tp, bsa, fa)
        sync = throughput.t_sync(tp, na, ra, fa)
        it = throughput.combine(tp, throughput.t_io(tp, ra, bsa), grad, sync)
        f_rel = fa / self.gpu.f0_mhz
        e = energy.energy_per_iter(self.params.energy, na, bsa, f_rel, grad, sync, it)
        return it, e
