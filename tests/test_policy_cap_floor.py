"""Caps cannot go below the board's lowest power limit: the plan must leave them room.

At eta 0.2 and 0.3 the A100 cluster's limit is 60 and 90 W per GPU, below the
100 W an A100 accepts as its lowest limit. Were the policy to fill the GPUs up to
the limit with jobs it predicts at ~75 W per GPU, every cap would sit at the floor
and their sum would pass the limit; so it runs no more GPUs than floor caps can
hold (docs/policy.md, "Below the boards' lowest power limit").
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import ScaledModel, job, nodes, snapshots

from powerflow.core.gpus import A100
from powerflow.core.policy.power_loop import MIN_CAP_W, _floored, cappable_gpus, caps_w
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Plan, Snapshot

LOW_POWER = ScaledModel(t1=1.0, a=0.9, watts=60.0)
"""Near-linear speed-up, 60 W per GPU at the top clock: under the 100 W floor."""


def _idle_w(snapshot: Snapshot, plan: Plan) -> float:
    gpu, gpn = snapshot.nodes[0].gpu, snapshot.nodes[0].gpus
    on = len(snapshot.nodes) - len(plan.powered_down_nodes)
    return gpu.idle_power_w * (on * gpn - sum(jp.gpus for jp in plan.jobs))


def _floor_w(snapshot: Snapshot, plan: Plan) -> float:
    """What the busy GPUs draw at most with every cap at the board's lowest limit."""
    low = max(MIN_CAP_W, snapshot.nodes[0].gpu.min_power_limit_w or 0.0)
    return low * sum(jp.gpus for jp in plan.jobs) + _idle_w(snapshot, plan)


def test_cappable_gpus_leave_room_for_floor_caps_and_a_partly_used_node() -> None:
    # 2 x 8 A100 at eta 0.2: 960.3 W; one full node (800 W) fits, 9 GPUs on two
    # nodes (900 W + 7 idle at 52.5 W) do not
    limit = 0.2 * 16 * A100.p_max_w
    assert cappable_gpus(limit, 100.0, A100.idle_power_w, 8, 16) == 8
    # 64 x 8 at eta 0.2 (30,730 W): 304 GPUs on 38 nodes; 305 would open a 39th
    assert cappable_gpus(0.2 * 512 * A100.p_max_w, 100.0, 52.5, 8, 512) == 304
    assert cappable_gpus(0.4 * 512 * A100.p_max_w, 100.0, 52.5, 8, 512) == 512
    assert cappable_gpus(500.0, 100.0, 52.5, 8, 16) == 1  # 2: 200 + 6 x 52.5 > 500
    assert cappable_gpus(99.0, 100.0, 52.5, 8, 16) == 0
    assert cappable_gpus(float("inf"), 100.0, 52.5, 8, 16) == 16


def test_cappable_gpus_cached_answers_are_the_loops() -> None:
    for limit in (500.0, 960.3, 0.2 * 512 * A100.p_max_w, 12_000.0):
        for floor, idle, gpn, total in ((100.0, 52.5, 8, 512), (30.0, 60.0, 4, 16)):
            args = (limit, floor, idle, gpn, total)
            want = cappable_gpus.__wrapped__(*args)
            assert cappable_gpus(*args) == cappable_gpus(*args) == want


def test_a_tight_limit_runs_only_as_many_gpus_as_floor_caps_can_hold() -> None:
    snapshot = Snapshot(
        nodes=nodes(2, 8),
        jobs=tuple(job(f"j{i}", model=LOW_POWER, requested_gpus=1) for i in range(8)),
        budget=Budget(eta=0.2),
        now_s=0.0,
    )
    plan = PowerFlowPolicy().plan(snapshot)
    # the models alone would fit all eight (about 55 W each): caps at 100 W could not
    assert sum(jp.gpus for jp in plan.jobs) == 8
    assert _floor_w(snapshot, plan) <= plan.limit_w
    # without caps (the paper's mode) nothing holds it anyway: no change there
    paper = PowerFlowPolicy(power_caps=False).plan(snapshot)
    assert sum(jp.gpus for jp in paper.jobs) == 16


