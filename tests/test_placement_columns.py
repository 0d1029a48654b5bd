"""Placement's column entry point (``place_columns``, what the policy calls) answers
exactly as ``place`` does with request objects."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import scenarios

from powerflow.core.errors import PlacementError
from powerflow.core.gpus import A100
from powerflow.core.policy import placement
from powerflow.core.policy.placement import PlacementRequest, PlacementResult
from powerflow.core.policy.snapshot import Node

pytestmark = pytest.mark.usefixtures("compiled_placement")


def fields(result: PlacementResult) -> tuple[object, ...]:
    """A placement result as plain data, the assignments' order included."""
    return (
        list(result.assignments.items()),
        result.migrations,
        result.unplaced,
        result.powered_down_nodes,
    )


def both_entries(nodes: list[Node], requests: list[PlacementRequest]) -> PlacementResult:
    """``place`` and ``place_columns`` on the same requests: the same answer."""
    result = placement.place(nodes, requests)
    columns = placement.place_columns(
        nodes,
        [r.job_id for r in requests],
        [r.gpus for r in requests],
        [r.current for r in requests],
        [r.movable for r in requests],
    )
    assert fields(columns) == fields(result)
    return result


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=scenarios(), pin=st.sets(st.integers(0, 20), max_size=4))
def test_place_columns_equals_place(
    case: tuple[list[Node], list[PlacementRequest]], pin: set[int]
) -> None:
    nodes, requests = case
    result = both_entries(nodes, requests)
    # Placing the answer again (the kept-block shortcut's case), some jobs immovable.
    again = [
        PlacementRequest(
            r.job_id,
            r.gpus,
            result.assignments.get(r.job_id, ()),
            not (k in pin and r.job_id in result.assignments),
        )
        for k, r in enumerate(requests)
    ]
    kept = both_entries(nodes, again)
    # Current GPUs given as lists (not tuples) take the slot-by-slot path: same answer.
    listed = [
        PlacementRequest(r.job_id, r.gpus, list(r.current), r.movable)  # type: ignore[arg-type]
        for r in again
    ]
    assert fields(both_entries(nodes, listed)) == fields(kept)


@pytest.mark.parametrize("gpus", [3, 0])
def test_place_columns_refuses_what_a_request_refuses(gpus: int) -> None:
    nodes = [Node("n0", 8, A100)]
    with pytest.raises(PlacementError) as from_request:
        placement.place(nodes, [PlacementRequest("a", gpus)])
    with pytest.raises(PlacementError, match=re.escape(str(from_request.value))):
        placement.place_columns(nodes, ["a"], [gpus], [()], [True])


@pytest.mark.parametrize("gpus", [2.0, np.int64(2), True, 6])
def test_place_columns_checks_odd_counts_like_a_request(gpus: object) -> None:
    """The column check at C speed accepts and refuses exactly what a request does."""
    nodes = [Node("n0", 8, A100)]
    try:
        want = placement.place(nodes, [placement.PlacementRequest("a", gpus)])  # type: ignore[arg-type]
    except PlacementError as err:
        with pytest.raises(PlacementError, match=re.escape(str(err))):
            placement.place_columns(nodes, ["a"], [gpus], [()], [True])  # type: ignore[list-item]
    else:
        assert placement.place_columns(nodes, ["a"], [gpus], [()], [True]) == want  # type: ignore[list-item]
