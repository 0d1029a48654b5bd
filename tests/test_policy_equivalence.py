"""The policy's caches and shortcuts never change a decision.

The speed work gave the policy memory across calls: model predictions cached
per job key (``tablecache.py``), the previous call's stacked rows reused when
an event changed no job's rows, and placement shortcuts that recognise kept
blocks by lookup. None of that may change a plan. So one long-lived policy
object (warm caches, memos, the reuse path) plans a seeded sequence of related
snapshots like the simulator's (jobs run where the last plan put them,
progress, finish, arrive, get refitted models, get pinned, sometimes hold GPUs
that are not an aligned block, nodes power on and off), and every plan, or
error, must equal that of a fresh policy object (cold path) on the same
snapshot. Placement's column entry point (``place_columns``, what the policy
uses) must answer exactly as ``place`` with request objects.

The equivalence with the code before the speed work was checked against a
frozen copy of it at the commits that added the caches (a081f11 and after);
these tests keep the property that can regress without that copy.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import snapshots
from test_placement import scenarios

from powerflow.errors import PlacementError, SnapshotError
from powerflow.gpus import A100
from powerflow.models.fitted import FittedModel
from powerflow.models.priors import shipped_priors
from powerflow.policy import placement
from powerflow.policy.placement import PlacementRequest, PlacementResult
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.scenarios import synthetic_snapshot
from powerflow.policy.snapshot import Budget, GpuSlot, Job, Node, Plan, Snapshot
from powerflow.policy.synthetic import synthetic_zoo

VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"energy_aware": False},
    {"elastic": False},
    {"frequency_scaling": False},
    {"frequency_step": 4, "strict_power": True},
)


def warm_and_cold(warm: PowerFlowPolicy, snapshot: Snapshot) -> Plan | None:
    """Plan with the long-lived object and a fresh copy; equal plans, or the same error."""
    try:
        expected = replace(warm).plan(snapshot)  # a new object: empty caches
    except (SnapshotError, PlacementError) as err:
        with pytest.raises(type(err), match=re.escape(str(err))):
            warm.plan(snapshot)
        return None
    got = warm.plan(snapshot)
    assert got == expected
    return got


def scatter(rng: np.random.Generator, job: Job, free: list[GpuSlot]) -> Job:
    """Move a running job onto arbitrary free GPUs (not an aligned block)."""
    picks = rng.choice(len(free), size=len(job.placement), replace=False)
    slots = tuple(sorted(free[int(k)] for k in picks))
    for s in slots:
        free.remove(s)
    return replace(job, placement=slots)


def next_snapshot(
    snapshot: Snapshot, plan: Plan, rng: np.random.Generator, models: list[Any], step: int
) -> Snapshot:
    """What the simulator would show next: progress, finishes, arrivals, refits, pins."""
    jobs = []
    for j in snapshot.jobs:
        jp = plan.job(j.id)
        remaining = max(0.0, j.remaining_iterations - float(rng.integers(0, 4000)) * jp.gpus)
        if remaining == 0.0 or rng.random() < 0.05:
            continue  # finished
        placed = bool(jp.placement)
        model = models[int(rng.integers(len(models)))] if rng.random() < 0.1 else j.model
        jobs.append(
            replace(
                j,
                model=model,
                placement=jp.placement,
                frequency_mhz=jp.frequency_mhz if placed else None,
                remaining_iterations=remaining,
                pinned=placed and rng.random() < 0.1,
                elapsed_s=j.elapsed_s + 60.0,
            )
        )
    used = {s for j in jobs for s in j.placement}
    free = [(n.name, i) for n in snapshot.nodes for i in range(n.gpus) if (n.name, i) not in used]
    if jobs and rng.random() < 0.3:
        k = int(rng.integers(len(jobs)))
        if jobs[k].placement and not jobs[k].pinned:
            free += list(jobs[k].placement)
            jobs[k] = scatter(rng, jobs[k], free)
    for a in range(int(rng.integers(0, 4))):
        jobs.append(
            Job(
                id=f"new-{step}-{a}",
                model=models[int(rng.integers(len(models)))],
                remaining_iterations=float(rng.integers(1_000, 100_000)),
                global_batch_size=int(2 ** rng.integers(3, 10)),
                requested_gpus=int(2 ** rng.integers(0, 4)),
                arrival_s=snapshot.now_s + 1.0,
                max_local_batch_size=int(2 ** rng.integers(5, 10)) if rng.random() < 0.7 else None,
                min_gpus=int(rng.integers(1, 3)),
                max_gpus=int(2 ** rng.integers(1, 6)) if rng.random() < 0.3 else None,
            )
        )
    nodes = tuple(replace(n, powered_on=bool(rng.random() < 0.8)) for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes, jobs=tuple(jobs), now_s=snapshot.now_s + 60.0)


def unchanged_event(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The next event with no job's rows changed: the policy's reuse-previous-stack path."""
    jobs = tuple(replace(j, placement=plan.job(j.id).placement) for j in snapshot.jobs)
    return replace(snapshot, jobs=jobs, now_s=snapshot.now_s + 1.0)


