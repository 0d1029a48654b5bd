"""Simulated GPUs driven by the ground truth: what tests and ``--simulate`` use.

Each GPU runs what the caller assigns to it (``assign``/``clear``: one of a
job's GPUs, with the job's size, placement and local batch) at the clock the
GPU would really run: the locked clock rounded down to a supported one, and
lower still when a power limit below the workload's power forces it
(``capped_clock_mhz``, the rule the policy's power caps rely on too). Time is
injected, never read from the wall: either ``advance(seconds)`` moves it, or a
``clock`` callable is read at every call (``time.monotonic`` for
``--simulate``, a fake clock in tests).

Over each stretch of time between two calls every GPU draws one noisy sample
of the ground truth at its effective clock (``powerflow.lab.groundtruth.measure``,
the profiler's noise model: independent log-normal factors on step time and
energy, their spread shrinking with the iterations the stretch holds), and
runs at that sample's power and speed for the whole stretch. So the energy
counter is exactly the integral of the power readings, iterations advance at
the sampled speed, and a window of iterations costs the ground truth's energy
per iteration within the noise. An idle GPU draws the GPU type's idle power
with the same noise. Randomness comes from one seeded generator, drawn GPU by
GPU in index order: the same calls with the same seed give the same readings.

Simplifications (no data to do better): idle power does not depend on the
clock; the GPUs of one job progress independently (real data-parallel GPUs
wait for each other), so read a job's iterations from one of its GPUs.

Thread-safe: every public call holds one lock of the node's. A node's GPUs
always have two users on different threads, as NVML's do: the node agent
(clocks, limits, power and energy readings) and the workers (``assign``,
``clear``, iterations). Every call first runs the GPUs forward to the clock,
so two unserialised calls interleave that catch-up with a change (a GPU
cleared mid-run would be credited the old job's iterations).
"""

from __future__ import annotations

import functools
import math
import threading
import uuid
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import numpy as np

from powerflow.core.devices.capping import capped_clock_mhz
from powerflow.core.devices.errors import GpuNotSupported, GpuUnavailable
from powerflow.core.devices.interface import (
    GpuInfo,
    PowerLimitRangeW,
    Workload,
    check_clock_range,
    check_power_limit,
    gpu_at,
)
from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.groundtruth import GroundTruth, ground_truth, measure

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S", bound="SimulatedGpus")


