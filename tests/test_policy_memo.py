"""The policy's memo (``powerflow.core.policy.memo``) never changes a decision.

One long-lived policy object (rows and plans kept from earlier calls) plans a
seeded sequence of related snapshots like the simulator's (jobs run where the
last plan put them, progress, finish, arrive, get refitted models, get pinned,
sometimes hold GPUs that are not an aligned block, nodes power on and off), and
every plan, or error, must equal that of a fresh policy object on the same
snapshot. The memo's own rules (identity, bounds, reuse) are checked directly.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import snapshots

from powerflow.core.errors import PlacementError, SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import shipped_priors
from powerflow.core.policy import static
from powerflow.core.policy.curves import tie_ranks
from powerflow.core.policy.memo import PolicyMemo
from powerflow.core.policy.power_loop import SCALE_RANGE, job_scales
from powerflow.core.policy.powerflow import PowerFlowPolicy, _job_plan
from powerflow.core.policy.snapshot import Budget, GpuSlot, Job, JobPlan, Plan, Snapshot
from powerflow.core.policy.tables import (
    UID,
    JobRows,
    Previous,
    allowed_mask,
    build_tables,
    counts_of,
)
from powerflow.core.policy.validate import cluster_of
from powerflow.lab.scenarios import synthetic_snapshot
from powerflow.lab.synthetic import synthetic_zoo


@dataclass(frozen=True)
class Rows:
    model: object


def cold(policy: PowerFlowPolicy, snapshot: Snapshot) -> Plan:
    return replace(policy).plan(snapshot)


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
@pytest.mark.parametrize("seed", range(2))
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
        snap = next_snapshot(snap, plan, rng, models, step)
    assert planned >= 4
    assert len(warm.memo) > 0  # the warm object did keep something


@settings(max_examples=60, deadline=None, derandomize=True)
@given(first=snapshots(), variant=st.sampled_from(range(len(VARIANTS))))
def test_warm_plans_equal_cold_plans_on_random_snapshots(first: Snapshot, variant: int) -> None:
    warm = PowerFlowPolicy(**VARIANTS[variant])
    plan = warm_and_cold(warm, first)
    if plan is None:
        return
    # Run the plan (some pinned) and plan again with the memo warm.
    jobs = tuple(
        replace(
            j,
            placement=plan.job(j.id).placement,
            pinned=bool(plan.job(j.id).placement) and k % 3 == 0,
        )
        for k, j in enumerate(first.jobs)
    )
    warm_and_cold(warm, replace(first, jobs=jobs, now_s=first.now_s + 30.0))


def test_a_new_model_object_is_a_miss_even_with_the_same_id() -> None:
    """The entry keeps its model alive and a hit checks identity, never the id alone."""
    memo: PolicyMemo[Rows] = PolicyMemo()
    model, other = object(), object()
    rows = Rows(model)
    key = (id(model), (1,), b"")
    memo.keep(key, rows)
    assert memo.rows(key, model) is rows
    assert memo.rows(key, other) is None


def test_the_memo_stays_bounded_and_keeps_recent_entries() -> None:
    memo: PolicyMemo[Rows] = PolicyMemo(capacity=4)
    model = object()
    for i in range(50):
        memo.keep((i, (), b""), Rows(model))
        assert memo.rows((i, (), b""), model) is not None
    assert len(memo) <= 8
    assert memo.rows((0, (), b""), model) is None


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
    policy.memo.capacity = 8
    policy.plan(snap)
    kept = len(policy.memo)
    assert kept >= len(snap.jobs)
    plan = policy.plan(replace(snap, now_s=snap.now_s + 1.0))
    assert len(policy.memo) == kept
    assert plan == cold(policy, replace(snap, now_s=snap.now_s + 1.0))


def test_a_gpu_with_another_top_clock_is_a_miss_at_a_fixed_frequency() -> None:
    """The ``P_max`` row is read at the GPU's top clock, which a fixed clock list omits.

    Two clusters whose GPUs differ only in their top clock give the same clock
    list (one fixed clock) and the same shape, so the memo must still tell them
    apart: tables and plans equal a fresh memo's.
    """
    lower = replace(A100, clocks_mhz=tuple(range(210, 1306, 15)), default_clock_mhz=1305)
    assert lower.max_clock_mhz != A100.max_clock_mhz
    first = synthetic_snapshot(64, 12, seed=4, eta=0.5, distinct_models=3)
    second = replace(first, nodes=tuple(replace(n, gpu=lower) for n in first.nodes))
    policy = PowerFlowPolicy(frequency_scaling=False, fixed_frequency_mhz=1200)
    clocks = policy.clocks(A100)
    assert clocks == policy.clocks(lower)
    memo: PolicyMemo[JobRows] = PolicyMemo()
    for snap in (first, second, first):
        cluster = cluster_of(snap)
        warm = build_tables(snap.jobs, cluster, clocks, policy.elastic, memo)
        fresh = build_tables(snap.jobs, cluster, clocks, policy.elastic)
        for w, f in zip(warm.job_rows, fresh.job_rows, strict=True):
            np.testing.assert_array_equal(w.vectors[:, :UID], f.vectors[:, :UID])  # not serials
            np.testing.assert_array_equal(w.both, f.both)
        assert policy.plan(snap) == cold(policy, snap)


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


def test_measured_jobs_are_scaled_against_what_their_model_predicts_there() -> None:
    """``job_scales`` reads a measured job's predicted power from its table row; it must
    equal the model's own answer at the measured configuration, also where no row is
    that configuration (GPUs not packed, a clock the policy does not plan with)."""
    snap = synthetic_snapshot(128, 24, seed=9, eta=0.5, distinct_models=4)
    plan = PowerFlowPolicy().plan(snap)
    rng = np.random.default_rng(4)
    placed = [job for job in snap.jobs if plan.job(job.id).placement]
    free: list[GpuSlot] = []
    while len({node for node, _ in free}) < 2:  # GPUs of dropped jobs, on two nodes
        free += plan.job(placed.pop().id).placement
    apart = [s for s in free if s[0] != free[0][0]]
    split = (free[0], apart[0])  # two GPUs on two nodes: no row has r = 1 at n = 2
    jobs = []
    for k, job in enumerate(placed):
        slots = plan.job(job.id).placement
        clock = plan.job(job.id).frequency_mhz if k % 4 else 1207  # 1207: not an A100 clock
        jobs.append(
            replace(
                job,
                placement=slots,
                measured_power_w=float(rng.uniform(50, 3000)),
                measured_frequency_mhz=clock,
            )
        )
    jobs[0] = replace(jobs[0], placement=split, max_gpus=None, min_gpus=1)
    used = [s for j in jobs for s in j.placement]
    assert len(set(used)) == len(used)
    snap = replace(snap, jobs=tuple(jobs))
    cluster = cluster_of(snap)
    clocks = A100.clocks_mhz
    tables = build_tables(snap.jobs, cluster, clocks, True)
    got = job_scales(tables, snap.jobs, cluster.gpus_per_node, clocks)
    lo, hi = SCALE_RANGE
    for job, scale in zip(snap.jobs, got.tolist(), strict=True):
        n = len(job.placement)
        r = max(Counter(node for node, _ in job.placement).values())
        bs = -(-job.global_batch_size // n)
        f = float(job.measured_frequency_mhz or 0)
        power = float(job.model.energy_per_iter_j(n, r, bs, f) / job.model.step_time_s(n, r, bs, f))
        assert job.measured_power_w is not None
        assert scale == min(hi, max(lo, job.measured_power_w / power))
    assert any(len({node for node, _ in j.placement}) == 2 and len(j.placement) == 2 for j in jobs)


def running(snapshot: Snapshot, plan: Plan, rng: np.random.Generator) -> Snapshot:
    """Every job where ``plan`` put it, the placed ones measured there, some profiled."""
    jobs = []
    for job in snapshot.jobs:
        jp = plan.job(job.id)
        placed = bool(jp.placement)
        jobs.append(
            replace(
                job,
                placement=jp.placement,
                frequency_mhz=jp.frequency_mhz if placed else None,
                power_cap_w=jp.power_cap_w if placed else None,
                measured_power_w=(jp.power_w or 1.0) * float(rng.uniform(0.8, 1.2))
                if placed
                else None,
                measured_frequency_mhz=jp.frequency_mhz if placed else None,
                profiled_gpus=frozenset({jp.gpus}) if placed and rng.random() < 0.5 else None,
            )
        )
    return replace(snapshot, jobs=tuple(jobs))


def progressed(snapshot: Snapshot, seconds: float) -> Snapshot:
    """The same jobs ``seconds`` later: only progress (and the time) changed."""
    jobs = tuple(
        replace(
            j,
            remaining_iterations=j.remaining_iterations * 0.97,
            elapsed_s=j.elapsed_s + seconds,
            attained_gpu_s=j.attained_gpu_s + seconds * len(j.placement),
        )
        for j in snapshot.jobs
    )
    return replace(snapshot, jobs=jobs, now_s=snapshot.now_s + seconds)


def warmed(seed: int) -> tuple[PowerFlowPolicy, Snapshot, object]:
    """A policy that planned a snapshot of running jobs, the snapshot, and the static
    part its memo kept."""
    rng = np.random.default_rng(seed)
    policy = PowerFlowPolicy()
    snap = synthetic_snapshot(128, 40, seed=seed, eta=0.5, distinct_models=None)
    snap = running(snap, policy.plan(snap), rng)
    warm_and_cold(policy, snap)
    part = policy.memo.static
    assert part is not None
    return policy, snap, part


def test_only_progress_changed_reuses_the_static_part_and_plans_as_a_fresh_policy() -> None:
    """``static.py``: the last call's static part is handed out again when the jobs
    changed only in progress, and the plan equals a fresh policy's."""
    policy, snap, part = warmed(11)
    for _ in range(4):
        snap = progressed(snap, 60.0)
        warm_and_cold(policy, snap)
        assert policy.memo.static is part


