"""The allocator behind ``placement.place``: which aligned block each job gets.

Internal to placement: plain data in (items with a size and a preferred
block), a dict of blocks out. The rules, the guarantee and its proof are in
``placement.py``'s docstring; this module holds the mechanics, in the order
they run:

0. *keep all*: every running job keeps its preferred block if free; this
   answer stands if it places everything with at most one node partly used,
   or if steps 1-4 do no better;
1. *whole-node jobs*: aligned node groups, largest first;
2. *settle*: nodes that the jobs running there fill exactly stay as they are;
3. *keep the fullest*: just enough of the remaining nodes to hold the
   remaining demand keep their jobs; jobs on the others, new jobs and
   displaced ones fill the kept nodes' holes, best fit, largest first, the
   node meant to stay partly used (``_slack_nodes``) last;
4. *repair*: if that leaves more than one node partly used (or a job with no
   hole), those nodes alone are repacked by decreasing-size best fit, which
   guarantees at most one partly used node.
"""

from __future__ import annotations

import heapq
import operator
from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass

from powerflow.core.policy.buddy import Block, Geometry


@dataclass(slots=True)
class Item:
    """One movable job to place; ``pref`` is where it runs now (see ``preferred_block``).

    Not frozen, only because one is built per running job at every placement and
    a frozen dataclass is built several times slower; nothing changes an item.
    """

    job_id: str
    size: int
    pref: Block | None


def sort_key(item: Item) -> tuple[int, bool, str]:
    """Largest first (the buddy guarantee), running jobs before new ones, then by id."""
    return (-item.size, item.pref is None, item.job_id)


def in_sort_order(items: Iterable[Item]) -> list[Item]:
    """``sorted(items, key=sort_key)``, the same list, by one key at a time.

    Stable sorts from the last key to the first give the order of the whole
    key, equal keys included; with C-level keys and no tuple per item this
    is two to three times faster on the thousands of jobs of a large cluster.
    """
    by_id = sorted(items, key=_JOB_ID)
    ordered = [it for it in by_id if it.pref is not None]
    ordered += [it for it in by_id if it.pref is None]
    ordered.sort(key=_SIZE, reverse=True)  # reverse=True keeps equal sizes in order
    return ordered


_JOB_ID = operator.attrgetter("job_id")
_SIZE = operator.attrgetter("size")


_ONES = b"\x01" * 4096
_ZEROS = bytes(4096)


