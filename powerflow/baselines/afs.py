"""AFS-L (Hwang et al., NSDI'21, "Elastic Resource Sharing for Distributed DL").

What AFS does and what is kept here:

- **Elastic, not energy-aware**: every event re-divides the GPUs among all
  active jobs, from zero, at one cluster-wide clock (``frequency_mhz``,
  default the highest). The power limit is reported, not enforced, and no
  node is powered down.
- **AFS-L's allocation loop**: GPUs are handed out one step at a time to the
  winner of AFS-L's pairwise tournament (``TopPriority``). For two jobs, let
  ``l`` be the one with the shorter remaining time at its current allocation
  (a job without GPUs has infinite remaining time) and ``h`` the other; with
  ``s`` a job's speed now and ``s'`` after the step, the step goes to ``l``
  if ``(s'_l - s_l) / s_l > (s'_h - s_h) / s'_h`` and to ``h`` otherwise.
  The asymmetric denominators are AFS's short-job preference: the shorter job
  wins unless the longer one gains clearly more. Two jobs without GPUs: the
  one that would finish sooner on its first step wins.
- Speeds come from each job's ``PerfModel`` (``1 / T_iter`` at the step's GPU
  count, local batch ``ceil(global / n)``, consolidated placement), remaining
  times from ``remaining_iterations`` -- AFS assumes job lengths are known, as
  the trace gives them.
- Placement: network packing with buddy allocation, ``powerflow.policy.
  placement.place`` -- the placement AFS itself proposes and PowerFlow
  borrows from it.

Simplifications, and why:

- **Power-of-two steps**: network packing needs worker counts that are
  powers of two, so a job grows ``0 -> n_min -> 2 n_min -> ...`` instead of
  one GPU at a time, and each gain in the rule above is divided by the GPUs
  the step costs (``n`` when doubling ``n``), so a doubling competes with a
  single GPU per GPU spent. With all steps of one GPU it is AFS-L exactly.
- A job's ladder ends where the next step would not speed it up (AFS's
  per-job demand: GPUs that do not help a job are not its to take). A step
  that no longer fits the free GPUs drops that job from the rest of the
  round (the free count only shrinks); GPUs no step fits stay idle.
- Bounds: ``n_min`` is ``min_gpus`` (or what ``max_local_batch_size`` needs)
  rounded up to a power of two; a job never takes more than ``max_gpus``, the
  cluster or its global batch (local batch >= 1) allows.
- Pinned jobs keep their GPUs and are left out of the tournament.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from powerflow.baselines.common import (
    arrival_order,
    cluster_gpu,
    evaluate,
    finish,
    fixed_clock,
    local_batch,
    running,
    waiting,
)
from powerflow.policy.placement import PlacementRequest, place
from powerflow.policy.snapshot import GpuSlot, Job, JobPlan, Migration, Plan, Snapshot


@dataclass(frozen=True)
class Ladder:
    """One job's possible GPU counts and its remaining time on each."""

    counts: tuple[int, ...]
    remaining_s: tuple[float, ...]


def ladder_counts(job: Job, cluster_gpus: int) -> tuple[int, ...]:
    """Powers of two a job may run on, smallest first (empty: it cannot run)."""
    lo = job.min_gpus
    if job.max_local_batch_size is not None:
        lo = max(lo, math.ceil(job.global_batch_size / job.max_local_batch_size))
    hi = min(cluster_gpus, job.global_batch_size)
    if job.max_gpus is not None:
        hi = min(hi, job.max_gpus)
    n = 1 << max(lo - 1, 0).bit_length()
    counts = []
    while n <= hi:
        counts.append(n)
        n *= 2
    return tuple(counts)


def afs_l(ladders: Sequence[Ladder], free_gpus: int) -> list[int]:
    """AFS-L's GPU counts for jobs in FIFO order (see the module docstring)."""
    level = [-1] * len(ladders)  # index into counts; -1: no GPUs yet
    live = [i for i, lad in enumerate(ladders) if lad.counts and lad.counts[0] <= free_gpus]
    inf = math.inf
    while live:
        best = -1
        for i in live:
            if best < 0:
                best = i
                continue
            best = _top(ladders, level, best, i, inf)
        k = level[best] + 1
        counts = ladders[best].counts
        free_gpus -= counts[k] - (counts[k - 1] if k > 0 else 0)
        level[best] = k
        live = [i for i in live if _next_cost(ladders[i], level[i]) <= free_gpus]
    return [ladders[i].counts[lv] if lv >= 0 else 0 for i, lv in enumerate(level)]


