"""The allocator's fast searches choose exactly what the plain searches they replace chose.

``packing.py`` finds free node groups through heaps (``_FreeGroups``) and
fills empty nodes in order when best fit has one answer (``_fill_in_order``).
The references are the plain searches: a scan over every aligned group
(kept here as the specification), and best fit through a heap per block size
(``packing._fill_by_heaps``, the general path). Random clusters with
powered-off nodes, immovable jobs, preferred blocks (free, taken, colliding)
and the weights other jobs put on nodes must give identical results, step by
step and for a whole ``allocate``.
"""

from __future__ import annotations

import heapq
import random

import pytest

from powerflow.core.policy import packing
from powerflow.core.policy.buddy import Block, Geometry
from powerflow.core.policy.packing import (
    Cluster,
    Item,
    Metrics,
    allocate,
    in_sort_order,
    sort_key,
)


def place_big_scan(
    cluster: Cluster, items: list[Item], weight: list[int], placed: dict[str, Block]
) -> bytearray:
    """``packing._place_big`` as a scan over every aligned group for each job."""
    geo = cluster.geo
    off = [0 if on else 1 for on in geo.powered_on]
    taken = bytearray(geo.num_nodes)
    heap = [(off[i], weight[i], i) for i in range(geo.num_nodes) if not cluster.busy[i]]
    heapq.heapify(heap)
    for it in items:
        g = it.size // geo.per_node
        packing._add_weight(geo, weight, it, -1)
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


def geometry(rng: random.Random) -> Geometry:
    per_node = rng.choice([1, 2, 4, 8])
    num_nodes = rng.choice([1, 2, 3, 5, 8, 12, 16, 23, 32, 40, 64])
    p_off = rng.choice([0.0, 0.2, 0.5, 1.0])
    names = tuple(f"n{i}" for i in range(num_nodes))
    on = tuple(rng.random() >= p_off for _ in names)
    return Geometry(names, {x: i for i, x in enumerate(names)}, per_node, on)


def random_block(rng: random.Random, geo: Geometry, size: int) -> Block | None:
    n = geo.per_node
    if size < n:
        return Block(rng.randrange(geo.num_nodes), rng.randrange(0, n, size), size)
    g = size // n
    if g > geo.num_nodes:
        return None
    return Block(rng.randrange(0, geo.num_nodes - g + 1, g), 0, size)


