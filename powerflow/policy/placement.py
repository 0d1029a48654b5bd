"""Job placement: network packing and buddy allocation (paper §5.3).

The allocation policy decides how many GPUs each job gets; this module decides
which ones. It is a pure function of the nodes and the requests, so the policy,
the simulator, the baselines and the scheduler extender share it.

Rules
-----
*Network packing* (AFS, Hwang et al., NSDI'21): every job asks for a power of
two GPUs and every node has the same power-of-two GPU count ``N`` (else
``PlacementError``). A job of ``s <= N`` GPUs runs inside one node; a job of
``s > N`` GPUs takes ``s / N`` whole nodes. So a node holds either several
single-node jobs or one slice of exactly one multi-node job: at most one job
on any node spans nodes.

*Buddy allocation* (HiveD, Zhao et al., OSDI'20): every job gets an *aligned*
block (see ``buddy.py``): GPUs ``[k*s, (k+1)*s)`` of one node, or the whole
nodes ``[k*g, (k+1)*g)`` in the order of ``nodes`` for ``g = s / N``. Aligned
blocks nest or are disjoint, so free space never splinters into pieces no job
can use.

Guarantee (tested with hypothesis in ``tests/test_placement.py``)
--------------------------------------------------------------------
When every request is movable:

1. Requests are admitted in the given order while their total fits the
   cluster (a request larger than the largest aligned run of whole nodes is
   skipped); every admitted request is placed. In particular, if the total
   demand is at most the cluster's GPU count, everything is placed.
2. At most one node that holds a job is partially used, so the jobs occupy
   exactly ``ceil(demand / N)`` nodes and every other node is in
   ``powered_down_nodes``.

Why: jobs are placed in decreasing size. When a job of size ``s`` is placed,
every block taken so far is aligned and at least ``s`` large, so the free space
is a union of free aligned ``s``-blocks plus, when the node count is not a
power of two, a tail shorter than ``s``; since the remaining demand is at least
``s`` and at most the free space, a free ``s``-block exists. Single-node jobs
go to the fullest node that still has room (best fit) and open an empty node
only when no node has room, so at most one node is partially filled at any
time. Nodes that the kept jobs already fill exactly are left alone, which does
not change the argument. Immovable requests occupy whatever block they hold;
with them the rules still apply but the guarantee can be lost to their
fragmentation (a movable request that finds no block is reported unplaced).

Stability and migrations
------------------------
Each movable running job *prefers* the aligned block of its new size that
overlaps its current GPUs most (first in node/GPU order on ties): its current
block when the size is unchanged, the first aligned half (its buddy stays
free) when it shrinks, the enclosing block when it grows.

- Nodes whose preferring jobs fill them exactly are kept as they are.
- Whole-node jobs keep their preferred nodes when those are free; other jobs
  keep their block when its node is already in use (or opened for them) and
  the block is free.
- New blocks avoid GPUs that jobs not yet placed prefer, so a job moves only
  when the space is needed: to fit a larger job, or to consolidate partly used
  nodes so that one can be freed (guarantee 2).

A ``Migration`` is reported for a running job whose new GPUs neither contain
nor lie within its current ones: some worker must move. Growing or shrinking in
place is a resize, not a migration. Immovable requests (bound pods, a job being
profiled) keep exactly their GPUs, which must form an aligned block of their
size on known nodes without overlapping each other, else ``PlacementError``.
Placing the previous output again (same requests, ``current`` set to the
assigned GPUs) changes nothing.

Power and preference
--------------------
Among equally good choices: a job's own preferred node, then powered-on nodes,
then nodes where more not-yet-placed jobs run now, then node order. A
powered-off node is used when the job needs it. Every node that ends with no
GPU assigned is listed in ``powered_down_nodes`` (the simulator counts it as
zero watts, the operator cordons it).

Determinism and cost
--------------------
Ties break on node order, GPU index and job id, never on hash order, so the
same input gives the same output. Time is ``O((jobs + GPUs) log)`` with small
constants (``benchmarks/placement_bench.py``); memory is ``O(jobs + GPUs)``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from powerflow.errors import PlacementError
from powerflow.policy.buddy import (
    Block,
    Geometry,
    exact_block,
    geometry,
    is_power_of_two,
    preferred_block,
    resolve_slots,
)
from powerflow.policy.snapshot import GpuSlot, Migration, Node

__all__ = [
    "PlacementRequest",
    "PlacementResult",
    "is_migration",
    "place",
    "reserve_block",
]


@dataclass(frozen=True)
class PlacementRequest:
    """One job's GPU count, and the GPUs it holds now (empty while it waits).

    ``movable=False`` pins the job to ``current`` exactly (pods already bound,
    a job being profiled).
    """

    job_id: str
    gpus: int
    current: tuple[GpuSlot, ...] = ()
    movable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or not is_power_of_two(self.gpus):
            raise PlacementError(
                f"job {self.job_id}: GPU count must be a power of two >= 1, got {self.gpus}"
            )


@dataclass(frozen=True)
class PlacementResult:
    """Where every placed job runs, what moved, what waits, and which nodes idle."""

    assignments: Mapping[str, tuple[GpuSlot, ...]]
    migrations: tuple[Migration, ...]
    unplaced: tuple[str, ...]
    powered_down_nodes: tuple[str, ...]


def is_migration(source: Collection[GpuSlot], target: Collection[GpuSlot]) -> bool:
    """True when a running job must move workers, not just add or drop some."""
    src, tgt = set(source), set(target)
    return bool(src) and not (src <= tgt or tgt <= src)


@dataclass(frozen=True, slots=True)
class _Item:
    order: int
    job_id: str
    size: int
    pref: Block | None


def _sort_key(item: _Item) -> tuple[int, bool, str]:
    # Largest first (the buddy guarantee); jobs with a preferred block before
    # new ones of the same size, so that new jobs do not take their blocks.
    return (-item.size, item.pref is None, item.job_id)


class _Cluster:
    """Mutable occupancy during one ``place`` call (never escapes it)."""

    def __init__(self, geo: Geometry) -> None:
        self.geo = geo
        n = geo.per_node
        self.occ = [bytearray(n) for _ in range(geo.num_nodes)]
        self.fill = [0] * geo.num_nodes
        self.busy = bytearray(geo.num_nodes)

    def is_free(self, b: Block) -> bool:
        n = self.geo.per_node
        if b.size <= n:
            return self.occ[b.node].find(1, b.offset, b.offset + b.size) == -1
        g = b.size // n
        return self.busy.find(1, b.node, b.node + g) == -1

    def occupy(self, b: Block) -> None:
        n = self.geo.per_node
        if b.size <= n:
            self.occ[b.node][b.offset : b.offset + b.size] = b"\x01" * b.size
            self.fill[b.node] += b.size
            self.busy[b.node] = 1
            return
        for node in range(b.node, b.node + b.size // n):
            self.occ[node][:] = b"\x01" * n
            self.fill[node] = n
            self.busy[node] = 1

    def best_offset(self, node: int, size: int, reserved: list[int] | None) -> int | None:
        """A free aligned ``size``-block on ``node``: fewest GPUs others prefer, then lowest."""
        occ = self.occ[node]
        best: int | None = None
        best_r = 0
        for off in range(0, self.geo.per_node, size):
            if occ.find(1, off, off + size) != -1:
                continue
            if reserved is None:
                return off
            r = sum(reserved[off : off + size])
            if r == 0:
                return off
            if best is None or r < best_r:
                best, best_r = off, r
        return best


def place(nodes: Sequence[Node], requests: Sequence[PlacementRequest]) -> PlacementResult:
    """Choose exact GPUs for every request (see the module docstring for the rules)."""
    geo = geometry(nodes)
    cluster = _Cluster(geo)
    placed: dict[str, Block] = {}
    seen: set[str] = set()
    for r in requests:
        if r.job_id in seen:
            raise PlacementError(f"job {r.job_id} is requested twice")
        seen.add(r.job_id)

    fixed = 0
    for r in requests:
        if r.movable:
            continue
        slots, valid = resolve_slots(geo, r.current)
        block = exact_block(geo, slots, r.gpus) if valid else None
        if block is None:
            raise PlacementError(
                f"immovable job {r.job_id}: its GPUs {list(r.current)} are not an aligned"
                f" block of {r.gpus} GPUs on known nodes"
            )
        if not cluster.is_free(block):
            raise PlacementError(f"immovable job {r.job_id} overlaps another immovable job")
        cluster.occupy(block)
        placed[r.job_id] = block
        fixed += r.gpus

    left = geo.capacity - fixed
    items: list[_Item] = []
    for i, r in enumerate(requests):
        if not r.movable or r.gpus > geo.max_block or r.gpus > left:
            continue
        left -= r.gpus
        slots, _ = resolve_slots(geo, r.current)
        items.append(_Item(i, r.job_id, r.gpus, preferred_block(geo, slots, r.gpus)))

    n = geo.per_node
    big = sorted((it for it in items if it.size >= n), key=_sort_key)
    small = sorted((it for it in items if it.size < n), key=_sort_key)
    weight = [0] * geo.num_nodes
    for it in items:
        _add_weight(geo, weight, it, +1)
    taken = _place_big(cluster, big, weight, placed)
    _place_small(cluster, small, taken, placed)
    return _result(geo, requests, placed)


def _add_weight(geo: Geometry, weight: list[int], it: _Item, sign: int) -> None:
    if it.pref is None:
        return
    if it.size <= geo.per_node:
        weight[it.pref.node] += sign * it.size
        return
    for node in range(it.pref.node, it.pref.node + it.size // geo.per_node):
        weight[node] += sign * geo.per_node


def _place_big(
    cluster: _Cluster, items: list[_Item], weight: list[int], placed: dict[str, Block]
) -> bytearray:
    """Jobs of at least one node: whole aligned node groups, in decreasing size.

    Returns the nodes these jobs took. A job keeps its preferred group when
    all of it is free; otherwise it takes the free group with the fewest
    powered-off nodes, then the fewest GPUs that other jobs run on now.
    """
    geo = cluster.geo
    off = [0 if on else 1 for on in geo.powered_on]
    taken = bytearray(geo.num_nodes)
    heap = [(off[i], weight[i], i) for i in range(geo.num_nodes) if not cluster.busy[i]]
    heapq.heapify(heap)
    for it in items:
        g = it.size // geo.per_node
        _add_weight(geo, weight, it, -1)
        if it.pref is not None:
            for node in range(it.pref.node, it.pref.node + g):
                if not cluster.busy[node]:
                    heapq.heappush(heap, (off[node], weight[node], node))
        start: int | None = None
        if it.pref is not None and cluster.is_free(it.pref):
            start = it.pref.node
        elif g == 1:
            while heap:
                _, w, node = heapq.heappop(heap)
                if not cluster.busy[node] and w == weight[node]:
                    start = node
                    break
        else:
            best: tuple[int, int, int] | None = None
            for s in range(0, geo.num_nodes - g + 1, g):
                if cluster.busy.find(1, s, s + g) == -1:
                    key = (sum(off[s : s + g]), sum(weight[s : s + g]), s)
                    if best is None or key < best:
                        best = key
            start = None if best is None else best[2]
        if start is None:
            continue
        block = Block(start, 0, it.size)
        cluster.occupy(block)
        taken[start : start + g] = b"\x01" * g
        placed[it.job_id] = block
    return taken


def _place_small(
    cluster: _Cluster, items: list[_Item], taken: bytearray, placed: dict[str, Block]
) -> None:
    """Jobs smaller than a node: keep exactly filled nodes, best-fit the rest."""
    geo = cluster.geo
    n = geo.per_node
    by_node: dict[int, list[_Item]] = {}
    pool_items: list[_Item] = []
    for it in items:
        if it.pref is None or taken[it.pref.node]:
            pool_items.append(_Item(it.order, it.job_id, it.size, None))
        else:
            by_node.setdefault(it.pref.node, []).append(it)

    settled = bytearray(geo.num_nodes)
    for node in sorted(by_node):
        stay = sorted(by_node[node], key=_sort_key)
        mask = bytearray(cluster.occ[node])
        kept: list[_Item] = []
        for it in stay:
            assert it.pref is not None
            o, s = it.pref.offset, it.size
            if mask.find(1, o, o + s) == -1:
                mask[o : o + s] = b"\x01" * s
                kept.append(it)
        if cluster.fill[node] + sum(it.size for it in kept) == n:
            settled[node] = 1
            for it in kept:
                assert it.pref is not None
                cluster.occupy(it.pref)
                placed[it.job_id] = it.pref
            kept_ids = {it.job_id for it in kept}
            pool_items.extend(
                _Item(it.order, it.job_id, it.size, None)
                for it in stay
                if it.job_id not in kept_ids
            )
        else:
            pool_items.extend(stay)
    pool_items.sort(key=_sort_key)
    _best_fit(cluster, pool_items, taken, settled, placed)


def _best_fit(
    cluster: _Cluster,
    items: list[_Item],
    taken: bytearray,
    settled: bytearray,
    placed: dict[str, Block],
) -> None:
    """Decreasing-size best fit over the nodes not yet decided (the guarantee's core)."""
    geo = cluster.geo
    n = geo.per_node
    fill = cluster.fill
    in_pool = [not taken[i] and not settled[i] and fill[i] < n for i in range(geo.num_nodes)]
    weight = [0] * geo.num_nodes
    reserved: list[list[int] | None] = [None] * geo.num_nodes
    for it in items:
        pb = it.pref
        if pb is not None:
            weight[pb.node] += it.size
            res = reserved[pb.node]
            if res is None:
                res = reserved[pb.node] = [0] * n
            for i in range(pb.offset, pb.offset + pb.size):
                res[i] += 1

    buckets: dict[int, list[int]] = {}
    for i in range(geo.num_nodes):
        if in_pool[i] and fill[i] > 0:
            buckets.setdefault(fill[i], []).append(i)
    empty = [
        (not geo.powered_on[i], -weight[i], i)
        for i in range(geo.num_nodes)
        if in_pool[i] and fill[i] == 0
    ]
    heapq.heapify(empty)

    for it in items:
        s, p = it.size, it.pref
        if p is not None:
            # Its own preference no longer keeps others away from the block.
            weight[p.node] -= s
            res = reserved[p.node]
            assert res is not None
            for i in range(p.offset, p.offset + s):
                res[i] -= 1
            if fill[p.node] == 0:
                heapq.heappush(empty, (not geo.powered_on[p.node], -weight[p.node], p.node))
        target: Block | None = None
        if p is not None and in_pool[p.node] and fill[p.node] > 0 and cluster.is_free(p):
            target = p
        if target is None:
            target = _fullest_with_room(cluster, buckets, s, p, reserved)
        if target is None and p is not None and in_pool[p.node] and fill[p.node] == 0:
            target = p
        while target is None and empty:
            _, w, node = heapq.heappop(empty)
            if fill[node] == 0 and -w == weight[node]:
                o = cluster.best_offset(node, s, reserved[node])
                if o is not None:
                    target = Block(node, o, s)
        if target is None:
            continue
        before = fill[target.node]
        cluster.occupy(target)
        placed[it.job_id] = target
        if before > 0:
            bucket = buckets[before]
            del bucket[bisect_left(bucket, target.node)]
        if fill[target.node] < n:
            insort(buckets.setdefault(fill[target.node], []), target.node)


def _fullest_with_room(
    cluster: _Cluster,
    buckets: dict[int, list[int]],
    size: int,
    pref: Block | None,
    reserved: list[list[int] | None],
) -> Block | None:
    """Best fit: the most filled open node with a free aligned block (own node first on ties)."""
    fill = cluster.fill
    for f in range(cluster.geo.per_node - size, 0, -1):
        bucket = buckets.get(f)
        if not bucket:
            continue
        order = bucket
        if pref is not None and fill[pref.node] == f and pref.node in bucket:
            order = [pref.node, *(x for x in bucket if x != pref.node)]
        for node in order:
            o = cluster.best_offset(node, size, reserved[node])
            if o is not None:
                return Block(node, o, size)
    return None


def _result(
    geo: Geometry, requests: Sequence[PlacementRequest], placed: dict[str, Block]
) -> PlacementResult:
    assignments: dict[str, tuple[GpuSlot, ...]] = {}
    migrations: list[Migration] = []
    unplaced: list[str] = []
    used = bytearray(geo.num_nodes)
    for r in requests:
        got = placed.get(r.job_id)
        if got is None:
            unplaced.append(r.job_id)
            continue
        slots = tuple(sorted(geo.slots(got)))
        assignments[r.job_id] = slots
        g = max(1, got.size // geo.per_node)
        used[got.node : got.node + g] = b"\x01" * g
        if r.movable and is_migration(r.current, slots):
            migrations.append(Migration(r.job_id, tuple(sorted(set(r.current))), slots))
    idle = tuple(name for i, name in enumerate(geo.names) if not used[i])
    return PlacementResult(assignments, tuple(migrations), tuple(unplaced), idle)


def reserve_block(
    nodes: Sequence[Node],
    occupied: Mapping[str, int | Collection[int]],
    gpus: int,
) -> tuple[GpuSlot, ...] | None:
    """Choose an aligned block of ``gpus`` free GPUs for a new gang, or None.

    For the scheduler extender, which knows what is already used on each node
    (bound pods plus other reservations) but not which devices. ``occupied``
    maps a node name to either a count ``u`` (read as GPUs ``0 .. u-1``: the
    count is mapped to the lowest indices, consistently) or the exact used
    indices; nodes not in ``nodes`` are ignored. Pass every node of the cluster
    in a stable order (e.g. sorted by name): node groups are aligned in it.

    A gang of at most ``N`` GPUs goes to one node, at its lowest free aligned
    offset, on the powered-on node with the least free room that fits (best
    fit: busy nodes fill up, empty nodes stay free to power down). With counts,
    room for ``gpus`` always means an aligned offset exists, since ``N`` is a
    multiple of ``gpus``. A larger gang takes the aligned group of wholly free
    nodes with the fewest powered-off nodes, then the first.
    """
    if not isinstance(gpus, int) or not is_power_of_two(gpus):
        raise PlacementError(f"a gang must have a power-of-two size >= 1, got {gpus}")
    geo = geometry(nodes)
    cluster = _Cluster(geo)
    n = geo.per_node
    for name in sorted(occupied):
        node = geo.index.get(name)
        if node is None:
            continue
        used = occupied[name]
        indices = range(used) if isinstance(used, int) else sorted(set(used))
        if isinstance(used, int) and not 0 <= used <= n:
            raise PlacementError(f"node {name}: {used} GPUs used, but it has {n}")
        for i in indices:
            if not 0 <= i < n:
                raise PlacementError(f"node {name}: no GPU index {i} (it has {n})")
            cluster.occupy(Block(node, i, 1))
    if gpus > geo.max_block:
        return None
    if gpus <= n:
        best: tuple[bool, int, int, int] | None = None
        for node in range(geo.num_nodes):
            if n - cluster.fill[node] < gpus:
                continue
            o = cluster.best_offset(node, gpus, None)
            if o is None:
                continue
            key = (not geo.powered_on[node], n - cluster.fill[node], node, o)
            if best is None or key < best:
                best = key
        return None if best is None else geo.slots(Block(best[2], best[3], gpus))
    g = gpus // n
    group: tuple[int, int] | None = None
    for s in range(0, geo.num_nodes - g + 1, g):
        if cluster.busy.find(1, s, s + g) == -1:
            key2 = (sum(not on for on in geo.powered_on[s : s + g]), s)
            if group is None or key2 < group:
                group = key2
    return None if group is None else geo.slots(Block(group[1], 0, gpus))
