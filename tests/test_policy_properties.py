"""Properties every PowerFlow plan has, on random snapshots (hypothesis)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import allowed_counts, fill_slack_w, raised_any, snapshots

from powerflow.core.policy.power_loop import CAP_SLACK_W, CAP_STEP_W, SCALE_RANGE, caps_w
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Job, JobPlan, Plan, Snapshot

POLICY = PowerFlowPolicy()
STRICT = PowerFlowPolicy(strict_power=True)
PAPER = PowerFlowPolicy(strict_power=False)
"""Algorithm 1's node-boundary check, for the reproduction."""
VARIANTS = st.sampled_from(
    [
        POLICY,
        PAPER,
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
    plan = PAPER.plan(snapshot)
    slack = 1e-6 * max(1.0, plan.limit_w)
    if raised_any(snapshot, plan):
        # The clock phase only commits raises that keep the power within the limit.
        assert plan.predicted_w <= plan.limit_w + slack
    else:
        bound = plan.limit_w + fill_slack_w(snapshot)
        assert plan.predicted_w <= bound + slack


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
    assert abs(plan.predicted_w - (jobs_w + idle)) <= 1e-6 * max(1.0, jobs_w + idle)


@FAST
@given(snapshots())
def test_strict_power_never_exceeds_the_limit(snapshot: Snapshot) -> None:
    plan = STRICT.plan(snapshot)
    assert plan.predicted_w <= plan.limit_w * (1 + 1e-9) + 1e-6


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


def _measured(snapshot: Snapshot, plan: Plan, factors: list[float]) -> Snapshot:
    """Every placed job running as ``plan`` says, its power measured there: the model's
    times its factor (a model ``factor`` times too low or too high everywhere)."""
    jobs = []
    for job, factor in zip(snapshot.jobs, itertools.cycle(factors), strict=False):
        jp = plan.job(job.id)
        if not jp.gpus:
            jobs.append(job)
            continue
        watts = factor * _model_w(job, jp)
        jobs.append(
            replace(
                job,
                placement=jp.placement,
                frequency_mhz=jp.frequency_mhz,
                measured_power_w=watts,
                measured_frequency_mhz=jp.frequency_mhz,
            )
        )
    return replace(snapshot, jobs=tuple(jobs))


def _model_w(job: Job, jp: JobPlan) -> float:
    nodes = [n for n, _ in jp.placement]
    r = max(nodes.count(n) for n in set(nodes))
    args = (jp.gpus, r, jp.local_batch_size, jp.frequency_mhz)
    return float(job.model.energy_per_iter_j(*args) / job.model.step_time_s(*args))


def _idle_w(snapshot: Snapshot, plan: Plan) -> float:
    gpu, gpn = snapshot.nodes[0].gpu, snapshot.nodes[0].gpus
    on = len(snapshot.nodes) - len(plan.powered_down_nodes)
    return gpu.idle_power_w * (on * gpn - sum(jp.gpus for jp in plan.jobs))


FACTORS = st.lists(st.floats(SCALE_RANGE[0], SCALE_RANGE[1]), min_size=1, max_size=6)


@FAST
@given(snapshots(), FACTORS, st.floats(0.5, 1.5), st.floats(0.0, 0.2))
def test_strict_power_with_measured_power_keeps_the_true_power_within_the_limit(
    snapshot: Snapshot, factors: list[float], ratio: float, margin: float
) -> None:
    """The models of the running jobs are off by a per-job factor (the truth; the others'
    are right); once each is measured where it runs, the next plan's true power stays
    within the limit, cut by the cluster ratio and the margin."""
    policy = PowerFlowPolicy(power_margin=margin, power_caps=False)
    first = PAPER.plan(snapshot)
    measured = replace(_measured(snapshot, first, factors), power_ratio=ratio)
    plan = policy.plan(measured)
    truth = {j.id: j.measured_power_w / _model_w(j, first.job(j.id)) for j in measured.jobs
             if j.measured_power_w is not None}  # fmt: skip
    true_w = _idle_w(snapshot, plan) + sum(
        truth.get(job.id, 1.0) * _model_w(job, plan.job(job.id))
        for job in measured.jobs
        if plan.job(job.id).gpus
    )
    target = plan.limit_w / max(1.0, ratio) * (1 - margin)
    assert true_w <= target * (1 + 1e-9) + 1e-6
    assert abs(plan.predicted_w - true_w) <= 1e-6 * max(1.0, true_w)  # it counted them


@FAST
@given(snapshots(), FACTORS, st.floats(0.0, 1.0))
def test_caps_and_idle_gpus_sum_to_the_limit_and_cover_what_the_plan_counted(
    snapshot: Snapshot, factors: list[float], headroom: float
) -> None:
    policy = PowerFlowPolicy(cap_headroom=headroom)
    plan = policy.plan(_measured(snapshot, PAPER.plan(snapshot), factors))
    placed = [jp for jp in plan.jobs if jp.gpus]
    assert all(jp.power_w is not None for jp in placed)
    counted = sum(jp.power_w or 0.0 for jp in placed) + _idle_w(snapshot, plan)
    assert abs(counted - plan.predicted_w) <= 1e-6 * max(1.0, counted)
    capped = [jp for jp in placed if jp.power_cap_w is not None]
    if not capped:
        left = plan.limit_w - plan.predicted_w
        assert not placed or left >= headroom * plan.limit_w
        return
    assert capped == placed  # all or none
    total = sum(jp.power_cap_w * jp.gpus for jp in capped if jp.power_cap_w)
    low = snapshot.nodes[0].gpu.min_power_limit_w or 0.0
    assert min(jp.power_cap_w or 0 for jp in capped) >= low  # what the node agent applies
    floors = sum(max(low * jp.gpus, jp.power_w or 0.0) for jp in capped)
    if floors + _idle_w(snapshot, plan) <= plan.limit_w:  # the boards allow the sum
        # at most the limit, short of it only by the steps caps are rounded down to
        summed = total + _idle_w(snapshot, plan)
        assert summed <= plan.limit_w * (1 + 1e-9)
        high = snapshot.nodes[0].gpu.max_power_w  # nor above the board's highest limit
        assert max(jp.power_cap_w or 0 for jp in capped) <= high
        if all((jp.power_cap_w or 0) < high for jp in capped):
            steps = (CAP_STEP_W + CAP_SLACK_W) * sum(jp.gpus for jp in capped)
            assert summed >= plan.limit_w - steps - 1e-6
        assert all(
            # no cap held yet in these snapshots: at least what was counted, or the
            # board's highest limit
            (jp.power_cap_w or 0) >= min((jp.power_w or 0) / jp.gpus * (1 - 1e-12), high)
            for jp in capped
        )


NAN = float("nan")


@pytest.mark.parametrize(
    ("counted", "limit", "caps"),
    [
        ((90.0, 250.0), 350.0, [100.0, 250.0]),  # 95 W -> 100 W, from the other's room
        ((90.0, 250.0), 345.0, [100.0, 245.0]),  # that room, then below what it counted
        ((90.0, 80.0), 175.0, [100.0, 100.0]),  # both at the floor: only then above
        ((150.0, 250.0), 410.0, [155.0, 255.0]),  # none below: equal shares
    ],
)
def test_no_cap_is_below_the_boards_lowest_limit(
    counted: tuple[float, float], limit: float, caps: list[float]
) -> None:
    """Two 1-GPU jobs, no idle GPU, 100 W the board's lowest limit: a cap below it
    would be clamped up by the node agent (the GPU then draws more than its share), so
    it is raised and the other job's cap gives up what it gains."""
    got = caps_w(counted, (1, 1), (NAN, NAN), sum(counted), limit, 0.1, min_cap_w=100.0)
    assert got == pytest.approx(caps)