def _serialised(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Run ``method`` holding the GPUs' lock (see the module docstring: why)."""

    @functools.wraps(method)
    def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._mutex:
            return method(self, *args, **kwargs)

    return call


class _Gpu:
    """Mutable state of one simulated GPU (private to ``SimulatedGpus``)."""

    def __init__(self, info: GpuInfo, spec: GpuSpec, power_limit_w: float | None) -> None:
        self.info = info
        self.lock: tuple[int, int] | None = None
        self.power_limit_w = power_limit_w
        self.workload: Workload | None = None
        self.truth: GroundTruth | None = None
        self.frequency_mhz = spec.min_clock_mhz
        self.energy_mj = 0.0
        self.power_w = spec.idle_power_w
        self.iterations = 0.0


class SimulatedGpus:
    """``count`` GPUs of type ``gpu`` on one simulated node (satisfies ``GpuDevices``).

    Each GPU's name is the type's first NVML product name, as a real one of that type
    reports it (the node agent's GPU report names the type by it). ``node`` makes the
    UUIDs distinct across simulated nodes; ``seed`` and
    ``noise`` (relative spread of one iteration's time and energy, as in
    ``powerflow.lab.groundtruth.measure``) fix the randomness.
    """

    def __init__(
        self,
        count: int = 8,
        *,
        gpu: GpuSpec = A100,
        node: str = "sim-node",
        seed: int = 0,
        noise: float = 0.03,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if count < 1:
            raise SimulationError("a simulated node needs at least one GPU")
        if not noise >= 0:
            raise SimulationError("noise must be >= 0")
        # Reentrant: a subclass's method may call the public ones while holding it.
        self._mutex = threading.RLock()
        self._spec = gpu
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self._clock = clock
        self._now_s = clock() if clock is not None else 0.0
        self._infos = tuple(
            GpuInfo(
                i,
                f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'powerflow-sim:{node}:{i}')}",
                gpu.nvml_names[0] if gpu.nvml_names else f"NVIDIA {gpu.name}",
            )
            for i in range(count)
        )
        self._gpus = [_Gpu(info, gpu, self._default_power_limit_w()) for info in self._infos]
        self._closed = False
        for state in self._gpus:
            self._settle(state)

    # -- driving the simulation (not part of GpuDevices) ---------------------

    @property
    def now_s(self) -> float:
        """Simulated time the GPUs have been advanced to."""
        with self._mutex:
            return self._now_s

    @_serialised
    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (only without an injected ``clock``)."""
        if self._clock is not None:
            raise SimulationError("these GPUs follow their clock; advance() would fight it")
        if not seconds >= 0:
            raise SimulationError(f"cannot advance by {seconds!r} s")
        self._run(seconds)

    @_serialised
    def assign(self, gpu: int, workload: Workload) -> None:
        """From now on ``gpu`` trains ``workload`` (replacing what ran; iterations restart)."""
        state = self._state(gpu)
        truth = ground_truth(workload.model_name, self._spec)
        w = workload
        truth.step_time_s(w.n, w.gpus_per_node, w.local_batch_size, self._spec.max_clock_mhz)
        state.workload, state.truth, state.iterations = workload, truth, 0.0
        self._settle(state)

    @_serialised
    def clear(self, gpu: int) -> None:
        """From now on ``gpu`` is idle."""
        state = self._state(gpu)
        state.workload, state.truth, state.iterations = None, None, 0.0
        self._settle(state)

    @_serialised
    def workload(self, gpu: int) -> Workload | None:
        """What ``gpu`` runs now, if anything."""
        return self._state(gpu).workload

    @_serialised
    def iterations_completed(self, gpu: int) -> int:
        """Whole iterations the current workload has finished on ``gpu``."""
        return math.floor(self._state(gpu).iterations)

    @_serialised
    def restart_driver(self) -> None:
        """What a driver reload does: energy counters restart at zero, clocks
        and power limits return to their defaults (workloads keep running)."""
        self._sync()
        for state in self._gpus:
            state.energy_mj = 0.0
            state.lock = None
            state.power_limit_w = self._default_power_limit_w()
            self._settle(state)

    # -- GpuDevices ----------------------------------------------------------

    @_serialised
    def gpus(self) -> tuple[GpuInfo, ...]:
        self._sync()
        return self._infos

    @_serialised
    def supported_graphics_clocks_mhz(self, gpu: int) -> tuple[int, ...]:
        self._state(gpu)
        return self._spec.clocks_mhz

    @_serialised
    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        state = self._state(gpu)
        check_clock_range(state.info.label, lo_mhz, hi_mhz)
        state.lock = (lo_mhz, hi_mhz)
        self._settle(state)

    @_serialised
    def reset_clocks(self, gpu: int) -> None:
        state = self._state(gpu)
        state.lock = None
        self._settle(state)

    @_serialised
    def power_limit_w(self, gpu: int) -> float:
        state = self._state(gpu)
        self._range(state)
        assert state.power_limit_w is not None
        return state.power_limit_w

    @_serialised
    def power_limit_range_w(self, gpu: int) -> PowerLimitRangeW:
        return self._range(self._state(gpu))

    @_serialised
    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        state = self._state(gpu)
        check_power_limit(state.info.label, watts, self._range(state))
        state.power_limit_w = round(watts * 1000.0) / 1000.0  # NVML takes whole mW
        self._settle(state)

    @_serialised
    def reset_power_limit(self, gpu: int) -> None:
        state = self._state(gpu)
        state.power_limit_w = self._range(state).default_w
        self._settle(state)

    @_serialised
    def total_energy_mj(self, gpu: int) -> int:
        return math.floor(self._state(gpu).energy_mj)

    @_serialised
    def power_mw(self, gpu: int) -> int:
        return round(self._state(gpu).power_w * 1000.0)

    @_serialised
    def sm_clock_mhz(self, gpu: int) -> int:
        return self._state(gpu).frequency_mhz

    @_serialised
    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> SimulatedGpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------

    def _default_power_limit_w(self) -> float | None:
        return self._spec.max_power_w if self._spec.min_power_limit_w is not None else None

    def _range(self, state: _Gpu) -> PowerLimitRangeW:
        low = self._spec.min_power_limit_w
        if low is None:
            raise GpuNotSupported(
                f"{state.info.label}: {self._spec.name} has no settable power limit",
                gpu=state.info.label,
            )
        top = self._spec.max_power_w
        return PowerLimitRangeW(min_w=low, max_w=top, default_w=top)

    def _state(self, gpu: int) -> _Gpu:
        if self._closed:
            raise GpuUnavailable("simulated GPUs: already closed")
        info = gpu_at(self._infos, gpu)
        self._sync()
        return self._gpus[info.index]

    def _sync(self) -> None:
        """Catch up with the injected clock (a clock never runs backwards here)."""
        if self._clock is not None:
            self._run(max(0.0, self._clock() - self._now_s))

    def _settle(self, state: _Gpu) -> None:
        """Recompute the effective clock and the (noise-free) power after a change."""
        spec, lock = self._spec, state.lock
        clocks = spec.clocks_mhz
        hi = lock[1] if lock is not None else spec.max_clock_mhz
        w, truth = state.workload, state.truth
        if w is None or truth is None:
            lo = lock[0] if lock is not None else spec.min_clock_mhz
            ceiling = max([c for c in clocks if c <= hi] or [clocks[0]])
            state.frequency_mhz = min(ceiling, min([c for c in clocks if c >= lo] or [clocks[-1]]))
            state.power_w = spec.idle_power_w
            return
        state.frequency_mhz = capped_clock_mhz(truth, w, clocks, hi, state.power_limit_w)
        state.power_w = (
            float(truth.power_w(w.n, w.gpus_per_node, w.local_batch_size, state.frequency_mhz))
            / w.n
        )

    def _run(self, dt: float) -> None:
        """Every GPU runs ``dt`` seconds in its current state (one noisy draw each)."""
        self._now_s += dt
        if dt <= 0:
            return
        for state in self._gpus:
            w, truth = state.workload, state.truth
            if w is None or truth is None:
                sigma = self._noise
                factor = math.exp(sigma * float(self._rng.standard_normal()) - 0.5 * sigma**2)
                power_w = self._spec.idle_power_w * factor
            else:
                n, r, bs, f = w.n, w.gpus_per_node, w.local_batch_size, state.frequency_mhz
                true_step = float(truth.step_time_s(n, r, bs, f))
                sample = measure(
                    truth,
                    n,
                    r,
                    bs,
                    f,
                    rng=self._rng,
                    noise=self._noise,
                    iterations=max(1.0, dt / true_step),
                )
                step_s = float(sample.step_time_s[0])
                power_w = float(sample.energy_j[0]) / n / step_s
                state.iterations += dt / step_s
            state.power_w = power_w
            state.energy_mj += power_w * dt * 1000.0