def test_new_caps_and_clocks_on_every_job_keep_the_static_part() -> None:
    """Nothing in the static part reads a job's clock or power cap (``static.UNREAD``):
    a plan that moves every cap and clock (as the caps move together) keeps the part,
    and the next plan, which reads the new caps, equals a fresh policy's."""
    policy, snap, part = warmed(12)
    for step, (cap, clock) in enumerate(((150.0, 1005), (260.0, 1410), (None, None))):
        jobs = tuple(
            replace(j, power_cap_w=cap, frequency_mhz=clock) if j.placement else j
            for j in progressed(snap, 60.0 * (step + 1)).jobs
        )
        moved = replace(snap, jobs=jobs, now_s=snap.now_s + 60.0 * (step + 1))
        assert any(j.power_cap_w != k.power_cap_w for j, k in zip(jobs, snap.jobs, strict=True))
        warm_and_cold(policy, moved)
        assert policy.memo.static is part


FIELD_CHANGES: tuple[tuple[str, Any], ...] = (
    ("measured_power_w", lambda j, rng: (j.measured_power_w or 500.0) * 1.3),
    ("measured_frequency_mhz", lambda j, rng: 1005),
    ("profiled_gpus", lambda j, rng: frozenset({1, 2, 4, 8, 16, 32, 64, 128})),
    ("profiled_gpus", lambda j, rng: frozenset()),
    ("power_cap_w", lambda j, rng: 150.0),
    ("max_gpus", lambda j, rng: 1),
    ("min_gpus", lambda j, rng: 2),
    ("global_batch_size", lambda j, rng: j.global_batch_size * 2),
    ("max_local_batch_size", lambda j, rng: 16),
    ("requested_gpus", lambda j, rng: 8),
    ("arrival_s", lambda j, rng: j.arrival_s - 5000.0),
    ("pinned", lambda j, rng: bool(j.placement)),
    ("model", lambda j, rng: synthetic_zoo(1, seed=int(rng.integers(1000)))[0]),
    ("remaining_iterations", lambda j, rng: float("nan")),
    ("elapsed_s", lambda j, rng: float("inf")),
    ("remaining_iterations", lambda j, rng: -1.0),
)


