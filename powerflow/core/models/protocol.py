"""The one interface through which the policy sees a job's performance.

A fitted model and the ground truth ("oracle") both satisfy ``PerfModel``, so
the policy, the simulator and the baselines never know which one they use.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike


@runtime_checkable
class PerfModel(Protocol):
    """Step time and energy of one training job on one GPU type.

    All arguments broadcast like numpy arrays:
    ``n`` GPUs in total, ``r`` GPUs used per node (placement), ``bs`` the
    local (per-GPU) batch size, ``f`` the core clock in MHz.
    """

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        """Seconds per training iteration (``T_iter``)."""
        ...

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        """Joules per iteration summed over all ``n`` GPUs (``E_iter``)."""
        ...
