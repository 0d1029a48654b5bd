"""The sped-up policy and placement plan exactly what the versions before the speed work did.

``tests/support/policy_v1`` is a frozen copy of the policy and placement
modules as they were before the tables were cached per job, placement
recognised kept blocks by lookup and the plan stopped re-deriving rows. Every
test here runs both on the same inputs and asserts equal output (plans,
placements, or the same error), on seeded random snapshots and on sequences
of related snapshots like the simulator's (jobs run where the last plan put
them, progress, finish, arrive, get refitted models, get pinned, and
sometimes hold GPUs that are not an aligned block).
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
from support.policy_v1 import placement as old_placement
from support.policy_v1.powerflow import PowerFlowPolicy as OldPolicy
from test_placement import scenarios

from powerflow.errors import PlacementError, SnapshotError
from powerflow.models.fitted import FittedModel
from powerflow.models.priors import shipped_priors
from powerflow.policy import placement
from powerflow.policy.placement import PlacementRequest
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


def both(new: PowerFlowPolicy, old: OldPolicy, snapshot: Snapshot) -> Plan | None:
    """Plan with both; equal plans, or the same error (then None)."""
    try:
        expected = old.plan(snapshot)
    except (SnapshotError, PlacementError) as err:
        with pytest.raises(type(err), match=re.escape(str(err))):
            new.plan(snapshot)
        return None
    got = new.plan(snapshot)
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
def test_plans_equal_the_old_policy_over_simulated_sequences(
    seed: int, kind: str, variant: int
) -> None:
    rng = np.random.default_rng(1000 * seed + variant)
    snap, models = start_snapshot(seed, kind)
    new, old = PowerFlowPolicy(**VARIANTS[variant]), OldPolicy(**VARIANTS[variant])
    planned = 0
    for step in range(8):
        plan = both(new, old, snap)
        if plan is None:
            break
        planned += 1
        snap = next_snapshot(snap, plan, rng, models, step)
    assert planned >= 4


@settings(max_examples=150, deadline=None, derandomize=True)
@given(first=snapshots(), variant=st.sampled_from(range(len(VARIANTS))))
def test_plans_equal_the_old_policy_on_random_snapshots(first: Snapshot, variant: int) -> None:
    new, old = PowerFlowPolicy(**VARIANTS[variant]), OldPolicy(**VARIANTS[variant])
    plan = both(new, old, first)
    if plan is None:
        return
    # Run the plan (some pinned) and plan again with both caches warm.
    jobs = tuple(
        replace(
            j,
            placement=plan.job(j.id).placement,
            pinned=bool(plan.job(j.id).placement) and k % 3 == 0,
        )
        for k, j in enumerate(first.jobs)
    )
    both(new, old, replace(first, jobs=jobs, now_s=first.now_s + 30.0))


def fields(result: Any) -> tuple[object, ...]:
    """A placement result as plain data (the two versions' result classes differ)."""
    return (
        list(result.assignments.items()),
        result.migrations,
        result.unplaced,
        result.powered_down_nodes,
    )


def test_the_old_policy_is_the_frozen_copy_not_this_one() -> None:
    """Guard against the reference silently importing the code under test."""
    assert OldPolicy.__module__ == "support.policy_v1.powerflow"
    assert old_placement.place is not placement.place


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=scenarios(), pin=st.sets(st.integers(0, 20), max_size=4))
def test_placement_equals_the_old_placement(
    case: tuple[list[Node], list[PlacementRequest]], pin: set[int]
) -> None:
    nodes, requests = case
    result = placement.place(nodes, requests)
    assert fields(result) == fields(old_placement.place(nodes, requests))
    # Placing the answer again (the shortcut's case), with some jobs immovable.
    again = [
        PlacementRequest(
            r.job_id,
            r.gpus,
            result.assignments.get(r.job_id, ()),
            not (k in pin and r.job_id in result.assignments),
        )
        for k, r in enumerate(requests)
    ]
    assert fields(placement.place(nodes, again)) == fields(old_placement.place(nodes, again))
    # Current GPUs given as lists (not tuples) take the slot-by-slot path.
    listed = [
        PlacementRequest(r.job_id, r.gpus, list(r.current), r.movable)  # type: ignore[arg-type]
        for r in again
    ]
    assert fields(placement.place(nodes, listed)) == fields(old_placement.place(nodes, listed))


def test_a_replan_of_the_sim_workload_shape_equals_the_old_one() -> None:
    """512 GPUs and 160 jobs, as in the full-trace simulation, three events in a row."""
    rng = np.random.default_rng(7)
    snap = synthetic_snapshot(512, 160, seed=7, eta=0.6, distinct_models=None)
    snap = replace(snap, budget=Budget(eta=0.6))
    models = [j.model for j in snap.jobs[:8]]
    new, old = PowerFlowPolicy(), OldPolicy()
    for step in range(3):
        plan = both(new, old, snap)
        assert plan is not None
        snap = next_snapshot(snap, plan, rng, models, step)
