"""Properties every PowerFlow plan has, on random snapshots (hypothesis)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import allowed_counts, fill_slack_w, raised_any, snapshots

from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.snapshot import Plan, Snapshot

POLICY = PowerFlowPolicy()
STRICT = PowerFlowPolicy(strict_power=True)
VARIANTS = st.sampled_from(
    [
        POLICY,
        STRICT,
        PowerFlowPolicy(frequency_scaling=False),
        PowerFlowPolicy(elastic=False),
        PowerFlowPolicy(energy_aware=False),
        PowerFlowPolicy(frequency_step=5),
    ]
)
FAST = settings(max_examples=50, deadline=None, derandomize=True)


@FAST
@given(snapshots(), VARIANTS)
def test_gpus_fit_the_cluster_and_never_overlap(
    snapshot: Snapshot, policy: PowerFlowPolicy
) -> None:
    plan = policy.plan(snapshot)
    sizes = {n.name: n.gpus for n in snapshot.nodes}
    used = [slot for jp in plan.jobs for slot in jp.placement]
    assert len(used) == len(set(used))
    assert sum(jp.gpus for jp in plan.jobs) <= sum(sizes.values())
    for jp in plan.jobs:
        assert len(jp.placement) == jp.gpus
        assert all(node in sizes and 0 <= i < sizes[node] for node, i in jp.placement)
    busy = {node for node, _ in used}
    assert not busy & set(plan.powered_down_nodes)


@FAST
@given(snapshots(), VARIANTS)
def test_counts_respect_min_max_memory_and_batch(
    snapshot: Snapshot, policy: PowerFlowPolicy
) -> None:
    plan = policy.plan(snapshot)
    total = sum(n.gpus for n in snapshot.nodes)
    for job in snapshot.jobs:
        jp = plan.job(job.id)
        if jp.gpus == 0:
            continue
        assert jp.gpus in allowed_counts(job, total)
        assert jp.local_batch_size == -(-job.global_batch_size // jp.gpus)
        assert job.remaining_iterations > 0
        assert jp.frequency_mhz in snapshot.nodes[0].gpu.clocks_mhz


@FAST
@given(snapshots())
def test_power_stays_within_the_stated_guarantee(snapshot: Snapshot) -> None:
    plan = POLICY.plan(snapshot)
    slack = 1e-6 * max(1.0, plan.limit_watts)
    if raised_any(snapshot, plan):
        # The clock phase only commits raises that keep the power within the limit.
        assert plan.predicted_watts <= plan.limit_watts + slack
    else:
        bound = plan.limit_watts + fill_slack_w(snapshot)
        assert plan.predicted_watts <= bound + slack


@FAST
@given(snapshots(), VARIANTS)
def test_a_snapshot_always_gives_the_same_plan(snapshot: Snapshot, policy: PowerFlowPolicy) -> None:
    assert policy.plan(snapshot) == policy.plan(snapshot)
    reordered = Snapshot(
        nodes=snapshot.nodes,
        jobs=tuple(reversed(snapshot.jobs)),
        budget=snapshot.budget,
        now_s=snapshot.now_s,
    )
    again = policy.plan(reordered)
    plan = policy.plan(snapshot)
    for jp in plan.jobs:
        other = again.job(jp.job_id)
        assert (other.gpus, other.frequency_mhz) == (jp.gpus, jp.frequency_mhz)


@FAST
@given(snapshots())
def test_predicted_power_is_jobs_plus_idle_gpus_on_powered_nodes(snapshot: Snapshot) -> None:
    plan = POLICY.plan(snapshot)
    gpu, gpn = snapshot.nodes[0].gpu, snapshot.nodes[0].gpus
    jobs_w = 0.0
    for job in snapshot.jobs:
        jp = plan.job(job.id)
        if jp.gpus:
            nodes = [n for n, _ in jp.placement]
            r = max(nodes.count(n) for n in set(nodes))
            args = (jp.gpus, r, jp.local_batch_size, jp.frequency_mhz)
            jobs_w += float(job.model.energy_per_iter_j(*args) / job.model.step_time_s(*args))
    on = len(snapshot.nodes) - len(plan.powered_down_nodes)
    idle = gpu.idle_power_w * (on * gpn - sum(jp.gpus for jp in plan.jobs))
    assert abs(plan.predicted_watts - (jobs_w + idle)) <= 1e-6 * max(1.0, jobs_w + idle)


@FAST
@given(snapshots())
def test_strict_power_never_exceeds_the_limit(snapshot: Snapshot) -> None:
    plan = STRICT.plan(snapshot)
    assert plan.predicted_watts <= plan.limit_watts * (1 + 1e-9) + 1e-6


def _running(snapshot: Snapshot, plan: Plan, pin: Callable[[int], bool]) -> Snapshot:
    jobs = tuple(
        replace(
            j,
            placement=plan.job(j.id).placement,
            frequency_mhz=plan.job(j.id).frequency_mhz if plan.job(j.id).gpus else None,
            pinned=bool(plan.job(j.id).gpus) and pin(k),
        )
        for k, j in enumerate(snapshot.jobs)
    )
    return replace(snapshot, jobs=jobs)


@FAST
@given(snapshots())
def test_replanning_a_plan_changes_nothing(snapshot: Snapshot) -> None:
    plan = POLICY.plan(snapshot)
    again = POLICY.plan(_running(snapshot, plan, lambda k: False))
    assert again.migrations == ()
    assert again.jobs == plan.jobs


@FAST
@given(snapshots(), st.integers(0, 2**6 - 1))
def test_pinned_jobs_keep_their_gpus(snapshot: Snapshot, mask: int) -> None:
    plan = POLICY.plan(snapshot)
    pinned = _running(snapshot, plan, lambda k: bool(mask >> k & 1))
    again = POLICY.plan(pinned)
    used = [slot for jp in again.jobs for slot in jp.placement]
    assert len(used) == len(set(used))
    for job in pinned.jobs:
        if job.pinned:
            assert again.job(job.id).placement == job.placement
