"""The policy's per-call memos hand back earlier answers only when they still hold.

``PlanMemo`` reuses the previous call's ``JobPlan`` objects, ``Gathered`` the
previous call's gathered table rows, and ``cluster_of`` / ``geometry`` the
answer for the very node tuple they saw last. Each test checks both sides:
the memo is really used (identity), and a changed input gets a fresh, correct
answer (equal to what a cold computation gives).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from powerflow.errors import PlacementError, SnapshotError
from powerflow.gpus import A100
from powerflow.policy import buddy, placement, validate
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.scenarios import SMALL_GPU, synthetic_snapshot
from powerflow.policy.snapshot import Budget, Node, Snapshot
from powerflow.policy.tablecache import TableCache
from powerflow.policy.tables import build_tables


def replanned(snapshot: Snapshot, policy: PowerFlowPolicy) -> Snapshot:
    """The snapshot with every job running where the policy's plan put it."""
    plan = policy.plan(snapshot)
    jobs = tuple(replace(job, placement=plan.job(job.id).placement) for job in snapshot.jobs)
    return replace(snapshot, jobs=jobs)


def test_an_unchanged_replan_hands_back_the_same_job_plans() -> None:
    policy = PowerFlowPolicy()
    snap = replanned(synthetic_snapshot(64, 40, seed=3, eta=0.7), policy)
    first = policy.plan(snap)
    again = policy.plan(snap)
    assert again == first
    assert all(a is b for a, b in zip(again.jobs, first.jobs, strict=True))


def test_changed_job_plans_are_rebuilt_and_equal_a_cold_policy() -> None:
    policy = PowerFlowPolicy()
    snap = replanned(synthetic_snapshot(64, 40, seed=5, eta=0.9), policy)
    before = policy.plan(snap)
    tighter = replace(snap, budget=Budget(eta=0.3))
    warm = policy.plan(tighter)
    assert warm == PowerFlowPolicy().plan(tighter)
    pairs = list(zip(warm.jobs, before.jobs, strict=True))
    assert any(a != b for a, b in pairs)  # the tighter budget changed some plans ...
    assert all(a is b for a, b in pairs if a == b)  # ... and the others were handed back


def test_gathered_rows_equal_a_fresh_gather_when_the_clocks_change() -> None:
    """A warm gather memo across tables of other clocks (other widths) slices afresh."""
    snap = synthetic_snapshot(64, 30, seed=11, eta=0.8)
    cluster = validate.cluster_of(snap)
    cache = TableCache()
    rng = np.random.default_rng(2)
    for clocks in (A100.clocks_mhz, A100.clocks_mhz[::3], (A100.max_clock_mhz,), A100.clocks_mhz):
        for _ in range(3):
            warm = build_tables(snap.jobs, cluster, clocks, True, cache)
            cold = build_tables(snap.jobs, cluster, clocks, True, TableCache())
            rows = np.sort(rng.choice(warm.counts.size, size=12, replace=False))
            first = int(rng.integers(0, len(clocks)))
            for got, want in zip(warm.values(rows, first), cold.values(rows, first), strict=True):
                np.testing.assert_array_equal(got, want)
                assert not got.flags.writeable


def test_the_same_node_tuple_gets_the_remembered_answer_and_another_its_own() -> None:
    snap = synthetic_snapshot(64, 5, seed=1)
    assert validate.cluster_of(snap) is validate.cluster_of(snap)
    assert buddy.geometry(snap.nodes) is buddy.geometry(snap.nodes)
    fewer = replace(snap, nodes=snap.nodes[:4])
    assert validate.cluster_of(fewer).node_names == tuple(n.name for n in snap.nodes[:4])
    assert buddy.geometry(fewer.nodes).num_nodes == 4
    off = tuple(replace(n, powered_on=False) for n in snap.nodes)
    assert not any(buddy.geometry(off).powered_on)


def test_a_node_list_is_checked_every_time() -> None:
    """A list can change in place between calls, so it is never answered from memory."""
    nodes = [Node("a", 8, A100), Node("b", 8, A100)]
    assert buddy.geometry(nodes).num_nodes == 2
    nodes.append(Node("c", 4, A100))
    with pytest.raises(PlacementError):
        buddy.geometry(nodes)
    mixed = (Node("a", 8, A100), Node("b", 8, SMALL_GPU))
    snap = replace(synthetic_snapshot(16, 2, seed=1), nodes=mixed)
    with pytest.raises(SnapshotError):
        validate.cluster_of(snap)
    with pytest.raises(SnapshotError):
        validate.cluster_of(snap)  # a refused tuple is never remembered


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