@pytest.mark.parametrize("change", range(len(FIELD_CHANGES)))
def test_a_changed_field_is_seen_by_a_warm_policy(change: int) -> None:
    """One job's field changes between two calls (everything else only progresses):
    the warm policy's plan, or error, equals a fresh policy's (``static.py``'s per-job
    facts must not hide the change)."""
    name, value = FIELD_CHANGES[change]
    rng = np.random.default_rng(change)
    policy = PowerFlowPolicy()
    snap = synthetic_snapshot(128, 40, seed=change, eta=0.6, distinct_models=None)
    snap = running(snap, policy.plan(snap), rng)
    warm_and_cold(policy, snap)
    for k in (0, 7, 19):
        snap = progressed(snap, 30.0)
        jobs = list(snap.jobs)
        jobs[k] = replace(jobs[k], **{name: value(jobs[k], rng)})
        snap = replace(snap, jobs=tuple(jobs))
        warm_and_cold(policy, snap)


def test_arrivals_and_departures_between_calls_plan_as_a_fresh_policy() -> None:
    """Jobs come and go (the others keep their facts, at new positions)."""
    rng = np.random.default_rng(5)
    policy = PowerFlowPolicy()
    snap = synthetic_snapshot(128, 48, seed=5, eta=0.7, distinct_models=None)
    later = snap.jobs[36:]
    snap = replace(snap, jobs=snap.jobs[:36])
    for step in range(6):
        plan = warm_and_cold(policy, snap)
        assert plan is not None
        snap = progressed(running(snap, plan, rng), 60.0)
        kept = [j for k, j in enumerate(snap.jobs) if k % 5 != step % 5]
        snap = replace(snap, jobs=(*kept, *later[2 * step : 2 * step + 2]))


