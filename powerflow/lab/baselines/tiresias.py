"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional LAS, preemptive.

Sources: the paper and its simulator (github.com/SymbioticLab/Tiresias,
``simulator/run_sim.py``, ``dlas_sim_jobs``; ``simulator/jobs.py``).

Faithful:

- **2D-LAS on attained GPU-time**: a job's priority is its attained service,
  GPUs x seconds run (``attained_gpu_s``), the two dimensions of 2DAS.
  Discretised into queues by ``queue_thresholds_gpu_s``: a job starts in the
  top queue and is demoted when its attained service crosses a threshold
  (the simulator's ``dlas-gpu``: ``executed_time x num_gpu >= queue_limit``).
- **Order within a queue**: the jobs running now first, then the waiting
  ones by arrival. The simulator moves the jobs it leaves waiting to the back
  of their queue after every round, so a waiting job never preempts a
  running job of its own queue; only a job of a higher queue does.
- **Preemptive with backfilling**: at every event the jobs are walked in
  that order and each one whose GPU count still fits runs; a running job
  that does not make the cut is preempted (0 GPUs); a job that does not fit
  is skipped, not waited for (the simulator's loop over its queues).
- **Starvation guard (PROMOTE_KNOB)**: a job in a lower queue that has
  waited at least ``promote_knob`` times its executed time goes back to the
  top queue (the simulator's ``solve_starvation``); ``None`` turns it off,
  which is the simulator's ``dlas-gpu`` default.
- **Not elastic, not energy-aware**: each job runs on its requested GPU
  count at one cluster-wide clock (``frequency_mhz``, default the highest);
  the power limit is reported, not enforced.

Defaults (``TIRESIAS_THRESHOLDS_GPU_S``, ``TIRESIAS_PROMOTE_KNOB``): the best
of a grid on the tuning windows of the whole trace, days no result is reported
on (``powerflow sweep tuning``, ``powerflow.lab.sim.tuning``; the grid, its
table and the reasons in docs/baselines.md, "Tiresias at its best"), started
from the simulator's settings (thresholds 3,250 and 7,200 GPU-s: three queues;
no promotion). Any thresholds can be given.

Simplified, and why:

- Stateless (every policy here is a function of the snapshot): the executed
  time is ``attained_gpu_s / requested_gpus`` and the waiting time
  ``now_s - arrival_s - executed``, both from the snapshot. Tiresias resets a
  promoted job's executed time to zero, so it sinks again only after another
  threshold's worth of service; without state, a *running* job keeps its
  promotion while it has waited at least ``promote_knob / 2`` times its
  executed time, so it runs for about as long again as it had run before it
  can be preempted, instead of being preempted at the next event.
- Placement: Tiresias consolidates the jobs whose models are sensitive to
  placement (high tensor skew, from its profiler) and places the others
  anywhere; the simulator here has no tensor profiles, so every job is
  consolidated when possible (one node, or whole nodes when larger) and
  spread over as few nodes as possible otherwise, which is never worse for a
  job. New jobs are placed largest first; running jobs keep their GPUs, so a
  resumed job may land elsewhere (a restart from checkpoint, as in Tiresias).
- 2D-Gittins (Tiresias's variant for a known distribution of job sizes) is
  not implemented: the comparison gives no scheduler that distribution, and
  2D-LAS is the paper's variant for no job information.
- Pinned jobs (restarting, waiting for a node to boot) are never preempted.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from powerflow.core.errors import SnapshotError
from powerflow.core.policy.snapshot import GpuSlot, Job, Plan, Snapshot
from powerflow.lab.baselines.common import (
    ModelMemo,
    Pool,
    cluster_gpu,
    finish,
    fixed_clock,
    job_plans,
)

TIRESIAS_THRESHOLDS_GPU_S: tuple[float, ...] = (32500.0, 72000.0, 180000.0)
"""Queue thresholds in attained GPU-seconds: four queues. The best of
``powerflow sweep tuning`` on the tuning windows (docs/baselines.md, "Tiresias
at its best"; score 1.010, the simulator's own 3,250 and 7,200 GPU-s 1.081):
ten times the Tiresias simulator's thresholds (the traces' jobs are long: 8
GPUs pass 3,250 GPU-s in under 7 minutes) and one queue more."""
TIRESIAS_PROMOTE_KNOB: float | None = None
"""No promotion, as the Tiresias simulator's ``dlas-gpu``: on the tuning windows
every knob tried (2, 8) lengthened the average JCT."""


@dataclass(frozen=True)
class TiresiasPolicy:
    """Discretised 2D-LAS at one cluster-wide clock; see the module docstring."""

    frequency_mhz: int | None = None
    queue_thresholds_gpu_s: tuple[float, ...] = field(default=TIRESIAS_THRESHOLDS_GPU_S)
    promote_knob: float | None = TIRESIAS_PROMOTE_KNOB
    memo: ModelMemo = field(default_factory=ModelMemo, compare=False, repr=False)

    def __post_init__(self) -> None:
        th = self.queue_thresholds_gpu_s
        if any(t <= 0 for t in th) or list(th) != sorted(set(th)):
            raise SnapshotError("queue thresholds must be positive and strictly increasing")
        if self.promote_knob is not None and self.promote_knob <= 0:
            raise SnapshotError("promote_knob must be positive (or None to disable)")

    def queue(self, job: Job, now_s: float) -> int:
        """The job's priority queue, 0 the highest."""
        return _serve_key(self.queue_thresholds_gpu_s, self.promote_knob, now_s)(job)[1]

    def priority(self, snapshot: Snapshot) -> list[Job]:
        """Jobs in the order Tiresias serves them (pinned jobs first)."""
        key = _serve_key(self.queue_thresholds_gpu_s, self.promote_knob, snapshot.now_s)
        return sorted(snapshot.jobs, key=key)

    def plan(self, snapshot: Snapshot) -> Plan:
        spec = cluster_gpu(snapshot)
        clock = fixed_clock(spec, self.frequency_mhz)
        free = sum(node.gpus for node in snapshot.nodes)
        chosen: list[Job] = []
        for job in self.priority(snapshot):
            need = len(job.placement) if job.pinned and job.placement else job.requested_gpus
            if need <= free:
                chosen.append(job)
                free -= need
        pool = Pool(snapshot.nodes)
        where: dict[str, tuple[GpuSlot, ...]] = {}
        for job in chosen:
            if job.placement and (job.pinned or len(job.placement) == job.requested_gpus):
                pool.take(job.placement)
                where[job.id] = job.placement
        for job in sorted(chosen, key=lambda j: (-j.requested_gpus, j.arrival_s, j.id)):
            if job.id in where:
                continue
            target = pool.take_consolidated(job.requested_gpus)
            if target is None:
                target = pool.take_spread(job.requested_gpus)
            if target is None:  # pragma: no cover - counts were checked above
                raise SnapshotError(f"no GPUs left for job {job.id}")
            where[job.id] = target
        plans = job_plans(snapshot.jobs, where, clock, self.memo)
        return finish(snapshot, spec, plans, self.memo)


def _serve_key(
    thresholds: tuple[float, ...], knob: float | None, now: float
) -> Callable[[Job], tuple[bool, int, bool, float, str]]:
    """The sort key of Tiresias's service order:
    (not pinned, queue, not running, arrival, id).

    Within a queue the jobs running now come first, then the waiting ones by
    arrival: Tiresias's simulator moves the jobs it leaves waiting to the
    back of their queue after every round, so a waiting job never preempts a
    running job of its own queue.

    One closure per policy call rather than a method per job: the key runs for
    every job at every event, and ``queue`` reads its second field.
    """
    bisect_right = bisect.bisect_right

    def key(j: Job) -> tuple[bool, int, bool, float, str]:
        q = bisect_right(thresholds, j.attained_gpu_s)
        if q and knob is not None:
            n = j.requested_gpus
            executed = j.attained_gpu_s / (n if n > 1 else 1)  # max(n, 1)
            waited = now - j.arrival_s - executed
            if waited >= (knob / 2 if j.placement else knob) * executed:
                q = 0
        return (not j.pinned, q, not j.placement, j.arrival_s, j.id)

    return key
