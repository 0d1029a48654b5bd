"""``place``'s shortcut for a job that keeps its block agrees with the general rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import scenarios

from powerflow.core.errors import PlacementError
from powerflow.core.gpus import A100
from powerflow.core.policy import placement
from powerflow.core.policy.buddy import geometry
from powerflow.core.policy.placement import PlacementRequest, _kept_block, _preferred, place
from powerflow.core.policy.snapshot import GpuSlot, Node

pytestmark = pytest.mark.usefixtures("compiled_placement")


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Node], tuple[GpuSlot, ...], int]:
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = [Node(f"n{i}", per_node, A100) for i in range(draw(st.integers(1, 5)))]
    gpus = draw(st.sampled_from([g for g in (1, 2, 4, 8, 16) if g <= per_node * len(nodes)]))
    names = [n.name for n in nodes] + ["gone"]
    if draw(st.booleans()):
        # A block-shaped current placement, possibly shifted, reordered or cut.
        name = draw(st.sampled_from(names))
        first = draw(st.integers(-1, per_node))
        size = draw(st.sampled_from([gpus, max(1, gpus // 2), gpus * 2]))
        current = [(name, first + k) for k in range(size)]
        if draw(st.booleans()):
            current = draw(st.permutations(current))
    else:
        current = draw(
            st.lists(
                st.tuples(st.sampled_from(names), st.integers(-1, per_node)), max_size=2 * gpus
            )
        )
    return nodes, tuple(current), gpus


@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_kept_block_is_the_preferred_block_whenever_it_answers(
    case: tuple[list[Node], tuple[GpuSlot, ...], int],
) -> None:
    nodes, current, gpus = case
    geo = geometry(nodes)
    fast = _kept_block(geo, current, gpus)
    if fast is not None:
        assert fast == _preferred(geo, current, gpus)
        assert geo.slots(fast) == current


def test_the_shortcut_answers_for_a_kept_block() -> None:
    geo = geometry([Node("a", 8, A100), Node("b", 8, A100)])
    current = (("b", 4), ("b", 5), ("b", 6), ("b", 7))
    block = _kept_block(geo, current, 4)
    assert block is not None
    assert block == _preferred(geo, current, 4)
    assert _kept_block(geo, current[::-1], 4) is None
    assert _kept_block(geo, current, 8) is None


@settings(max_examples=150, deadline=None)
@given(case=scenarios())
def test_place_with_the_shortcut_equals_place_without_it(
    case: tuple[list[Node], list[PlacementRequest]],
) -> None:
    nodes, requests = case
    fast = place(nodes, requests)
    # Feed the answer back as current placements: the shortcut's main case.
    again = [
        PlacementRequest(r.job_id, r.gpus, fast.assignments.get(r.job_id, ()), r.movable)
        for r in requests
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placement, "_kept_block", lambda *_: None)
        mp.setattr(placement, "_node_blocks_of", lambda _, currents: [None] * len(currents))
        slow, slow_again = place(nodes, requests), place(nodes, again)
    assert fast == slow
    assert place(nodes, again) == slow_again


@settings(max_examples=150, deadline=None)
@given(case=scenarios())
def test_place_columns_equals_place(case: tuple[list[Node], list[PlacementRequest]]) -> None:
    nodes, requests = case
    columns = (
        [r.job_id for r in requests],
        [r.gpus for r in requests],
        [r.current for r in requests],
        [r.movable for r in requests],
    )
    assert placement.place_columns(nodes, *columns) == place(nodes, requests)


def test_place_columns_checks_counts_like_a_request() -> None:
    nodes = [Node("a", 8, A100)]
    with pytest.raises(PlacementError, match="power of two") as columns:
        placement.place_columns(nodes, ["x"], [3], [()], [True])
    with pytest.raises(PlacementError) as request:
        PlacementRequest("x", 3)
    assert str(columns.value) == str(request.value)
