"""The compiled placement (``placement._place_compiled``) answers as the Python one does.

``placement._place_python`` is the specification: the steps of ``packing.py`` one by
one. Random clusters (powered-off nodes, node counts that are not powers of two, one
to eight GPUs a node) get random requests: new jobs, jobs that keep, shrink or grow
their blocks, jobs whose GPUs are shifted, scattered, on unknown nodes or not in
order, whole-node groups, immovable jobs (valid, overlapping, not blocks), more
demand than GPUs and counts larger than any block. Both paths must return equal
results, or raise the same error; the compiled path must answer (not hand the case
to Python) wherever it claims to.
"""

from __future__ import annotations

import random

import pytest

from powerflow.core.errors import PlacementError
from powerflow.core.gpus import A100
from powerflow.core.policy import placement
from powerflow.core.policy.buddy import Geometry, block_id, geometry
from powerflow.core.policy.placement import PlacementResult
from powerflow.core.policy.snapshot import GpuSlot, Node

Case = tuple[list[Node], list[str], list[int], list[tuple[GpuSlot, ...]], list[bool]]


def random_block(rng: random.Random, geo: Geometry, size: int) -> tuple[GpuSlot, ...]:
    """The slots of a random aligned block of ``size`` (a group sorted by name, index)."""
    n = geo.per_node
    if size <= n:
        node = rng.randrange(geo.num_nodes)
        off = rng.randrange(n // size) * size
        return tuple((geo.names[node], i) for i in range(off, off + size))
    g = size // n
    start = rng.randrange(geo.num_nodes // g) * g
    return tuple(sorted((geo.names[x], i) for x in range(start, start + g) for i in range(n)))


def random_current(rng: random.Random, geo: Geometry, size: int) -> tuple[GpuSlot, ...]:
    kind = rng.random()
    top = geo.max_block
    if kind < 0.25:
        return ()
    if kind < 0.7:
        return random_block(rng, geo, size)  # keeps its block
    if kind < 0.85:
        other = rng.choice([s for s in (size // 2, size * 2) if 1 <= s <= top] or [size])
        return random_block(rng, geo, other)  # it shrinks or grows
    if kind < 0.92:
        slots = list(random_block(rng, geo, size))
        rng.shuffle(slots)
        return tuple(slots)  # its block, not in order
    names = [*geo.names, "gone"]
    return tuple(
        (rng.choice(names), rng.randrange(-1, geo.per_node + 1))
        for _ in range(rng.randint(1, 2 * size))
    )


def random_case(rng: random.Random) -> Case:
    per_node = rng.choice([1, 2, 4, 8])
    count = rng.choice([1, 2, 3, 4, 5, 6, 8, 11, 16])
    p_off = rng.choice([0.0, 0.3, 1.0])
    nodes = [Node(f"n{i:02d}", per_node, A100, rng.random() >= p_off) for i in range(count)]
    geo = geometry(nodes)
    sizes = [1 << k for k in range((geo.max_block * 2).bit_length())]
    jobs = rng.randint(1, 3 * count)
    ids = [f"j{rng.randrange(10**6):06d}" for _ in range(jobs)]
    ids = list(dict.fromkeys(ids))
    gpus = [rng.choice(sizes) if rng.random() < 0.3 else rng.choice(sizes[:3]) for _ in ids]
    currents = [random_current(rng, geo, min(n, geo.max_block)) for n in gpus]
    movable = [True] * len(ids)
    if rng.random() < 0.5:
        # Pinned jobs on blocks, usually disjoint ones (taken one by one on a map).
        used: set[GpuSlot] = set()
        for k in rng.sample(range(len(ids)), rng.randint(1, len(ids))):
            n = min(gpus[k], geo.max_block)
            slots = random_block(rng, geo, n)
            if used.isdisjoint(slots) or rng.random() < 0.05:
                gpus[k], currents[k], movable[k] = n, slots, False
                used.update(slots)
            elif rng.random() < 0.03:
                movable[k] = False  # whatever it holds: usually not a block
    if rng.random() < 0.05:
        currents[0] = list(currents[0])  # type: ignore[call-overload]  # a list
    return nodes, ids, gpus, currents, movable


def answer(fn: object, case: Case) -> PlacementResult | str:
    try:
        return fn(*case)  # type: ignore[operator, no-any-return]
    except PlacementError as exc:
        return str(exc)


def python(*case: object) -> PlacementResult:
    nodes, ids, gpus, currents, movables = case
    placement._no_duplicates(ids)  # type: ignore[arg-type]
    return placement._place_python(geometry(nodes), ids, gpus, currents, movables)  # type: ignore[arg-type]


def compare(seed: int) -> bool:
    """Whether the compiled path answered case ``seed`` itself (it must agree either way)."""
    case = random_case(random.Random(seed))
    if seed % 2:
        # The geometry's own slot tuples, as a running job hands back what it was given
        # (``BlockTable.by_identity``); the rest are equal tuples built anew.
        table = geometry(case[0]).block_table
        owned = {run: run for run in table.slots if run is not None}
        case = (*case[:3], [owned.get(c, c) if type(c) is tuple else c for c in case[3]], case[4])
    want = answer(python, case)
    got = answer(placement.place_columns, case)
    assert got == want, f"seed {seed}"
    if isinstance(want, str):
        return False
    nodes, ids, gpus, currents, movables = case
    direct = placement._place_compiled(geometry(nodes), ids, gpus, currents, movables)
    if direct is not None:
        assert direct == want, f"seed {seed}"
    return direct is not None


def test_the_compiled_placement_answers_as_the_python_one() -> None:
    answered = sum(compare(seed) for seed in range(300))
    assert answered > 200  # most cases run compiled, not handed back to Python


def test_a_placement_with_migrations_unplaced_jobs_and_pinned_ones() -> None:
    nodes = [Node(f"n{i}", 4, A100, powered_on=i != 2) for i in range(3)]
    n0 = tuple(("n0", i) for i in range(4))
    n1 = tuple(("n1", i) for i in range(4))
    case: Case = (
        nodes,
        ["pinned", "grows", "moves", "new", "toolarge"],
        [2, 4, 4, 2, 16],
        [(("n1", 2), ("n1", 3)), (("n0", 0), ("n0", 1)), n1, (), ()],
        [False, True, True, True, True],
    )
    want = answer(python, case)
    assert isinstance(want, PlacementResult)
    assert want.migrations and want.unplaced  # the rare paths are taken
    direct = placement._place_compiled(geometry(nodes), *case[1:])
    assert direct == want
    assert want.assignments["grows"] == n0


def test_overlapping_immovable_jobs_raise_the_python_path_s_error() -> None:
    nodes = [Node("a", 4, A100), Node("b", 4, A100)]
    pair = (("a", 0), ("a", 1))
    case: Case = (nodes, ["x", "y"], [2, 2], [pair, pair], [False, False])
    assert placement._place_compiled(geometry(nodes), *case[1:]) is None
    with pytest.raises(PlacementError, match="y overlaps"):
        placement.place_columns(*case)


def test_block_ids_are_distinct_and_name_their_blocks() -> None:
    nodes = [Node(f"n{i}", 4, A100) for i in range(6)]
    geo = geometry(nodes)
    table = geo.block_table
    ids = [k for k in table.ids.values() if k >= 0]
    assert len(ids) == len(set(ids)) == len(table.ids) - 1
    for run, k in table.ids.items():
        if k >= 0:
            block = (table.node[k], table.offset[k], table.size[k])
            assert k == block_id(block, 6, 4)  # type: ignore[arg-type]
            assert table.slots[k] == run


def test_the_same_nodes_tuple_gets_its_geometry_again_and_another_its_own() -> None:
    up = tuple(Node(f"n{i}", 8, A100) for i in range(4))
    down = (*up[:3], Node("n3", 8, A100, powered_on=False))
    first = placement._geometry(up)
    assert placement._geometry(up) is first and first == geometry(up)
    assert placement._geometry(down) == geometry(down) != first  # numbered anew
    assert placement._geometry(list(up)) == first  # a list may change: never reused
    for nodes in (up, down, up):  # the placement follows the nodes handed in
        got = placement.place_columns(nodes, ["a"], [8], [()], [True])
        assert got == placement._place_python(geometry(nodes), ["a"], [8], [()], [True])
