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

1. Admission: requests are taken in the given order (the caller's priority),
   and each one that still fits in the GPUs left is admitted; a request
   larger than the largest aligned run of whole nodes is never admitted.
   Every admitted request is placed. In particular, if the total demand is at
   most the cluster's GPU count, everything is placed.
2. At most one node that holds a job is partly used, so the jobs occupy
   exactly ``ceil(demand / N)`` nodes and every other node is in
   ``powered_down_nodes``.

Why. (a) Jobs are placed in decreasing size. When a job of size ``s`` is
placed, every block taken so far is aligned and at least ``s`` large, so the
free space is a union of free aligned ``s``-blocks plus, when the node count
is not a power of two, a tail shorter than ``s``; as the remaining demand is at
least ``s`` and at most the free space, a free ``s``-block exists. This places
the multi-node jobs, and, within each node, any set of single-node jobs whose
sizes sum to at most ``N``. (b) Single-node jobs then fill nodes by best fit.
Nodes that keep their jobs either end full or are, if more than one ends
partly used, emptied and repacked together with any job that found no hole:
largest first, each into the fullest node with room, an empty node opened
only when no node has room. From empty nodes this keeps at most one node
partly used at every step (a partly used node's room is a multiple of the job
size, so it always takes the job), and empty nodes are added until the room
covers the demand. (c) "Keep everything" is used only when it already leaves at
most one node partly used.

Immovable requests occupy whatever block they hold; the same rules apply to
the rest, but the guarantee can be lost to the fragmentation the immovable
ones cause (a movable request that finds no block is reported unplaced).

Stability and migrations
------------------------
Each movable running job *prefers* the aligned block of its new size that
overlaps its current GPUs most (first in node/GPU order on ties): its current
block when the size is unchanged, the first aligned half (its buddy stays
free) when it shrinks, the enclosing block when it grows. The steps, in
order (mechanics in ``packing.py``):

0. If every job can keep its preferred block and that leaves at most one node
   partly used, nothing moves. Otherwise:
1. Multi-node jobs keep their node group when it is free, else take the free
   group with the fewest powered-off nodes and the fewest GPUs others use now.
2. Nodes that their jobs (those whose preferred blocks do not collide) fill
   exactly stay as they are.
3. Of the other nodes, the fullest keep their jobs, just enough of them to
   hold the remaining demand; jobs on the rest, new jobs and jobs displaced by
   a growing neighbour fill the kept nodes' holes, largest first, each into
   the fullest node with a free aligned block.
4. If more than one node is now partly used, only those nodes are repacked (a
   job keeps its block there when its node is in use and the block is free).

So a job moves only when the space is needed: a larger job or a growing
neighbour takes it, or its node is emptied or repacked to satisfy
guarantee 2. A ``Migration`` is reported for a running job whose new GPUs
neither contain nor lie within its current ones: some worker must move.
Growing or shrinking in place is a resize, not a migration. Immovable
requests (bound pods, a job being profiled) keep exactly their GPUs, which
must form an aligned block of their size on known nodes without overlapping
each other, else ``PlacementError``.

Placing the previous output again (same requests, ``current`` set to the
assigned GPUs, empty for unplaced ones) changes nothing: step 0's answer is
kept unless steps 1-4 do strictly better on (unplaced jobs, used nodes, partly
used nodes), and ``place`` only returns an answer that steps 1-4 cannot
improve that way (it repeats them on its own answer until they cannot; without
immovable requests one pass suffices, by guarantee 2).

Power and preference
--------------------
Among equally good choices: a job's own preferred node, then powered-on nodes,
then nodes where more not-yet-placed jobs run now, then node order. Nodes are
kept or filled busiest first (best fit), so that whole nodes become free. A
powered-off node is used when the job needs it. Every node that ends with no
GPU assigned is listed in ``powered_down_nodes`` (the simulator counts it as
zero watts, the operator marks it powered down: ``operator/parking.py``).

Determinism and cost
--------------------
Ties break on node order, GPU index and job id, never on hash order, so the
same input gives the same output. Time is about ``O((jobs + GPUs) log)``,
plus a scan of the aligned node groups for each multi-node job and a few
retries of hole filling (``benchmarks/placement_bench.py``: tens of ms at
4,096 GPUs / 2,048 jobs); memory is ``O(jobs + GPUs)``. A job that hands
back exactly the block it holds (the common replan) is recognised by one dict
lookup among the cluster's aligned blocks (built once per node list and GPU
count, ``buddy.Geometry.node_blocks`` and ``node_groups``), and when no two
jobs' preferred blocks collide, step 0 takes them without sorting.
``place_columns`` is ``place`` with the requests as parallel columns (the
policy's form, which skips building a request object per job).

The steps run compiled (``placement_kernels.place``, through
``_place_compiled``) on integer columns; ``_place_python`` is the same placement
in Python, the specification the compiled one is tested against
(``tests/test_placement_compiled.py``) and the path for the rare input the
kernel does not take (current GPUs that are not tuples, overlapping or broken
immovable jobs, which it leaves to ``_place_python`` to report).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import TYPE_CHECKING, cast

import numpy as np

from powerflow.core.errors import PlacementError
from powerflow.core.policy.buddy import (
    Block,
    Geometry,
    aligned_blocks,
    block_id,
    exact_block,
    geometry,
    is_power_of_two,
    preferred_block,
    resolve_slots,
)
from powerflow.core.policy.packing import Cluster, Item, allocate
from powerflow.core.policy.snapshot import GpuSlot, Migration, Node

if TYPE_CHECKING:
    from powerflow.core.policy.placement_kernels import Blocks

__all__ = [
    "PlacementRequest",
    "PlacementResult",
    "is_migration",
    "place",
    "place_columns",
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
        _check_gpus(self.job_id, self.gpus)


def _check_gpus(job_id: str, n: int) -> None:
    if not isinstance(n, int) or not is_power_of_two(n):
        raise PlacementError(f"job {job_id}: GPU count must be a power of two >= 1, got {n}")


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


def place(nodes: Sequence[Node], requests: Sequence[PlacementRequest]) -> PlacementResult:
    """Choose exact GPUs for every request (see the module docstring for the rules)."""
    return _place(
        nodes,
        [r.job_id for r in requests],
        [r.gpus for r in requests],
        [r.current for r in requests],
        [r.movable for r in requests],
    )


def place_columns(
    nodes: Sequence[Node],
    job_ids: Sequence[str],
    gpus: Sequence[int],
    current: Sequence[tuple[GpuSlot, ...]],
    movable: Sequence[bool],
) -> PlacementResult:
    """``place`` with the requests given as parallel columns (same checks, same result).

    Why: the policy places every running job at every event; building a
    ``PlacementRequest`` per job only to take it apart again would be a measurable
    part of a decision.
    """
    if len(job_ids) != len(gpus) or not (
        set(map(type, gpus)) <= _INT_TYPES and set(gpus) <= _POWERS_OF_TWO
    ):
        # Not all plain powers of two: the per-request check names the first bad one.
        for job_id, n in zip(job_ids, gpus, strict=True):
            _check_gpus(job_id, n)
    return _place(nodes, job_ids, gpus, current, movable)


_INT_TYPES = frozenset({int, bool})
_POWERS_OF_TWO = frozenset(1 << k for k in range(64))
"""``place_columns`` checks a whole column against these at C speed (``_check_gpus`` accepts
exactly these values of these types, and more only for other ``int`` subclasses, which take
the per-request path)."""


def _place(
    nodes: Sequence[Node],
    job_ids: Sequence[str],
    gpus: Sequence[int],
    currents: Sequence[Sequence[GpuSlot]],
    movables: Sequence[bool],
) -> PlacementResult:
    geo = _geometry(nodes)
    _no_duplicates(job_ids)
    done = _place_compiled(geo, job_ids, gpus, currents, movables)
    if done is not None:
        return done
    return _place_python(geo, job_ids, gpus, currents, movables)


def _geometry(nodes: Sequence[Node]) -> Geometry:
    """``geometry(nodes)``, or the previous call's answer when ``nodes`` is the same tuple.

    Why: a run hands the policy the same tuple of nodes until one changes (1,390
    of a fitted run's 1,424 placements), and a tuple of frozen nodes cannot
    change, so the same object has the same geometry; numbering 64 nodes costs
    12 µs (timeit), about 17 ms of the run. Any other sequence is numbered anew.
    """
    last = _LAST_GEOMETRY[0]
    if last is not None and last[0] is nodes:
        return last[1]
    geo = geometry(nodes)
    if type(nodes) is tuple:
        _LAST_GEOMETRY[0] = (nodes, geo)  # holding it: its id cannot be reused
    return geo


_LAST_GEOMETRY: list[tuple[Sequence[Node], Geometry] | None] = [None]


def _no_duplicates(job_ids: Sequence[str]) -> None:
    if len(set(job_ids)) != len(job_ids):
        seen: set[str] = set()
        for job_id in job_ids:
            if job_id in seen:
                raise PlacementError(f"job {job_id} is requested twice")
            seen.add(job_id)


def _place_compiled(
    geo: Geometry,
    job_ids: Sequence[str],
    gpus: Sequence[int],
    currents: Sequence[Sequence[GpuSlot]],
    movables: Sequence[bool],
) -> PlacementResult | None:
    """``_place_python``'s answer from one compiled pass (``placement_kernels.place``),
    or None where that does not apply: GPU counts beyond the largest block, current
    GPUs that are not hashable tuples, no nodes, or keys too large for 63 bits.

    Here Python only reads the requests into integer columns (a job's current GPUs
    by one dict lookup among the aligned blocks, ``Geometry.block_table``; its id by
    its place in sorted id order, ``sort_key``'s last key), checks the immovable
    jobs, works out the preferred block of a job whose current GPUs are not its
    block (a few a call), and turns the blocks back into slots.

    Measured: placing again the 2,811 placements of the default trace's fitted
    powerflow and powerflow+ runs (``place_columns``' recorded arguments, each
    current placement the geometry's own tuple as in a run): 1.20-1.27 s CPU with
    ``_place_python``, 0.45-0.50 s with this (best of 5, 3 alternations, 2-core
    machine). A cold numba cache compiles the kernel once per machine (see
    ``powerflow/core/jit.py``).
    """
    if not job_ids or not geo.per_node:
        return None
    table = geo.block_table
    cur: list[int | None] = list(map(table.by_identity.get, map(id, currents)))
    if None in cur:  # not all the table's own tuples: look them up by their slots
        if not set(map(type, currents)) <= _TUPLE:
            return None
        try:
            cur = list(map(table.ids.get, currents, repeat(-1)))  # type: ignore[arg-type]
        except TypeError:
            return None
    from powerflow.core.policy import placement_kernels as pk

    top = geo.max_block
    # A count beyond every block is never placed: any larger number stands for it.
    size = np.array(gpus if max(gpus) <= top else [min(n, 2 * top) for n in gpus], np.int64)
    if not pk.key_bounds(geo.num_nodes, geo.per_node, size):
        return None
    m = len(job_ids)
    blocks = _kernel_blocks(geo.names, geo.per_node)
    cur_arr = np.array(cur, dtype=np.int64)
    known = cur_arr >= 0
    exact = known & (blocks.size[np.where(known, cur_arr, 0)] == size)
    movable = np.array(movables, dtype=np.bool_)
    fixed = np.where(movable, -1, cur_arr)
    if not movable.all():
        for k in np.flatnonzero(~movable & ~exact).tolist():
            # Not its block's slots in order: the general check (None: not a block,
            # and ``_place_python`` raises the first error in request order).
            slots, valid = resolve_slots(geo, currents[k])
            block = exact_block(geo, slots, gpus[k]) if valid else None
            if block is None:
                return None
            fixed[k] = block_id(block, geo.num_nodes, geo.per_node)
    left = geo.capacity - int(size[~movable].sum())
    admitted = movable & (size <= top)
    if int(size[admitted].sum()) > left:
        # More than fits: taken in request order while they do (``_place_python``).
        for k in np.flatnonzero(admitted).tolist():
            if gpus[k] > left:
                admitted[k] = False
            else:
                left -= gpus[k]
    kept = admitted & exact
    pref = np.where(kept, cur_arr, -1)
    for k in np.flatnonzero(admitted & ~kept & (cur_arr != -2)).tolist():
        block = _preferred(geo, currents[k], gpus[k])
        if block is not None:
            pref[k] = block_id(block, geo.num_nodes, geo.per_node)
    rank = np.empty(m, dtype=np.int64)
    rank[sorted(range(m), key=job_ids.__getitem__)] = np.arange(m)
    requests = pk.Requests(
        size, fixed, admitted.view(np.uint8), pref, kept.view(np.uint8), cur_arr, rank
    )
    got, flags, idle = pk.place(
        blocks, np.array(geo.powered_on, dtype=np.uint8), geo.per_node, requests
    )
    if got.shape[0] != m:
        return None  # immovable jobs overlap: ``_place_python`` says which
    # Every id the kernel returns names a block, so its slots are never None.
    slots_of = cast("tuple[tuple[GpuSlot, ...], ...]", table.slots)
    got_ids: list[int] = got.tolist()
    assignments: dict[str, tuple[GpuSlot, ...]]
    if min(got_ids) >= 0:
        assignments = dict(zip(job_ids, map(slots_of.__getitem__, got_ids), strict=True))
        unplaced: tuple[str, ...] = ()
    else:
        assignments = {
            job_id: slots_of[b] for job_id, b in zip(job_ids, got_ids, strict=True) if b >= 0
        }
        unplaced = tuple(job_id for job_id, b in zip(job_ids, got_ids, strict=True) if b < 0)
    migrations: list[Migration] = []
    for k in np.flatnonzero(flags).tolist():
        run = slots_of[got_ids[k]]
        current = currents[k]
        if flags[k] == 1 or is_migration(current, run):
            migrations.append(Migration(job_ids[k], tuple(sorted(set(current))), run))
    powered_down = tuple(compress(geo.names, idle.tolist()))
    return PlacementResult(assignments, tuple(migrations), unplaced, powered_down)


_TUPLE = frozenset({tuple})


@functools.lru_cache(maxsize=16)
def _kernel_blocks(names: tuple[str, ...], per_node: int) -> Blocks:
    """``Geometry.block_table``'s blocks as the kernel's arrays, once per cluster shape."""
    from powerflow.core.policy.placement_kernels import Blocks

    table = aligned_blocks(names, per_node)
    return Blocks(
        np.array(table.node, dtype=np.int64),
        np.array(table.offset, dtype=np.int64),
        np.array(table.size, dtype=np.int64),
    )


def _place_python(
    geo: Geometry,
    job_ids: Sequence[str],
    gpus: Sequence[int],
    currents: Sequence[Sequence[GpuSlot]],
    movables: Sequence[bool],
) -> PlacementResult:
    """The placement in Python, step by step (``packing.allocate``): the specification
    ``_place_compiled`` must agree with, and the path for what it does not take."""
    cluster = Cluster(geo)
    placed: dict[str, Block] = {}
    fixed = 0
    if not all(movables):
        for job_id, n, current, movable in zip(job_ids, gpus, currents, movables, strict=True):
            if movable:
                continue
            slots, valid = resolve_slots(geo, current)
            block = exact_block(geo, slots, n) if valid else None
            if block is None:
                raise PlacementError(
                    f"immovable job {job_id}: its GPUs {list(current)} are not an aligned"
                    f" block of {n} GPUs on known nodes"
                )
            if not cluster.is_free(block):
                raise PlacementError(f"immovable job {job_id} overlaps another immovable job")
            cluster.occupy(block)
            placed[job_id] = block
            fixed += n

    left = geo.capacity - fixed
    max_block = geo.max_block
    items: list[Item] = []
    kept: list[Block | None] = [None] * len(job_ids)
    k = -1
    for job_id, n, current, movable, block in zip(
        job_ids, gpus, currents, movables, _node_blocks_of(geo, currents), strict=True
    ):
        k += 1
        if not movable or n > max_block or n > left:
            continue
        left -= n
        pref: Block | None
        if block is not None and block.size == n and type(current) is tuple:
            pref = kept[k] = block  # _kept_block's first answer, without the call
        elif current:
            pref = _kept_block(geo, current, n)
            if pref is not None:
                kept[k] = pref
            else:
                pref = _preferred(geo, current, n)
        else:
            pref = None
        items.append(Item(job_id, n, pref))
    placed.update(allocate(cluster, items))
    return _result(geo, job_ids, currents, movables, placed, kept)


def _node_blocks_of(geo: Geometry, currents: Sequence[Sequence[GpuSlot]]) -> list[Block | None]:
    """Per request, the aligned block within one node whose slots its current GPUs are
    (``Geometry.node_blocks``), or None: ``_kept_block``'s dict lookup for every job at
    once.

    Why: ``_place`` then calls ``_kept_block`` only for the jobs this does not answer.
    Together with ``_result``'s batched lookups: 1.47 -> 1.41 s CPU (best of 5, 3
    alternations) to place again the 2,811 placements of the default trace's fitted
    powerflow and powerflow+ runs (``place_columns``' arguments as recorded by
    ``benchmarks/replay_bench.py``'s ``record``); whole replays are within noise. All
    None when some current GPUs are not hashable: ``_kept_block`` then decides job by
    job. ``tests/test_placement_fastpath.py`` patches this and ``_kept_block`` out to
    check that the shortcut never changes a placement.
    """
    try:
        return list(map(geo.node_blocks.by_slots.get, currents))  # type: ignore[arg-type]
    except TypeError:
        return [None] * len(currents)


def _preferred(geo: Geometry, current: Sequence[GpuSlot], gpus: int) -> Block | None:
    """The general rule: ``preferred_block`` of the request's current GPUs."""
    slots, _ = resolve_slots(geo, current)
    return preferred_block(geo, slots, gpus)


def _kept_block(geo: Geometry, current: Sequence[GpuSlot], gpus: int) -> Block | None:
    """The common case without building sets: ``current`` is already the block.

    Why: at most events nearly every running job keeps its GPUs, and the plan
    hands them back sorted, so a job of at most one node whose current GPUs
    are ``(name, k*gpus) .. (name, k*gpus + gpus - 1)`` in this order prefers
    exactly that block (``preferred_block``'s own fast path). None otherwise:
    the caller then takes the general path (``_preferred``), which
    ``tests/test_placement_fastpath.py`` checks this against. A tuple is
    looked up among the node's aligned blocks (``Geometry.node_blocks``);
    anything else is compared slot by slot (``_kept_block_scan``), with the
    same answer. A job of several whole nodes that hands back its group is
    recognised the same way (``_kept_group``). ``_place`` takes the lookup's
    answer for all jobs at once from ``_node_blocks_of`` and calls this for the
    movable jobs that does not answer, so patching both out disables the whole
    shortcut.
    """
    if type(current) is not tuple:
        return _kept_block_scan(geo, current, gpus)
    try:
        block = geo.node_blocks.by_slots.get(current)
    except TypeError:  # unhashable slots: the scan decides
        return _kept_block_scan(geo, current, gpus)
    if block is not None and block.size == gpus:
        return block
    return _kept_group(geo, current, gpus) if gpus > geo.per_node else None


def _kept_group(geo: Geometry, current: Sequence[GpuSlot], gpus: int) -> Block | None:
    """``_kept_block`` for a job of several whole nodes that hands back its group, sorted.

    Such a job's current GPUs are exactly one aligned group, so ``_preferred``
    would find that group (every slot counts for it, for no other); the
    lookup skips building the set. None otherwise (also for a list, which the
    general path handles).
    """
    if type(current) is not tuple:
        return None
    try:
        block = geo.node_groups.by_slots.get(current)
    except TypeError:
        return None
    return block if block is not None and block.size == gpus else None


def _kept_block_scan(geo: Geometry, current: Sequence[GpuSlot], gpus: int) -> Block | None:
    """``_kept_block`` slot by slot (for sequences that are not hashable tuples)."""
    if len(current) != gpus or gpus > geo.per_node:
        return None
    name, first = current[0]
    node = geo.index.get(name)
    if node is None or first % gpus or first < 0 or first + gpus > geo.per_node:
        return None
    for k, slot in enumerate(current):
        if slot[0] != name or slot[1] != first + k:
            return None
    return Block(node, first, gpus)


def _result(
    geo: Geometry,
    job_ids: Sequence[str],
    currents: Sequence[Sequence[GpuSlot]],
    movables: Sequence[bool],
    placed: dict[str, Block],
    kept: Sequence[Block | None],
) -> PlacementResult:
    """``kept``: per request, the ``_kept_block`` answer ``place`` already found (None
    for immovable requests and where it found none).

    A block within one node is looked up among the node's aligned blocks for all jobs
    at once (``None`` for an unplaced job and for a group of whole nodes, which the
    loop then tells apart), so a job that keeps its block costs no call in the loop.
    """
    assignments: dict[str, tuple[GpuSlot, ...]] = {}
    migrations: list[Migration] = []
    unplaced: list[str] = []
    used = bytearray(geo.num_nodes)
    per_node = geo.per_node
    got_all = list(map(placed.get, job_ids))
    known = list(map(geo.node_blocks.slots.get, got_all))  # type: ignore[arg-type]
    for job_id, got, slots, pref, current, movable in zip(
        job_ids, got_all, known, kept, currents, movables, strict=True
    ):
        if slots is not None:
            assignments[job_id] = slots
            used[got[0]] = 1
            if pref == got:
                continue  # it keeps its GPUs (the block's slots, in order): no migration
        elif got is None:
            unplaced.append(job_id)
            continue
        else:
            node, _, size = got
            if size <= per_node:
                slots = geo.slots(got)
                assignments[job_id] = slots
                used[node] = 1
            else:
                slots = geo.node_groups.slots.get(got) or tuple(sorted(geo.slots(got)))
                assignments[job_id] = slots
                g = size // per_node
                used[node : node + g] = b"\x01" * g
            if pref == got:
                continue  # it keeps its GPUs (a block, or exactly its current group)
        if movable and current and is_migration(current, slots):
            migrations.append(Migration(job_id, tuple(sorted(set(current))), slots))
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
    indices (ints); nodes not in ``nodes`` are ignored. Pass every node of the
    cluster in a stable order (e.g. sorted by name): node groups are aligned
    in it.

    A gang of at most ``N`` GPUs goes to one node, at its lowest free aligned
    offset, on the powered-on node with the least free room that fits (best
    fit: busy nodes fill up, empty nodes stay free to power down). With counts,
    room for ``gpus`` always means an aligned offset exists, since ``N`` is a
    multiple of ``gpus``. A larger gang takes the aligned group of wholly free
    nodes with the fewest powered-off nodes, then the first.

    The extender calls this on its request path, so it works from one used
    count per node (O(nodes), plus an offset check on the nodes that would
    win), never marking GPUs one by one; ``_reserve_block_by_gpu`` is the
    plain GPU-by-GPU version it must agree with (tested with hypothesis), and
    it answers (raises) for input that is not valid.
    """
    if not isinstance(gpus, int) or not is_power_of_two(gpus):
        raise PlacementError(f"a gang must have a power-of-two size >= 1, got {gpus}")
    geo = geometry(nodes)
    n = geo.per_node
    fill = [0] * geo.num_nodes
    exact: dict[int, Collection[int]] = {}
    indices = frozenset(range(n))
    for name, used in occupied.items():
        node = geo.index.get(name)
        if node is None:
            continue
        if isinstance(used, int):
            if not 0 <= used <= n:
                return _reserve_block_by_gpu(geo, occupied, gpus)  # raises, as it says why
            fill[node] = used
            continue
        taken = used if isinstance(used, (set, frozenset)) else set(used)
        if not taken <= indices:
            return _reserve_block_by_gpu(geo, occupied, gpus)
        fill[node] = len(taken)
        if taken:
            exact[node] = taken
    if gpus > geo.max_block:
        return None
    if gpus <= n:
        found = _best_fit_node(geo, fill, exact, gpus)
        return None if found is None else geo.slots(Block(found[0], found[1], gpus))
    start = _free_node_group(geo, fill, gpus // n)
    return None if start is None else geo.slots(Block(start, 0, gpus))


def _best_fit_node(
    geo: Geometry, fill: list[int], exact: Mapping[int, Collection[int]], gpus: int
) -> tuple[int, int] | None:
    """Node and offset by (powered off, room left, node, offset), smallest first."""
    n = geo.per_node
    off = n + 1  # a powered-off node ranks after every powered-on one
    best_rank, best = 2 * off, None
    powered = geo.powered_on
    for node, used in enumerate(fill):
        rank = n - used
        if rank < gpus:
            continue
        if not powered[node]:
            rank += off
        if rank >= best_rank:
            continue
        taken = exact.get(node)
        if taken is None:
            offset: int | None = -(-used // gpus) * gpus  # GPUs 0 .. used-1 are taken
        else:
            offset = next(
                (o for o in range(0, n, gpus) if not any(i in taken for i in range(o, o + gpus))),
                None,
            )
        if offset is not None:
            best_rank, best = rank, (node, offset)
    return best


def _free_node_group(geo: Geometry, fill: list[int], g: int) -> int | None:
    """First node of the aligned group of ``g`` empty nodes with the fewest powered off."""
    best: tuple[int, int] | None = None
    powered = geo.powered_on
    for s in range(0, geo.num_nodes - g + 1, g):
        if any(fill[s : s + g]):
            continue
        key = (g - sum(powered[s : s + g]), s)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def _reserve_block_by_gpu(
    geo: Geometry, occupied: Mapping[str, int | Collection[int]], gpus: int
) -> tuple[GpuSlot, ...] | None:
    """``reserve_block`` by marking every used GPU: the reference, and the input checks."""
    cluster = Cluster(geo)
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
