"""One node's simulated GPUs, shared by its node agent and its workers.

The node agent (its own thread and event loop) sets clocks and power limits
and reads power and energy, as it does through NVML; the twin's workers (the
kubelet's thread) make their GPU compute (``assign``: the trainer's kernels)
and read how many iterations it has run. ``SimulatedGpus`` serialises those
calls itself. What this adds: the energy each GPU draws summed by what it did,
training a workload (``active_j``) or idling (``idle_j``), the split
``powerflow simulate`` reports.
"""

from __future__ import annotations

from collections.abc import Callable

from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.simulated_gpus import SimulatedGpus


class TwinGpus(SimulatedGpus):
    """``SimulatedGpus`` with active and idle energy totals (joules)."""

    def __init__(
        self,
        count: int,
        *,
        node: str,
        seed: int,
        clock: Callable[[], float],
        gpu: GpuSpec = A100,
    ) -> None:
        self.active_j = 0.0
        self.idle_j = 0.0
        super().__init__(count, gpu=gpu, node=node, seed=seed, clock=clock)

    def _run(self, dt: float) -> None:
        # Called by SimulatedGpus with its lock held: the split stays whole.
        gpus = self._gpus
        before = [(g.energy_mj, g.workload is not None) for g in gpus]
        super()._run(dt)
        for g, (mj, busy) in zip(gpus, before, strict=True):
            joules = (g.energy_mj - mj) / 1000.0
            if busy:
                self.active_j += joules
            else:
                self.idle_j += joules

    def energy_split_j(self) -> tuple[float, float]:
        """(active, idle) joules of these GPUs, brought up to now."""
        with self._mutex:
            self.gpus()  # catch up with the clock
            return self.active_j, self.idle_j


def totals(nodes: dict[str, TwinGpus]) -> tuple[float, float]:
    """(active, idle) joules of every node's GPUs, brought up to now."""
    active = idle = 0.0
    for gpus in nodes.values():
        a, i = gpus.energy_split_j()
        active += a
        idle += i
    return active, idle
