"""The clock a GPU runs at under a clock ceiling and a power cap: the rule of the board.

A GPU with a power limit slows to the highest clock whose draw fits it. The
simulated GPUs follow this rule, the simulator's rates are checked against it,
and the policy's power loop counts on it when it sets caps; it is a function of
a performance model only, so it lives in the core.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from powerflow.core.devices.interface import Workload
from powerflow.core.models.protocol import PerfModel


def capped_clock_mhz(
    model: PerfModel,
    workload: Workload,
    clocks_mhz: Sequence[int],
    hi_mhz: int,
    cap_w: float | None,
) -> int:
    """The clock a GPU runs ``workload`` at under a clock ceiling and a power cap.

    The highest of ``clocks_mhz`` (ascending) at or below ``hi_mhz`` whose
    per-GPU power under ``model`` fits ``cap_w`` (None: no cap); the lowest
    supported clock when the ceiling is below every clock or no clock fits
    (the board cannot slow down further; its power then exceeds the cap).
    """
    below = [c for c in clocks_mhz if c <= hi_mhz] or [clocks_mhz[0]]
    if cap_w is None:
        return below[-1]
    w = workload
    f = np.asarray(below, dtype=np.float64)
    step = model.step_time_s(w.n, w.gpus_per_node, w.local_batch_size, f)
    energy = model.energy_per_iter_j(w.n, w.gpus_per_node, w.local_batch_size, f)
    fits = np.flatnonzero(energy / (w.n * step) <= cap_w)
    return below[int(fits[-1])] if fits.size else below[0]
