"""Placement: network packing, buddy blocks, the one-partial-node guarantee, stability."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerflow.core.errors import PlacementError
from powerflow.core.gpus import A100
from powerflow.core.policy.placement import (
    PlacementRequest,
    PlacementResult,
    place,
    reserve_block,
)
from powerflow.core.policy.snapshot import GpuSlot, Node

pytestmark = pytest.mark.usefixtures("compiled_placement")


def cluster(count: int, per_node: int = 8, off: Sequence[int] = ()) -> list[Node]:
    return [Node(f"n{i}", per_node, A100, powered_on=i not in off) for i in range(count)]


def req(
    job: str, gpus: int, current: Sequence[GpuSlot] = (), movable: bool = True
) -> PlacementRequest:
    return PlacementRequest(job, gpus, tuple(current), movable)


def block(node: str, start: int, size: int) -> tuple[GpuSlot, ...]:
    return tuple((node, i) for i in range(start, start + size))


def node_use(nodes: Sequence[Node], result: PlacementResult) -> dict[str, int]:
    use = Counter(name for slots in result.assignments.values() for name, _ in slots)
    return {n.name: use[n.name] for n in nodes}


def partial_nodes(nodes: Sequence[Node], result: PlacementResult) -> list[str]:
    per = {n.name: n.gpus for n in nodes}
    return [name for name, u in node_use(nodes, result).items() if 0 < u < per[name]]


def check_valid(
    nodes: Sequence[Node], requests: Sequence[PlacementRequest], result: PlacementResult
) -> None:
    """Every rule a result must obey, checked from scratch (not with the module's helpers)."""
    per_node = nodes[0].gpus
    position = {n.name: i for i, n in enumerate(nodes)}
    by_id = {r.job_id: r for r in requests}
    assert set(result.assignments) | set(result.unplaced) == set(by_id)
    assert not set(result.assignments) & set(result.unplaced)
    every = [s for slots in result.assignments.values() for s in slots]
    assert len(every) == len(set(every)), "two jobs on one GPU"
    assert len(every) <= per_node * len(nodes), "over capacity"
    for job, slots in result.assignments.items():
        r = by_id[job]
        assert list(slots) == sorted(slots)
        assert len(slots) == r.gpus
        assert all(name in position and 0 <= i < per_node for name, i in slots)
        names = sorted({name for name, _ in slots}, key=position.__getitem__)
        if r.gpus <= per_node:
            assert len(names) == 1, f"{job} of {r.gpus} GPUs spans nodes"
            first = min(i for _, i in slots)
            assert first % r.gpus == 0, f"{job} is not aligned"
            assert sorted(i for _, i in slots) == list(range(first, first + r.gpus))
        else:
            g = r.gpus // per_node
            idx = [position[name] for name in names]
            assert len(idx) == g and idx[0] % g == 0, f"{job} is not an aligned node group"
            assert idx == list(range(idx[0], idx[0] + g))
        if not r.movable:
            assert slots == tuple(sorted(r.current)), "an immovable job moved"
    used = {name for slots in result.assignments.values() for name, _ in slots}
    assert set(result.powered_down_nodes) == {n.name for n in nodes} - used
    moved = set()
    for r in requests:
        new = set(result.assignments.get(r.job_id, ()))
        old = set(r.current)
        if new and old and not (new <= old or old <= new):
            moved.add(r.job_id)
    assert {m.job_id for m in result.migrations} == moved
    for m in result.migrations:
        assert m.target == result.assignments[m.job_id]
        assert set(m.source) == set(by_id[m.job_id].current)


def admitted(nodes: Sequence[Node], requests: Sequence[PlacementRequest]) -> list[str]:
    """The documented admission rule, written independently: in order, while it fits."""
    per_node, count = nodes[0].gpus, len(nodes)
    largest = per_node * 2 ** (count.bit_length() - 1)
    left, out = per_node * count, []
    for r in requests:
        if r.gpus <= left and r.gpus <= largest:
            left -= r.gpus
            out.append(r.job_id)
    return out


# ----------------------------------------------------------------------------
# Hypothesis: random clusters, random demands, running jobs resized and moved.


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Node], list[PlacementRequest]]:
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 9))
    off = draw(st.sets(st.integers(0, count - 1)))
    nodes = cluster(count, per_node, sorted(off))
    cap = per_node * count
    sizes = st.sampled_from([1 << k for k in range((2 * cap).bit_length())])
    first = draw(st.lists(sizes, max_size=12))
    before = place(nodes, [req(f"j{i}", s) for i, s in enumerate(first)])
    requests = []
    for i, s in enumerate(first):
        job = f"j{i}"
        if draw(st.booleans()) and draw(st.booleans()):
            continue  # finished
        factor = draw(st.sampled_from([0.25, 0.5, 1, 1, 1, 2, 4]))
        new = max(1, int(s * factor))
        requests.append(req(job, new, before.assignments.get(job, ())))
    requests += [req(f"new{i}", s) for i, s in enumerate(draw(st.lists(sizes, max_size=6)))]
    requests = draw(st.permutations(requests))
    return nodes, list(requests)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(scenarios())
