"""A fitted model behind the ``PerfModel`` interface the policy consumes."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.gpus import GPU_SPECS, GpuSpec, gpu_spec
from powerflow.core.models import kernels
from powerflow.core.models.params import ModelParams
from powerflow.core.models.protocol import ArrayLike, FloatArray


@dataclass(frozen=True)
class FittedModel:
    """Predictions of the paper's model with fixed parameters.

    Satisfies ``PerfModel``; every method broadcasts its arguments like numpy.
    """

    params: ModelParams
    # The spec of a type not in the catalogue (``powerflow fit
    # --clocks-from-samples``); None: the catalogue's type ``params.gpu``.
    spec: GpuSpec | None = None

    @classmethod
    def on(cls, params: ModelParams, gpu: GpuSpec) -> FittedModel:
        """``params`` as fitted on ``gpu``: its spec kept only where the catalogue's type of
        that name differs (a discovered or estimated type), so a model of a catalogue type
        is the same value however it was made."""
        return cls(params, None if GPU_SPECS.get(gpu.name) == gpu else gpu)

    @property
    def gpu(self) -> GpuSpec:
        return gpu_spec(self.params.gpu) if self.spec is None else self.spec

    # Packed once per model (``cached_property`` writes the instance's
    # ``__dict__``, which a frozen dataclass allows): the policy predicts with
    # the same model at every call.
    @functools.cached_property
    def _vectors(self) -> tuple[FloatArray, FloatArray]:
        return self.params.vectors()

    @functools.cached_property
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
        """Step time and energy together, sharing the step-time terms."""
        cols = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (n, r, bs, f)))
        shape = cols[0].shape
        t, e = self.predict_columns(*(a.ravel() for a in cols))
        return t.reshape(shape), e.reshape(shape)

    def predict_grid(
        self, n: FloatArray, r: FloatArray, bs: FloatArray, f: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """``predict`` of the rows ``(n[i], r[i], bs[i])`` (1-D) at every clock ``f[j]``
        (1-D), as (rows, clocks) arrays: the same floats as ``predict`` of a column
        and a row, without building the grid of arguments (``kernels.predict_grid``)."""
        tp, ep = self._vectors
        return kernels.predict_grid(
            tp, ep, self._f0_mhz, *(as_column(np.ravel(a)) for a in (n, r, bs, f))
        )

    @staticmethod
    def predict_grids(
        models: Sequence[FittedModel],
        bounds: Sequence[int],
        n: FloatArray,
        r: FloatArray,
        bs: FloatArray,
        f: FloatArray,
    ) -> tuple[FloatArray, FloatArray]:
        """``predict_grid`` of several models at once: ``models[k]`` predicts the rows
        ``bounds[k]`` to ``bounds[k + 1] - 1`` of ``n``, ``r``, ``bs`` (1-D) at every
        clock of ``f``. The same floats as one ``predict_grid`` per model
        (``kernels.predict_grids``), in one compiled call: the policy's tables
        evaluate the few new models of a decision together."""
        vectors = [m._vectors for m in models]
        return kernels.predict_grids(
            np.array([v[0] for v in vectors]).reshape(len(models), -1),
            np.array([v[1] for v in vectors]).reshape(len(models), -1),
            np.array([m._f0_mhz for m in models], dtype=np.float64),
            np.asarray(bounds, dtype=np.int64),
            *(as_column(np.ravel(a)) for a in (n, r, bs, f)),
        )

    def predict_columns(
        self, n: FloatArray, r: FloatArray, bs: FloatArray, f: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """``predict`` of equal-length 1-D columns, without broadcasting."""
        tp, ep = self._vectors
        return kernels.predict(tp, ep, self._f0_mhz, *(as_column(a) for a in (n, r, bs, f)))


def as_column(a: FloatArray) -> FloatArray:
    """``a`` as the contiguous float64 column the compiled kernels take."""
    return np.ascontiguousarray(a, dtype=np.float64)
