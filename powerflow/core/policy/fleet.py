"""One plan for a cluster of several pools under one budget.

Every policy (PowerFlow's greedy and each baseline) plans for one node shape
and one GPU type (paper §4.1; ``validate.cluster_of``). A real cluster mixes
them: A100 and H100 nodes, 8- and 4-GPU nodes. ``FleetPolicy`` plans such a
cluster with the single-pool policy, once per pool, and decides three things
the pools cannot decide alone:

* **Which pool serves a job.** A job runs in one pool at a time: a running
  job stays in the pool its GPUs are in (moving it is a checkpoint-restart on
  another type, which the per-pool greedy already prices as a rescale inside a
  pool but cannot compare across them), and a job whose workers exist but
  whose GPUs are not known yet in the pools of their type
  (``Job.committed_gpu``). A waiting job ranks the pools by its energy-delay
  product there, ``T_iter x E_iter`` at its first allowed GPU
  count and its most energy-efficient clock: the state PowerFlow's greedy
  starts a job from, read off the job's model *for that GPU type*
  (``Job.models_by_gpu``). The product is the cluster-wide quantity
  PowerFlow+'s floor of 1 asks each step to lower (``returns.py``), here for
  the one step the pools cannot compare, the start: a type twice as fast at
  twice the energy per iteration ties. The job is offered to its best pool
  first; if it is still waiting there, to the next pool that has GPUs left
  after its own jobs, and so on.
* **How the budget splits.** The admin sets one limit for the cluster:
  ``limit_w``, or ``eta x sum over pools of G_pool x P_max(type)`` (each
  type's reference power, ``budget.resolve_limit_w`` per pool, so the same
  ``eta`` is the same watts as on each pool alone). Each pool is first planned
  with its share (its ``G x P_max`` part of the limit); then the watts a pool
  left unused go to the others, one pool at a time, each re-planned with the
  limit less what the others' plans predict. The sum of the pools' predicted
  power never exceeds the limit (each plan keeps its own), and a busy pool
  beside an idle one is not held to its share.
* **One plan.** The pools' plans joined: every job once, the powered-down
  nodes, migrations and notes of all, the limit the cluster's.

With one pool ``FleetPolicy`` is the single-pool policy itself (the same
call, the same plan): a homogeneous cluster plans exactly as before.

Pure: snapshots in, a plan out; one single-pool policy object per pool, kept
between calls, because a policy may keep a cache for its pool's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.budget import resolve_limit_w
from powerflow.core.policy.snapshot import Budget, Job, JobPlan, Node, Plan, Policy, Snapshot

PoolKey = tuple[str, int]
"""A pool: (GPU type name, GPUs per node)."""


@dataclass(frozen=True)
class FleetPool:
    """The nodes of one GPU type and one node size, in the snapshot's order."""

    key: PoolKey
    gpu: GpuSpec
    nodes: tuple[Node, ...]

    @property
    def gpus(self) -> int:
        return self.key[1] * len(self.nodes)


def fleet_pools(nodes: Iterable[Node]) -> tuple[FleetPool, ...]:
    """The snapshot's pools, most GPUs first (ties: larger nodes, then the type's name).

    The order never depends on the nodes' order, so the budget's hand-out of
    unused watts (``FleetPolicy``) does not either.
    """
    members: dict[PoolKey, list[Node]] = {}
    types: dict[PoolKey, GpuSpec] = {}
    for node in nodes:
        key = (node.gpu.name, node.gpus)
        members.setdefault(key, []).append(node)
        known = types.setdefault(key, node.gpu)
        if known != node.gpu:
            raise SnapshotError(
                f"node {node.name!r}: GPU type {node.gpu.name!r} is given two different specs"
            )
    found = [FleetPool(key, types[key], tuple(members[key])) for key in members]
    found.sort(key=lambda p: (-p.gpus, -p.key[1], p.key[0]))
    return tuple(found)


def model_on(job: Job, gpu: GpuSpec) -> PerfModel:
    """The job's model on ``gpu``: ``models_by_gpu``'s entry for the type, else ``model``."""
    for name, model in job.models_by_gpu:
        if name == gpu.name:
            return model
    return job.model