class Cluster:
    """Mutable GPU occupancy during one placement (never escapes it)."""

    def __init__(self, geo: Geometry) -> None:
        self.geo = geo
        self.occ = [bytearray(geo.per_node) for _ in range(geo.num_nodes)]
        self.fill = [0] * geo.num_nodes
        self.busy = bytearray(geo.num_nodes)

    def take(self, other: Cluster) -> None:
        """Adopt ``other``'s occupancy (a copy this one was tried on)."""
        self.occ, self.fill, self.busy = other.occ, other.fill, other.busy

    def copy(self) -> Cluster:
        other = Cluster.__new__(Cluster)
        other.geo = self.geo
        other.occ = [bytearray(o) for o in self.occ]
        other.fill = list(self.fill)
        other.busy = bytearray(self.busy)
        return other

    def is_free(self, b: Block) -> bool:
        node, offset, size = b
        n = self.geo.per_node
        if size <= n:
            return self.occ[node].find(1, offset, offset + size) == -1
        return self.busy.find(1, node, node + size // n) == -1

    def occupy(self, b: Block) -> None:
        node, offset, size = b
        if size <= self.geo.per_node:
            # The common case inline (one node): same effect as ``_mark(b, 1)``.
            self.occ[node][offset : offset + size] = _ONES[:size]
            self.fill[node] += size
            self.busy[node] = 1
            return
        self._mark(b, 1)

    def release(self, b: Block) -> None:
        self._mark(b, 0)

    def _mark(self, b: Block, value: int) -> None:
        n = self.geo.per_node
        pattern = (_ONES if value else _ZEROS)[: min(b.size, n)]
        if b.size <= n:
            node = b.node
            self.occ[node][b.offset : b.offset + b.size] = pattern
            self.fill[node] += b.size if value else -b.size
            self.busy[node] = 1 if self.fill[node] else 0
            return
        for node in range(b.node, b.node + b.size // n):
            self.occ[node][:] = pattern
            self.fill[node] = n if value else 0
            self.busy[node] = value

    def best_offset(self, node: int, size: int, reserved: list[int] | None = None) -> int | None:
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

    def largest_free(self, node: int) -> int:
        """Size of the largest free aligned block on ``node`` (0 when full)."""
        occ, size = self.occ[node], self.geo.per_node
        while size:
            for off in range(0, self.geo.per_node, size):
                if occ.find(1, off, off + size) == -1:
                    return size
            size //= 2
        return 0


Metrics = tuple[int, int, int]
"""(jobs unplaced, nodes used, nodes partly used): smaller is better, in this order."""


def allocate(cluster: Cluster, items: list[Item]) -> dict[str, Block]:
    """Place movable ``items`` on ``cluster`` (which holds the immovable jobs).

    Iterates to a fixed point so that placing the answer again returns it
    unchanged: if steps 1-4, run on the answer's own blocks as preferences,
    find a strictly better layout, that becomes the answer. The metrics
    decrease strictly, so this ends; without immovable jobs the first answer
    already leaves at most one node partly used and is final.
    """
    placed, metrics = _once(cluster, items)
    while metrics[0] or metrics[2] > 1:
        again = [Item(it.job_id, it.size, placed.get(it.job_id)) for it in items]
        nxt, nxt_metrics = _once(cluster, again)
        if nxt_metrics >= metrics:
            break
        placed, metrics = nxt, nxt_metrics
    return placed


def _metrics(cluster: Cluster, items: list[Item], placed: dict[str, Block]) -> Metrics:
    n = cluster.geo.per_node
    partial = sum(1 for f in cluster.fill if 0 < f < n)
    used = sum(1 for f in cluster.fill if f)
    return (len(items) - len(placed), used, partial)


def _once(cluster: Cluster, items: list[Item]) -> tuple[dict[str, Block], Metrics]:
    """Step 0 (keep every preferred block that is free) unless steps 1-4 do better."""
    new_jobs = sum(1 for it in items if it.pref is None)
    kept: tuple[dict[str, Block], Metrics] | None = None
    if not new_jobs:
        kept = _keep(cluster, items)
        if kept[1][0] == 0 and kept[1][2] <= 1:
            return kept
    state = cluster.copy()
    placed: dict[str, Block] = {}
    n = state.geo.per_node
    big = in_sort_order(it for it in items if it.size >= n)
    small = [it for it in items if it.size < n]  # _place_small sorts what it needs to
    if big:
        weight = [0] * state.geo.num_nodes
        for it in items:
            pref = it.pref
            if pref is not None and it.size <= n:
                weight[pref.node] += it.size  # _add_weight's one-node case, inline
            else:
                _add_weight(state.geo, weight, it, +1)
        taken = _place_big(state, big, weight, placed)
    else:
        taken = bytearray(state.geo.num_nodes)  # what _place_big takes without jobs
    _place_small(state, small, taken, placed)
    metrics = _metrics(state, items, placed)
    if kept is None and metrics[0] >= new_jobs:
        # Step 0 leaves at least the new jobs unplaced; only now can it compete.
        kept = _keep(cluster, items)
    if kept is not None and kept[1] <= metrics:
        return kept
    return placed, metrics


def _keep(cluster: Cluster, items: list[Item]) -> tuple[dict[str, Block], Metrics]:
    """Every preferred block that is free, in ``sort_key`` order (bigger jobs win).

    When no two preferred blocks overlap (the usual replan) the order decides
    nothing, so the blocks are first taken in input order, on one flat
    occupancy map and the fill counts (all the metrics need), without sorting
    or copying the cluster; only a collision starts again in sorted order.
    """
    return _keep_in_order(cluster, items, ordered=False)


def _keep_in_order(
    cluster: Cluster, items: list[Item], *, ordered: bool
) -> tuple[dict[str, Block], Metrics]:
    """``_keep``'s pass: in input order (``ordered`` False), which gives up at the
    first collision for the pass in ``in_sort_order``; in that order (True), each
    preferred block taken when still free.

    On one flat occupancy map and the fill counts (a node is busy exactly when one
    of its GPUs is taken, so a group of whole nodes is free exactly when its GPUs
    are): the answer of copying the cluster and occupying block by block in
    ``sorted(items, key=sort_key)``, without either
    (``tests/test_packing_equivalence.py`` checks it against that). Placing again
    the 2,811 placements of the default trace's fitted powerflow and powerflow+ runs
    (``place_columns``' arguments as ``benchmarks/replay_bench.py``'s ``record`` sees
    them; 913 reach the sorted pass): 1.41 -> 1.32 s CPU against copying and
    occupying, best of 5, 3 alternations.
    """
    n = cluster.geo.per_node
    flat = bytearray().join(cluster.occ)
    fill = list(cluster.fill)
    kept: dict[str, Block] = {}
    for it in in_sort_order(it for it in items if it.pref is not None) if ordered else items:
        pref = it.pref
        if pref is None:
            continue
        node, offset, size = pref
        lo = node * n + offset if size <= n else node * n
        if flat.find(1, lo, lo + size) != -1:
            if not ordered:
                return _keep_in_order(cluster, items, ordered=True)
            continue
        if size <= n:
            flat[lo : lo + size] = _ONES[:size]
            fill[node] += size
        else:
            flat[lo : lo + size] = _ONES[:size] if size <= len(_ONES) else b"\x01" * size
            fill[node : node + size // n] = [n] * (size // n)
        kept[it.job_id] = pref
    partial = sum(1 for f in fill if 0 < f < n)
    used = sum(1 for f in fill if f)
    return kept, (len(items) - len(kept), used, partial)


def _add_weight(geo: Geometry, weight: list[int], it: Item, sign: int) -> None:
    if it.pref is None:
        return
    if it.size <= geo.per_node:
        weight[it.pref.node] += sign * it.size
        return
    for node in range(it.pref.node, it.pref.node + it.size // geo.per_node):
        weight[node] += sign * geo.per_node


def _place_big(
    cluster: Cluster, items: list[Item], weight: list[int], placed: dict[str, Block]
) -> bytearray:
    """Jobs of at least one node: whole aligned node groups, in decreasing size.

    Returns the nodes these jobs took. A job keeps its preferred group when
    all of it is free; otherwise it takes the free group with the fewest
    powered-off nodes, then the fewest GPUs that other jobs run on now, then
    the first. Single nodes come from one heap and groups of ``g`` nodes from
    a ``_FreeGroups`` per ``g``, so a choice costs a few heap steps rather
    than a scan over every group (which made this quadratic at scale).
    Weights only fall here (a job being placed stops counting on its
    preferred nodes) and every fall pushes the new key, so a popped entry
    whose key is not the current one is stale and dropped, as is one whose
    nodes got busy.
    """
    geo = cluster.geo
    n = geo.per_node
    busy = cluster.busy
    off = [0 if on else 1 for on in geo.powered_on]
    taken = bytearray(geo.num_nodes)
    heap = [(off[i], weight[i], i) for i in range(geo.num_nodes) if not busy[i]]
    heapq.heapify(heap)
    groups: dict[int, _FreeGroups] = {}
    for it in items:
        g = it.size // n
        _add_weight(geo, weight, it, -1)
        pref = it.pref
        if pref is not None:
            for node in range(pref.node, pref.node + g):
                if not busy[node]:
                    heapq.heappush(heap, (off[node], weight[node], node))
            for index in groups.values():
                index.lighter(pref.node, g, n, busy)
        start: int | None = None
        if pref is not None and cluster.is_free(pref):
            start = pref.node
        elif g == 1:
            while heap:
                _, w, node = heapq.heappop(heap)
                if not busy[node] and w == weight[node]:
                    start = node
                    break
        else:
            free = groups.get(g)
            if free is None:
                free = groups[g] = _FreeGroups(g, off, weight, busy)
            start = free.best(busy)
        if start is None:
            continue
        block = Block(start, 0, it.size)
        cluster.occupy(block)
        taken[start : start + g] = b"\x01" * g
        placed[it.job_id] = block
    return taken


class _FreeGroups:
    """The free aligned groups of ``g`` nodes, least (powered-off, weight, start) first.

    A heap with lazy deletion. ``weight[j]`` is the current weight of group
    ``j`` (nodes ``j*g`` to ``j*g + g - 1``); ``lighter`` lowers it and pushes
    the group's new key, so every free group always has an entry with its
    current key, and ``best`` drops entries whose key is not current or whose
    group is no longer free: the first valid entry is the group a scan over
    all free groups would pick. Built when the first job of ``g`` nodes
    needs it, from the weights and occupancy of that moment.
    """

    __slots__ = ("g", "heap", "off", "weight")

    def __init__(self, g: int, off: list[int], weight: list[int], busy: bytearray) -> None:
        self.g = g
        starts = range(0, len(weight) - g + 1, g)
        self.off = [sum(off[s : s + g]) for s in starts]
        self.weight = [sum(weight[s : s + g]) for s in starts]
        self.heap = [
            (self.off[s // g], self.weight[s // g], s)
            for s in starts
            if busy.find(1, s, s + g) == -1
        ]
        heapq.heapify(self.heap)

    def lighter(self, first: int, count: int, per_node: int, busy: bytearray) -> None:
        """Nodes ``first`` to ``first + count - 1`` each lost ``per_node`` GPUs of weight."""
        g = self.g
        end = min(first + count, len(self.weight) * g)  # later nodes are in no whole group
        for j in range(first // g, (end + g - 1) // g):
            s = j * g
            self.weight[j] -= per_node * (min(end, s + g) - max(first, s))
            if busy.find(1, s, s + g) == -1:
                heapq.heappush(self.heap, (self.off[j], self.weight[j], s))

    def best(self, busy: bytearray) -> int | None:
        """The first node of the chosen free group (its entry is used up), or None."""
        g, heap, weight = self.g, self.heap, self.weight
        while heap:
            _, w, s = heapq.heappop(heap)
            if w == weight[s // g] and busy.find(1, s, s + g) == -1:
                return s
        return None


def _place_small(
    cluster: Cluster, items: list[Item], taken: bytearray, placed: dict[str, Block]
) -> None:
    """Jobs smaller than a node: steps 2-4 of the module docstring.

    ``items`` may come in any order: the jobs that keep their blocks do not
    depend on it (``_stayers``), and the rest are sorted by ``sort_key``, a
    total order, before anything else looks at them.
    """
    geo = cluster.geo
    n = geo.per_node
    fixed = [f > 0 for f in cluster.fill]
    by_node: dict[int, list[Item]] = {}
    homeless: list[Item] = []
    for it in items:
        if it.pref is None or taken[it.pref.node]:
            homeless.append(it)
        else:
            by_node.setdefault(it.pref.node, []).append(it)

    # Step 2: which running jobs can stay, and nodes they fill exactly.
    occ, fill = cluster.occ, cluster.fill
    stayers: dict[int, list[Item]] = {}
    stay_size: dict[int, int] = {}
    for node, its in by_node.items():
        # ``_stayers``' first pass inline, summing the sizes on the way: without a
        # collision (the usual node) every job stays. Placing the fitted default-trace
        # runs' 2,811 placements again (see ``_keep_in_order``): 1.31 -> 1.27 s CPU.
        mask = bytearray(occ[node])
        size = 0
        for it in its:
            o, s = it.pref.offset, it.size  # type: ignore[union-attr]  # all have one here
            if mask.find(1, o, o + s) != -1:
                stay = _stayers(occ[node], its)
                staying = {id(it) for it in stay}
                homeless.extend(it for it in its if id(it) not in staying)
                size = sum([it.size for it in stay])
                break
            mask[o : o + s] = _ONES[:s]
            size += s
        else:
            stay = its
        if fill[node] + size == n:
            # They and the immovable jobs fill the node: the same as occupying
            # each job's block in turn.
            occ[node][:] = _ONES[:n]
            fill[node] = n
            cluster.busy[node] = 1
            for it in stay:
                pref = it.pref
                assert pref is not None
                placed[it.job_id] = pref
        elif stay:
            stayers[node] = stay
            stay_size[node] = size
    pool = [i for i in range(geo.num_nodes) if not taken[i] and fill[i] < n]

    # Step 3: keep the fullest nodes, just enough for the demand; fill their holes.
    demand = sum([it.size for it in homeless]) + sum(stay_size.values())
    on = geo.powered_on
    order = sorted(
        pool, key=lambda i: (not fixed[i], -(fill[i] + stay_size.get(i, 0)), not on[i], i)
    )
    kept: list[int] = []
    room = 0
    for i in order:
        if room >= demand and not fixed[i]:
            homeless.extend(stayers.pop(i, ()))
            continue
        kept.append(i)
        room += n - cluster.fill[i]
    on_node: dict[int, list[Item]] = {}
    for i in kept:
        kept_here = stayers.get(i)
        if kept_here:
            for it in kept_here:
                assert it.pref is not None
                cluster.occupy(it.pref)
                placed[it.job_id] = it.pref
            on_node[i] = list(kept_here)
    homeless = in_sort_order(homeless)
    tries: list[int | None] = [*_slack_nodes(cluster, kept, sum(it.size for it in homeless))[:3]]
    tries.append(None)
    chosen: tuple[Cluster, dict[str, Block], dict[int, list[Item]], list[Item]] | None = None
    for slack_node in tries:
        state, got, where = cluster.copy(), dict(placed), {k: list(v) for k, v in on_node.items()}
        first = [i for i in kept if i != slack_node]
        leftover = _fill_holes(state, homeless, first, got, where)
        if slack_node is not None and leftover:
            leftover = _fill_holes(state, leftover, [slack_node], got, where)
        if chosen is None:
            chosen = (state, got, where, leftover)
        if not leftover and sum(1 for i in kept if 0 < state.fill[i] < n) <= 1:
            chosen = (state, got, where, leftover)
            break
    assert chosen is not None
    state, got, on_node, leftover = chosen
    cluster.take(state)
    placed.clear()
    placed.update(got)

    # Step 4: repack the partly used nodes (and leftovers) if more than one remains.
    partial = [i for i in kept if 0 < cluster.fill[i] < n]
    if len(partial) <= 1 and not leftover:
        return
    redo = list(leftover)
    for i in partial:
        for it in on_node.get(i, ()):
            cluster.release(placed.pop(it.job_id))
            redo.append(it)
    room = sum(n - cluster.fill[i] for i in partial)
    need = sum(it.size for it in redo)
    nodes = list(partial)
    spare = sorted(
        (i for i in pool if cluster.fill[i] == 0),
        key=lambda i: (not geo.powered_on[i], i),
    )
    for i in spare:
        if room >= need:
            break
        nodes.append(i)
        room += n
    redo.sort(key=sort_key)
    _best_fit(cluster, redo, sorted(nodes), placed)


def _stayers(occupied: bytearray, items: list[Item]) -> list[Item]:
    """The running jobs that keep their blocks on a node, bigger ones first on a collision.

    Taken in ``sort_key`` order, each job whose block is still free stays. When
    no two blocks collide (nor with the node's immovable jobs) every job
    stays whatever the order, so the blocks are first tried in the given order
    and only a collision sorts (the order of the stayers matters nowhere: every
    later use sorts them by ``sort_key``, a total order).
    """
    mask = bytearray(occupied)
    for it in items:
        pref = it.pref
        assert pref is not None
        o = pref.offset
        if mask.find(1, o, o + it.size) != -1:
            break
        mask[o : o + it.size] = _ONES[: it.size]
    else:
        return items
    mask = bytearray(occupied)
    stay: list[Item] = []
    for it in sorted(items, key=sort_key):
        assert it.pref is not None
        o, size = it.pref.offset, it.size
        if mask.find(1, o, o + size) == -1:
            mask[o : o + size] = _ONES[:size]
            stay.append(it)
    return stay


def _slack_nodes(cluster: Cluster, kept: list[int], demand: int) -> list[int]:
    """Kept nodes that could stay the partly used one, best first.

    The kept nodes have ``slack`` GPUs more room than the jobs still to place
    need, so in the end one node holds ``N - slack`` GPUs and the others are
    full. Filling holes elsewhere first lets a node that already holds no
    more than that stay the partly used one (often it was before): the
    fullest such node first; ties go to powered-off, then later nodes.
    """
    n = cluster.geo.per_node
    slack = sum(n - cluster.fill[i] for i in kept) - demand
    if not 0 < slack < n:
        return []
    on = cluster.geo.powered_on
    fits = [i for i in kept if cluster.fill[i] <= n - slack]
    return sorted(fits, key=lambda i: (-cluster.fill[i], on[i], -i))


def _fill_holes(
    cluster: Cluster,
    items: list[Item],
    nodes: list[int],
    placed: dict[str, Block],
    on_node: dict[int, list[Item]],
) -> list[Item]:
    """Best fit by free room on ``nodes``, largest item first; return what found no hole.

    One heap per block size holds (room, node, version) for the nodes with a
    free aligned block of that size, so each item finds the fullest node that
    can take it in logarithmic time. Onto empty nodes in decreasing size (new
    jobs on a cluster being filled, every decision of a fresh queue) the
    answer is known without them: ``_fill_in_order``.
    """
    n = cluster.geo.per_node
    sizes = [it.size for it in items]
    decreasing = all(map(operator.ge, sizes, sizes[1:])) and (not sizes or sizes[0] < n)
    if decreasing and not any(map(cluster.fill.__getitem__, nodes)):
        return _fill_in_order(cluster, items, nodes, placed, on_node)
    return _fill_by_heaps(cluster, items, nodes, placed, on_node)


def _fill_by_heaps(
    cluster: Cluster,
    items: list[Item],
    nodes: list[int],
    placed: dict[str, Block],
    on_node: dict[int, list[Item]],
) -> list[Item]:
    """``_fill_holes``' general path: best fit by the heaps, any nodes, any order."""
    n = cluster.geo.per_node
    levels = n.bit_length()
    heaps: list[list[tuple[int, int, int]]] = [[] for _ in range(levels)]
    version = dict.fromkeys(nodes, 0)

    def push(node: int) -> None:
        top = cluster.largest_free(node)
        for k in range(top.bit_length()):
            heapq.heappush(heaps[k], (n - cluster.fill[node], node, version[node]))

    for node in nodes:
        push(node)
    leftover: list[Item] = []
    for it in items:
        heap = heaps[it.size.bit_length() - 1]
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        if not heap:
            leftover.append(it)
            continue
        node = heap[0][1]
        off = cluster.best_offset(node, it.size)
        assert off is not None
        block = Block(node, off, it.size)
        cluster.occupy(block)
        placed[it.job_id] = block
        on_node.setdefault(node, []).append(it)
        version[node] += 1
        push(node)
    return leftover


def _fill_in_order(
    cluster: Cluster,
    items: list[Item],
    nodes: list[int],
    placed: dict[str, Block],
    on_node: dict[int, list[Item]],
) -> list[Item]:
    """``_fill_holes`` when ``nodes`` are empty and the items come in decreasing size.

    Then best fit has one answer at every step, with no heaps or scans: sizes
    are powers of two below a node, each a divisor of every earlier one, so
    the GPUs taken on a node are always a prefix whose length is a multiple
    of the current size. At most one node is partly used; its room is a
    positive multiple of the size and the least room of any node with a free
    block, so it takes the item at the end of its prefix (the lowest free
    aligned offset); with none partly used, the empty node of lowest index
    (best fit's tie-break) opens. When every node is full the rest is left over.
    """
    n = cluster.geo.per_node
    order = sorted(nodes)
    opened = 0
    node = -1
    used = n
    here: list[Item] = []
    rest: list[Item] = []
    for k, it in enumerate(items):
        if used == n:
            if opened == len(order):
                rest = items[k:]
                break
            node = order[opened]
            opened += 1
            used = 0
            here = on_node.setdefault(node, [])
        placed[it.job_id] = Block(node, used, it.size)
        here.append(it)
        used += it.size
    # What occupying each block in turn does: every node opened is taken from
    # GPU 0 up, all of it but the last, which holds ``used`` GPUs.
    occ, fill, busy = cluster.occ, cluster.fill, cluster.busy
    for k in range(opened):
        node = order[k]
        take = n if k < opened - 1 else used
        occ[node][:take] = _ONES[:take]
        fill[node] = take
        busy[node] = 1
    return rest


def _best_fit(
    cluster: Cluster, items: list[Item], nodes: list[int], placed: dict[str, Block]
) -> None:
    """Decreasing-size best fit over ``nodes`` (the guarantee's core; see placement.py).

    A job keeps its preferred block when its node is already open; otherwise
    it goes to the fullest open node with a free aligned block, and only when
    there is none opens an empty node: its own, else a powered-on one where
    more of the remaining jobs run now, else the first. Starting from empty
    nodes this keeps at most one node partly used at any time.
    """
    geo = cluster.geo
    n = geo.per_node
    fill = cluster.fill
    in_set = bytearray(geo.num_nodes)
    for i in nodes:
        in_set[i] = 1
    weight = [0] * geo.num_nodes
    reserved: list[list[int] | None] = [None] * geo.num_nodes
    for it in items:
        pb = it.pref
        if pb is not None and in_set[pb.node]:
            weight[pb.node] += it.size
            res = reserved[pb.node]
            if res is None:
                res = reserved[pb.node] = [0] * n
            for i in range(pb.offset, pb.offset + pb.size):
                res[i] += 1

    buckets: dict[int, list[int]] = {}
    for i in nodes:
        if 0 < fill[i] < n:
            buckets.setdefault(fill[i], []).append(i)
    empty = [(not geo.powered_on[i], -weight[i], i) for i in nodes if fill[i] == 0]
    heapq.heapify(empty)

    for it in items:
        s = it.size
        p = it.pref if it.pref is not None and in_set[it.pref.node] else None
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
        if p is not None and fill[p.node] > 0 and cluster.is_free(p):
            target = p
        if target is None:
            target = _fullest_with_room(cluster, buckets, s, p, reserved)
        if target is None and p is not None and fill[p.node] == 0:
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
    cluster: Cluster,
    buckets: dict[int, list[int]],
    size: int,
    pref: Block | None,
    reserved: list[list[int] | None],
) -> Block | None:
    """The most filled open node with a free aligned block (own node first on ties)."""
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
