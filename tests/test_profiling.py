"""The clock ladders a profiling phase sweeps (``powerflow.core.profiling``)."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep
from powerflow.core.schedulers import PLUS_PROFILE_SWEEP
from powerflow.lab import groundtruth as gt


def test_the_paper_s_ladder_is_every_fourth_clock_from_the_top() -> None:
    clocks = PAPER_SWEEP.clocks_mhz(A100)
    assert clocks == PAPER_SWEEP.clocks_mhz(A100)
    assert len(clocks) == 21 and clocks[0] == 210 and clocks[-1] == A100.clocks_mhz[-1]
    assert list(clocks) == sorted(clocks)
    assert set(np.diff(clocks)) == {4 * 15}  # A100 clocks are 15 MHz apart


def test_a_floor_keeps_the_top_and_drops_the_clocks_below_it() -> None:
    top = A100.clocks_mhz[-1]
    assert ClockSweep(8, 0.5).clocks_mhz(A100) == (810, 930, 1050, 1170, 1290, 1410)
    assert ClockSweep(1, 1.0).clocks_mhz(A100) == (top,)  # the top is always on it
    assert ClockSweep(100, 0.0).clocks_mhz(A100) == (top,)
    every = ClockSweep(1, 0.0).clocks_mhz(A100)
    assert every == A100.clocks_mhz


@pytest.mark.parametrize(("stride", "fraction"), [(0, 0.0), (-1, 0.5), (4, -0.1), (4, 1.5)])
def test_bad_ladders_are_refused(stride: int, fraction: float) -> None:
    with pytest.raises(SimulationError):
        ClockSweep(stride, fraction)


def test_powerflow_plus_s_ladder_brackets_every_model_s_most_efficient_clock() -> None:
    """PowerFlow+ sweeps only from half the top clock up because no plan runs a job
    below its most energy-efficient clock: on the ground truth that clock is inside
    the ladder for every model, GPU count, placement and batch (not below its
    lowest clock)."""
    ladder = PLUS_PROFILE_SWEEP.clocks_mhz(A100)
    f = np.asarray(A100.clocks_mhz, dtype=np.float64)
    seen = set()
    for name in gt.MODEL_NAMES:
        truth = gt.ground_truth(name)
        for gbs in truth.global_batch_sizes:
            for n in (1, 2, 4, 8, 16, 32):
                for r in (1, 2, 4, 8):  # GPUs per node: packed and spread placements
                    if gbs % n or r > n or n % r:
                        continue
                    ones = np.ones_like(f)
                    energy = truth.energy_per_iter_j(n * ones, r * ones, gbs / n * ones, f)
                    seen.add(int(f[np.argmin(energy)]))
    assert seen and ladder[0] < min(seen) <= max(seen) < ladder[-1]
