"""The table cache never changes a plan: warm-cache plans equal cold-cache plans.

One policy object plans a sequence of related snapshots (the simulator's and
the operator's pattern: jobs progress, arrive, finish, get a new model, start
running where the previous plan put them), and every plan must equal the plan
of a fresh policy (empty cache) on the same snapshot.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from policy_cases import snapshots

from powerflow.errors import SnapshotError
from powerflow.gpus import A100
from powerflow.models.fitted import FittedModel
from powerflow.models.priors import shipped_priors
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.scenarios import synthetic_snapshot
from powerflow.policy.snapshot import Job, Plan, Snapshot
from powerflow.policy.tablecache import CachedRows, TableCache
from powerflow.policy.tables import build_tables
from powerflow.policy.validate import cluster_of

POLICIES = (
    PowerFlowPolicy(),
    PowerFlowPolicy(energy_aware=False),
    PowerFlowPolicy(elastic=False),
    PowerFlowPolicy(frequency_scaling=False),
    PowerFlowPolicy(frequency_step=4, strict_power=True),
)


def cold(policy: PowerFlowPolicy, snapshot: Snapshot) -> Plan:
    return replace(policy).plan(snapshot)


def running(snapshot: Snapshot, plan: Plan, pin: set[str]) -> Snapshot:
    """The next event: jobs run where ``plan`` put them, some pinned, 60 s later."""
    jobs = []
    for j in snapshot.jobs:
        jp = plan.job(j.id)
        placed = bool(jp.placement)
        jobs.append(
            replace(
                j,
                placement=jp.placement,
                frequency_mhz=jp.frequency_mhz if placed else None,
                remaining_iterations=max(0.0, j.remaining_iterations - 500.0 * jp.gpus),
                pinned=placed and j.id in pin,
            )
        )
    return replace(snapshot, jobs=tuple(jobs), now_s=snapshot.now_s + 60.0)


def evolve(snapshot: Snapshot, rng: np.random.Generator, models: list[object]) -> Snapshot:
    """Drop a job, give one a new model object (a refit), reorder the rest."""
    jobs = list(snapshot.jobs)
    if len(jobs) > 2:
        jobs.pop(int(rng.integers(len(jobs))))
    if jobs:
        k = int(rng.integers(len(jobs)))
        jobs[k] = replace(jobs[k], model=models[int(rng.integers(len(models)))])
    order = rng.permutation(len(jobs))
    return replace(snapshot, jobs=tuple(jobs[i] for i in order))


def fitted_snapshot(seed: int, jobs: int) -> tuple[Snapshot, list[object]]:
    """The simulator's case: fitted models of the paper's form, shared by network."""
    priors = shipped_priors()
    models: list[object] = [FittedModel(p) for _, p in sorted(priors.items())]
    base = synthetic_snapshot(64, jobs, seed=seed, eta=0.5, distinct_models=3)
    rng = np.random.default_rng(seed)
    queue = tuple(replace(j, model=models[int(rng.integers(len(models)))]) for j in base.jobs)
    return replace(base, jobs=queue), models


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["synthetic", "fitted"])
def test_warm_cache_plans_equal_cold_plans_over_a_sequence(seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    if kind == "fitted":
        snap, models = fitted_snapshot(seed, 24)
    else:
        snap = synthetic_snapshot(64, 24, seed=seed, eta=0.4 + 0.1 * seed, distinct_models=4)
        models = [j.model for j in snap.jobs[:6]]
    policy = POLICIES[seed % len(POLICIES)]
    warm = replace(policy)
    for step in range(5):
        plan = warm.plan(snap)
        assert plan == cold(policy, snap)
        pin = {j.id for j in snap.jobs if rng.random() < 0.2}
        snap = running(snap, plan, pin)
        if step % 2:
            snap = evolve(snap, rng, models)
    assert len(warm.cache) > 0


@settings(max_examples=60, deadline=None)
@given(first=snapshots(), second=snapshots())
def test_warm_cache_equals_cold_on_random_snapshots(first: Snapshot, second: Snapshot) -> None:
    policy = PowerFlowPolicy()
    warm = replace(policy)
    for snap in (first, second, first):
        try:
            expected = cold(policy, snap)
        except SnapshotError as err:
            with pytest.raises(SnapshotError, match=re.escape(str(err))):
                warm.plan(snap)
            continue
        assert warm.plan(snap) == expected


def test_a_new_model_object_is_a_miss_even_with_the_same_id() -> None:
    """The entry keeps its model alive and a hit checks identity, never the id alone."""
    cache = TableCache()
    model, other = object(), object()
    rows = CachedRows(model)
    key = (id(model), (1,), b"")
    cache.put(key, rows)
    assert cache.get(key, model) is rows
    assert cache.get(key, other) is None


def test_cache_stays_bounded_and_keeps_recent_entries() -> None:
    cache = TableCache(capacity=4)
    model = object()
    for i in range(50):
        cache.put((i, (), b""), CachedRows(model))
        assert cache.get((i, (), b""), model) is not None
    assert len(cache) <= 8
    assert cache.get((0, (), b""), model) is None


def test_cached_rows_are_reused_across_plans() -> None:
    """A replan with unchanged models makes no model call at all."""
    calls = []

    class Counting:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def step_time_s(self, *args: object) -> object:
            calls.append(1)
            return self.inner.step_time_s(*args)  # type: ignore[attr-defined]

        def energy_per_iter_j(self, *args: object) -> object:
            calls.append(1)
            return self.inner.energy_per_iter_j(*args)  # type: ignore[attr-defined]

    snap = synthetic_snapshot(64, 16, seed=3, distinct_models=16)
    jobs: tuple[Job, ...] = tuple(replace(j, model=Counting(j.model)) for j in snap.jobs)
    snap = replace(snap, jobs=jobs)
    policy = PowerFlowPolicy()
    first = policy.plan(snap)
    made = len(calls)
    assert made > 0
    later = replace(snap, now_s=snap.now_s + 30.0)
    assert policy.plan(later) == cold(policy, later)
    second_calls = len(calls) - made
    policy.plan(later)
    assert len(calls) - made - second_calls == 0
    assert first.jobs


def test_a_snapshot_larger_than_the_capacity_is_served_warm() -> None:
    """A job count above the capacity must not make the jobs evict each other."""
    snap = synthetic_snapshot(64, 40, seed=5, distinct_models=None)
    policy = PowerFlowPolicy()
    policy.cache.capacity = 8
    policy.plan(snap)
    cached = len(policy.cache)
    assert cached >= len(snap.jobs)
    plan = policy.plan(replace(snap, now_s=snap.now_s + 1.0))
    assert len(policy.cache) == cached
    assert plan == cold(policy, replace(snap, now_s=snap.now_s + 1.0))


def test_a_gpu_with_another_top_clock_is_a_miss_at_a_fixed_frequency() -> None:
    """The ``P_max`` row is read at the GPU's top clock, which a fixed clock list omits.

    Two clusters whose GPUs differ only in their top clock give the same clock
    list (one fixed clock) and the same shape, so the cache must still tell them
    apart: tables and plans equal a fresh cache's.
    """
    lower = replace(A100, clocks_mhz=tuple(range(210, 1306, 15)), default_clock_mhz=1305)
    assert lower.max_clock_mhz != A100.max_clock_mhz
    first = synthetic_snapshot(64, 12, seed=4, eta=0.5, distinct_models=3)
    second = replace(first, nodes=tuple(replace(n, gpu=lower) for n in first.nodes))
    policy = PowerFlowPolicy(frequency_scaling=False, fixed_frequency_mhz=1200)
    clocks = policy.clocks(A100)
    assert clocks == policy.clocks(lower)
    cache = TableCache()
    for snap in (first, second, first):
        cluster = cluster_of(snap)
        warm = build_tables(snap.jobs, cluster, clocks, policy.elastic, cache)
        fresh = build_tables(snap.jobs, cluster, clocks, policy.elastic)
        for w, f in zip(warm.job_rows, fresh.job_rows, strict=True):
            np.testing.assert_array_equal(w.vectors, f.vectors)
            np.testing.assert_array_equal(w.both, f.both)
        assert policy.plan(snap) == cold(policy, snap)
