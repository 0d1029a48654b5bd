"""``placement._place_python`` compiled: the same placement, over integer arrays.

Why: PowerFlow places every running job at every decision, and placement's
Python passes (the steps of ``packing.py``, a dozen per job) were about 40 % of
its policy's CPU in a fitted run of the default trace. ``packing.py`` stays the
readable specification; this file is that algorithm step by step. ``place``
takes the requests as columns (``Requests``, which ``placement._place_compiled``
builds: every aligned block is an integer, ``buddy.block_id``), occupies the
immovable blocks, runs ``_allocate`` (``packing.allocate``) on the admitted
movable jobs over

- the cluster's occupancy, ``Occupancy``: ``occ`` (nodes x GPUs, uint8),
  ``fill`` (GPUs used per node), ``busy`` (``fill > 0``) and ``on`` (powered
  on, 0/1);
- the movable items in request order: ``size``, the preferred block's node and
  offset (``pref_node``/``pref_off``, -1: none) and ``rank``, the job's place
  among the job ids in sorted order (``sort_key``'s last key), from which
  ``_item_keys`` makes the steps' ``key``; the steps take ``size``,
  ``pref_node``, ``pref_off`` and ``key`` together, as ``Items``,

and returns each request's block, migration flag, and the idle nodes. The
steps write their answer into ``Placed`` (each item's node and offset). These
groups are ``NamedTuple``s: numba passes one as a struct of its fields, so a
kernel reads them as it would separate arguments.

Where ``packing.py`` keys a dict by job id, this indexes an array by item;
where it sorts by a tuple or keeps tuples in a heap, this uses one integer that
orders the same (``key_bounds`` says when such integers would not fit in 63 bits, and
the caller then runs ``packing.py``). Lists are arrays with a count, heaps are
arrays sifted here (``_push``, ``_pop``): numba compiles those in a fraction of
the time its typed lists take. Two shortcuts of ``packing.py`` are left out
because they only save work: ``_keep_in_order`` and ``_stayers`` try the blocks
in input order first and sort only on a collision, and without a collision both
orders keep every block, so here the blocks are always taken in sorted order.
``tests/test_placement_compiled.py`` checks the answers against
``placement._place_python``.

Everything compiled for placement lives in this one file (numba's cache notices a
change in a cached function's own file only: ``powerflow/core/jit.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from powerflow.core.jit import njit

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]
Metrics = tuple[int, int, int]


class Occupancy(NamedTuple):
    """The cluster as the steps see it: ``occ`` (nodes x GPUs, 1: taken), ``fill``
    (GPUs taken per node), ``busy`` (``fill > 0``), all three updated in place by the
    steps (or copied for a try), and ``on`` (powered on, 0/1), only read."""

    occ: ByteArray
    fill: IntArray
    busy: ByteArray
    on: ByteArray


class Items(NamedTuple):
    """The movable items' columns, in request order: ``size``, the preferred block's
    node and offset (``pref_node``/``pref_off``, -1: none) and ``key``, the integer
    that orders the items as ``sort_key`` (``_item_keys``)."""

    size: IntArray
    pref_node: IntArray
    pref_off: IntArray
    key: IntArray


class Placed(NamedTuple):
    """The answer being built, per item: its block's node and offset (-1: unplaced),
    written in place by the steps."""

    node: IntArray
    off: IntArray


def key_bounds(nodes: int, per_node: int, size: IntArray) -> bool:
    """Whether every integer key the kernels build fits in 63 bits: the largest is a
    group's (powered-off nodes, weight, first node) with weight at most the sum of the
    sizes, or a size rank times the items."""
    m = int(size.shape[0])
    total = int(size.sum()) if m else 0
    node_key = (nodes + 1) * (total + 1) * (nodes + 1)
    item_key = (int(size.max()) + 1 if m else 1) * 2 * (m + 1)
    hole_key = (per_node + 1) * (nodes + 1) * (m + 2)
    return max(node_key, item_key, hole_key) < 2**62


# --- heaps of int64 keys ----------------------------------------------------------


@njit
def _push(heap: IntArray, size: int, key: int) -> int:
    """Push ``key`` onto ``heap[:size]``; the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= key:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = key
    return size + 1


@njit
def _pop(heap: IntArray, size: int) -> tuple[int, int]:
    """The least key of ``heap[:size]``, removed; and the new size."""
    top = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top, size


# --- the cluster ----------------------------------------------------------------