def random_case(rng: random.Random) -> tuple[Cluster, list[Item]]:
    """A cluster holding some immovable jobs, and movable jobs of every size to place."""
    geo = geometry(rng)
    n = geo.per_node
    cluster = Cluster(geo)
    for _ in range(rng.randrange(geo.num_nodes + 1) // rng.choice([1, 2, 4])):
        size = rng.choice([s for s in (1, 2, 4, 8, 16) if s <= 2 * n])
        b = random_block(rng, geo, size)
        if b is not None and cluster.is_free(b):
            cluster.occupy(b)
    sizes = [1 << k for k in range((n * geo.num_nodes).bit_length() + 1)]
    items: list[Item] = []
    for k in range(rng.randrange(1, 3 * geo.num_nodes + 3)):
        size = rng.choice(sizes)
        pref = random_block(rng, geo, size) if rng.random() < rng.choice([0.3, 0.7, 1.0]) else None
        items.append(Item(f"j{k:03d}", size, pref))
    return cluster, items


def weights(geo: Geometry, items: list[Item]) -> list[int]:
    """What ``_once`` hands ``_place_big``: GPUs every job's preferred block holds per node."""
    weight = [0] * geo.num_nodes
    for it in items:
        packing._add_weight(geo, weight, it, +1)
    return weight


@pytest.mark.parametrize(("seed", "shuffled"), [(s, s % 2 == 1) for s in range(8)])
def test_place_big_chooses_what_the_scan_over_every_group_chose(seed: int, shuffled: bool) -> None:
    """In ``sort_key`` order as ``_once`` calls it, and in any order.

    In decreasing size a group's weight only changes once no job of its size
    can take it any more; in other orders it changes while smaller groups'
    jobs are placed, which exercises the index's updates and stale entries.
    """
    rng = random.Random(seed)
    for _ in range(400):
        cluster, items = random_case(rng)
        geo = cluster.geo
        big = sorted((it for it in items if it.size >= geo.per_node), key=sort_key)
        if shuffled:
            rng.shuffle(big)
        want_state, got_state = cluster.copy(), cluster.copy()
        want_weight, got_weight = weights(geo, items), weights(geo, items)
        want: dict[str, Block] = {}
        got: dict[str, Block] = {}
        want_taken = place_big_scan(want_state, big, want_weight, want)
        got_taken = packing._place_big(got_state, big, got_weight, got)
        assert got == want
        assert got_taken == want_taken
        assert got_weight == want_weight
        assert (got_state.occ, got_state.fill, got_state.busy) == (
            want_state.occ,
            want_state.fill,
            want_state.busy,
        )


@pytest.mark.parametrize("seed", range(8))
def test_fill_holes_fills_as_best_fit_by_heaps_does(seed: int) -> None:
    """Empty nodes or not, decreasing sizes or not: ``_fill_in_order`` only where it agrees."""
    rng = random.Random(200 + seed)
    for _ in range(400):
        cluster, items = random_case(rng)
        geo = cluster.geo
        n = geo.per_node
        small = sorted((it for it in items if it.size < n), key=sort_key)
        if rng.random() < 0.2:
            rng.shuffle(small)
        empty = [i for i in range(geo.num_nodes) if cluster.fill[i] == 0]
        pool = empty if rng.random() < 0.7 else list(range(geo.num_nodes))
        nodes = rng.sample(pool, rng.randrange(len(pool) + 1))
        before = {nodes[0]: [small[0]]} if nodes and small and rng.random() < 0.3 else {}
        want_state, got_state = cluster.copy(), cluster.copy()
        want: dict[str, Block] = {"other": Block(0, 0, 1)}
        got = dict(want)
        want_on = {k: list(v) for k, v in before.items()}
        got_on = {k: list(v) for k, v in before.items()}
        want_left = packing._fill_by_heaps(want_state, small, nodes, want, want_on)
        got_left = packing._fill_holes(got_state, small, nodes, got, got_on)
        assert got_left == want_left
        assert got == want
        assert got_on == want_on
        assert (got_state.occ, got_state.fill, got_state.busy) == (
            want_state.occ,
            want_state.fill,
            want_state.busy,
        )


def test_in_sort_order_is_the_order_of_sort_key() -> None:
    """Sizes, running or new, ids, and equal keys (same id twice) left in input order."""
    rng = random.Random(7)
    for _ in range(300):
        items = [
            Item(
                f"j{rng.randrange(30)}",
                rng.choice([1, 2, 4, 8, 16]),
                Block(rng.randrange(4), 0, 1) if rng.random() < 0.5 else None,
            )
            for _ in range(rng.randrange(40))
        ]
        got = in_sort_order(iter(items))
        want = sorted(items, key=sort_key)
        assert [id(it) for it in got] == [id(it) for it in want]


@pytest.mark.parametrize("seed", range(4))
def test_allocate_is_unchanged_by_the_fast_searches(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(100 + seed)
    cases = [random_case(rng) for _ in range(300)]
    cases += [(Cluster(c.geo), items) for c, items in cases[:100]]  # nothing immovable
    got = [allocate(c.copy(), items) for c, items in cases]
    monkeypatch.setattr(packing, "_place_big", place_big_scan)
    monkeypatch.setattr(packing, "_fill_holes", packing._fill_by_heaps)
    want = [allocate(c.copy(), items) for c, items in cases]
    assert got == want


def keep_sorted_by_occupying(
    cluster: Cluster, items: list[Item]
) -> tuple[dict[str, Block], Metrics]:
    """``packing._keep`` as the rule says it: on a copy of the cluster, every
    preferred block in ``sort_key`` order that is still free is occupied."""
    state = cluster.copy()
    kept: dict[str, Block] = {}
    for it in sorted(items, key=sort_key):
        if it.pref is not None and state.is_free(it.pref):
            state.occupy(it.pref)
            kept[it.job_id] = it.pref
    return kept, packing._metrics(state, items, kept)


@pytest.mark.parametrize("seed", range(4))
def test_keep_keeps_what_occupying_in_sort_order_keeps(seed: int) -> None:
    """Free, taken and colliding preferred blocks, with and without immovable jobs:
    the sorted pass keeps the same blocks in the same order, and ``_keep`` (input
    order first) the same blocks."""
    rng = random.Random(300 + seed)
    for _ in range(400):
        cluster, items = random_case(rng)
        if rng.random() < 0.3:
            cluster = Cluster(cluster.geo)
        want = keep_sorted_by_occupying(cluster, items)
        got = packing._keep_in_order(cluster, items, ordered=True)
        assert list(got[0].items()) == list(want[0].items())
        assert got == want
        assert packing._keep(cluster, items) == want
