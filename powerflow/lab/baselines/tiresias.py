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
- **Consolidation for placement-sensitive jobs** (the paper's section 4): a
  sensitive job gets a consolidated block (one node, or the fewest whole
  nodes) or, while its wait is within the bound below, is skipped this round
  like a job that does not fit (its GPUs go to the jobs after it); the others
  are consolidated when a block is free and spread over as few nodes as the
  free GPUs allow otherwise. The jobs chosen to run get their blocks before
  any running job moves to one.
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
- Placement from a profile instead of tensor skew: Tiresias's profiler
  finds the models with high tensor skew (VGG), whose jobs slow down when
  spread; the simulator has no tensor profiles, but the baselines are given
  each job's model (the ground truth). A job is placement-sensitive when its
  step time spread over one node more than consolidated needs is more than
  ``skew_slowdown`` slower than consolidated; a one-GPU job never is. The
  trace's models slow down by 0-15 % one node more, most by 1-6 %; the
  threshold (``TIRESIAS_SKEW_SLOWDOWN``, 0: any slowdown) was chosen on the
  tuning windows, where a higher one only lengthened the average JCT.
- A bound on waiting for a block: a sensitive job waits only while the time
  it has waited is below what running spread would cost it, its remaining
  time consolidated times its slowdown; past that it runs spread (the
  break-even rule of ski rental: the wait never costs it more than the
  slowdown it avoids would have). Stateless, the time waited is all of its
  time since arrival not run (``now_s - arrival_s - executed``), so a job
  that already waited long behind others for GPUs does not wait again for a
  block: it starts spread and moves when a block frees (next item).
- Re-consolidation: Tiresias moves a job only by preempting it and resuming
  it elsewhere. Here a running sensitive job that is spread (a resumed job
  lands where GPUs are free) also moves, at any event, to a consolidated
  block that is free, when the move saves it at least ``move_gain_s`` over
  its remaining iterations; the move is a checkpoint-restart, which the
  simulator charges as any changed placement (``restart_s``). Running jobs
  otherwise keep their GPUs; new jobs are placed largest first, after the
  moves.
- 2D-Gittins (Tiresias's variant for a known distribution of job sizes) is
  not implemented: the comparison gives no scheduler that distribution, and
  2D-LAS is the paper's variant for no job information.
- Pinned jobs (restarting, waiting for a node to boot) are never preempted.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from powerflow.core.errors import SnapshotError
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.snapshot import GpuSlot, Job, Migration, Plan, Snapshot
from powerflow.lab.baselines.common import (
    Decision,
    ModelMemo,
    PlanWatts,
    Pool,
    cluster_gpu,
    finish,
    fixed_clock,
    job_plans,
    local_batch,
    node_count,
    per_node,
)

TIRESIAS_THRESHOLDS_GPU_S: tuple[float, ...] = (32500.0, 72000.0)
"""Queue thresholds in attained GPU-seconds: three queues. The best of
``powerflow sweep tuning`` on the tuning windows (docs/baselines.md, "Tiresias
at its best"; score 1.008, a fourth queue at 180,000 GPU-s 1.009, the
simulator's own 3,250 and 7,200 GPU-s 1.077): ten times the Tiresias
simulator's thresholds (the traces' jobs are long: 8 GPUs pass 3,250 GPU-s in
under 7 minutes)."""
TIRESIAS_PROMOTE_KNOB: float | None = None
"""No promotion, as the Tiresias simulator's ``dlas-gpu``: on the tuning windows
every knob tried (2, 8) lengthened the average JCT."""
TIRESIAS_SKEW_SLOWDOWN = 0.0
"""A job is placement-sensitive (Tiresias: high tensor skew, consolidated) when
its step time spread over one node more than consolidated needs is more than
this much slower than consolidated. 0: every multi-GPU job whose model slows
at all when spread, the best of 0, 3, 5 and 10 % on the tuning windows
(``powerflow sweep tuning``'s "tiresias placement" grid; docs/baselines.md,
"Tiresias at its best"; score 1.000 against 1.009 for 3 %). The trace's models
slow down by 0-15 % one node more (docs/baselines.md, "Tiresias's placement",
lists them with the command). The wait bound scales with the slowdown, so a
mildly sensitive job waits little, and a spread one moves only when the move
saves more than its restart."""
TIRESIAS_MOVE_GAIN_S = 60.0
"""A spread sensitive job moves to a free consolidated block only when the move
saves it at least this many seconds over its remaining iterations: twice the
simulator's checkpoint-restart (``RESTART_S``, 30 s), which the move costs it."""


@dataclass(frozen=True)
class TiresiasPolicy:
    """Discretised 2D-LAS at one cluster-wide clock; see the module docstring."""

    frequency_mhz: int | None = None
    queue_thresholds_gpu_s: tuple[float, ...] = field(default=TIRESIAS_THRESHOLDS_GPU_S)
    promote_knob: float | None = TIRESIAS_PROMOTE_KNOB
    skew_slowdown: float = TIRESIAS_SKEW_SLOWDOWN
    move_gain_s: float = TIRESIAS_MOVE_GAIN_S
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
        decided, priced = self._decide(snapshot, price=True)
        return finish(snapshot, cluster_gpu(snapshot), decided, self.memo, priced)

    def decide(self, snapshot: Snapshot) -> Decision:
        return self._decide(snapshot, price=False)[0]

    def _decide(self, snapshot: Snapshot, price: bool) -> tuple[Decision, PlanWatts | None]:
        """The decision; with ``price``, its running plans gathered for pricing too."""
        clock = fixed_clock(cluster_gpu(snapshot), self.frequency_mhz)
        order = self.priority(snapshot)
        biggest = max(node.gpus for node in snapshot.nodes)
        skew = _Skew(biggest, clock, self.skew_slowdown, self.move_gain_s, self.memo)
        held: set[str] = set()
        placed = _place(snapshot, _choose(snapshot, order, held), skew)
        while placed.held:  # each pass holds back at least one more job: it ends
            held |= placed.held
            placed = _place(snapshot, _choose(snapshot, order, held), skew)
        priced = PlanWatts(self.memo) if price else None
        plans = job_plans(snapshot.jobs, placed.where, clock, self.memo, priced)
        return Decision(tuple(plans), tuple(placed.moves)), priced


def placement_slowdown(
    model: PerfModel, gpus: int, global_batch_size: int, per_node: int, frequency_mhz: int
) -> tuple[float, float]:
    """(step time consolidated, its slowdown spread over one node more), by the model.

    Consolidated is one node, or the fewest whole nodes (``per_node`` GPUs
    each); one node more is the most GPUs per node that needs one more node.
    The slowdown is the spread step time over the consolidated one, less 1; 0
    for a job that cannot be spread (one GPU, or one GPU per node).
    """
    bs = local_batch(global_batch_size, gpus)
    r = min(gpus, per_node)
    spread = r - 1
    while spread > 0 and math.ceil(gpus / spread) == math.ceil(gpus / r):
        spread -= 1
    rows = [(gpus, r, bs, frequency_mhz)] + ([(gpus, spread, bs, frequency_mhz)] if spread else [])
    t = [float(x) for x in model.step_time_s(*np.array(rows, dtype=np.float64).T)]
    return t[0], (t[1] / t[0] - 1.0 if spread else 0.0)


@dataclass
class _Placed:
    """One placement pass: GPUs per job, re-consolidations, jobs left to wait for a block."""

    where: dict[str, tuple[GpuSlot, ...]] = field(default_factory=dict)
    moves: list[Migration] = field(default_factory=list)
    held: set[str] = field(default_factory=set)


def _choose(snapshot: Snapshot, order: list[Job], held: set[str]) -> list[Job]:
    """The jobs that run this round by GPU count, in the service order.

    Jobs in ``held`` were left waiting for a consolidated block by an earlier
    pass; they are skipped, so their GPUs go to the jobs after them as a job's
    that does not fit would.
    """
    free = sum(node.gpus for node in snapshot.nodes)
    chosen: list[Job] = []
    for job in order:
        if job.id in held:
            continue
        need = len(job.placement) if job.pinned and job.placement else job.requested_gpus
        if need <= free:
            chosen.append(job)
            free -= need
    return chosen


def _place(snapshot: Snapshot, chosen: list[Job], skew: _Skew) -> _Placed:
    """GPUs for the chosen jobs (module docstring: consolidation, re-consolidation).

    Running jobs keep theirs, then the others are placed largest first, then
    spread sensitive running ones move to the blocks still free: a job chosen
    to run gets a block before a move does, or a move of a job of a lower
    queue could take the only block from one served before it. A
    placement-sensitive job that finds no block and still waits for one is in
    ``held`` of the result, and the caller chooses again without it.
    """
    out = _Placed()
    where = out.where
    running = [
        job
        for job in chosen
        if job.placement and (job.pinned or len(job.placement) == job.requested_gpus)
    ]
    pool = Pool(snapshot.nodes, list(chain.from_iterable([job.placement for job in running])))
    for job in running:
        where[job.id] = job.placement
    # Largest first; the running jobs, placed above, are left out before the sort
    # (a stable sort of the rest orders them as sorting all and skipping those would).
    starting = [job for job in chosen if job.id not in where]
    for job in sorted(starting, key=lambda j: (-j.requested_gpus, j.arrival_s, j.id)):
        target = pool.take_consolidated(job.requested_gpus)
        if target is None:
            if skew.waits(job, snapshot.now_s):
                out.held.add(job.id)
                continue
            target = pool.take_spread(job.requested_gpus)
        if target is None:  # pragma: no cover - counts were checked above
            raise SnapshotError(f"no GPUs left for job {job.id}")
        where[job.id] = target
    for job in running:  # re-consolidation, in service order
        if not job.pinned and job.requested_gpus > 1:  # one GPU never moves (``move``)
            target = skew.move(job, pool)
            if target is not None:
                out.moves.append(Migration(job.id, job.placement, target))
                where[job.id] = target
    return out


@dataclass(frozen=True)
class _Skew:
    """What Tiresias's profiler tells it about a job's placement, here from its model.

    ``per_node``: GPUs of the cluster's largest node, which sets what
    consolidated means (one node, or the fewest whole nodes).
    """

    per_node: int
    clock: int
    threshold: float
    move_gain_s: float
    memo: ModelMemo

    def _step_s(self, job: Job, r: int) -> float:
        n = job.requested_gpus
        t, _ = self.memo.rows(
            [job.model], [(n, r, local_batch(job.global_batch_size, n), self.clock)]
        )
        return t[0]

    def profile(self, job: Job) -> tuple[float, float]:
        """``placement_slowdown`` of the job, read from the memo by job id: a
        job's profile is asked for at every event and changes only with its
        model, GPU count or batch."""
        n = job.requested_gpus
        known = self.memo.last(("tiresias-skew", self.clock, self.per_node))
        config = (n, job.global_batch_size)
        hit: tuple[float, float] | None = known.recall(job.id, job.model, config)
        if hit is None:
            hit = placement_slowdown(job.model, n, job.global_batch_size, self.per_node, self.clock)
            known.remember(job.id, job.model, config, hit)
        return hit

    def waits(self, job: Job, now_s: float) -> bool:
        """Whether a job that found no consolidated block waits for one this round.

        An insensitive job never does. A sensitive one waits while the time it
        has waited is below what running spread would cost it, its remaining
        time consolidated times its slowdown; past that it runs spread.
        """
        step_s, slowdown = self.profile(job)
        if slowdown <= self.threshold:
            return False
        waited = now_s - job.arrival_s - job.attained_gpu_s / job.requested_gpus
        return waited < job.remaining_iterations * step_s * slowdown

    def move(self, job: Job, pool: Pool) -> tuple[GpuSlot, ...] | None:
        """A consolidated block for a running sensitive job that is spread, or None.

        Only when the time the move saves the job over its remaining
        iterations is at least ``move_gain_s``. The job's own GPUs are
        free to the search (a block may keep some of them); when none is
        found, it keeps them.
        """
        n = job.requested_gpus
        if n <= 1 or node_count(job.placement) <= math.ceil(n / self.per_node):
            return None
        step_s, slowdown = self.profile(job)
        if slowdown <= self.threshold or not pool.block_after_release(n, job.placement):
            return None
        saved = job.remaining_iterations * (self._step_s(job, per_node(job.placement)) - step_s)
        if saved < self.move_gain_s:
            return None
        pool.release(job.placement)
        target = pool.take_consolidated(n)
        if target is None:  # pragma: no cover - block_after_release said there is one
            pool.take(job.placement)
        return target


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