@njit
def _is_free(occ: ByteArray, busy: ByteArray, node: int, off: int, size: int) -> bool:
    n = occ.shape[1]
    if size > n:
        return _group_free(busy, node, size // n)
    taken = 0
    for k in range(off, off + size):
        taken |= occ[node, k]
    return taken == 0


@njit
def _occupy(
    occ: ByteArray, fill: IntArray, busy: ByteArray, node: int, off: int, size: int
) -> None:
    n = occ.shape[1]
    if size <= n:
        for k in range(off, off + size):
            occ[node, k] = 1
        fill[node] += size
        busy[node] = 1
        return
    for j in range(node, node + size // n):
        for x in range(n):
            occ[j, x] = 1
        fill[j] = n
        busy[j] = 1


@njit
def _release(
    occ: ByteArray, fill: IntArray, busy: ByteArray, node: int, off: int, size: int
) -> None:
    n = occ.shape[1]
    if size <= n:
        for k in range(off, off + size):
            occ[node, k] = 0
        fill[node] -= size
        busy[node] = 1 if fill[node] else 0
        return
    for j in range(node, node + size // n):
        for x in range(n):
            occ[j, x] = 0
        fill[j] = 0
        busy[j] = 0


@njit
def _first_free(occ: ByteArray, node: int, size: int) -> int:
    """The lowest free aligned ``size``-block on ``node`` (-1: none)."""
    for off in range(0, occ.shape[1], size):
        free = True
        for k in range(off, off + size):
            if occ[node, k]:
                free = False
                break
        if free:
            return off
    return -1


@njit
def _best_offset(occ: ByteArray, node: int, size: int, reserved: IntArray) -> int:
    """``Cluster.best_offset``: a free aligned block, fewest reserved GPUs, then lowest
    (-1: none)."""
    best = -1
    best_r = 0
    for off in range(0, occ.shape[1], size):
        free = True
        for k in range(off, off + size):
            if occ[node, k]:
                free = False
                break
        if not free:
            continue
        r = 0
        for k in range(off, off + size):
            r += reserved[node, k]
        if r == 0:
            return off
        if best < 0 or r < best_r:
            best, best_r = off, r
    return best


@njit
def _largest_free(occ: ByteArray, node: int) -> int:
    size: int = occ.shape[1]
    while size:
        if _first_free(occ, node, size) >= 0:
            return size
        size //= 2
    return 0


@njit
def _bit_length(x: int) -> int:
    k = 0
    while x:
        x >>= 1
        k += 1
    return k


@njit
def _metrics(fill: IntArray, per_node: int, items: int, placed: IntArray) -> Metrics:
    """(jobs unplaced, nodes used, nodes partly used), as ``packing._metrics``."""
    used = 0
    partial = 0
    for f in fill:
        if f:
            used += 1
            if f < per_node:
                partial += 1
    got = 0
    for node in placed:
        if node >= 0:
            got += 1
    return items - got, used, partial


@njit
def _less(a: Metrics, b: Metrics) -> bool:
    """Python's tuple ``<``."""
    if a[0] != b[0]:
        return a[0] < b[0]
    if a[1] != b[1]:
        return a[1] < b[1]
    return a[2] < b[2]


@njit
def _item_keys(size: IntArray, pref_node: IntArray, rank: IntArray) -> IntArray:
    """One integer per item that orders as ``sort_key``: largest first, then items with
    a preferred block, then by job id."""
    m = size.shape[0]
    top = 0
    span = 1
    for i in range(m):
        top = max(top, size[i])
        span = max(span, rank[i] + 1)
    key = np.empty(m, dtype=np.int64)
    for i in range(m):
        key[i] = ((top - size[i]) * 2 + (1 if pref_node[i] < 0 else 0)) * span + rank[i]
    return key


@njit
def _argsort(keys: IntArray) -> IntArray:
    """The positions of ``keys`` (distinct) in increasing order: a heapsort, written out
    because numba compiles ``np.argsort`` anew for every file that calls it."""
    m = keys.shape[0]
    order = np.arange(m)
    for start in range((m - 2) // 2, -1, -1):
        _sift_down(order, keys, start, m)
    for end in range(m - 1, 0, -1):
        order[0], order[end] = order[end], order[0]
        _sift_down(order, keys, 0, end)
    return order


@njit
def _sift_down(order: IntArray, keys: IntArray, root: int, end: int) -> None:
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and keys[order[child + 1]] > keys[order[child]]:
            child += 1
        if keys[order[child]] <= keys[order[root]]:
            return
        order[root], order[child] = order[child], order[root]
        root = child


@njit
def _sorted_by(items: IntArray, key: IntArray) -> IntArray:
    """``items`` (item indices) in the order of ``key``."""
    picked = np.empty(items.shape[0], dtype=np.int64)
    for k in range(items.shape[0]):
        picked[k] = key[items[k]]
    order = _argsort(picked)
    out = np.empty(items.shape[0], dtype=np.int64)
    for k in range(items.shape[0]):
        out[k] = items[order[k]]
    return out


# --- steps 0-4 ------------------------------------------------------------------


@njit
def _keep(cluster: Occupancy, items: Items) -> tuple[IntArray, IntArray, Metrics]:
    """Step 0: every preferred block that is free, bigger jobs first (``packing._keep``);
    the items' nodes and offsets (-1: unplaced) and the metrics."""
    occ, fill, busy = cluster.occ, cluster.fill, cluster.busy
    size, pref_node, pref_off, key = items
    m = size.shape[0]
    s_occ, s_fill, s_busy = occ.copy(), fill.copy(), busy.copy()
    out_n = np.full(m, -1, dtype=np.int64)
    out_o = np.full(m, -1, dtype=np.int64)
    for i in _argsort(key):
        node = pref_node[i]
        if node >= 0 and _is_free(s_occ, s_busy, node, pref_off[i], size[i]):
            _occupy(s_occ, s_fill, s_busy, node, pref_off[i], size[i])
            out_n[i] = node
            out_o[i] = pref_off[i]
    return out_n, out_o, _metrics(s_fill, occ.shape[1], m, out_n)


@njit
def _group_free(busy: ByteArray, s: int, g: int) -> bool:
    taken = 0
    for x in range(s, s + g):
        taken |= busy[x]
    return taken == 0


@njit
def _place_big(
    cluster: Occupancy, items: Items, big: IntArray, weight: IntArray, out: Placed
) -> ByteArray:
    """``packing._place_big``: the items ``big`` (whole aligned node groups), largest
    first, into ``cluster`` and ``out``; returns the nodes taken. A node's heap key is
    (powered off, weight, node) and a group's (powered-off nodes, weight, first node),
    each as one integer; ``_FreeGroups`` of ``g`` nodes is the heap row ``level[g]``,
    made when a job of ``g`` nodes first needs it."""
    occ, fill, busy, on = cluster
    size, pref_node, pref_off = items.size, items.pref_node, items.pref_off
    out_n, out_o = out
    nodes, n = occ.shape
    wb = 1  # weights only fall: every key's weight is below this
    for w in weight:
        wb += w
    taken = np.zeros(nodes, dtype=np.uint8)
    pushes = nodes + 1
    for i in big:
        pushes += size[i] // n + 2
    heap = np.empty(pushes, dtype=np.int64)
    count = 0
    for i in range(nodes):
        if not busy[i]:
            count = _push(heap, count, ((1 - on[i]) * wb + weight[i]) * nodes + i)
    levels = _bit_length(nodes) + 1
    level = np.full(levels, -1, dtype=np.int64)  # by log2(g): the group heap's row
    made = 0
    g_size = np.zeros(levels, dtype=np.int64)
    g_count = np.zeros(levels, dtype=np.int64)
    g_off = np.zeros((levels, nodes), dtype=np.int64)
    g_weight = np.zeros((levels, nodes), dtype=np.int64)
    g_heap = np.empty((levels, pushes), dtype=np.int64)
    for i in big:
        g = size[i] // n
        p = pref_node[i]
        if p >= 0:
            if size[i] <= n:
                weight[p] -= size[i]
            else:
                for j in range(p, p + g):
                    weight[j] -= n
            for j in range(p, p + g):
                if not busy[j]:
                    count = _push(heap, count, ((1 - on[j]) * wb + weight[j]) * nodes + j)
            for r in range(made):
                gg = g_size[r]
                groups = nodes // gg
                end = min(p + g, groups * gg)
                for j in range(p // gg, (end + gg - 1) // gg):
                    s = j * gg
                    g_weight[r, j] -= n * (min(end, s + gg) - max(p, s))
                    if _group_free(busy, s, gg):
                        g_count[r] = _push(
                            g_heap[r], g_count[r], (g_off[r, j] * wb + g_weight[r, j]) * nodes + s
                        )
        start = -1
        if p >= 0 and _is_free(occ, busy, p, pref_off[i], size[i]):
            start = p
        elif g == 1:
            while count:
                top, count = _pop(heap, count)
                node = top % nodes
                if not busy[node] and (top // nodes) % wb == weight[node]:
                    start = node
                    break
        elif g <= nodes:
            lg = _bit_length(g) - 1
            r = level[lg]
            if r < 0:
                r = made
                made += 1
                level[lg] = r
                g_size[r] = g
                for j in range(nodes // g):
                    s = j * g
                    for x in range(s, s + g):
                        g_off[r, j] += 1 - on[x]
                        g_weight[r, j] += weight[x]
                    if _group_free(busy, s, g):
                        g_count[r] = _push(
                            g_heap[r], g_count[r], (g_off[r, j] * wb + g_weight[r, j]) * nodes + s
                        )
            while g_count[r]:
                top, g_count[r] = _pop(g_heap[r], g_count[r])
                s = top % nodes
                if (top // nodes) % wb == g_weight[r, s // g] and _group_free(busy, s, g):
                    start = s
                    break
        if start < 0:
            continue
        _occupy(occ, fill, busy, start, 0, size[i])
        for j in range(start, start + g):
            taken[j] = 1
        out_n[i] = start
        out_o[i] = 0
    return taken


@njit
def _place_small(
    cluster: Occupancy, cols: Items, items: IntArray, taken: ByteArray, out: Placed
) -> Occupancy:
    """``packing._place_small``: steps 2-4 for the jobs smaller than a node (``items``),
    off the nodes ``taken``, into ``cluster`` and ``out``. Returns the occupancy it
    leaves (the chosen try's arrays, as ``Cluster.take`` adopts them)."""
    occ, fill, busy, on = cluster
    size, pref_node, pref_off, key = cols
    out_n, out_o = out
    nodes, n = occ.shape
    m = size.shape[0]
    fixed = fill > 0
    homeless = np.empty(m, dtype=np.int64)
    homeless_count = 0
    # The items by preferred node, in input order (CSR).
    begin = np.zeros(nodes + 1, dtype=np.int64)
    for i in items:
        p = pref_node[i]
        if p < 0 or taken[p]:
            homeless[homeless_count] = i
            homeless_count += 1
        else:
            begin[p + 1] += 1
    for node in range(nodes):
        begin[node + 1] += begin[node]
    at = begin.copy()
    by_node = np.empty(begin[nodes], dtype=np.int64)
    for i in items:
        p = pref_node[i]
        if p >= 0 and not taken[p]:
            by_node[at[p]] = i
            at[p] += 1

    # Step 2: which running jobs can stay, and nodes they fill exactly.
    stayer = np.zeros(m, dtype=np.bool_)
    stay_size = np.zeros(nodes, dtype=np.int64)
    has_stayers = np.zeros(nodes, dtype=np.bool_)
    mask = np.empty(n, dtype=np.uint8)
    for node in range(nodes):
        here = by_node[begin[node] : begin[node + 1]]
        if not here.shape[0]:
            continue
        for x in range(n):
            mask[x] = occ[node, x]
        total = 0
        for i in _sorted_by(here, key):
            o = pref_off[i]
            free = True
            for x in range(o, o + size[i]):
                if mask[x]:
                    free = False
                    break
            if free:
                for x in range(o, o + size[i]):
                    mask[x] = 1
                stayer[i] = True
                total += size[i]
            else:
                homeless[homeless_count] = i
                homeless_count += 1
        if fill[node] + total == n:
            for x in range(n):
                occ[node, x] = 1
            fill[node] = n
            busy[node] = 1
            for i in here:
                if stayer[i]:
                    out_n[i] = node
                    out_o[i] = pref_off[i]
                    stayer[i] = False
        elif total:
            stay_size[node] = total
            has_stayers[node] = True
    pool = np.empty(nodes, dtype=np.int64)
    pool_count = 0
    for i in range(nodes):
        if not taken[i] and fill[i] < n:
            pool[pool_count] = i
            pool_count += 1
    pool = pool[:pool_count]

    # Step 3: keep the fullest nodes, just enough for the demand; fill their holes.
    demand = 0
    for i in range(nodes):
        demand += stay_size[i]
    for i in homeless[:homeless_count]:
        demand += size[i]
    pool_key = np.empty(pool.shape[0], dtype=np.int64)
    for k in range(pool.shape[0]):
        i = pool[k]
        rest = n - (fill[i] + stay_size[i])
        pool_key[k] = (((0 if fixed[i] else 1) * (n + 1) + rest) * 2 + 1 - on[i]) * nodes + i
    kept = np.empty(pool.shape[0], dtype=np.int64)
    kept_count = 0
    room = 0
    for k in _argsort(pool_key):
        i = pool[k]
        if room >= demand and not fixed[i]:
            if has_stayers[i]:
                for x in range(begin[i], begin[i + 1]):
                    if stayer[by_node[x]]:
                        stayer[by_node[x]] = False
                        homeless[homeless_count] = by_node[x]
                        homeless_count += 1
                has_stayers[i] = False
            continue
        kept[kept_count] = i
        kept_count += 1
        room += n - fill[i]
    kept = kept[:kept_count]
    where = np.full(m, -1, dtype=np.int64)
    for i in kept:
        if has_stayers[i]:
            for x in range(begin[i], begin[i + 1]):
                it = by_node[x]
                if stayer[it]:
                    _occupy(occ, fill, busy, int(i), pref_off[it], size[it])
                    out_n[it] = i
                    out_o[it] = pref_off[it]
                    where[it] = i
    homeless = _sorted_by(homeless[:homeless_count], key)
    need = 0
    for i in homeless:
        need += size[i]
    slack_nodes = _slack_nodes(fill, on, kept, need, n)
    tries = np.full(slack_nodes.shape[0] + 1, -1, dtype=np.int64)
    tries[: slack_nodes.shape[0]] = slack_nodes
    best_occ, best_fill, best_busy = occ, fill, busy
    best_n, best_o, best_where = out_n, out_o, where
    best_left = homeless
    chosen = False
    for slack in tries:
        st_occ, st_fill, st_busy = occ.copy(), fill.copy(), busy.copy()
        got_n, got_o, wh = out_n.copy(), out_o.copy(), where.copy()
        first = np.empty(kept.shape[0], dtype=np.int64)
        n_first = 0
        for i in kept:
            if i != slack:
                first[n_first] = i
                n_first += 1
        first = first[:n_first]
        st = Occupancy(st_occ, st_fill, st_busy, on)
        got = Placed(got_n, got_o)
        leftover = _fill_holes(st, size, homeless, first, got, wh)
        if slack >= 0 and leftover.shape[0]:
            only = np.full(1, slack, dtype=np.int64)
            leftover = _fill_holes(st, size, leftover, only, got, wh)
        partly = 0
        for i in kept:
            if 0 < st_fill[i] < n:
                partly += 1
        good = not leftover.shape[0] and partly <= 1
        if not chosen or good:
            best_occ, best_fill, best_busy = st_occ, st_fill, st_busy
            best_n, best_o, best_where = got_n, got_o, wh
            best_left = leftover
            chosen = True
        if good:
            break
    occ, fill, busy = best_occ, best_fill, best_busy
    out_n[:] = best_n
    out_o[:] = best_o
    where = best_where

    # Step 4: repack the partly used nodes (and leftovers) if more than one remains.
    is_partial = np.zeros(nodes, dtype=np.bool_)
    partial_count = 0
    for i in kept:
        if 0 < fill[i] < n:
            is_partial[i] = True
            partial_count += 1
    if partial_count <= 1 and not best_left.shape[0]:
        return Occupancy(occ, fill, busy, on)
    redo = np.empty(m, dtype=np.int64)
    redo_count = 0
    for i in best_left:
        redo[redo_count] = i
        redo_count += 1
    for it in range(m):
        node = where[it]
        if node >= 0 and is_partial[node] and out_n[it] == node:
            _release(occ, fill, busy, node, out_o[it], size[it])
            out_n[it] = -1
            out_o[it] = -1
            redo[redo_count] = it
            redo_count += 1
    room = 0
    for i in kept:
        if is_partial[i]:
            room += n - fill[i]
    need = 0
    for i in redo[:redo_count]:
        need += size[i]
    chosen_nodes = np.empty(nodes, dtype=np.int64)
    chosen_count = 0
    for i in kept:
        if is_partial[i]:
            chosen_nodes[chosen_count] = i
            chosen_count += 1
    spare = np.empty(pool.shape[0], dtype=np.int64)
    spare_count = 0
    for i in pool:
        if fill[i] == 0:
            spare[spare_count] = i
            spare_count += 1
    spare = spare[:spare_count]
    spare_key = np.empty(spare_count, dtype=np.int64)
    for k in range(spare_count):
        spare_key[k] = (1 - on[spare[k]]) * nodes + spare[k]
    for k in _argsort(spare_key):
        i = spare[k]
        if room >= need:
            break
        chosen_nodes[chosen_count] = i
        chosen_count += 1
        room += n
    result = Occupancy(occ, fill, busy, on)
    _best_fit(
        result, cols, _sorted_by(redo[:redo_count], key), _sorted(chosen_nodes[:chosen_count]), out
    )
    return result


@njit
def _slack_nodes(fill: IntArray, on: ByteArray, kept: IntArray, demand: int, n: int) -> IntArray:
    """``packing._slack_nodes``, its first three: kept nodes that could stay the partly
    used one, best first (the fullest, then powered off, then the last)."""
    nodes = fill.shape[0]
    slack = -demand
    for i in kept:
        slack += n - fill[i]
    if not 0 < slack < n:
        return kept[:0]
    fits = np.empty(kept.shape[0], dtype=np.int64)
    n_fits = 0
    for i in kept:
        if fill[i] <= n - slack:
            fits[n_fits] = i
            n_fits += 1
    fits = fits[:n_fits]
    keys = np.empty(fits.shape[0], dtype=np.int64)
    for k in range(fits.shape[0]):
        i = fits[k]
        keys[k] = ((n - fill[i]) * 2 + on[i]) * nodes + (nodes - 1 - i)
    order = _argsort(keys)
    out = np.empty(min(3, n_fits), dtype=np.int64)
    for k in range(out.shape[0]):
        out[k] = fits[order[k]]
    return out


@njit
def _fill_holes(
    cluster: Occupancy,
    size: IntArray,
    items: IntArray,
    nodes: IntArray,
    out: Placed,
    where: IntArray,
) -> IntArray:
    """``packing._fill_holes``: best fit by free room on ``nodes``, largest item first;
    returns what found no hole (``where``: each placed item's node)."""
    occ, fill = cluster.occ, cluster.fill
    n = occ.shape[1]
    decreasing = not items.shape[0] or size[items[0]] < n
    for k in range(1, items.shape[0]):
        if size[items[k - 1]] < size[items[k]]:
            decreasing = False
            break
    empty = True
    for node in nodes:
        if fill[node]:
            empty = False
            break
    if decreasing and empty:
        return _fill_in_order(cluster, size, items, nodes, out, where)
    return _fill_by_heaps(cluster, size, items, nodes, out, where)


@njit
def _fill_by_heaps(
    cluster: Occupancy,
    size: IntArray,
    items: IntArray,
    nodes: IntArray,
    out: Placed,
    where: IntArray,
) -> IntArray:
    """``packing._fill_by_heaps``: per block size, a heap of (room, node, version) as one
    integer; a node's entries of an older version are stale."""
    occ, fill, busy = cluster.occ, cluster.fill, cluster.busy
    out_n, out_o = out
    total, n = occ.shape
    levels = _bit_length(n)
    vb = items.shape[0] + 1  # versions stay below this
    heaps = np.empty((levels, nodes.shape[0] + items.shape[0] + 1), dtype=np.int64)
    counts = np.zeros(levels, dtype=np.int64)
    version = np.zeros(total, dtype=np.int64)
    for node in nodes:
        _push_node(occ, fill, heaps, counts, version, node, vb)
    leftover = np.empty(items.shape[0], dtype=np.int64)
    left = 0
    for it in items:
        k = _bit_length(size[it]) - 1
        heap = heaps[k]
        while counts[k] and heap[0] % vb != version[(heap[0] // vb) % total]:
            _, counts[k] = _pop(heap, counts[k])
        if not counts[k]:
            leftover[left] = it
            left += 1
            continue
        node = (heap[0] // vb) % total
        off = _first_free(occ, node, size[it])
        _occupy(occ, fill, busy, node, off, size[it])
        out_n[it] = node
        out_o[it] = off
        where[it] = node
        version[node] += 1
        _push_node(occ, fill, heaps, counts, version, node, vb)
    return leftover[:left]


@njit
def _push_node(
    occ: ByteArray,
    fill: IntArray,
    heaps: IntArray,
    counts: IntArray,
    version: IntArray,
    node: int,
    vb: int,
) -> None:
    total, n = occ.shape
    entry = ((n - fill[node]) * total + node) * vb + version[node]
    for k in range(_bit_length(_largest_free(occ, node))):
        counts[k] = _push(heaps[k], counts[k], entry)


@njit
def _sorted(values: IntArray) -> IntArray:
    """``values`` (distinct) in increasing order."""
    order = _argsort(values)
    out = np.empty(values.shape[0], dtype=np.int64)
    for k in range(values.shape[0]):
        out[k] = values[order[k]]
    return out


@njit
def _fill_in_order(
    cluster: Occupancy,
    size: IntArray,
    items: IntArray,
    nodes: IntArray,
    out: Placed,
    where: IntArray,
) -> IntArray:
    """``packing._fill_in_order``: empty nodes, items in decreasing size."""
    occ, fill, busy = cluster.occ, cluster.fill, cluster.busy
    out_n, out_o = out
    n = occ.shape[1]
    order = _sorted(nodes)
    opened = 0
    node = -1
    used = n
    for k in range(items.shape[0]):
        it = items[k]
        if used == n:
            if opened == order.shape[0]:
                _close(occ, fill, busy, order, opened, used)
                return items[k:]
            node = order[opened]
            opened += 1
            used = 0
        out_n[it] = node
        out_o[it] = used
        where[it] = node
        used += size[it]
    _close(occ, fill, busy, order, opened, used)
    return items[:0]


@njit
def _close(
    occ: ByteArray, fill: IntArray, busy: ByteArray, order: IntArray, opened: int, used: int
) -> None:
    """What occupying each block in turn does: every node opened is taken from GPU 0
    up, all of it but the last, which holds ``used`` GPUs."""
    n = occ.shape[1]
    for k in range(opened):
        node = order[k]
        take = n if k < opened - 1 else used
        for x in range(take):
            occ[node, x] = 1
        fill[node] = take
        busy[node] = 1


@njit
def _best_fit(
    cluster: Occupancy, cols: Items, items: IntArray, nodes: IntArray, out: Placed
) -> None:
    """``packing._best_fit``: decreasing-size best fit of ``items`` over ``nodes``
    (sorted), into ``cluster`` and ``out``. The open nodes of each fill are a sorted row
    of ``bucket``; the empty ones a heap of (powered off, -weight, node) as one integer."""
    occ, fill, busy, on = cluster
    size, pref_node, pref_off = cols.size, cols.pref_node, cols.pref_off
    out_n, out_o = out
    total, n = occ.shape
    in_set = np.zeros(total, dtype=np.bool_)
    for i in nodes:
        in_set[i] = True
    weight = np.zeros(total, dtype=np.int64)
    reserved = np.zeros((total, n), dtype=np.int64)
    for it in items:
        p = pref_node[it]
        if p >= 0 and in_set[p]:
            weight[p] += size[it]
            for x in range(pref_off[it], pref_off[it] + size[it]):
                reserved[p, x] += 1
    wb = 1  # weights only fall: every key's weight is below this
    for i in range(total):
        wb += weight[i]
    bucket = np.empty((n, nodes.shape[0]), dtype=np.int64)
    in_bucket = np.zeros(n, dtype=np.int64)
    for i in nodes:
        f = fill[i]
        if 0 < f < n:
            bucket[f, in_bucket[f]] = i
            in_bucket[f] += 1
    empty = np.empty(nodes.shape[0] + items.shape[0] + 1, dtype=np.int64)
    count = 0
    for i in nodes:
        if fill[i] == 0:
            count = _push(empty, count, ((1 - on[i]) * wb + wb - 1 - weight[i]) * total + i)
    for it in items:
        s = size[it]
        p = pref_node[it]
        has_p = p >= 0 and in_set[p]
        po = pref_off[it]
        if has_p:
            weight[p] -= s
            for x in range(po, po + s):
                reserved[p, x] -= 1
            if fill[p] == 0:
                count = _push(empty, count, ((1 - on[p]) * wb + wb - 1 - weight[p]) * total + p)
        t_node = -1
        t_off = -1
        if has_p and fill[p] > 0 and _is_free(occ, busy, p, po, s):
            t_node, t_off = p, po
        if t_node < 0:
            t_node, t_off = _fullest_with_room(occ, fill, bucket, in_bucket, s, has_p, p, reserved)
        if t_node < 0 and has_p and fill[p] == 0:
            t_node, t_off = p, po
        while t_node < 0 and count:
            top, count = _pop(empty, count)
            node = top % total
            if fill[node] == 0 and wb - 1 - (top // total) % wb == weight[node]:
                o = _best_offset(occ, node, s, reserved)
                if o >= 0:
                    t_node, t_off = node, o
        if t_node < 0:
            continue
        before = fill[t_node]
        _occupy(occ, fill, busy, t_node, t_off, s)
        out_n[it] = t_node
        out_o[it] = t_off
        if before > 0:
            _remove(bucket[before], in_bucket, before, t_node)
        if fill[t_node] < n:
            _insert(bucket[fill[t_node]], in_bucket, fill[t_node], t_node)


@njit
def _remove(row: IntArray, counts: IntArray, f: int, x: int) -> None:
    """Take ``x`` out of the sorted ``row[:counts[f]]``."""
    k = 0
    while row[k] != x:
        k += 1
    for j in range(k, counts[f] - 1):
        row[j] = row[j + 1]
    counts[f] -= 1


@njit
def _insert(row: IntArray, counts: IntArray, f: int, x: int) -> None:
    """Put ``x`` into the sorted ``row[:counts[f]]``, after equal ones (``insort``)."""
    k = counts[f]
    while k > 0 and row[k - 1] > x:
        row[k] = row[k - 1]
        k -= 1
    row[k] = x
    counts[f] += 1


@njit
def _fullest_with_room(
    occ: ByteArray,
    fill: IntArray,
    bucket: IntArray,
    in_bucket: IntArray,
    size: int,
    has_p: bool,
    p: int,
    reserved: IntArray,
) -> tuple[int, int]:
    """``packing._fullest_with_room``: the most filled open node with a free aligned
    block, its own node first on ties; (-1, -1) for none."""
    n = occ.shape[1]
    for f in range(n - size, 0, -1):
        row = bucket[f, : in_bucket[f]]
        if not row.shape[0]:
            continue
        own = False
        if has_p and fill[p] == f:
            for node in row:
                if node == p:
                    own = True
                    break
        if own:
            o = _best_offset(occ, p, size, reserved)
            if o >= 0:
                return p, o
        for node in row:
            if own and node == p:
                continue
            o = _best_offset(occ, node, size, reserved)
            if o >= 0:
                return node, o
    return -1, -1


# --- the whole placement ----------------------------------------------------------


class Blocks(NamedTuple):
    """Every aligned block of a cluster shape by its integer id (``block_id``): its first
    node, its offset on that node and its size (0 where no block has that id)."""

    node: IntArray
    offset: IntArray
    size: IntArray


@njit
def block_id(node: int, offset: int, size: int, nodes: int, per_node: int) -> int:
    """The id of an aligned block: inside one node, ``node * 2N`` plus its place in the
    node's buddy tree (``N / size + offset / size``, 1 to ``2N - 1``); a group of
    ``g = 2**k`` whole nodes (``k >= 1``), ``nodes * 2N + k * nodes + node / g``."""
    if size <= per_node:
        return node * 2 * per_node + per_node // size + offset // size
    g = size // per_node
    return nodes * 2 * per_node + (_bit_length(g) - 1) * nodes + node // g


class Requests(NamedTuple):
    """The requests' columns, per request ``k``: its GPU count ``size[k]``, the
    immovable block ``fixed[k]`` (-1: movable), whether it is ``admitted`` (0/1), its
    preferred block ``pref[k]`` (-1: none), whether that is the block it ``kept``
    (0/1), what its current GPUs are (``cur[k]``: a block's id, -1 not one block, -2
    none) and ``rank[k]``, the job's place among the job ids in sorted order."""

    size: IntArray
    fixed: IntArray
    admitted: ByteArray
    pref: IntArray
    kept: ByteArray
    cur: IntArray
    rank: IntArray


@njit
def place(
    blocks: Blocks, on: ByteArray, per_node: int, requests: Requests
) -> tuple[IntArray, ByteArray, ByteArray]:
    """``placement._place`` after its checks, over the ``requests`` on nodes ``on``
    (powered on, 0/1) of ``per_node`` GPUs each.

    Returns per request the id of its block (-1: unplaced) and its migration flag
    (1: a migration; 2: its current GPUs are not one block, Python decides with
    ``is_migration``), and per node whether it ends with no GPU assigned; all three
    empty when two immovable blocks overlap.
    """
    size, fixed, admitted, pref, kept, cur, rank = requests
    nodes = on.shape[0]
    n = per_node
    jobs = size.shape[0]
    occ = np.zeros((nodes, n), dtype=np.uint8)
    fill = np.zeros(nodes, dtype=np.int64)
    busy = np.zeros(nodes, dtype=np.uint8)
    got = np.full(jobs, -1, dtype=np.int64)
    count = 0
    for k in range(jobs):
        b = fixed[k]
        if b >= 0:
            if not _is_free(occ, busy, blocks.node[b], blocks.offset[b], blocks.size[b]):
                return got[:0], kept[:0], on[:0]
            _occupy(occ, fill, busy, blocks.node[b], blocks.offset[b], blocks.size[b])
            got[k] = b
        elif admitted[k]:
            count += 1
    items = np.empty(count, dtype=np.int64)
    it_size = np.empty(count, dtype=np.int64)
    it_node = np.empty(count, dtype=np.int64)
    it_off = np.empty(count, dtype=np.int64)
    it_rank = np.empty(count, dtype=np.int64)
    j = 0
    for k in range(jobs):
        if fixed[k] < 0 and admitted[k]:
            items[j] = k
            it_size[j] = size[k]
            p = pref[k]
            it_node[j] = blocks.node[p] if p >= 0 else -1
            it_off[j] = blocks.offset[p] if p >= 0 else -1
            it_rank[j] = rank[k]
            j += 1
    if count:
        out_n, out_o = _allocate(Occupancy(occ, fill, busy, on), it_size, it_node, it_off, it_rank)
        for j in range(count):
            if out_n[j] >= 0:
                got[items[j]] = block_id(out_n[j], out_o[j], it_size[j], nodes, n)
    idle = np.ones(nodes, dtype=np.uint8)
    mig = np.zeros(jobs, dtype=np.uint8)
    for k in range(jobs):
        b = got[k]
        if b < 0:
            continue
        first = blocks.node[b]
        last = first + (blocks.size[b] // n if blocks.size[b] > n else 1)
        for x in range(first, last):
            idle[x] = 0
        c = cur[k]
        if fixed[k] >= 0 or c == -2 or (kept[k] and pref[k] == b):
            continue
        if c == -1:
            mig[k] = 2
            continue
        lo_a = blocks.node[c] * n + blocks.offset[c]
        lo_b = blocks.node[b] * n + blocks.offset[b]
        if lo_a + blocks.size[c] <= lo_b or lo_b + blocks.size[b] <= lo_a:
            mig[k] = 1  # aligned blocks nest or are disjoint: disjoint ones mean a move
    return got, mig, idle


@njit
def _allocate(
    cluster: Occupancy, size: IntArray, pref_node: IntArray, pref_off: IntArray, rank: IntArray
) -> tuple[IntArray, IntArray]:
    """``packing.allocate`` of the items (``size``, preferred ``pref_node``/``pref_off``,
    ``rank``) on ``cluster``, left as it is: ``packing._once`` (step 0 unless steps 1-4
    do better) iterated to the fixed point, in one function (numba optimises a function
    together with every function it calls, so each level of calls costs its whole
    subtree's compilation again)."""
    occ, fill, busy, on = cluster
    nodes, n = occ.shape
    m = size.shape[0]
    best_n = pref_node
    best_o = pref_off
    best = (0, 0, 0)
    first = True
    while True:
        # ``_once`` with the preferences ``pref_node``/``pref_off``:
        key = _item_keys(size, pref_node, rank)
        cols = Items(size, pref_node, pref_off, key)
        new_jobs = 0
        for i in range(m):
            if pref_node[i] < 0:
                new_jobs += 1
        kept_n = pref_node[:0]
        kept_o = pref_off[:0]
        kept_m = (0, 0, 0)
        have_kept = False
        if not new_jobs:
            kept_n, kept_o, kept_m = _keep(cluster, cols)
            have_kept = True
        if have_kept and kept_m[0] == 0 and kept_m[2] <= 1:
            out_n, out_o, metrics = kept_n, kept_o, kept_m
        else:
            s = Occupancy(occ.copy(), fill.copy(), busy.copy(), on)
            out_n = np.full(m, -1, dtype=np.int64)
            out_o = np.full(m, -1, dtype=np.int64)
            out = Placed(out_n, out_o)
            big = np.empty(m, dtype=np.int64)
            small = np.empty(m, dtype=np.int64)
            n_big = 0
            n_small = 0
            for i in range(m):
                if size[i] >= n:
                    big[n_big] = i
                    n_big += 1
                else:
                    small[n_small] = i
                    n_small += 1
            taken = np.zeros(nodes, dtype=np.uint8)
            if n_big:
                weight = np.zeros(nodes, dtype=np.int64)
                for i in range(m):
                    node = pref_node[i]
                    if node < 0:
                        continue
                    if size[i] <= n:
                        weight[node] += size[i]
                    else:
                        for j in range(node, node + size[i] // n):
                            weight[j] += n
                taken = _place_big(s, cols, _sorted_by(big[:n_big], key), weight, out)
            s = _place_small(s, cols, small[:n_small], taken, out)
            metrics = _metrics(s.fill, n, m, out_n)
            if not have_kept and metrics[0] >= new_jobs:
                kept_n, kept_o, kept_m = _keep(cluster, cols)
                have_kept = True
            if have_kept and not _less(metrics, kept_m):
                out_n, out_o, metrics = kept_n, kept_o, kept_m
        # ``allocate``'s loop: place the answer again while that does strictly better.
        if not first and not _less(metrics, best):
            break
        first = False
        best_n, best_o, best = out_n, out_o, metrics
        if not (best[0] or best[2] > 1):
            break
        pref_node, pref_off = best_n, best_o
    return best_n, best_o