def test_a_replan_of_the_same_requests_reuses_the_placement() -> None:
    """The memo's placement is handed out again for equal inputs (and the plan equals a
    fresh policy's); nodes switched on or off are other inputs."""
    policy = PowerFlowPolicy()
    snap = replanned(synthetic_snapshot(64, 30, seed=2, eta=0.8), policy)
    policy.plan(snap)
    assert policy.memo.placement is not None
    kept = policy.memo.placement[1]
    again = progressed(snap, 1.0)
    assert policy.plan(again) == cold(policy, again)
    assert policy.memo.placement[1] is kept
    off = replace(again, nodes=tuple(replace(n, powered_on=False) for n in again.nodes))
    assert policy.plan(off) == cold(policy, off)
    assert policy.memo.placement[1] is not kept


@pytest.mark.parametrize("order", ["field first", "progress first"])
def test_two_faults_raise_the_first_as_a_fresh_policy_does(order: str) -> None:
    """A changed job with a bad field and an unchanged one with bad progress: a warm
    policy checks them differently (``validate_jobs``' ``checked``) but must raise the
    fresh policy's error, the first in job order."""
    rng = np.random.default_rng(3)
    policy = PowerFlowPolicy()
    snap = synthetic_snapshot(64, 20, seed=3, eta=0.6, distinct_models=None)
    snap = running(snap, policy.plan(snap), rng)
    warm_and_cold(policy, snap)
    jobs = list(progressed(snap, 30.0).jobs)
    field, progress = (4, 9) if order == "field first" else (9, 4)
    jobs[field] = replace(jobs[field], global_batch_size=0)
    jobs[progress] = replace(jobs[progress], remaining_iterations=None)  # type: ignore[arg-type]
    with pytest.raises((SnapshotError, TypeError)) as fresh:
        cold(policy, replace(snap, jobs=tuple(jobs)))
    with pytest.raises(type(fresh.value), match=re.escape(str(fresh.value))):
        policy.plan(replace(snap, jobs=tuple(jobs)))


