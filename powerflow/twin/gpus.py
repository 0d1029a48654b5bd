"""One node's simulated GPUs, shared by its node agent and its workers.

The node agent (its own thread and event loop) sets clocks and power limits
and reads power and energy, as it does through NVML; the twin's workers (the
kubelet's thread) make their GPU compute (``assign``: the trainer's kernels)
and read how many iterations it has run. ``SimulatedGpus`` is not thread-safe, so
every call here holds one lock. The energy each GPU draws is also summed by
what it did: training a workload (``active_j``) or idling (``idle_j``), the
split ``powerflow simulate`` reports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from powerflow.devices import SimulatedGpus


class TwinGpus(SimulatedGpus):
    """``SimulatedGpus`` behind a lock, with active and idle energy totals (joules)."""

    def __init__(self, count: int, *, node: str, seed: int, clock: Callable[[], float]) -> None:
        self._lock = threading.RLock()
        self.active_j = 0.0
        self.idle_j = 0.0
        with self._lock:
            super().__init__(count, node=node, seed=seed, clock=clock)

    def _run(self, dt: float) -> None:
        gpus = self._gpus
        before = [(g.energy_mj, g.workload is not None) for g in gpus]
        super()._run(dt)
        for g, (mj, busy) in zip(gpus, before, strict=True):
            joules = (g.energy_mj - mj) / 1000.0
            if busy:
                self.active_j += joules
            else:
                self.idle_j += joules


def _locked(name: str) -> Any:
    method = getattr(SimulatedGpus, name)

    def call(self: TwinGpus, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


for _name in (
    "assign",
    "clear",
    "workload",
    "iterations_completed",
    "restart_driver",
    "gpus",
    "supported_graphics_clocks_mhz",
    "lock_clocks_mhz",
    "reset_clocks",
    "power_limit_w",
    "power_limit_range_w",
    "set_power_limit_w",
    "reset_power_limit",
    "total_energy_mj",
    "power_mw",
    "sm_clock_mhz",
):
    setattr(TwinGpus, _name, _locked(_name))


def totals(nodes: dict[str, TwinGpus]) -> tuple[float, float]:
    """(active, idle) joules of every node's GPUs, brought up to now."""
    active = idle = 0.0
    for gpus in nodes.values():
        with gpus._lock:
            gpus.gpus()  # catch up with the clock
            active += gpus.active_j
            idle += gpus.idle_j
    return active, idle
