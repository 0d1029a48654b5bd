"""Energy from successive readings of a GPU's cumulative energy counter.

NVML's ``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the
driver was loaded. The counter restarts from zero when the driver reloads or
the GPU is reset (and, in principle, wraps at 2**64), so a later reading can
be smaller than an earlier one. A plain difference would then be negative
(or, on a wrap, absurd); instead a reading below its predecessor is taken as
a restart, and the new reading counted from zero: the energy spent since the
restart is exactly what the new counter says. What was spent between the
last reading before the restart and the restart itself is unknowable and is
lost, which undercounts by at most one sampling interval.
"""

from __future__ import annotations

from collections.abc import Iterable

from powerflow.core.errors import DataError


def energy_delta_mj(previous_mj: int, current_mj: int) -> int:
    """Millijoules spent between two counter readings, robust to a restart."""
    if previous_mj < 0 or current_mj < 0:
        raise DataError("energy counter readings are never negative")
    if current_mj < previous_mj:  # the counter restarted: count from zero
        return current_mj
    return current_mj - previous_mj


def energy_deltas_mj(readings_mj: Iterable[int]) -> list[int]:
    """The delta between each reading and the one before it (one fewer than readings)."""
    out: list[int] = []
    previous: int | None = None
    for reading in readings_mj:
        if previous is not None:
            out.append(energy_delta_mj(previous, reading))
        previous = reading
    return out
