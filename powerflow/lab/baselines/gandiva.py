"""Gandiva (Xiao et al., OSDI'18): introspective, locality-aware, time-slicing.

The paper's four mechanisms (§4.1), each against what is here:

- **Suspend-resume and time-slicing: kept.** When a job cannot start because
  the GPUs are exhausted, it shares the GPUs of a running job of the same
  size, round robin; the two plans have the same placement and the simulator
  gives each an equal share of time. Gandiva time-slices jobs of the same
  GPU count on the same GPUs (its affinity), so sharing never leaves part of
  a gang idle. Sharing is bounded at ``max_jobs_per_gpu`` (default
  ``GANDIVA_JOBS_PER_GPU``, 3, chosen on the tuning windows by ``powerflow
  sweep tuning``) and never joins a pinned job
  (profiling or restarting). The victim is the most recently arrived
  same-size job (older jobs keep full speed, in the spirit of FIFO).
  Simplified: no switch cost (Gandiva suspends at the memory minimum of an
  iteration and measures well under a second; a checkpoint-restart charge
  would weaken the baseline).
- **Migration: kept**, for the three reasons the paper migrates: (a) when
  fragmentation alone blocks a job that fits a node (enough free GPUs in
  total, none with enough on one node), small exclusive jobs are moved off
  the node that needs the fewest moved GPUs; (b) a running job spread over
  more nodes than it needs is moved onto a consolidated set as soon as one
  is free (introspection); (c) a time-sliced job is moved to free GPUs as
  soon as they exist. Migrations cost the simulator's checkpoint-restart
  time, like any rescale.
- **Grow-shrink: kept, off by default** (``grow_shrink=True``). When nobody
  waits and nothing is time-sliced, each exclusive one-node job (oldest
  first) grows in place onto free GPUs of its node, to the largest
  power-of-two multiple of its GPUs that its global batch and ``max_gpus``
  allow, stopping before the first doubling its model does not predict
  faster (Gandiva keeps a grown job only when its measured throughput
  improves). As soon as a job waits, grown jobs shrink back to their request
  within their own GPUs (a resize, not a migration) before admission. Off by
  default because the paper's cluster experiments (§6: time-slicing with
  packing, time-slicing with migration) do not use it, and the comparison's
  elastic baseline is AFS. docs/baselines.md ("Gandiva") gives its measured
  effect.
- **Packing: left out.** Gandiva runs two jobs on one GPU at once when their
  memory fits, and keeps the pair only while introspection measures a higher
  combined throughput than time-slicing them; otherwise it unpacks. The
  ground truth has no model of two jobs running concurrently on a GPU (its
  profiles measure one job at a time, so a packed pair's speed and power
  would be invented), and Gandiva's own rule falls back to time-slicing when
  packing does not pay. Time-slicing is therefore what a packed pair is
  assumed to achieve: exact when packing does not pay, an understatement of
  Gandiva when two small jobs would have co-run faster.

Also kept: FIFO admission, a job never blocking later ones (Gandiva has no
head-of-line blocking: time-slicing admits what it can), and packing *onto
nodes* with affinity: a job that fits a node gets one node, best fit,
preferring nodes that already run jobs of the same size (Gandiva's node
affinity by job size, which keeps fragmentation low); a larger job gets
whole free nodes; only when neither exists does it start spread over as few
nodes as possible, to be consolidated later. Every job runs at one
cluster-wide clock (``frequency_mhz``, default the highest; the paper's
JCT-energy curve sweeps it); the power limit is reported, not enforced.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import ClassVar

from powerflow.core.errors import SnapshotError
from powerflow.core.policy.snapshot import GpuSlot, Job, Migration, Plan, Snapshot
from powerflow.lab.baselines.common import (
    ARRIVAL_KEY,
    Decision,
    ModelMemo,
    PlanWatts,
    Pool,
    Sharing,
    arrival_order,
    cluster_gpu,
    finish,
    fixed_clock,
    job_plans,
    local_batch,
    node_count,
)

GANDIVA_JOBS_PER_GPU = 3
"""At most this many jobs share a GPU. Chosen on the tuning windows of the whole
trace by ``powerflow sweep tuning`` (docs/baselines.md, "Tiresias at its best"):
score 1.008 against 1.011 for 2, 1.016 for 4 and 1.031 for no sharing; within 1 %
from 2 to 4."""


_REQUESTED = attrgetter("requested_gpus")


@dataclass(frozen=True)
class GandivaPolicy:
    """Gandiva at one cluster-wide clock; see the module docstring."""

    frequency_mhz: int | None = None
    max_jobs_per_gpu: int = GANDIVA_JOBS_PER_GPU
    grow_shrink: bool = False
    memo: ModelMemo = field(default_factory=ModelMemo, compare=False, repr=False)
    time_slices: ClassVar[bool] = True
    """Jobs share GPU sets: a plan's watts count the sharers at once (``PlanWatts.total``)."""

    def __post_init__(self) -> None:
        if self.max_jobs_per_gpu < 1:
            raise SnapshotError("max_jobs_per_gpu must be at least 1")

    def plan(self, snapshot: Snapshot) -> Plan:
        decided, priced = self._decide(snapshot, price=True)
        return finish(snapshot, cluster_gpu(snapshot), decided, self.memo, priced, self.time_slices)

    def decide(self, snapshot: Snapshot) -> Decision:
        return self._decide(snapshot, price=False)[0]

    def _decide(self, snapshot: Snapshot, price: bool) -> tuple[Decision, PlanWatts | None]:
        clock = fixed_clock(cluster_gpu(snapshot), self.frequency_mhz)
        round_ = _Round(
            snapshot, self.max_jobs_per_gpu, self.grow_shrink, self.memo.last("gandiva-keys")
        )
        return round_.run(clock, self.memo, price)