def first_count(job: Job, pool: FleetPool) -> int | None:
    """The smallest power-of-two GPU count the job may run on in ``pool``, or None.

    At least ``min_gpus``, at most ``max_gpus`` and the pool's GPUs, with a
    local batch within ``max_local_batch_size``: the count PowerFlow's greedy
    starts a job from.
    """
    top = pool.gpus if job.max_gpus is None else min(pool.gpus, job.max_gpus)
    n = 1 << max(0, job.min_gpus - 1).bit_length()
    while n <= top:
        local = -(-job.global_batch_size // n)
        if job.max_local_batch_size is None or local <= job.max_local_batch_size:
            return n
        n *= 2
    return None


def energy_delay(job: Job, pool: FleetPool) -> float:
    """``T_iter x E_iter`` of the job starting in ``pool`` (inf: it cannot run there).

    At its first allowed count (``first_count``), packed on as few nodes as it
    fits, at the clock of the type with the least energy per iteration.
    """
    n = first_count(job, pool)
    if n is None:
        return math.inf
    model = model_on(job, pool.gpu)
    clocks = np.asarray(pool.gpu.clocks_mhz, dtype=np.float64)
    r = min(n, pool.key[1])
    bs = -(-job.global_batch_size // n)
    step = np.asarray(model.step_time_s(n, r, bs, clocks), dtype=np.float64)
    energy = np.asarray(model.energy_per_iter_j(n, r, bs, clocks), dtype=np.float64)
    best = int(np.argmin(energy))
    value = float(step[best] * energy[best])
    return value if math.isfinite(value) and value > 0 else math.inf


def fleet_limit_w(budget: Budget, pools: Sequence[FleetPool]) -> tuple[float, tuple[float, ...]]:
    """The cluster's limit and each pool's share of it.

    ``limit_w`` is the limit as given; otherwise each pool's part is
    ``resolve_limit_w`` on that pool alone (``eta x G x P_max`` of its
    type, or ``budget.p_max_w`` when the admin set one for all). The
    shares split the limit in proportion to ``G x P_max``.
    """
    parts = [resolve_limit_w(replace(budget, limit_w=None), p.gpus, p.gpu.p_max_w) for p in pools]
    if budget.limit_w is None:
        return sum(parts), tuple(parts)
    limit = resolve_limit_w(budget, 0, 1.0)
    weights = [p.gpus * (budget.p_max_w or p.gpu.p_max_w) for p in pools]
    total = sum(weights)
    return limit, tuple(limit * w / total for w in weights)


class FleetPolicy:
    """Plans a cluster of several pools with one single-pool policy per pool (module doc)."""

    def __init__(self, make_policy: Callable[[], Policy]) -> None:
        self._make = make_policy
        self._policies: dict[PoolKey, Policy] = {}

    def _policy(self, key: PoolKey) -> Policy:
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = self._make()
        return policy

    def plan(self, snapshot: Snapshot) -> Plan:
        pools = fleet_pools(snapshot.nodes)
        if len(pools) <= 1:
            key = pools[0].key if pools else ("", 0)
            return self._policy(key).plan(snapshot)
        limit, shares = fleet_limit_w(snapshot.budget, pools)
        prefs = {j.id: _preference(j, pools) for j in snapshot.jobs if not j.placement}
        members = _assign(snapshot.jobs, pools, prefs)
        plans = self._plan_all(snapshot, pools, members, shares)
        for rank in range(1, len(pools)):
            if self._offer_waiting(snapshot, pools, members, plans, shares, prefs, rank):
                plans = self._plan_all(snapshot, pools, members, shares)
        return _joined(self._hand_out_unused(snapshot, pools, members, plans, limit), limit)

    def _plan_all(
        self,
        snapshot: Snapshot,
        pools: Sequence[FleetPool],
        members: Mapping[PoolKey, list[Job]],
        shares: Sequence[float],
    ) -> list[Plan]:
        return [
            self._plan_pool(snapshot, pool, members[pool.key], share)
            for pool, share in zip(pools, shares, strict=True)
        ]

    def _plan_pool(
        self, snapshot: Snapshot, pool: FleetPool, jobs: Sequence[Job], limit_w: float
    ) -> Plan:
        sub = Snapshot(
            nodes=pool.nodes,
            jobs=tuple(_on(job, pool.gpu) for job in jobs),
            budget=Budget(limit_w=max(0.0, limit_w)),
            now_s=snapshot.now_s,
            power_ratio=snapshot.power_ratio,
        )
        return self._policy(pool.key).plan(sub)

    def _offer_waiting(
        self,
        snapshot: Snapshot,
        pools: Sequence[FleetPool],
        members: dict[PoolKey, list[Job]],
        plans: Sequence[Plan],
        shares: Sequence[float],
        prefs: Mapping[str, tuple[PoolKey, ...]],
        rank: int,
    ) -> bool:
        """Offer the jobs still waiting to their ``rank``-th pool where it has GPUs left.

        A pool takes those its own plan, tried with them, starts; they leave
        the pool they waited in. True when a job moved (every pool is then
        planned again).
        """
        home = {job.id: key for key, jobs in members.items() for job in jobs}
        index = {pool.key: i for i, pool in enumerate(pools)}
        waiting = [
            job
            for job in snapshot.jobs
            if not job.placement
            and job.remaining_iterations > 0
            and len(prefs[job.id]) > rank
            and plans[index[home[job.id]]].job(job.id).gpus == 0
        ]
        moved = False
        for i, pool in enumerate(pools):
            offered = [job for job in waiting if prefs[job.id][rank] == pool.key]
            if not offered or pool.gpus <= sum(jp.gpus for jp in plans[i].jobs):
                continue
            trial = self._plan_pool(snapshot, pool, [*members[pool.key], *offered], shares[i])
            for job in offered:
                if trial.job(job.id).gpus > 0:
                    members[home[job.id]].remove(job)
                    members[pool.key].append(job)
                    moved = True
        return moved

    def _hand_out_unused(
        self,
        snapshot: Snapshot,
        pools: Sequence[FleetPool],
        members: Mapping[PoolKey, list[Job]],
        plans: list[Plan],
        limit: float,
    ) -> list[Plan]:
        """Re-plan each hungry pool with the limit less the others' predicted power.

        A pool is hungry when one of its unfinished jobs waits or runs below
        the type's top clock; the hungriest goes first. A pool that needs
        nothing more keeps its first plan.

        The others' power is counted as each pool plans its own: its predicted
        watts times the snapshot's ``power_ratio`` (at least 1), since a pool plans
        against its limit over that ratio (``power_loop.planning_limit_w``).
        Counted at their predicted watts alone, the pools' plans could sum to
        the whole limit in planned watts, which is the limit times the ratio in
        true ones.
        """
        ratio = max(1.0, snapshot.power_ratio)
        hunger = [_hunger(plans[i], members[p.key], p.gpu) for i, p in enumerate(pools)]
        for i in sorted(range(len(pools)), key=lambda i: (-hunger[i], i)):
            if hunger[i] == 0:
                continue
            others = sum(p.predicted_w for j, p in enumerate(plans) if j != i)
            room = limit - ratio * others
            if room > ratio * plans[i].predicted_w + 1e-9:
                plans[i] = self._plan_pool(snapshot, pools[i], members[pools[i].key], room)
        return plans


def _on(job: Job, gpu: GpuSpec) -> Job:
    model = model_on(job, gpu)
    return job if model is job.model else replace(job, model=model)


def _preference(job: Job, pools: Sequence[FleetPool]) -> tuple[PoolKey, ...]:
    """The pools the job can run in, best energy-delay product first (ties: pool order):
    those of its ``Job.committed_gpu`` only, where one of them can hold it. Where none
    can (its type's nodes left), every pool: its workers cannot run anyway, and a plan
    elsewhere is the one way on (a later generation there)."""
    scored = [(energy_delay(job, pool), i, pool) for i, pool in enumerate(pools)]
    own = [entry for entry in scored if entry[2].gpu.name == job.committed_gpu]
    if any(math.isfinite(value) for value, _, _ in own):
        scored = own
    return tuple(pool.key for value, _, pool in sorted(scored) if math.isfinite(value))


def _assign(
    jobs: Sequence[Job], pools: Sequence[FleetPool], prefs: Mapping[str, tuple[PoolKey, ...]]
) -> dict[PoolKey, list[Job]]:
    """Running jobs to the pool their GPUs are in, waiting jobs to their best pool."""
    node_pool = {node.name: pool.key for pool in pools for node in pool.nodes}
    members: dict[PoolKey, list[Job]] = {pool.key: [] for pool in pools}
    for job in jobs:
        if job.placement:
            held = {node_pool.get(node) for node, _ in job.placement}
            if None in held:
                raise SnapshotError(f"job {job.id!r} is placed on a node the cluster lacks")
            if len(held) > 1:
                raise SnapshotError(f"job {job.id!r} holds GPUs of more than one pool")
            key = held.pop()
            assert key is not None
            members[key].append(job)
            continue
        order = prefs[job.id]
        # A job that fits no pool waits in the first, which says why.
        members[order[0] if order else pools[0].key].append(job)
    return members


def _hunger(plan: Plan, jobs: Sequence[Job], gpu: GpuSpec) -> int:
    """How many of the pool's unfinished jobs would take more power: waiting, or below
    the top clock."""
    left = {job.id for job in jobs if job.remaining_iterations > 0}
    return sum(
        1
        for jp in plan.jobs
        if jp.job_id in left and (jp.gpus == 0 or jp.frequency_mhz < gpu.max_clock_mhz)
    )


def _joined(plans: Sequence[Plan], limit: float) -> Plan:
    jobs: list[JobPlan] = [jp for plan in plans for jp in plan.jobs]
    return Plan(
        jobs=tuple(jobs),
        limit_w=limit,
        predicted_w=sum(plan.predicted_w for plan in plans),
        powered_down_nodes=tuple(n for plan in plans for n in plan.powered_down_nodes),
        migrations=tuple(m for plan in plans for m in plan.migrations),
        notes=tuple(note for plan in plans for note in plan.notes),
    )
