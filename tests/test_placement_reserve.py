"""``reserve_block``'s count-per-node path agrees with marking every GPU, on random clusters.

The extender reserves a gang's block on its request path, so ``reserve_block``
works from one used count per node; ``_reserve_block_by_gpu`` is the plain
version that occupies GPU by GPU. Same nodes, same occupancy (counts, exact
index sets, lists with duplicates, unknown nodes, invalid entries), same gang
size: the same block, or the same error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerflow.core.errors import PlacementError
from powerflow.core.gpus import A100
from powerflow.core.policy.buddy import geometry, is_power_of_two
from powerflow.core.policy.placement import _reserve_block_by_gpu, reserve_block
from powerflow.core.policy.snapshot import Node


def by_gpu(nodes: list[Node], occupied: Any, gpus: int) -> Any:
    """The reference, behind the same size check as ``reserve_block``."""
    if not isinstance(gpus, int) or not is_power_of_two(gpus):
        raise PlacementError(f"a gang must have a power-of-two size >= 1, got {gpus}")
    return _reserve_block_by_gpu(geometry(nodes), occupied, gpus)


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args))
    except PlacementError as exc:
        return ("error", str(exc))


@st.composite
def clusters(draw: st.DrawFn, valid: bool) -> tuple[list[Node], dict[str, Any], int]:
    per_node = draw(st.sampled_from([1, 2, 4, 8, 16]))
    count = draw(st.integers(0, 12))
    powered = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    nodes = [Node(f"n{i:02d}", per_node, A100, powered_on=on) for i, on in enumerate(powered)]
    names = [n.name for n in nodes] + ["elsewhere"]
    occupied: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))):
        if valid:
            indices = st.integers(0, per_node - 1)
            count_of = st.integers(0, per_node)
        else:
            indices = st.integers(-2, per_node + 1)
            count_of = st.integers(-1, per_node + 1)
        occupied[name] = draw(
            st.one_of(
                count_of,
                st.sets(indices, max_size=per_node),
                st.frozensets(indices, max_size=per_node),
                st.lists(indices, max_size=per_node + 2),  # duplicates count once
            )
        )
    gpus = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]) if valid else st.integers(-1, 70))
    return nodes, occupied, gpus


@settings(max_examples=300, deadline=None, derandomize=True)
@given(clusters(valid=True))
def test_counts_per_node_agree_with_marking_every_gpu(
    case: tuple[list[Node], dict[str, Any], int],
) -> None:
    nodes, occupied, gpus = case
    got = outcome(reserve_block, nodes, occupied, gpus)
    assert got == outcome(by_gpu, nodes, occupied, gpus)
    if got[0] == "ok" and got[1] is not None:
        used = {
            (name, i)
            for name, u in occupied.items()
            for i in (range(u) if isinstance(u, int) else u)
        }
        assert not used & set(got[1]) and len(got[1]) == gpus


@settings(max_examples=200, deadline=None, derandomize=True)
@given(clusters(valid=False))
def test_invalid_input_gets_the_same_answer_or_error(
    case: tuple[list[Node], dict[str, Any], int],
) -> None:
    nodes, occupied, gpus = case
    assert outcome(reserve_block, nodes, occupied, gpus) == outcome(by_gpu, nodes, occupied, gpus)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.data())
def test_gangs_reserved_one_after_another_agree(data: st.DataObject) -> None:
    """Busy clusters as the extender builds them: each gang's block is taken before the next."""
    per_node = data.draw(st.sampled_from([2, 4, 8]))
    nodes = [
        Node(f"n{i}", per_node, A100, powered_on=data.draw(st.booleans()))
        for i in range(data.draw(st.integers(1, 9)))
    ]
    used: dict[str, set[int]] = {n.name: set() for n in nodes}
    for size in data.draw(st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), max_size=20)):
        got = reserve_block(nodes, used, size)
        assert got == by_gpu(nodes, used, size)
        for name, i in got or ():
            used[name].add(i)


def test_mixed_unequal_nodes_still_raise() -> None:
    nodes = [Node("a", 8, A100), Node("b", 4, A100)]
    with pytest.raises(PlacementError, match="equal nodes"):
        reserve_block(nodes, {}, 2)