def test_rules_hold_and_at_most_one_node_is_partly_used(
    case: tuple[list[Node], list[PlacementRequest]],
) -> None:
    nodes, requests = case
    result = place(nodes, requests)
    check_valid(nodes, requests, result)
    assert sorted(result.assignments) == sorted(admitted(nodes, requests))
    assert len(partial_nodes(nodes, result)) <= 1
    demand = sum(len(s) for s in result.assignments.values())
    used = len(nodes) - len(result.powered_down_nodes)
    assert used == -(-demand // nodes[0].gpus)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(scenarios())
def test_placing_the_output_again_changes_nothing(
    case: tuple[list[Node], list[PlacementRequest]],
) -> None:
    nodes, requests = case
    first = place(nodes, requests)
    again = [req(r.job_id, r.gpus, first.assignments.get(r.job_id, ())) for r in requests]
    second = place(nodes, again)
    assert second.migrations == ()
    assert second.assignments == first.assignments
    assert second == place(nodes, again)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_request_order_when_all_fit(
    case: tuple[list[Node], list[PlacementRequest]], rnd: random.Random
) -> None:
    nodes, requests = case
    result = place(nodes, requests)
    assert place(nodes, list(requests)) == result
    if not result.unplaced:
        shuffled = list(requests)
        rnd.shuffle(shuffled)
        assert place(nodes, shuffled).assignments == result.assignments


@settings(max_examples=200, deadline=None, derandomize=True)
@given(scenarios(), st.data())
def test_immovable_jobs_never_move(
    case: tuple[list[Node], list[PlacementRequest]], data: st.DataObject
) -> None:
    nodes, requests = case
    layout = place(nodes, requests)
    pinned = (
        data.draw(st.sets(st.sampled_from(sorted(layout.assignments))))
        if layout.assignments
        else set()
    )
    # The pinned jobs hold their blocks; the others change size and ask again.
    later = []
    for r in requests:
        if r.job_id in pinned:
            later.append(req(r.job_id, r.gpus, layout.assignments[r.job_id], movable=False))
        else:
            new = max(
                1, r.gpus * data.draw(st.sampled_from([1, 2])) // data.draw(st.sampled_from([1, 2]))
            )
            later.append(req(r.job_id, new, layout.assignments.get(r.job_id, ())))
    result = place(nodes, later)
    check_valid(nodes, later, result)
    for job in pinned:
        assert result.assignments[job] == layout.assignments[job]
    again = [req(r.job_id, r.gpus, result.assignments.get(r.job_id, ()), r.movable) for r in later]
    second = place(nodes, again)
    assert second.assignments == result.assignments
    assert second.migrations == ()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_arrivals_that_replace_finished_jobs_move_nothing(data: st.DataObject) -> None:
    # Putting each arrival where a finished job of its size ran is a valid
    # answer without migrations, so none may be needed.
    per_node = data.draw(st.sampled_from([2, 4, 8, 16]))
    nodes = cluster(data.draw(st.integers(1, 8)), per_node)
    cap = per_node * len(nodes)
    sizes = st.sampled_from([1 << k for k in range(cap.bit_length())])
    first = place(nodes, [req(f"j{i}", s) for i, s in enumerate(data.draw(st.lists(sizes)))])
    running = [req(j, len(s), s) for j, s in first.assignments.items()]
    gone = data.draw(st.sets(st.sampled_from([r.job_id for r in running]))) if running else set()
    stay = [r for r in running if r.job_id not in gone]
    arrivals = [req(f"a{i}", r.gpus) for i, r in enumerate(running) if r.job_id in gone]
    result = place(nodes, data.draw(st.permutations(stay + arrivals)))
    assert result.migrations == ()
    assert all(result.assignments[r.job_id] == r.current for r in stay)
    assert len(result.powered_down_nodes) == len(first.powered_down_nodes)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_garbage_current_placements_of_movable_jobs_are_tolerated(data: st.DataObject) -> None:
    nodes = cluster(data.draw(st.integers(1, 5)), data.draw(st.sampled_from([2, 4, 8])))
    slots = st.tuples(st.sampled_from(["n0", "n1", "n2", "gone"]), st.integers(-1, 9))
    requests = [
        req(
            f"j{i}",
            data.draw(st.sampled_from([1, 2, 4, 8, 16])),
            data.draw(st.lists(slots, max_size=9)),
        )
        for i in range(data.draw(st.integers(0, 8)))
    ]
    result = place(nodes, requests)
    check_valid(nodes, requests, result)
    assert len(partial_nodes(nodes, result)) <= 1


# ----------------------------------------------------------------------------
# Scenarios from the paper's §5.3 and the issue.


def test_a_gang_of_four_lands_on_one_node() -> None:
    nodes = cluster(4)
    result = place(nodes, [req("a", 4)])
    (name,) = {n for n, _ in result.assignments["a"]}
    assert result.assignments["a"] == block(name, 0, 4)
    assert len(result.powered_down_nodes) == 3


def test_sixteen_workers_take_two_whole_aligned_nodes() -> None:
    nodes = cluster(4)
    result = place(nodes, [req("a", 4), req("big", 16)])
    names = sorted({n for n, _ in result.assignments["big"]})
    assert names in (["n0", "n1"], ["n2", "n3"])
    assert result.assignments["big"] == block(names[0], 0, 8) + block(names[1], 0, 8)
    # The 4-GPU job does not sit on the big job's nodes.
    assert not {n for n, _ in result.assignments["a"]} & set(names)


def test_fragmentation_cannot_strand_gpus_on_two_nodes() -> None:
    # Four half-used nodes: kept as they are, a new 8-GPU job would not fit.
    nodes = cluster(4)
    running = [req(f"r{i}", 4, block(f"n{i}", 4 * (i % 2), 4)) for i in range(4)]
    result = place(nodes, [*running, req("new", 8)])
    check_valid(nodes, [*running, req("new", 8)], result)
    assert not result.unplaced
    assert partial_nodes(nodes, result) == []
    assert len(result.powered_down_nodes) == 1
    # Two of the four move, the minimum for two full nodes of 4+4.
    assert len(result.migrations) == 2


def test_two_half_used_nodes_consolidate_with_one_migration() -> None:
    nodes = cluster(3)
    running = [req("a", 4, block("n0", 0, 4)), req("b", 4, block("n1", 4, 4))]
    result = place(nodes, running)
    assert partial_nodes(nodes, result) == []
    assert len(result.migrations) == 1
    assert sorted(result.powered_down_nodes) == ["n1", "n2"] or sorted(
        result.powered_down_nodes
    ) == ["n0", "n2"]


def test_shrinking_keeps_the_buddy_half() -> None:
    nodes = cluster(4)
    result = place(nodes, [req("a", 4, block("n0", 0, 8)), req("big", 8, block("n2", 0, 8))])
    assert result.assignments["a"] == block("n0", 0, 4)
    assert result.assignments["big"] == block("n2", 0, 8)
    assert result.migrations == ()
    result = place(nodes, [req("b", 2, block("n1", 4, 4)), req("c", 4, block("n1", 0, 4))])
    assert result.assignments == {"b": block("n1", 4, 2), "c": block("n1", 0, 4)}
    assert result.migrations == ()


def test_a_multi_node_job_shrinking_keeps_its_first_node() -> None:
    nodes = cluster(4)
    result = place(nodes, [req("a", 8, block("n2", 0, 8) + block("n3", 0, 8))])
    assert result.assignments["a"] == block("n2", 0, 8)
    assert result.migrations == ()


def test_growing_into_a_free_buddy_is_not_a_migration() -> None:
    nodes = cluster(2)
    result = place(nodes, [req("a", 4, block("n1", 0, 2)), req("b", 4, block("n1", 4, 4))])
    assert result.assignments["a"] == block("n1", 0, 4)
    assert result.assignments["b"] == block("n1", 4, 4)
    assert result.migrations == ()


def test_an_unchanged_valid_layout_stays_put_even_when_partly_used() -> None:
    nodes = cluster(3)
    running = [req("a", 4, block("n1", 4, 4)), req("b", 1, block("n1", 2, 1))]
    result = place(nodes, running)
    assert result.assignments == {"a": block("n1", 4, 4), "b": block("n1", 2, 1)}
    assert result.migrations == ()
    assert result.powered_down_nodes == ("n0", "n2")


def test_new_jobs_refill_the_holes_finished_jobs_leave_without_moves() -> None:
    nodes = cluster(4)
    first = place(nodes, [req(f"j{i}", 1 << (i % 3)) for i in range(12)])
    assert not first.unplaced
    finished = {"j0", "j4", "j5"}  # 1, 2 and 4 GPUs on whichever nodes they landed
    running = [req(j, len(s), s) for j, s in first.assignments.items() if j not in finished]
    arrivals = [req("a1", 4), req("a2", 2), req("a3", 1)]
    result = place(nodes, running + arrivals)
    assert result.migrations == ()
    for r in running:
        assert result.assignments[r.job_id] == r.current
    assert result.powered_down_nodes == first.powered_down_nodes


def test_a_new_job_fills_the_partly_used_node_first() -> None:
    nodes = cluster(3)
    result = place(nodes, [req("a", 4, block("n1", 4, 4)), req("c", 2)])
    assert {n for n, _ in result.assignments["c"]} == {"n1"}
    assert result.powered_down_nodes == ("n0", "n2")


def test_powered_on_nodes_are_preferred_and_powered_off_ones_used_when_needed() -> None:
    nodes = cluster(3, off=[0, 2])
    one = place(nodes, [req("a", 8)])
    assert one.assignments["a"] == block("n1", 0, 8)
    two = place(nodes, [req("a", 8), req("b", 8)])
    assert not two.unplaced
    assert two.assignments["a"] == block("n1", 0, 8)
    assert len(two.powered_down_nodes) == 1


def test_a_running_job_whose_gpus_are_taken_by_a_pinned_job_moves() -> None:
    nodes = cluster(2)
    requests = [
        req("pinned", 4, block("n0", 0, 4), movable=False),
        req("a", 2, block("n0", 2, 2)),
    ]
    result = place(nodes, requests)
    check_valid(nodes, requests, result)
    assert result.assignments["pinned"] == block("n0", 0, 4)
    assert [m.job_id for m in result.migrations] == ["a"]
    assert {n for n, _ in result.assignments["a"]} == {"n0"}


def test_over_demand_admits_in_request_order() -> None:
    nodes = cluster(2)
    result = place(nodes, [req("a", 8), req("b", 16), req("c", 4), req("d", 8)])
    assert sorted(result.assignments) == ["a", "c"]
    assert result.unplaced == ("b", "d")


def test_a_job_larger_than_any_aligned_group_is_unplaced() -> None:
    nodes = cluster(3)  # 24 GPUs, but no aligned group of 4 nodes
    result = place(nodes, [req("huge", 32), req("a", 16), req("b", 8)])
    assert result.unplaced == ("huge",)
    assert result.assignments["a"] == block("n0", 0, 8) + block("n1", 0, 8)
    assert result.assignments["b"] == block("n2", 0, 8)


def test_empty_cluster_places_nothing() -> None:
    assert place([], [req("a", 1)]).unplaced == ("a",)


@pytest.mark.parametrize(
    ("nodes", "requests", "message"),
    [
        ([Node("a", 8, A100), Node("b", 4, A100)], [], "differ"),
        ([Node("a", 6, A100)], [], "power-of-two"),
        ([Node("a", 8, A100), Node("a", 8, A100)], [], "duplicate node"),
        (cluster(1), [req("x", 1), req("x", 2)], "twice"),
        (cluster(1), [req("x", 2, block("n0", 1, 2), movable=False)], "aligned"),
        (cluster(1), [req("x", 2, block("n0", 0, 4), movable=False)], "aligned"),
        (cluster(1), [req("x", 1, [("gone", 0)], movable=False)], "known nodes"),
        (
            cluster(1),
            [
                req("x", 4, block("n0", 0, 4), movable=False),
                req("y", 2, block("n0", 2, 2), movable=False),
            ],
            "overlaps",
        ),
    ],
)
def test_bad_input_raises_placement_error(
    nodes: list[Node], requests: list[PlacementRequest], message: str
) -> None:
    with pytest.raises(PlacementError, match=message):
        place(nodes, requests)


@pytest.mark.parametrize("gpus", [0, 3, 6, -2])
def test_worker_counts_must_be_powers_of_two(gpus: int) -> None:
    with pytest.raises(PlacementError, match="power of two"):
        PlacementRequest("x", gpus)


# ----------------------------------------------------------------------------
# reserve_block: the extender's view, GPU counts per node.


def test_reserve_block_fits_the_busiest_node_at_an_aligned_offset() -> None:
    nodes = cluster(3)
    assert reserve_block(nodes, {"n0": 3, "n1": 5}, 2) == block("n1", 6, 2)
    assert reserve_block(nodes, {"n0": 3, "n1": 7}, 2) == block("n0", 4, 2)
    assert reserve_block(nodes, {"n0": 3, "n1": 7}, 1) == block("n1", 7, 1)
    assert reserve_block(nodes, {"n0": 8, "n1": 8, "n2": 5}, 4) is None


def test_reserve_block_takes_exact_indices_and_ignores_unknown_nodes() -> None:
    nodes = cluster(2)
    assert reserve_block(nodes, {"n0": {0, 2, 5}, "other": 3}, 2) == block("n0", 6, 2)
    assert reserve_block(nodes, {"n0": [0, 2, 4, 6]}, 2) == block("n1", 0, 2)


def test_reserve_block_for_a_multi_node_gang_takes_free_aligned_nodes() -> None:
    nodes = cluster(4, off=[0])
    assert reserve_block(nodes, {"n1": 1}, 16) == block("n2", 0, 8) + block("n3", 0, 8)
    assert reserve_block(nodes, {}, 16) == block("n2", 0, 8) + block("n3", 0, 8)
    assert reserve_block(nodes, {"n2": 1}, 16) == block("n0", 0, 8) + block("n1", 0, 8)
    assert reserve_block(nodes, {"n1": 1, "n2": 1}, 16) is None
    assert reserve_block(nodes, {}, 64) is None


def test_reserve_block_prefers_powered_on_nodes() -> None:
    nodes = cluster(2, off=[0])
    assert reserve_block(nodes, {"n0": 4}, 2) == block("n1", 0, 2)


@pytest.mark.parametrize(
    ("occupied", "gpus"), [({"n0": 9}, 1), ({"n0": -1}, 1), ({"n0": [8]}, 1), ({}, 3)]
)
def test_reserve_block_rejects_bad_input(occupied: dict[str, int | list[int]], gpus: int) -> None:
    with pytest.raises(PlacementError):
        reserve_block(cluster(1), occupied, gpus)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_reserved_gangs_never_overlap_and_pack_nodes(data: st.DataObject) -> None:
    per_node = data.draw(st.sampled_from([2, 4, 8]))
    nodes = cluster(data.draw(st.integers(1, 6)), per_node)
    used: dict[str, set[int]] = {n.name: set() for n in nodes}
    gangs = data.draw(st.lists(st.sampled_from([1, 2, 4, 8, 16]), max_size=15))
    gangs.sort(reverse=True)
    for size in gangs:
        got = reserve_block(nodes, used, size)
        free = sum(per_node - len(u) for u in used.values())
        if got is None:
            continue
        assert len(got) == size and free >= size
        for name, i in got:
            assert i not in used[name]
            used[name].add(i)
    # Gangs in decreasing size with best fit leave at most one node partly used.
    assert sum(0 < len(u) < per_node for u in used.values()) <= 1
