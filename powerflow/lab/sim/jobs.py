"""The simulator's mutable record of one job (private to the engine)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np

from powerflow.core.learning import Knowledge
from powerflow.core.models.protocol import PerfModel
from powerflow.core.models.samples import Samples
from powerflow.core.policy.snapshot import GpuSlot, JobPlan
from powerflow.lab.sim import kernels
from powerflow.lab.sim.trace import TraceJob

if TYPE_CHECKING:
    from powerflow.lab.sim.on_type import OnType


class Phase(enum.Enum):
    PENDING = "pending"  # not yet submitted
    PRERUN = "prerun"  # offline 1-GPU clock sweep, not yet schedulable
    QUEUED = "queued"  # schedulable, holds no GPUs
    RESTART = "restart"  # holds GPUs, restoring from a checkpoint
    PROFILE = "profile"  # holds GPUs, sweeping clocks (makes progress)
    RUN = "run"  # holds GPUs, computing at the planned clock
    DONE = "done"


HOLDING = frozenset({Phase.RESTART, Phase.PROFILE, Phase.RUN})
COMPUTING = frozenset({Phase.PROFILE, Phase.RUN})


class JobArrays:
    """The per-job numbers the engine updates at every event, one array each
    (the rows of two blocks, ``floats`` and ``flags``).

    Between events the engine advances progress, energy and held time of all
    holders, and recomputes their next events, in compiled loops over these
    columns (``powerflow.lab.sim.kernels``) instead of Python attribute access per
    job; they do each job's float operations in the same order, so its numbers
    are the very floats a per-job Python loop gives. ``SimJob`` exposes its
    row as plain attributes for everything else.
    """

    def __init__(self, size: int) -> None:
        # The blocks are the compiled loops' arguments (``kernels`` says why
        # and holds the row indices).
        self.floats = np.zeros((kernels.FLOAT_ROWS, size))
        self.flags = np.zeros((kernels.FLAG_ROWS, size), dtype=bool)
        f = self.floats
        self.done = f[kernels.DONE]  # iterations done
        self.energy = f[kernels.ENERGY]  # J while computing (pre-run apart)
        self.attained = f[kernels.ATTAINED]  # GPU-seconds held
        self.run_s = f[kernels.RUN_S]  # seconds held
        self.share = f[kernels.SHARE]  # time share of its GPUs (time-slicing)
        self.step = f[kernels.STEP]  # s per iteration at its current rates
        self.power = f[kernels.POWER]  # W of all its GPUs while computing
        self.n = f[kernels.N]  # GPUs held, as a float
        self.iterations = f[kernels.ITERATIONS]
        self.phase_end = f[kernels.PHASE_END]
        self.next_event = f[kernels.NEXT_EVENT]
        self.planned = f[kernels.PLANNED]  # W its plan counts for it (0: none)
        # W of all its GPUs at its phase's hungriest clock (no compiled loop reads it)
        self.peak = np.zeros(size)
        self.completion = self.flags[kernels.COMPLETION]  # the next event is its completion
        self.computing = self.flags[kernels.COMPUTING]
        self.running = self.flags[kernels.RUNNING]  # in phase RUN
        self.share[:] = 1.0
        self.step[:] = np.inf
        self.phase_end[:] = np.inf
        self.next_event[:] = np.inf


def _column(name: str, doc: str) -> property:
    def get(self: SimJob) -> float:
        return float(getattr(self.arrays, name)[self.index])

    def put(self: SimJob, value: float) -> None:
        getattr(self.arrays, name)[self.index] = value

    return property(get, put, doc=doc)


class SimJob:
    """State that changes as the simulation runs; the engine owns every write.

    The numbers the engine's per-event passes touch live in a shared
    ``JobArrays`` (row ``index``); the attributes below read and write that row.
    """

    __slots__ = (
        "_n",
        "arrays",
        "bs",
        "cap_w",
        "computing",
        "counted",
        "f",
        "finish_s",
        "holding",
        "index",
        "iterations",
        "job_id",
        "knowledge",
        "measured_f",
        "measured_w",
        "migrations",
        "on",
        "phase",
        "placement",
        "plan",
        "preemptions",
        "prerun_energy_j",
        "profile_clocks",
        "profile_start_s",
        "profiled",
        "profilings",
        "r",
        "rescales",
        "restarts",
        "rng",
        "samples",
        "started",
        "trace",
        "truth",
        "visible_s",
    )

    done_iters = _column("done", "Iterations done so far.")
    energy_j = _column("energy", "Energy while computing (the pre-run apart).")
    attained_gpu_s = _column("attained", "GPU-seconds held.")
    run_s = _column("run_s", "Seconds held.")
    share = _column("share", "Time share of its GPUs (below 1 when time-sliced).")
    step_s = _column("step", "Seconds per iteration at its current rates.")
    power_w = _column("power", "Watts of all its GPUs while computing.")
    peak_w = _column("peak", "Highest watts of all its GPUs in its current phase.")
    phase_end_s = _column("phase_end", "When the current phase ends (inf: never).")
    next_event_s = _column("next_event", "Its next event: phase end or completion.")

    def __init__(
        self,
        index: int,
        trace: TraceJob,
        truth: PerfModel,
        seed: int,
        arrays: JobArrays,
        on: OnType,
    ) -> None:
        self.index = index
        self.trace = trace
        self.truth = truth  # the ground truth on its type, ``on``
        self.on = on  # the GPU type it runs on (or last ran on, or starts on)
        self.arrays = arrays
        self.iterations = trace.iterations  # read in the engine's hot loops
        arrays.iterations[self.index] = trace.iterations
        self.job_id = trace.job_id
        self.rng = np.random.default_rng([seed, index])
        self.phase = Phase.PENDING
        self.holding = False
        self.computing = False
        self.placement: tuple[GpuSlot, ...] = ()
        self.counted: tuple[GpuSlot, ...] = ()  # the placement in the engine's load
        self.plan: JobPlan | None = None  # the plan it holds GPUs by (None: it holds none)
        self.n = 0
        self.r = 0
        self.bs = 0.0
        self.f = 0
        self.cap_w: float | None = None  # per-GPU power cap of its plan (None: none)
        self.measured_w: float | None = None  # measured power on its placement, at:
        self.measured_f: int | None = None  # the clock its GPUs really ran
        self.knowledge: Knowledge | None = None
        self.samples: list[Samples] = []
        self.profiled: set[int] = set()
        self.profile_clocks: tuple[int, ...] = ()
        self.profile_start_s = 0.0
        self.prerun_energy_j = 0.0
        self.visible_s = float("nan")
        self.finish_s = float("nan")
        self.started = False
        self.rescales = 0
        self.migrations = 0
        self.preemptions = 0
        self.restarts = 0
        self.profilings = 0

    @property
    def n(self) -> int:
        """GPUs held."""
        return self._n

    @n.setter
    def n(self, value: int) -> None:
        self._n = value
        self.arrays.n[self.index] = value

    @property
    def next_is_completion(self) -> bool:
        """Whether ``next_event_s`` is its completion (else its phase end)."""
        return bool(self.arrays.completion[self.index])

    @next_is_completion.setter
    def next_is_completion(self, value: bool) -> None:
        self.arrays.completion[self.index] = value

    @property
    def remaining(self) -> float:
        done: float = self.done_iters
        return max(self.iterations - done, 0.0)

    def set_phase(self, phase: Phase) -> None:
        """Change phase; ``holding``/``computing`` are cached for the hot loops."""
        self.phase = phase
        self.holding = phase in HOLDING
        self.computing = phase in COMPUTING
        self.arrays.computing[self.index] = self.computing
        self.arrays.running[self.index] = phase is Phase.RUN

    def set_plan(self, plan: JobPlan | None) -> None:
        """Hold ``plan``; the power it counts goes to the arrays (0 for none), where
        the engine's power ratio reads it (``kernels.ratio_sums``)."""
        self.plan = plan
        self.arrays.planned[self.index] = (plan.power_w or 0.0) if plan is not None else 0.0
