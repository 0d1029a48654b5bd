"""Plain data in and out of every scheduling policy.

A policy (PowerFlow and each baseline) is an object with one method,
``plan(snapshot) -> Plan``. The snapshot is frozen and self-contained: it
carries the time (``now_s``) and each job's performance model, so a policy
never reads a clock, NVML or the Kubernetes API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import PerfModel

GpuSlot = tuple[str, int]
"""One GPU: (node name, GPU index on that node)."""


@dataclass(frozen=True)
class Node:
    """One machine of the cluster."""

    name: str
    gpus: int
    gpu: GpuSpec
    powered_on: bool = True


@dataclass(frozen=True)
class Job:
    """One active (submitted, unfinished) training job as the policy sees it.

    ``placement`` and ``frequency_mhz`` describe what the job runs on right
    now (empty and ``None`` while it waits). ``pinned`` asks the policy to keep
    the job's current GPUs as they are (e.g. while it is profiling a new GPU
    count or restarting from a checkpoint).

    What the backend measured, for the power loop (``powerflow.core.policy.power_loop``):
    ``measured_power_w`` is the mean power of all the job's GPUs over its latest
    measurement window on its current ``placement`` (local batch
    ``ceil(global_batch_size / GPUs)``), at clock ``measured_frequency_mhz`` (the
    clock the GPUs really ran, which a power cap may hold below the planned one);
    ``None`` when not measured there yet. ``profiled_gpus`` lists the GPU counts
    the job has been profiled on: a first run on any other count sweeps the
    clocks up to the highest one (``None``: the backend does not profile).
    ``power_cap_w`` is the per-GPU power cap its GPUs hold now (``None``: none);
    the policy keeps it unless it must lower it or can raise it by a clear step
    (``power_loop.steady_caps``), so that caps are not rewritten at every pass.
    """

    id: str
    model: PerfModel
    remaining_iterations: float
    global_batch_size: int
    requested_gpus: int
    arrival_s: float
    elapsed_s: float = 0.0
    min_gpus: int = 1
    max_gpus: int | None = None
    max_local_batch_size: int | None = None
    placement: tuple[GpuSlot, ...] = ()
    frequency_mhz: int | None = None
    attained_gpu_s: float = 0.0
    model_name: str | None = None
    pinned: bool = False
    measured_power_w: float | None = None
    measured_frequency_mhz: int | None = None
    profiled_gpus: frozenset[int] | None = None
    power_cap_w: float | None = None
    models_by_gpu: tuple[tuple[str, PerfModel], ...] = field(default=(), compare=False)
    """The job's model on each GPU type of a mixed cluster, by type name
    (``powerflow.core.policy.fleet``); ``model`` serves a type not listed. Empty on
    a cluster of one type, where ``model`` is the job's model on it."""
    committed_gpu: str | None = None
    """The GPU type (``GpuSpec.name``) the job's current workers can only run on, on a
    cluster of several types (where they are bound, else their node affinity's). A
    job without a known ``placement`` (a gang created, not bound yet) is planned in
    that type's pools (``fleet``): a plan elsewhere would hand those workers another
    type's clock and count them at its watts. ``None``: any type."""


@dataclass(frozen=True)
class Budget:
    """The admin's power budget.

    Precedence: an absolute ``limit_w`` wins over ``eta``. With ``eta``
    the limit is ``eta * G * p_max_w`` (paper §5.2), ``G`` all GPUs of the
    cluster; ``p_max_w`` defaults to the GPU type's reference power
    (``GpuSpec.p_max_w``). ``powerflow.core.policy.budget`` states the exact rule
    (neither given: ``eta = 1``).
    """

    eta: float | None = None
    limit_w: float | None = None
    p_max_w: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at to make one decision.

    ``power_ratio``: the backend's recent ratio of measured to predicted power
    of the jobs running as planned (1.0 when it has none); a policy keeping the
    budget plans against ``limit / max(1, power_ratio)``
    (``powerflow.core.policy.power_loop``).
    """

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    budget: Budget
    now_s: float
    power_ratio: float = 1.0


@dataclass(frozen=True)
class JobPlan:
    """What one job should run on. ``gpus == 0`` means it waits.

    ``power_w``: the power of all its GPUs the plan counted for it (None: the
    policy does not say). ``power_cap_w``: a per-GPU power limit the backend
    sets on each of its GPUs (a hardware backstop: the GPU then runs at the
    highest clock whose power fits it, ``powerflow.core.devices.capped_clock_mhz``);
    None: no cap.
    """

    job_id: str
    gpus: int
    frequency_mhz: int
    local_batch_size: int
    placement: tuple[GpuSlot, ...] = ()
    power_w: float | None = None
    power_cap_w: float | None = None


@dataclass(frozen=True)
class Migration:
    """A running job whose GPUs change although its GPU count may not."""

    job_id: str
    source: tuple[GpuSlot, ...]
    target: tuple[GpuSlot, ...]


@dataclass(frozen=True)
class Plan:
    """A policy's decision for the whole cluster.

    ``predicted_w`` (PowerFlow): the placed jobs' predicted
    ``E_iter / T_iter`` at their clocks plus idle power for every unallocated
    GPU on a node not in ``powered_down_nodes``; powered-down nodes count zero.
    ``limit_w`` is the budget resolved by ``powerflow.core.policy.budget``.
    """

    jobs: tuple[JobPlan, ...]
    limit_w: float
    predicted_w: float
    powered_down_nodes: tuple[str, ...] = ()
    migrations: tuple[Migration, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def job(self, job_id: str) -> JobPlan:
        for jp in self.jobs:
            if jp.job_id == job_id:
                return jp
        raise KeyError(job_id)


class Policy(Protocol):
    """Every scheduler: PowerFlow, its ablations and the baselines."""

    def plan(self, snapshot: Snapshot) -> Plan:
        """Decide GPUs, clock, local batch and placement for every job."""
        ...
