"""Measured (or simulated) profile samples: what a profiler sees.

One row per measurement: a configuration ``(n, r, bs, f)`` and the observed
step time and energy per iteration (summed over the job's ``n`` GPUs). Both the
ground truth's measurement API and ``powerflow fit --samples`` produce this,
and every fitting routine consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.errors import DataError
from powerflow.models.protocol import FloatArray


@dataclass(frozen=True)
class Samples:
    """Columns of equal length; ``r`` is GPUs used per node."""

    n: FloatArray
    r: FloatArray
    bs: FloatArray
    f: FloatArray
    step_time_s: FloatArray
    energy_j: FloatArray

    def __post_init__(self) -> None:
        cols = (self.n, self.r, self.bs, self.f, self.step_time_s, self.energy_j)
        if len({len(c) for c in cols}) != 1:
            raise DataError("sample columns differ in length")
        for c in cols:
            if not np.all(np.isfinite(c)):
                raise DataError("samples contain NaN or infinite values")
            if np.any(c <= 0):
                raise DataError("samples must be positive")
        if np.any(self.r > self.n):
            raise DataError("GPUs per node (r) cannot exceed GPUs (n)")

    def __len__(self) -> int:
        return len(self.n)

    def take(self, index: FloatArray | np.ndarray | slice) -> Samples:
        """A subset of the rows (boolean mask, index array or slice)."""
        return Samples(
            self.n[index],
            self.r[index],
            self.bs[index],
            self.f[index],
            self.step_time_s[index],
            self.energy_j[index],
        )

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        return Samples(
            *(
                np.concatenate([getattr(p, col) for p in parts])
                for col in ("n", "r", "bs", "f", "step_time_s", "energy_j")
            )
        )
