"""Which clocks a profiling phase sweeps: shared by the simulator and the operator.

A job profiling a GPU count runs slices of its window at a ladder of clocks
(the operator writes the ladder on the job's pods, the node agent locks each
clock in turn, ``operator/profile_plan.py``; the simulator samples the same
ladder). The ladder is every ``stride``-th supported clock counted down from
the top, so the default (top) clock is always on it, optionally only those at
or above ``lowest_fraction`` of the top clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerflow.core.errors import SimulationError
from powerflow.core.gpus import GpuSpec

PROFILE_CLOCK_STRIDE = 4
"""The paper's sweep visits every 4th supported clock (A100: 81 clocks, 21
slices of ~11 s in a 240 s window): enough clocks for the frequency terms,
slices long enough for several iterations each."""


@dataclass(frozen=True)
class ClockSweep:
    """Every ``stride``-th supported clock from the top, those at or above
    ``lowest_fraction`` x the top clock."""

    stride: int = PROFILE_CLOCK_STRIDE
    lowest_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.stride < 1:
            raise SimulationError("profile clock stride must be >= 1")
        if not 0.0 <= self.lowest_fraction <= 1.0:
            raise SimulationError("the sweep's lowest clock fraction must be in [0, 1]")

    def clocks_mhz(self, gpu: GpuSpec) -> tuple[int, ...]:
        """The ladder for ``gpu``, ascending (never empty: the top clock is on it)."""
        lowest = self.lowest_fraction * gpu.clocks_mhz[-1]
        return tuple(f for f in gpu.clocks_mhz[:: -self.stride][::-1] if f >= lowest)


PAPER_SWEEP = ClockSweep()
"""The paper's ladder (A100: 21 clocks, 210-1410 MHz)."""
