"""What one simulation run produced: per-job records, a power series, totals."""

from __future__ import annotations

from dataclasses import dataclass

from powerflow.core.models.protocol import FloatArray


@dataclass(frozen=True)
class JobRecord:
    """One job's outcome. JCT counts from submission, pre-run included."""

    job_id: str
    model_name: str
    requested_gpus: int
    submit_s: float
    finish_s: float
    energy_j: float
    attained_gpu_s: float
    rescales: int
    migrations: int
    preemptions: int
    restarts: int
    profilings: int
    fits: int

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.submit_s


@dataclass(frozen=True)
class Series:
    """Cluster state as a step function: each row holds until the next ``t_s``.

    ``busy_gpus`` counts GPU-equivalents computing (time-sliced GPUs by their
    busy share); ``held_gpus`` GPUs allocated to some job (computing or
    restarting); ``limit_w`` the plan's power limit (inf when it has none).
    """

    t_s: FloatArray
    power_w: FloatArray
    busy_gpus: FloatArray
    powered_gpus: FloatArray
    held_gpus: FloatArray
    queued_jobs: FloatArray
    limit_w: FloatArray


@dataclass(frozen=True)
class GpuTypeTotals:
    """One GPU type's part of a mixed cluster's run: its GPUs, the GPU-seconds they
    computed (time-sliced GPUs by their busy share) and were held, and the energy
    they drew computing and idle (boots included); the types' energies add up to
    the run's ``active_energy_j + idle_energy_j``."""

    gpu: str
    gpus: int
    busy_gpu_s: float
    held_gpu_s: float
    active_energy_j: float
    idle_energy_j: float


@dataclass(frozen=True)
class RunResult:
    jobs: tuple[JobRecord, ...]
    series: Series
    total_gpus: int
    active_energy_j: float
    idle_energy_j: float
    prerun_energy_j: float
    busy_gpu_s: float
    held_gpu_s: float
    powered_gpu_s: float
    above_limit_s: float
    """Seconds the ground truth's cluster power was above the plan's limit."""
    above_limit_j: float
    """Energy drawn above the limit: the integral of max(0, power - limit)."""
    max_overshoot_w: float
    """Largest excess of power over the limit in force (0: never above)."""
    max_overshoot_pct: float
    """The same relative to the limit in force then, in percent."""
    limit_w: float
    """The lowest limit in force during the run (constant unless the budget
    changes over time; the series has it per time); inf without a limit."""
    policy_calls: int
    policy_s: float
    fit_s: float
    events: int
    wall_s: float
    power_ons: int = 0
    """Nodes switched on (each boots for ``SimConfig.power_on_s`` first)."""
    power_on_energy_j: float = 0.0
    """The part of ``idle_energy_j`` drawn by nodes while they boot."""
    by_gpu: tuple[GpuTypeTotals, ...] = ()
    """A mixed cluster's totals per GPU type (empty on a cluster of one type)."""