def _two_placed(seed: int) -> tuple[PowerFlowPolicy, Snapshot, list[Job], int, int]:
    """A warm policy, the snapshot it planned (jobs running as planned), that snapshot's
    jobs 30 s later and the positions of its first and last placed unpinned jobs."""
    rng = np.random.default_rng(seed)
    policy = PowerFlowPolicy()
    snap = synthetic_snapshot(64, 20, seed=seed, eta=0.9, distinct_models=None)
    snap = running(snap, policy.plan(snap), rng)
    warm_and_cold(policy, snap)
    jobs = list(progressed(snap, 30.0).jobs)
    placed = [k for k, j in enumerate(jobs) if j.placement and not j.pinned]
    return policy, snap, jobs, placed[0], placed[-1]


def test_a_job_moved_onto_anothers_gpus_is_refused_as_a_fresh_policy_does() -> None:
    """Only the moved job changed; the GPUs it now shares are checked all the same."""
    policy, snap, jobs, a, b = _two_placed(8)
    jobs[a] = replace(jobs[a], placement=jobs[b].placement)
    with pytest.raises(SnapshotError, match="held by both"):
        cold(policy, replace(snap, jobs=tuple(jobs)))
    with pytest.raises(SnapshotError, match="held by both"):
        policy.plan(replace(snap, jobs=tuple(jobs)))


def test_gathered_rows_are_the_rows_asked_for_whatever_the_last_call_gathered() -> None:
    """``Tables.values`` with a memo takes the rows the last call gathered by their
    serials: over tables where the same row numbers hold other values (a refitted model,
    a job gone), with shuffled, repeated and new rows, every answer equals a gather
    without the memo, and a call for the rows of the last one hands its rows back."""
    rng = np.random.default_rng(7)
    snap = synthetic_snapshot(64, 40, seed=3, eta=0.5)
    cluster = cluster_of(snap)
    memo: PolicyMemo[JobRows] = PolicyMemo()
    jobs = list(snap.jobs)
    zoo = synthetic_zoo(4, seed=9)
    for step in range(12):
        if step % 3 == 1:  # a refit: the job's rows keep their numbers, not their values
            k = int(rng.integers(len(jobs)))
            jobs[k] = replace(jobs[k], model=zoo[step % len(zoo)])
        elif step % 3 == 2:  # a job leaves: the rows after its own move up
            jobs.pop(int(rng.integers(len(jobs))))
        tables = build_tables(jobs, cluster, A100.clocks_mhz, True, memo)
        rows = rng.choice(len(tables.row_job), size=int(rng.integers(1, 60)))
        first = int(rng.integers(0, tables.width))
        t, e = tables.values(rows, first, memo)
        want_t, want_e = tables.values(rows, first)
        np.testing.assert_array_equal(t, want_t)
        np.testing.assert_array_equal(e, want_e)
        kept = memo.gathered
        again_t, _ = tables.values(rows, first, memo)
        assert memo.gathered is kept and np.shares_memory(again_t, t)
        back_t, _ = tables.values(rows[::-1], 0, memo)
        np.testing.assert_array_equal(back_t[::-1, first:], want_t)


