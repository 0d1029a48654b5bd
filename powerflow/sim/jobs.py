"""The simulator's mutable record of one job (private to the engine)."""

from __future__ import annotations

import enum

import numpy as np

from powerflow.models.protocol import PerfModel
from powerflow.models.samples import Samples
from powerflow.policy.snapshot import GpuSlot, Job
from powerflow.sim.learning import Knowledge
from powerflow.sim.trace import TraceJob


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


class SimJob:
    """State that changes as the simulation runs; the engine owns every write."""

    __slots__ = (
        "attained_gpu_s",
        "bs",
        "computing",
        "counted",
        "done_iters",
        "energy_j",
        "f",
        "finish_s",
        "holding",
        "index",
        "iterations",
        "job_id",
        "knowledge",
        "migrations",
        "n",
        "next_event_s",
        "next_is_completion",
        "phase",
        "phase_end_s",
        "placement",
        "power_w",
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
        "run_s",
        "samples",
        "share",
        "started",
        "step_s",
        "trace",
        "truth",
        "view",
        "view_model",
        "visible_s",
    )

    def __init__(self, index: int, trace: TraceJob, truth: PerfModel, seed: int) -> None:
        self.index = index
        self.trace = trace
        self.iterations = trace.iterations  # read in the engine's hot loops
        self.job_id = trace.job_id
        self.truth = truth
        self.rng = np.random.default_rng([seed, index])
        self.phase = Phase.PENDING
        self.holding = False
        self.computing = False
        self.phase_end_s = float("inf")
        self.next_event_s = float("inf")
        self.next_is_completion = False
        self.done_iters = 0.0
        self.placement: tuple[GpuSlot, ...] = ()
        self.counted: tuple[GpuSlot, ...] = ()  # the placement in the engine's load
        self.n = 0
        self.r = 0
        self.bs = 0.0
        self.f = 0
        self.step_s = float("inf")
        self.power_w = 0.0
        self.share = 1.0
        self.knowledge: Knowledge | None = None
        self.samples: list[Samples] = []
        self.profiled: set[int] = set()
        self.profile_clocks: tuple[int, ...] = ()
        self.profile_start_s = 0.0
        self.attained_gpu_s = 0.0
        self.run_s = 0.0
        self.energy_j = 0.0
        self.prerun_energy_j = 0.0
        self.visible_s = float("nan")
        self.finish_s = float("nan")
        self.started = False
        self.rescales = 0
        self.migrations = 0
        self.preemptions = 0
        self.restarts = 0
        self.profilings = 0
        self.view: Job | None = None
        self.view_model: PerfModel | None = None

    @property
    def remaining(self) -> float:
        return max(self.iterations - self.done_iters, 0.0)

    def set_phase(self, phase: Phase) -> None:
        """Change phase; ``holding``/``computing`` are cached for the hot loops."""
        self.phase = phase
        self.holding = phase in HOLDING
        self.computing = phase in COMPUTING