def test_a_job_larger_than_floor_caps_can_hold_waits_and_says_why() -> None:
    snapshot = Snapshot(
        nodes=nodes(2, 8),
        jobs=(job("big", model=LOW_POWER, requested_gpus=16, min_gpus=16),),
        budget=Budget(eta=0.2),
        now_s=0.0,
    )
    plan = PowerFlowPolicy().plan(snapshot)
    assert plan.job("big").gpus == 0
    assert any(
        note.startswith("big: its smallest count, 16 GPUs, is more than caps")
        and "(8 GPUs)" in note
        for note in plan.notes
    )
    assert _floor_w(snapshot, plan) <= plan.limit_w


@settings(max_examples=100, deadline=None, derandomize=True)
@given(snapshots(), st.floats(0.05, 0.4), st.floats(55.0, 150.0))
def test_floor_caps_and_idle_gpus_never_pass_the_limit(
    snapshot: Snapshot, eta: float, watts: float
) -> None:
    """Whatever the models predict, caps at the floor on every busy GPU fit the limit,
    so the caps the plan sets (when it sets them) can always hold it. On A100s (a 100 W
    floor) under tight limits, jobs drawing about ``watts`` per GPU, where it bites."""
    model = ScaledModel(t1=1.0, a=0.9, watts=watts)
    snapshot = replace(
        snapshot,
        jobs=tuple(replace(j, model=model) for j in snapshot.jobs),
        nodes=tuple(replace(node, gpu=A100) for node in snapshot.nodes),
        budget=Budget(eta=eta),
    )
    plan = PowerFlowPolicy().plan(snapshot)
    if any(jp.gpus for jp in plan.jobs):
        assert _floor_w(snapshot, plan) <= plan.limit_w * (1 + 1e-9)


def _caps_job_by_job(
    power: list[float],
    gpus: list[int],
    peak: list[float],
    planned: float,
    limit: float,
    headroom: float,
    low: float,
) -> list[float] | None:
    """``caps_w``'s rules written out one job at a time: what its arrays must give."""
    extra = [p - w if p > w else 0.0 for p, w in zip(peak, power, strict=True)]
    need, left = sum(extra), limit - planned
    if not sum(gpus) or not math.isfinite(limit) or left - need >= headroom * limit:
        return None
    if left <= 0:
        sweep, share = 0.0, left / sum(gpus)
    elif need <= left:
        sweep, share = 1.0, (left - need) / sum(gpus)
    else:
        sweep, share = left / need, 0.0
    caps = [(w + sweep * x) / n + share for w, x, n in zip(power, extra, gpus, strict=True)]
    floor = max(MIN_CAP_W, low)
    counted = [max(floor, w / n) for w, n in zip(power, gpus, strict=True)]
    return _floored(caps, gpus, floor, counted)


def test_caps_are_the_job_by_job_rules_to_the_last_bit() -> None:
    """``caps_w`` works on arrays: every answer (none, shares of a negative or positive
    room, sweeps scaled down, caps raised to the floor) equals the rules applied job by
    job, float for float (random powers, so that summing in another order shows)."""
    rng = np.random.default_rng(11)
    seen = set()
    for case in range(300):
        count = int(rng.integers(1, 40))
        power = rng.uniform(40.0, 3000.0, count).tolist()
        gpus = rng.choice((1, 2, 4, 8, 16), count).tolist()
        peak = np.where(rng.random(count) < 0.5, np.nan, rng.uniform(40.0, 3500.0, count))
        planned = sum(power) + 52.5 * 3
        limit = planned * float(rng.uniform(0.5, 1.2))
        low = (0.0, 100.0, 250.0)[case % 3]
        got = caps_w(power, gpus, peak.tolist(), planned, limit, 0.1, low)
        assert got == _caps_job_by_job(power, gpus, peak.tolist(), planned, limit, 0.1, low)
        seen.add("none" if got is None else "floored" if min(got) <= low else "caps")
    assert seen == {"none", "floored", "caps"}


def test_caps_w_refuses_a_job_without_gpus_or_columns_of_other_lengths() -> None:
    """A cap is watts per GPU: a placed job with no GPU is an error, not an inf or NaN
    cap; nor may the columns differ in length."""
    with pytest.raises(ValueError, match="no GPU"):
        caps_w([300.0, 200.0], [1, 0], [400.0, 250.0], 600.0, 500.0, 0.1, 100.0)
    with pytest.raises(ValueError, match="differ in length"):
        caps_w([300.0], [1, 2], [400.0], 600.0, 500.0, 0.1, 100.0)