class _Round:
    """The mutable state of one Gandiva decision (never outlives ``plan``)."""

    def __init__(
        self,
        snapshot: Snapshot,
        max_share: int,
        grow_shrink: bool = False,
        keys: dict[Hashable, tuple[object, ...]] | None = None,
    ) -> None:
        self.snapshot = snapshot
        # Job id -> (placement, its GPUs sorted): ``_hold``'s key of a job whose
        # placement is the very tuple of the last decision (see there).
        self.keys = {} if keys is None else keys
        self.jobs = arrival_order(snapshot.jobs)
        self.max_share = max_share
        self.grow_shrink = grow_shrink
        self.nodes = snapshot.nodes
        self.where: dict[str, tuple[GpuSlot, ...]] = {}
        self.users: dict[tuple[GpuSlot, ...], list[str]] = defaultdict(list)
        # Filled by ``_hold``'s pass over the jobs; with step 3 asking ``left`` (below)
        # rather than every job, a Gandiva replay of the default trace takes
        # 1.091-1.136 s of CPU against 1.129-1.153 s (``python
        # benchmarks/replay_bench.py --runs gandiva``, four alternations).
        self.by_id: dict[str, Job] = {}
        self.moves: dict[str, tuple[GpuSlot, ...]] = {}
        # Step 3's GPU sets open to sharing, by job size: set -> newest sharer's arrival.
        self.sharable: dict[int, dict[tuple[GpuSlot, ...], float]] | None = None
        # Jobs with no GPUs after ``_hold``, in arrival order: step 1's queue.
        self.waiting: list[Job] = []
        # Step 1's jobs that found no GPUs: step 3's, the only jobs without GPUs there.
        self.left: list[Job] = []
        # Jobs whose GPUs may span nodes: ``_hold``'s spread ones, and every job
        # started or moved since (``_consolidate`` looks at these only).
        self.maybe_spread: dict[str, Job] = {}
        # ``_affinity``'s answers by job size, kept while GPU sets only gain jobs.
        self.marks: dict[int, dict[str, bool]] = {}
        # Grow-shrink, reactive half: a job waits, so grown jobs give their extra GPUs back.
        self.shrink = grow_shrink and any(not job.placement for job in self.jobs)
        self._hold()

    def _hold(self) -> None:
        """Keep every running job where it is (sharers of one GPU set hold it once);
        a grown job shrinks in place to its first requested GPUs when ``shrink``.

        One loop with its lookups hoisted: it runs for every running job at every
        event, a third of a decision.
        """
        users, where, waiting, spread = self.users, self.where, self.waiting, self.maybe_spread
        by_id, keys = self.by_id, self.keys
        shrink, max_share = self.shrink, self.max_share
        held: list[tuple[GpuSlot, ...]] = []  # each set once, taken in one call at the end
        for job in self.jobs:
            jid = job.id
            by_id[jid] = job  # here rather than in a pass of its own
            placement = job.placement
            if not placement:
                waiting.append(job)
                continue
            # One GPU is sorted already (most jobs of the trace), and on one node. A
            # job keeps its placement tuple from event to event, so its sorted GPUs
            # are kept beside it and found by identity rather than sorted at every
            # event (Gandiva replays of the default trace, old and new code
            # alternated in one process: 0.985 -> 0.959 s of CPU, best of 7).
            key: tuple[GpuSlot, ...]
            if len(placement) == 1 and type(placement) is tuple:
                key = placement
                one_node = True
            else:
                seen = keys.get(jid)
                if seen is not None and seen[0] is placement:
                    key = seen[1]  # type: ignore[assignment]
                else:
                    key = tuple(sorted(placement))
                    if type(placement) is tuple:  # held: its address is never reused
                        keys[jid] = (placement, key)
                one_node = key[0][0] == key[-1][0]  # sorted: one node when its ends are
            if shrink and len(key) > job.requested_gpus and not job.pinned:
                key = key[: job.requested_gpus]  # a resize within its GPUs, not a migration
                one_node = bool(key) and key[0][0] == key[-1][0]
            ids = users.get(key)
            if ids is None:
                held.append(key)
                users[key] = [jid]
            else:
                if len(ids) >= max_share:
                    # the sets before it are taken first, as a take per set would have
                    self.pool = Pool(self.nodes, chain.from_iterable(held))
                    raise SnapshotError(f"GPUs of job {jid} are shared by too many jobs")
                ids.append(jid)
            where[jid] = key
            if not one_node:
                spread[jid] = job
        self.pool = Pool(self.nodes, chain.from_iterable(held))

    def _relocate(self, job: Job, target: tuple[GpuSlot, ...]) -> None:
        """Record that ``job`` now uses ``target`` (the pool is the caller's business)."""
        old = self.where[job.id]
        self.marks.clear()  # a job leaves a set: a node may lose its mark
        self.users[old].remove(job.id)
        if not self.users[old]:
            del self.users[old]
        key = tuple(sorted(target))
        self.users[key].append(job.id)
        self.where[job.id] = key
        self.maybe_spread[job.id] = job
        if job.placement and key != tuple(sorted(job.placement)):
            self.moves[job.id] = key
        else:
            self.moves.pop(job.id, None)

    def _start(self, job: Job, target: tuple[GpuSlot, ...]) -> None:
        key = tuple(sorted(target))
        self.users[key].append(job.id)
        self.where[job.id] = key
        self.maybe_spread[job.id] = job
        marks = self.marks.get(job.requested_gpus)
        if marks is not None:  # its nodes now run a job of its size
            for node, _ in key:
                marks[node] = True

    def _affinity(self, size: int) -> dict[str, bool]:
        """Nodes that already run a job of this size (Gandiva's node affinity).

        Asked for each waiting job that may start, with the sets changed only by
        the jobs started since (``_start`` marks their nodes): an answer is kept
        per size until a job leaves a set (``_relocate``, ``_grow`` clear them),
        and computed in plain loops: the 919 asks of a Gandiva replay of the default
        trace (``benchmarks/replay_bench.py --runs gandiva``) take 0.017-0.018 s of
        CPU against 0.094-0.101 s asking every set each time (``time.process_time``
        around each ask, two alternations of five replays).
        """
        marks = self.marks.get(size)
        if marks is not None:
            return marks
        marks = self.marks[size] = {}
        by_id = self.by_id
        for key, ids in self.users.items():
            for i in ids:
                if by_id[i].requested_gpus == size:
                    for node, _ in key:
                        marks[node] = True
                    break
        return marks

    def run(
        self, clock: int, memo: ModelMemo, price: bool = False
    ) -> tuple[Decision, PlanWatts | None]:
        """The decision; with ``price``, its running plans gathered for pricing too."""
        # 1. FIFO admission onto exclusive GPUs, defragmenting when needed.
        left = self.left
        for job in self.waiting:
            target = self._exclusive(job)
            if target is None:
                left.append(job)
            else:
                self._start(job, target)
        # 2. Introspection: end time-slicing, then consolidate spread jobs.
        self._unshare()
        self._consolidate()
        # 3. Oversubscription: whoever is still waiting time-slices.
        for job in left:
            partner = self._partner(job)
            if partner is not None:
                self._share(job, partner)
        # 4. Grow-shrink, introspective half: nobody waits or time-slices, so jobs
        # grow in place onto idle GPUs while that speeds them up.
        if self.grow_shrink and not left and all(len(ids) == 1 for ids in self.users.values()):
            self._grow(clock, memo)
        migrations: list[Migration] = []
        priced = PlanWatts(memo) if price else None
        plans = job_plans(self.snapshot.jobs, self.where, clock, memo, priced)
        if self.moves:
            for job in self.jobs:
                if job.id in self.moves:  # its final GPUs: a moved job may also have grown (4.)
                    migrations.append(Migration(job.id, job.placement, self.where[job.id]))
        # Every GPU set is disjoint from the others (the pool hands each GPU out
        # once), so its jobs are the sharers of each of its GPUs.
        users = self.users
        sharing = Sharing(
            sum(map(len, filter(users.get, users))),  # the sets that hold a job
            {i: len(ids) for ids in users.values() if len(ids) > 1 for i in ids},
        )
        if priced is not None:
            priced.sharing = sharing
        return Decision(tuple(plans), tuple(migrations), sharing), priced

    def _grow(self, clock: int, memo: ModelMemo) -> None:
        """Double each exclusive one-node job, oldest first, onto free GPUs of its node.

        A job grows to the largest power-of-two multiple of its GPUs that its node's
        free GPUs, its global batch and ``max_gpus`` allow, stopping before the first
        doubling its model does not predict faster (Gandiva keeps a grown job only
        if its measured throughput improves). One resize, not one per doubling.
        """
        for job in self.jobs:
            key = self.where.get(job.id)
            if key is None or job.pinned or len(self.users[key]) != 1:
                continue
            nodes = {node for node, _ in key}
            if len(nodes) != 1:
                continue
            (node,) = nodes
            n = len(key)
            cap = min(n + len(self.pool.free[node]), job.global_batch_size)
            if job.max_gpus is not None:
                cap = min(cap, job.max_gpus)
            sizes = [n]
            while sizes[-1] * 2 <= cap:
                sizes.append(sizes[-1] * 2)
            if len(sizes) == 1:
                continue
            configs = [(m, m, local_batch(job.global_batch_size, m), clock) for m in sizes]
            step, _ = memo.rows([job.model] * len(sizes), configs)
            keep = 0
            while keep + 1 < len(sizes) and step[keep + 1] < step[keep]:
                keep += 1
            if keep == 0:
                continue
            extra = self.pool.free[node][: sizes[keep] - n]
            self.pool.take((node, i) for i in extra)
            grown = tuple(sorted((*key, *((node, i) for i in extra))))
            self.marks.clear()  # a job leaves a set
            self.users.pop(key)
            self.users[grown].append(job.id)
            self.where[job.id] = grown

    def _exclusive(self, job: Job) -> tuple[GpuSlot, ...] | None:
        n = job.requested_gpus
        if self.pool.free_count < n:
            return None
        target = self.pool.take_consolidated(n, self._affinity(n))
        if target is None:
            target = self._defragment(n)
        if target is None:
            target = self.pool.take_spread(n)
        return target

    def _defragment(self, n: int) -> tuple[GpuSlot, ...] | None:
        """Free one node for an ``n``-GPU job by moving small exclusive jobs off it."""
        best: tuple[int, str, list[Job]] | None = None
        for node in self.pool.order:
            if self.pool.size[node] < n:
                continue
            need = n - len(self.pool.free[node])
            movable = sorted(
                (
                    self.by_id[ids[0]]
                    for key, ids in self.users.items()
                    if len(ids) == 1
                    and {m for m, _ in key} == {node}
                    and not self.by_id[ids[0]].pinned
                ),
                key=lambda j: (j.requested_gpus, -j.arrival_s, j.id),
            )
            chosen: list[Job] = []
            freed = 0
            for cand in movable:
                if freed >= need:
                    break
                chosen.append(cand)
                freed += cand.requested_gpus
            if freed < need:
                continue
            if best is None or freed < best[0]:
                best = (freed, node, chosen)
        if best is None:
            return None
        _, node, chosen = best
        trial = self.pool.copy()
        targets: dict[str, tuple[GpuSlot, ...]] = {}
        for cand in chosen:
            got = trial.take_consolidated(cand.requested_gpus, exclude=frozenset({node}))
            if got is None:
                return None
            targets[cand.id] = got
        for cand in chosen:
            trial.release(self.where[cand.id])
        if len(trial.free[node]) < n:
            return None
        self.pool = trial
        for cand in chosen:
            self._relocate(cand, targets[cand.id])
        got = self.pool.take_consolidated(n, exclude=frozenset(set(self.pool.order) - {node}))
        return got

    def _unshare(self) -> None:
        """Give a time-sliced job GPUs of its own as soon as some are free.

        With no GPU free no job of one GPU or more finds any (``take_consolidated``
        and ``take_spread`` both refuse more GPUs than are free), so the pass is
        skipped: the cluster is full at most of a loaded trace's events, and the
        pass sorted every shared set's jobs for nothing (0.18 s of the 1.6 s of
        policy CPU of a Gandiva run of the default trace, replayed with
        ``benchmarks/replay_bench.py``).
        """
        if self.pool.free_count == 0 and min(map(_REQUESTED, self.jobs), default=1) > 0:
            return
        for ids in [ids for ids in self.users.values() if len(ids) > 1]:
            for job_id in sorted(ids, key=lambda i: (self.by_id[i].arrival_s, i))[1:]:
                job = self.by_id[job_id]
                if job.pinned:
                    continue
                target = self.pool.take_consolidated(job.requested_gpus)
                if target is None:
                    target = self.pool.take_spread(job.requested_gpus)
                if target is not None:
                    self._relocate(job, target)

    def _consolidate(self) -> None:
        """Move a spread job onto fewer nodes once a consolidated set is free.

        Only the jobs in ``maybe_spread`` can be spread (every other job holds
        one node since ``_hold``), taken in arrival order as ``self.jobs`` has
        them: the same jobs in the same order as a pass over every job, which
        took 0.08 s more of a Gandiva run's policy CPU (replayed as above).
        """
        where, users = self.where, self.users
        for job in sorted(self.maybe_spread.values(), key=ARRIVAL_KEY):
            key = where.get(job.id)
            # A key is sorted, so one node when its ends are: fewest nodes already
            # (most keys; this spares them the node count).
            if key is None or key[0][0] == key[-1][0] or job.pinned or len(users[key]) != 1:
                continue
            if node_count(key) <= self.pool.min_nodes(len(key)):
                continue
            if not self.pool.block_after_release(len(key), key):
                continue  # no consolidated set even with its own GPUs free
            self.pool.release(key)
            target = self.pool.take_consolidated(len(key))
            if target is None or node_count(target) >= node_count(key):
                if target is not None:
                    self.pool.release(target)
                self.pool.take(key)
                continue
            self._relocate(job, target)

    def _partner(self, job: Job) -> tuple[GpuSlot, ...] | None:
        """Same-size GPU set with room for one more time-slice, newest job first.

        The sets open to sharing are collected, by size, at the first ask in
        step 3 and kept up to date by ``_share``: in step 3 nothing but sharing
        changes the sets, so this is the scan over every set, without the scan.
        A set of one job (most of them) is read inline, without the list and
        generators ``_newest_sharer`` builds for a shared one: ``_partner``'s 12k
        calls in a Gandiva replay of the default trace take 0.052-0.056 s of CPU
        against 0.083-0.087 s (``time.process_time`` around each call, three
        alternations).
        """
        if self.sharable is None:  # first ask: one pass over the sets of the sizes asked
            self.sharable = {}
            # The jobs without GPUs are step 1's ``left`` (``job`` among them): no
            # pass over every job to find them.
            asked = {left.requested_gpus for left in self.left}
            asked.add(job.requested_gpus)
            by_id, alone = self.by_id, self.max_share > 1  # one job leaves room
            for key, ids in self.users.items():
                n = len(key)
                if n not in asked:
                    continue
                if alone and len(ids) == 1:  # ``_newest_sharer`` of one job, inline
                    only = by_id[ids[0]]
                    if only.requested_gpus != n or only.pinned:
                        continue
                    newest: float | None = only.arrival_s
                else:
                    newest = self._newest_sharer(key, ids, n)
                if newest is not None:
                    self.sharable.setdefault(n, {})[key] = newest
        open_sets = self.sharable.get(job.requested_gpus)
        if not open_sets:
            return None
        return min(open_sets, key=lambda key: (-open_sets[key], key))

    def _share(self, job: Job, key: tuple[GpuSlot, ...]) -> None:
        """Time-slice ``job`` on ``key`` and update the sets open to its size."""
        self._start(job, key)
        assert self.sharable is not None  # ``_partner`` found ``key``
        open_sets = self.sharable[job.requested_gpus]
        newest = self._newest_sharer(key, self.users[key], job.requested_gpus)
        if newest is None:
            open_sets.pop(key, None)
        else:
            open_sets[key] = newest

    def _newest_sharer(self, key: tuple[GpuSlot, ...], ids: list[str], n: int) -> float | None:
        """Latest arrival on a set an ``n``-GPU job may join, ``None`` if it may not."""
        if len(ids) >= self.max_share or len(key) != n:
            return None
        sharers = [self.by_id[i] for i in ids]
        if any(j.requested_gpus != n or j.pinned for j in sharers):
            return None
        return max(j.arrival_s for j in sharers)
