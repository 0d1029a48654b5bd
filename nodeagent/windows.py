"""Windows of iterations at one clock -> ``WindowSample``s (pure: readings come in).

At every iteration boundary of a job on this node (a report of its lead
worker) the caller reads the energy counters of the job's GPUs here and hands
``observe`` the reading. A window runs from one boundary to a later one at a
single clock; it closes at the first boundary after ``window_s`` or when the
caller says the clock steps there (a profiling sweep), and becomes one sample:
energy per iteration summed over the job's GPUs on this node, step time as
elapsed time over iterations, tagged with the clock locked over the window.

Counters are differenced boundary by boundary with
``powerflow.core.devices.energy_delta_mj`` (they restart with the driver), so a
restart costs one boundary interval, not the window. A window is thrown away,
and a fresh one starts at the reading, whenever what it measures stopped being
one thing: the clock it was tagged with is no longer the one locked (changed
between two boundaries: part of the window ran at each), the job's GPUs here,
its shape or its lead worker changed, the iteration count went down (the
worker restarted) or time went backwards. A new generation is another job
key, so it starts fresh by construction.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import dataclass

from powerflow.core.devices import energy_delta_mj
from powerflow.core.telemetry import WindowSample


@dataclass(frozen=True)
class JobShape:
    """What a sample says about its job besides the measurement."""

    namespace: str
    job: str
    generation: int
    n: int
    gpus_per_node: int
    local_batch_size: float


@dataclass(frozen=True)
class Reading:
    """A boundary: the lead's iteration count and each GPU's counter (mJ), in ``gpus`` order."""

    now_s: float
    iterations: int
    energy_mj: tuple[int, ...]


@dataclass
class _Open:
    shape: JobShape
    lead: Hashable
    gpus: tuple[int, ...]
    frequency_mhz: int | None
    start_s: float
    start_iterations: int
    last: Reading
    energy_mj: int = 0


class Windows:
    """The open window of each job on this node."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._open: dict[Hashable, _Open] = {}

    def observe(
        self,
        key: Hashable,
        shape: JobShape,
        lead: Hashable,
        gpus: tuple[int, ...],
        reading: Reading,
        *,
        frequency_mhz: int | None,
        next_clock_mhz: int | None,
        close: bool = False,
    ) -> WindowSample | None:
        """A boundary of job ``key``: the sample of the window it closes, if any.

        ``frequency_mhz`` is the clock locked on the job's GPUs up to this
        boundary, ``next_clock_mhz`` the one from it on (they differ when the
        caller steps the clock here, and then ``close`` is True); None means
        the GPUs are not at one known clock, and no window is kept.
        """
        w = self._open.get(key)
        if (
            w is None
            or w.shape != shape
            or w.lead != lead
            or w.gpus != gpus
            or len(reading.energy_mj) != len(gpus)
            or reading.iterations < w.last.iterations
            or reading.now_s < w.last.now_s
        ):
            self._start(key, shape, lead, gpus, reading, next_clock_mhz)
            return None
        w.energy_mj += sum(
            energy_delta_mj(a, b) for a, b in zip(w.last.energy_mj, reading.energy_mj, strict=True)
        )
        w.last = reading
        if w.frequency_mhz is None or w.frequency_mhz != frequency_mhz:
            self._start(key, shape, lead, gpus, reading, next_clock_mhz)
            return None
        iterations = reading.iterations - w.start_iterations
        elapsed_s = reading.now_s - w.start_s
        if not close and (elapsed_s < self.window_s or iterations == 0):
            return None
        sample = None
        if iterations > 0 and elapsed_s > 0 and w.energy_mj > 0:
            sample = WindowSample(
                namespace=shape.namespace,
                job=shape.job,
                generation=shape.generation,
                n=shape.n,
                gpus_per_node=shape.gpus_per_node,
                local_batch_size=shape.local_batch_size,
                frequency_mhz=w.frequency_mhz,
                gpus_measured=len(gpus),
                iterations=iterations,
                step_time_s=elapsed_s / iterations,
                energy_j=w.energy_mj / 1000.0 / iterations,
                end_s=reading.now_s,
            )
        self._start(key, shape, lead, gpus, reading, next_clock_mhz)
        return sample

    def _start(
        self,
        key: Hashable,
        shape: JobShape,
        lead: Hashable,
        gpus: tuple[int, ...],
        reading: Reading,
        frequency_mhz: int | None,
    ) -> None:
        if len(reading.energy_mj) != len(gpus):
            self._open.pop(key, None)
            return
        self._open[key] = _Open(
            shape, lead, gpus, frequency_mhz, reading.now_s, reading.iterations, reading
        )

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s window (its job left the node)."""
        self._open.pop(key, None)

    def retain(self, keys: Collection[Hashable]) -> None:
        """Drop the windows of every job not in ``keys``."""
        for key in [k for k in self._open if k not in keys]:
            del self._open[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._open