def _next_cost(lad: Ladder, lv: int) -> float:
    if lv + 1 >= len(lad.counts):
        return math.inf
    return lad.counts[lv + 1] - (lad.counts[lv] if lv >= 0 else 0)


def _top(ladders: Sequence[Ladder], level: list[int], a: int, b: int, inf: float) -> int:
    """AFS-L's ``TopPriority`` between jobs ``a`` (the incumbent) and ``b``."""
    la, lb = ladders[a], ladders[b]
    ra = la.remaining_s[level[a]] if level[a] >= 0 else inf
    rb = lb.remaining_s[level[b]] if level[b] >= 0 else inf
    short, long_ = (b, a) if rb < ra else (a, b)
    ls, ll = ladders[short], ladders[long_]
    vs, vl = level[short], level[long_]
    if vs < 0:  # neither has GPUs: the one done sooner on its first step
        return b if lb.remaining_s[0] < la.remaining_s[0] else a
    cost_s = ls.counts[vs + 1] - ls.counts[vs]
    gain_short = (ls.remaining_s[vs] / ls.remaining_s[vs + 1] - 1.0) / cost_s
    if vl < 0:
        gain_long = 1.0 / ll.counts[0]
    else:
        cost_l = ll.counts[vl + 1] - ll.counts[vl]
        gain_long = (1.0 - ll.remaining_s[vl + 1] / ll.remaining_s[vl]) / cost_l
    return short if gain_short > gain_long else long_


@dataclass(frozen=True)
class AfsPolicy:
    """AFS-L at one cluster-wide clock, placed by network packing."""

    frequency_mhz: int | None = None

    def ladders(
        self, jobs: Sequence[Job], cluster_gpus: int, per_node: int, clock: int
    ) -> list[Ladder]:
        """Every job's counts and remaining times, in one grouped model call."""
        counts = [ladder_counts(job, cluster_gpus) for job in jobs]
        rows = [(job, n) for job, cs in zip(jobs, counts, strict=True) for n in cs]
        if not rows:
            return [Ladder((), ()) for _ in jobs]
        t, _ = evaluate(
            [job.model for job, _ in rows],
            [n for _, n in rows],
            [min(n, per_node) for _, n in rows],
            [local_batch(job.global_batch_size, n) for job, n in rows],
            [clock] * len(rows),
        )
        out: list[Ladder] = []
        pos = 0
        for job, cs in zip(jobs, counts, strict=True):
            step = t[pos : pos + len(cs)]
            pos += len(cs)
            keep = 1
            while keep < len(cs) and step[keep] < step[keep - 1]:
                keep += 1
            remaining = tuple(float(job.remaining_iterations * s) for s in step[:keep])
            out.append(Ladder(cs[:keep], remaining))
        return out

    def plan(self, snapshot: Snapshot) -> Plan:
        spec = cluster_gpu(snapshot)
        clock = fixed_clock(spec, self.frequency_mhz)
        total = sum(node.gpus for node in snapshot.nodes)
        per_node = max(node.gpus for node in snapshot.nodes)
        kept = [job for job in snapshot.jobs if job.pinned and job.placement]
        elastic = [job for job in arrival_order(snapshot.jobs) if job not in kept]
        free = total - sum(len(job.placement) for job in kept)
        counts = afs_l(self.ladders(elastic, total, per_node, clock), free)
        requests = [
            PlacementRequest(job.id, len(job.placement), job.placement, False) for job in kept
        ]
        requests += [
            PlacementRequest(job.id, n, job.placement, True)
            for job, n in zip(elastic, counts, strict=True)
            if n > 0
        ]
        result = place(snapshot.nodes, requests)
        where: dict[str, tuple[GpuSlot, ...]] = {
            job_id: tuple(slots) for job_id, slots in result.assignments.items()
        }
        plans: list[JobPlan] = [
            running(job, where[job.id], clock) if where.get(job.id) else waiting(job, clock)
            for job in snapshot.jobs
        ]
        migrations: list[Migration] = list(result.migrations)
        return finish(snapshot, spec, plans, migrations)