def one_job_changed(snapshot: Snapshot, plan: Plan, rng: np.random.Generator) -> Snapshot:
    """The same jobs in the same order, one with another batch size: its rows must change."""
    jobs = [replace(j, placement=plan.job(j.id).placement) for j in snapshot.jobs]
    k = int(rng.integers(len(jobs)))
    jobs[k] = replace(jobs[k], global_batch_size=jobs[k].global_batch_size * 2)
    return replace(snapshot, jobs=tuple(jobs), now_s=snapshot.now_s + 1.0)


def start_snapshot(seed: int, kind: str) -> tuple[Snapshot, list[Any]]:
    gpus, count = (128, 48) if seed % 2 else (64, 30)
    eta = (0.3, 0.5, 0.7, 1.0)[seed % 4]
    if kind == "fitted":
        models: list[Any] = [FittedModel(p) for _, p in sorted(shipped_priors().items())]
        base = synthetic_snapshot(gpus, count, seed=seed, eta=eta, distinct_models=3)
        rng = np.random.default_rng(seed)
        jobs = tuple(replace(j, model=models[int(rng.integers(len(models)))]) for j in base.jobs)
        return replace(base, jobs=jobs), models
    distinct = None if kind == "per-job" else 5
    base = synthetic_snapshot(gpus, count, seed=seed, eta=eta, distinct_models=distinct)
    return base, [*synthetic_zoo(6, seed=seed + 100), *(j.model for j in base.jobs[:4])]


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
@pytest.mark.parametrize("kind", ["shared", "per-job", "fitted"])
@pytest.mark.parametrize("seed", range(4))
def test_warm_plans_equal_cold_plans_over_simulated_sequences(
    seed: int, kind: str, variant: int
) -> None:
    rng = np.random.default_rng(1000 * seed + variant)
    snap, models = start_snapshot(seed, kind)
    warm = PowerFlowPolicy(**VARIANTS[variant])
    planned = 0
    for step in range(8):
        plan = warm_and_cold(warm, snap)
        if plan is None:
            break
        planned += 1
        if step % 3 == 1:
            # Nothing changed but where jobs run: served from the previous stack.
            again = warm_and_cold(warm, unchanged_event(snap, plan))
            assert again is not None
            # The same jobs in the same order, one job's rows changed: not reused.
            warm_and_cold(warm, one_job_changed(snap, plan, rng))
        snap = next_snapshot(snap, plan, rng, models, step)
    assert planned >= 4
    assert len(warm.cache) > 0  # the warm object did keep something


@settings(max_examples=150, deadline=None, derandomize=True)
@given(first=snapshots(), variant=st.sampled_from(range(len(VARIANTS))))
def test_warm_plans_equal_cold_plans_on_random_snapshots(first: Snapshot, variant: int) -> None:
    warm = PowerFlowPolicy(**VARIANTS[variant])
    plan = warm_and_cold(warm, first)
    if plan is None:
        return
    # Run the plan (some pinned) and plan again with the caches warm.
    jobs = tuple(
        replace(
            j,
            placement=plan.job(j.id).placement,
            pinned=bool(plan.job(j.id).placement) and k % 3 == 0,
        )
        for k, j in enumerate(first.jobs)
    )
    warm_and_cold(warm, replace(first, jobs=jobs, now_s=first.now_s + 30.0))


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


def test_a_replan_of_the_sim_workload_shape_warm_equals_cold() -> None:
    """512 GPUs and 160 jobs, as in the full-trace simulation, three events in a row."""
    rng = np.random.default_rng(7)
    snap = synthetic_snapshot(512, 160, seed=7, eta=0.6, distinct_models=None)
    snap = replace(snap, budget=Budget(eta=0.6))
    models = [j.model for j in snap.jobs[:8]]
    warm = PowerFlowPolicy()
    for step in range(3):
        plan = warm_and_cold(warm, snap)
        assert plan is not None
        stacked = warm.cache.last
        assert warm_and_cold(warm, unchanged_event(snap, plan)) is not None
        assert warm.cache.last is stacked  # the reuse path was taken
        warm_and_cold(warm, one_job_changed(snap, plan, rng))
        assert warm.cache.last is not stacked  # and a changed job's rows were not
        snap = next_snapshot(snap, plan, rng, models, step)
