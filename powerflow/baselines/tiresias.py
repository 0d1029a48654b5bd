"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional LAS, preemptive.

What Tiresias does and what is kept here:

- **Not elastic, not energy-aware**: each job runs on its requested GPU
  count, at one cluster-wide clock (``frequency_mhz``, default the highest).
  The power limit is reported, not enforced.
- **2D-LAS**: a job's priority is its attained service in GPU-time
  (``attained_gpu_s``: GPUs x seconds run), the two dimensions of Tiresias's
  2DAS. It is discretised into queues by ``queue_thresholds_gpu_s``; jobs
  start in the top queue and are demoted when their attained service crosses
  a threshold; within a queue, FIFO by arrival.
- **Preemptive with backfilling**: at every event the jobs are walked in
  priority order and each one whose GPU count still fits in the cluster runs;
  a running job that does not make the cut is preempted (gets 0 GPUs); a
  job that does not fit is skipped, not waited for (as in Tiresias's
  simulator and prototype).
- **Starvation guard**: a job in a lower queue that has waited at least
  ``promote_knob`` times its executed time is promoted to the top queue
  (Tiresias's STARVELIMIT = PROMOTEKNOB x executed time).

Defaults and why:

- Two queues split at 3,600 GPU-seconds (``queue_thresholds_gpu_s=(3600,)``):
  Tiresias finds two queues enough (more queues bring little), and one
  GPU-hour is the threshold its simulator ships with. Any number of queues
  can be given.
- ``promote_knob = 2``: a job may wait twice as long as it has run before it
  jumps the queue again. ``None`` turns the guard off.

Simplifications, and why:

- Stateless: the executed time is ``attained_gpu_s / requested_gpus`` and the
  waiting time ``now_s - arrival_s - executed``, both from the snapshot.
  Promotion is remembered without state by hysteresis: a *running* job keeps
  its promotion while it has waited at least ``promote_knob / 2`` times its
  executed time, so a promoted job runs for about as long again as it had
  run before it can be preempted, instead of being preempted at the next
  event (Tiresias resets a promoted job's queue position; without state this
  is the closest equivalent that does not thrash).
- Placement: Tiresias consolidates jobs whose models are sensitive to
  placement (high skew) and places the others anywhere; here every job is
  consolidated when possible (one node, or whole nodes when larger) and
  spread over as few nodes as possible otherwise, which is never worse for a
  job. New jobs are placed largest first; running jobs keep their GPUs, so a
  resumed job may land elsewhere (a restart from checkpoint, as in Tiresias).
- Pinned jobs (profiling, restarting) are never preempted.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from powerflow.baselines.common import (
    ModelMemo,
    Pool,
    cluster_gpu,
    finish,
    fixed_clock,
    job_plans,
)
from powerflow.errors import SnapshotError
from powerflow.policy.snapshot import GpuSlot, Job, Plan, Snapshot


@dataclass(frozen=True)
class TiresiasPolicy:
    """Discretised 2D-LAS at one cluster-wide clock; see the module docstring."""

    frequency_mhz: int | None = None
    queue_thresholds_gpu_s: tuple[float, ...] = field(default=(3600.0,))
    promote_knob: float | None = 2.0
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