def test_tables_built_on_an_earlier_calls_rows_equal_tables_built_afresh() -> None:
    """``build_tables`` with ``Previous`` (the kept jobs' rows taken from an earlier
    call's stacked vectors) gives the tables it gives without: kept, new and gone jobs,
    jobs with no allowed count, and an earlier call whose jobs had no rows at all."""
    snap = synthetic_snapshot(64, 30, seed=5, eta=0.5)
    cluster = cluster_of(snap)
    clocks = A100.clocks_mhz
    memo: PolicyMemo[JobRows] = PolicyMemo()
    none = [
        replace(job, id=f"{job.id}-none", global_batch_size=4096, max_local_batch_size=1)
        for job in snap.jobs[:3]
    ]
    sequences = [
        (list(snap.jobs[:20]), [*snap.jobs[5:12], *snap.jobs[22:], *snap.jobs[:3]]),
        (none, [*none[1:], *snap.jobs[:4]]),
        ([*none, *snap.jobs[:6]], [snap.jobs[7], *snap.jobs[:6], none[0]]),
    ]
    for before, after in sequences:
        earlier = build_tables(before, cluster, clocks, True, memo)
        where = {job.id: k for k, job in enumerate(before)}
        index = np.asarray([where.get(job.id, -1) for job in after], dtype=np.int64)
        got = build_tables(after, cluster, clocks, True, memo, Previous(earlier, index))
        want = build_tables(after, cluster, clocks, True, memo)
        assert got.vectors is not None and want.vectors is not None
        np.testing.assert_array_equal(got.vectors, want.vectors)
        for name in ("start", "sizes", "row_job", "counts", "efficient", "peak_w"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        assert got.job_rows == want.job_rows


def test_the_cluster_is_kept_only_for_the_very_same_nodes() -> None:
    """The memo hands out the last cluster for the very same nodes tuple; any other
    nodes (here half of them) are read again, and plan as a fresh policy does."""
    snap = synthetic_snapshot(64, 20, seed=3, eta=0.7, distinct_models=None)
    policy = PowerFlowPolicy()
    warm_and_cold(policy, snap)
    kept = policy.memo.cluster
    assert kept is not None and kept[0] is snap.nodes
    warm_and_cold(policy, replace(snap, now_s=snap.now_s + 1.0))
    assert policy.memo.cluster is kept
    jobs = tuple(replace(j, placement=(), pinned=False) for j in snap.jobs)
    fewer = replace(snap, nodes=snap.nodes[: len(snap.nodes) // 2], jobs=jobs)
    plan = warm_and_cold(policy, fewer)
    assert plan is not None
    assert policy.memo.cluster is not None and policy.memo.cluster[0] is fewer.nodes
    assert {node for jp in plan.jobs for node, _ in jp.placement} <= {n.name for n in fewer.nodes}


@pytest.mark.parametrize(
    "keys",
    [
        [(0.0, "a"), (1.0, "b"), (2.0, "c")],  # increasing arrivals
        [(0.0, "a"), (0.0, "b"), (1.0, "a"), (1.0, "c")],  # ties in id order
        [(0.0, "b"), (0.0, "a"), (1.0, "c")],  # a tie out of id order
        [(2.0, "a"), (1.0, "b"), (3.0, "c")],  # arrivals out of order
        [(-0.0, "b"), (0.0, "a")],  # equal floats of two signs
        [(1, "a"), (1.0, "b"), (2**60 + 1, "c"), (2**60, "d")],  # ints, one rounding
        [(0.0, "a")],
        [],
    ],
)
def test_tie_ranks_from_arrivals_equal_the_ranks_of_the_keys(keys: list[Any]) -> None:
    """``static._tie_ranks`` answers from float64 arrivals where they increase and
    compares only tied pairs' keys: the same ranks as ``curves.tie_ranks``."""
    width = len(static._FIELDS)
    at = static._FIELDS.index("arrival_s")
    fields = [tuple(i if k == 0 else a if k == at else None for k in range(width)) for a, i in keys]
    arrival = np.asarray([float(a) for a, _ in keys], dtype=np.float64)
    got = static._tie_ranks(fields, arrival)
    np.testing.assert_array_equal(got, tie_ranks(keys))


@pytest.mark.parametrize(
    "move", ["onto a job gone", "onto a kept job", "two changed onto one", "off the cluster"]
)
def test_changed_jobs_gpus_are_checked_against_the_kept_ones_as_a_fresh_policy_does(
    move: str,
) -> None:
    """A warm call checks only the changed jobs' GPUs, against those the unchanged
    jobs kept (``static.kept_owners``): GPUs a departed job held are free again;
    a changed job on a GPU an unchanged job keeps, two changed jobs on one GPU and
    a GPU off the cluster are refused, each with a fresh policy's error; the owners
    kept equal a fresh policy's."""
    policy, snap, jobs, a, b = _two_placed(9)
    if move == "onto a job gone":
        jobs[b] = replace(jobs[b], id="newcomer")  # b left; a new job has its GPUs
    elif move == "onto a kept job":
        jobs[b] = replace(jobs[b], placement=(*jobs[b].placement, jobs[a].placement[0]))
        jobs[b] = replace(jobs[b], min_gpus=1, max_gpus=64)  # jobs[a] stays as it was
    elif move == "two changed onto one":
        slot = jobs[a].placement[0]
        jobs[b] = replace(jobs[b], placement=(*jobs[b].placement, slot), min_gpus=1)
        jobs[a] = replace(jobs[a], max_gpus=64)
    else:
        jobs[a] = replace(jobs[a], placement=(*jobs[a].placement, ("nowhere", 0)))
    later = replace(snap, jobs=tuple(jobs))
    refused = warm_and_cold(policy, later) is None  # both raised the same error
    assert refused == (move != "onto a job gone")
    if refused:  # the error a fresh policy raised, which the warm one matched
        why = "unknown GPU" if move == "off the cluster" else "held by both"
        with pytest.raises(SnapshotError, match=why):
            replace(policy).plan(later)
    if move == "onto a job gone":
        part = policy.memo.static
        fresh = replace(policy)
        fresh.plan(later)
        assert isinstance(part, static.StaticPart) and part.owners is not None
        assert part.owners == cast(static.StaticPart, fresh.memo.static).owners


@pytest.mark.parametrize("elastic", [True, False])
def test_counts_of_allows_the_counts_of_allowed_mask(elastic: bool) -> None:
    """``tables.counts_of`` (one job's counts, as ``_evaluate`` builds its rows) gives
    the counts of the job's row of ``allowed_mask``, the spec, on seeded random jobs."""
    rng = np.random.default_rng(11)
    cluster = cluster_of(synthetic_snapshot(64, 4, seed=1, eta=0.7))
    base = synthetic_snapshot(64, 4, seed=1, eta=0.7).jobs[0]
    jobs = []
    for _ in range(300):
        jobs.append(
            replace(
                base,
                global_batch_size=int(rng.integers(1, 600)),
                requested_gpus=int(rng.integers(1, 80)),
                min_gpus=int(rng.integers(1, 70)),
                max_gpus=[None, 0, int(rng.integers(1, 90))][int(rng.integers(3))],
                max_local_batch_size=[None, int(rng.integers(1, 300))][int(rng.integers(2))],
                pinned=bool(rng.random() < 0.1),
                placement=(("n0", 0),),
            )
        )
    mask = allowed_mask(jobs, cluster, elastic)
    powers = 1 << np.arange(mask.shape[1])
    for job, row in zip(jobs, mask, strict=True):
        assert counts_of(job, cluster.total_gpus, elastic) == powers[row].tolist()
    assert mask.any(axis=1).sum() > 100  # most jobs may run somewhere


def test_job_plans_built_at_once_equal_the_constructor_s() -> None:
    names = ("job_id", "gpus", "frequency_mhz", "local_batch_size", "placement", "power_w")
    assert tuple(f.name for f in fields(JobPlan)) == (*names, "power_cap_w")
    slots = (("n0", 0), ("n0", 1))
    for args in (("a", 2, 1410, 16, slots, 412.5, 180.0), ("b", 0, 1005, 32, (), None, None)):
        plan = _job_plan(*args)
        assert type(plan) is JobPlan and plan == JobPlan(*args)
        assert vars(plan) == vars(JobPlan(*args)) and hash(plan) == hash(JobPlan(*args))
