"""PowerFlowPolicy on hand-made snapshots: Algorithm 1's rules, caps, ablations, bad input."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from policy_cases import ZOO, ScaledModel, efficient_clock, job, job_power, nodes

from powerflow.core.errors import PlacementError, SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.policy.placement import PlacementResult
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot
from powerflow.lab.scenarios import SMALL_GPU

POLICY = PowerFlowPolicy()
AMPLE = Budget(limit_w=1e9)


def snap(cluster: tuple[Node, ...], *jobs: Job, budget: Budget = AMPLE) -> Snapshot:
    return Snapshot(nodes=cluster, jobs=jobs, budget=budget, now_s=100.0)


def test_a_job_starts_at_its_most_energy_efficient_clock() -> None:
    j = job("a", max_gpus=1)
    f_eff = efficient_clock(j, 1, 4, A100.clocks_mhz)
    # Exactly the power of the job at its efficient clock plus three idle GPUs:
    # any raise would exceed the limit.
    limit = float(job_power(j, 1, 4, f_eff)) + 3 * A100.idle_power_w
    plan = POLICY.plan(snap(nodes(1, 4), j, budget=Budget(limit_w=limit)))
    assert A100.min_clock_mhz < f_eff < A100.max_clock_mhz
    assert (plan.job("a").gpus, plan.job("a").frequency_mhz) == (1, f_eff)
    assert plan.predicted_w == pytest.approx(limit)


def test_ample_power_uses_gpus_while_they_help_and_the_top_clock() -> None:
    jobs = (job("a", model=ZOO[0], global_batch_size=512), job("b", model=ZOO[1]))
    plan = POLICY.plan(snap(nodes(2, 4), *jobs))
    free = 8 - sum(jp.gpus for jp in plan.jobs)
    assert all(jp.gpus for jp in plan.jobs)
    for j in jobs:
        jp = plan.job(j.id)
        assert jp.frequency_mhz == A100.max_clock_mhz  # step time falls with the clock
        n, m = jp.gpus, 2 * jp.gpus
        if m <= 8:
            f_n, f_m = (efficient_clock(j, k, 4, A100.clocks_mhz) for k in (n, m))
            now = j.model.step_time_s(n, min(n, 4), -(-j.global_batch_size // n), f_n)
            nxt = j.model.step_time_s(m, min(m, 4), -(-j.global_batch_size // m), f_m)
            # A doubling that would have helped was left out only for want of GPUs.
            assert nxt >= now or n > free
    assert plan.predicted_w <= plan.limit_w


def test_zero_budget_runs_nothing_and_powers_everything_down() -> None:
    plan = POLICY.plan(snap(nodes(2, 4), job("a"), job("b"), budget=Budget(eta=0.0)))
    assert [jp.gpus for jp in plan.jobs] == [0, 0]
    assert plan.powered_down_nodes == ("n0", "n1")
    assert plan.predicted_w == 0.0


def test_unused_nodes_are_powered_down_and_cost_nothing() -> None:
    plan = POLICY.plan(snap(nodes(4, 8), job("a", max_gpus=2)))
    assert plan.job("a").gpus == 2
    assert len(plan.powered_down_nodes) == 3
    jp = plan.job("a")
    busy = float(job_power(job("a"), 2, 8, jp.frequency_mhz))
    assert plan.predicted_w == pytest.approx(busy + 6 * A100.idle_power_w)


def test_pinned_job_keeps_its_gpus_and_is_counted_first() -> None:
    slots = tuple(("n0", i) for i in range(4))
    pinned = job("p", placement=slots, pinned=True, arrival_s=50.0)
    hungry = job("h", global_batch_size=1024, model=ZOO[2])
    plan = POLICY.plan(snap(nodes(1, 8), hungry, pinned))
    assert plan.job("p").placement == slots
    assert plan.job("p").gpus == 4
    assert not set(plan.job("h").placement) & set(slots)
    assert plan.job("h").gpus <= 4


def test_local_batch_rounds_up_when_the_count_does_not_divide_the_batch() -> None:
    plan = POLICY.plan(snap(nodes(1, 8), job("a", global_batch_size=100, min_gpus=8)))
    assert (plan.job("a").gpus, plan.job("a").local_batch_size) == (8, 13)


def test_min_gpus_round_up_to_a_power_of_two_and_memory_cap_forbids_small_counts() -> None:
    plan = POLICY.plan(
        snap(
            nodes(2, 8),
            job("m", min_gpus=3, max_gpus=4),
            job("c", global_batch_size=256, max_local_batch_size=32, max_gpus=8),
        )
    )
    assert plan.job("m").gpus == 4
    assert plan.job("c").gpus == 8
    assert plan.job("c").local_batch_size == 32


def test_a_job_with_no_feasible_count_waits_with_a_note() -> None:
    j = job("c", global_batch_size=256, max_local_batch_size=32)  # needs >= 8 GPUs
    plan = POLICY.plan(snap(nodes(1, 4), j))
    assert plan.job("c").gpus == 0
    assert any(note.startswith("c:") for note in plan.notes)


def test_jobs_with_no_rows_between_and_after_waiting_jobs_keep_their_own_clocks() -> None:
    """A job with no allowed count has no table rows (its start is the next job's first
    row, or past the end): a waiting job beside it still shows its own first count's
    clock and local batch."""
    wide = job("w", global_batch_size=256, max_local_batch_size=32)  # needs >= 8 GPUs
    waits = job("b", requested_gpus=4, min_gpus=4, global_batch_size=64, model=ZOO[1])
    runs = job("a", requested_gpus=4, min_gpus=4, global_batch_size=64, arrival_s=-1.0)
    plan = POLICY.plan(snap(nodes(1, 4), runs, wide, waits, replace(wide, id="z")))
    assert sorted(plan.job(x).gpus for x in "ab") == [0, 4]  # one node: one of them
    assert [plan.job(x).gpus for x in "wz"] == [0, 0]
    idle = runs if plan.job("a").gpus == 0 else waits
    assert plan.job(idle.id).local_batch_size == 16
    assert plan.job(idle.id).frequency_mhz == efficient_clock(idle, 4, 4, A100.clocks_mhz)
    assert plan.job("w").local_batch_size == plan.job("z").local_batch_size == 256
    assert sum(note.startswith(("w:", "z:")) for note in plan.notes) == 2


def test_a_finished_job_gets_no_gpus() -> None:
    plan = POLICY.plan(snap(nodes(1, 4), job("done", remaining_iterations=0.0)))
    assert plan.job("done").gpus == 0


def test_replanning_the_plan_keeps_every_job_where_it_is() -> None:
    first_snap = snap(
        nodes(2, 8),
        job("a", model=ZOO[0], global_batch_size=64, max_gpus=4),
        job("b", model=ZOO[1], max_gpus=2, arrival_s=10.0),
        job("c", model=ZOO[2], global_batch_size=512, max_gpus=8, arrival_s=20.0),
        budget=Budget(eta=0.8),
    )
    first = POLICY.plan(first_snap)
    running = tuple(
        replace(j, placement=first.job(j.id).placement, frequency_mhz=first.job(j.id).frequency_mhz)
        for j in first_snap.jobs
    )
    second = POLICY.plan(replace(first_snap, jobs=running))
    assert second.migrations == ()
    assert [jp.placement for jp in second.jobs] == [jp.placement for jp in first.jobs]


# --- ablations ---------------------------------------------------------------


def test_without_frequency_scaling_every_job_runs_at_the_fixed_clock() -> None:
    jobs = (job("a"), job("b", model=ZOO[1]))
    plan = PowerFlowPolicy(frequency_scaling=False).plan(snap(nodes(1, 8), *jobs))
    assert {jp.frequency_mhz for jp in plan.jobs} == {A100.max_clock_mhz}
    fixed = PowerFlowPolicy(frequency_scaling=False, fixed_frequency_mhz=1005)
    assert {jp.frequency_mhz for jp in fixed.plan(snap(nodes(1, 8), *jobs)).jobs} == {1005}
    with pytest.raises(SnapshotError, match="1000 MHz"):
        PowerFlowPolicy(frequency_scaling=False, fixed_frequency_mhz=1000).plan(
            snap(nodes(1, 8), *jobs)
        )


def test_without_elasticity_jobs_get_their_request_first_come_first_served() -> None:
    jobs = (
        job("late", requested_gpus=4, arrival_s=2.0),
        job("big", requested_gpus=8, arrival_s=1.0),
        job("first", requested_gpus=3, arrival_s=0.0),
    )
    plan = PowerFlowPolicy(elastic=False).plan(snap(nodes(1, 8), *jobs))
    # "first" (3 -> 4 GPUs) starts, "big" no longer fits, "late" backfills.
    assert [plan.job(i).gpus for i in ("first", "big", "late")] == [4, 0, 4]


def test_energy_awareness_prefers_the_cheaper_speed_up() -> None:
    costly = job("costly", model=ScaledModel(t1=1.0, a=0.5, watts=300.0))
    cheap = job("cheap", model=ScaledModel(t1=0.1, a=0.95, watts=300.0))
    flat = job("flat", model=ScaledModel(t1=0.01, a=0.0, watts=300.0))
    cluster = nodes(1, 4)
    # Premise: on one GPU more, "costly" gains more time, "cheap" more time per joule.
    gains = {}
    for j in (costly, cheap):
        f = efficient_clock(j, 1, 4, A100.clocks_mhz)
        t = [float(j.model.step_time_s(n, n, 128, f)) for n in (1, 2)]
        e = [float(j.model.energy_per_iter_j(n, n, 128, f)) for n in (1, 2)]
        gains[j.id] = (t[0] - t[1], (t[0] - t[1]) / (e[1] - e[0]))
    assert gains["costly"][0] > gains["cheap"][0]
    assert gains["costly"][1] < gains["cheap"][1]
    aware = POLICY.plan(snap(cluster, costly, cheap, flat))
    blind = PowerFlowPolicy(energy_aware=False).plan(snap(cluster, costly, cheap, flat))
    assert [aware.job(i).gpus for i in ("costly", "cheap", "flat")] == [1, 2, 1]
    assert [blind.job(i).gpus for i in ("costly", "cheap", "flat")] == [2, 1, 1]


def test_a_coarser_clock_step_only_lands_on_reachable_clocks() -> None:
    j = job("a", max_gpus=1)
    f_eff = efficient_clock(j, 1, 1, A100.clocks_mhz)
    plan = PowerFlowPolicy(frequency_step=4).plan(snap(nodes(1, 1), j))
    f = plan.job("a").frequency_mhz
    assert f == A100.max_clock_mhz or (f - f_eff) % 60 == 0


# --- bad snapshots -----------------------------------------------------------


class _Predicts:
    """A model predicting one constant step time (NaN, zero, ...)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def step_time_s(self, n: object, r: object, bs: object, f: object) -> np.ndarray:
        return np.full(np.broadcast(n, r, bs, f).shape, self.value)

    def energy_per_iter_j(self, n: object, r: object, bs: object, f: object) -> np.ndarray:
        return np.full(np.broadcast(n, r, bs, f).shape, 100.0)


@pytest.mark.parametrize(
    ("cluster", "jobs", "budget", "message"),
    [
        (nodes(1, 8), (job("a", remaining_iterations=-1.0),), AMPLE, "remaining iterations"),
        (nodes(1, 8), (job("a", min_gpus=16),), AMPLE, "at least 16 GPUs"),
        (nodes(1, 8), (job("a"),), Budget(eta=1.5), "eta"),
        (nodes(1, 8), (job("a", model=_Predicts(math.nan)),), AMPLE, "nan"),
        (nodes(1, 8), (job("a", model=_Predicts(0.0)),), AMPLE, "step time 0.0"),
        (nodes(1, 8), (job("a"), job("a")), AMPLE, "not unique"),
        (nodes(1, 8), (job("a", pinned=True),), AMPLE, "pinned"),
        (nodes(1, 8), (job("a", placement=(("zz", 0),)),), AMPLE, "unknown GPU"),
        ((*nodes(1, 8), Node("x", 8, SMALL_GPU)), (job("a"),), AMPLE, "GPU type"),
        ((*nodes(1, 8), Node("x", 4, A100)), (job("a"),), AMPLE, "node shape"),
        ((), (job("a"),), AMPLE, "no nodes"),
    ],
)
def test_bad_snapshots_raise_snapshot_error(
    cluster: tuple[Node, ...], jobs: tuple[Job, ...], budget: Budget, message: str
) -> None:
    with pytest.raises(SnapshotError, match=message):
        POLICY.plan(Snapshot(nodes=cluster, jobs=jobs, budget=budget, now_s=0.0))


def test_clock_raises_are_undone_when_placement_powers_more_gpus_than_estimated() -> None:
    # Two pinned 1-GPU jobs hold n0 and n1, so the 4-GPU job needs n2: placement
    # powers three nodes where the packing estimate counted two.
    a = job("a", placement=(("n0", 0),), pinned=True, model=ZOO[1])
    b = job("b", placement=(("n1", 0),), pinned=True, model=ZOO[2])
    c = job("c", min_gpus=4, max_gpus=4, model=ZOO[0])
    estimate = (
        sum(
            float(job_power(j, n, 4, efficient_clock(j, n, 4, A100.clocks_mhz)))
            for j, n in ((a, 1), (b, 1), (c, 4))
        )
        + 2 * A100.idle_power_w
    )
    limit = estimate + 500.0
    plan = POLICY.plan(snap(nodes(3, 4), a, b, c, budget=Budget(limit_w=limit)))
    assert plan.job("c").placement == tuple(("n2", i) for i in range(4))
    assert plan.powered_down_nodes == ()
    assert plan.predicted_w <= limit
    # 500 W of head room minus 4 more idle GPUs: some raises survive.
    assert any(
        plan.job(j.id).frequency_mhz > efficient_clock(j, plan.job(j.id).gpus, 4, A100.clocks_mhz)
        for j in (a, b, c)
    )


def test_a_job_placement_cannot_fit_waits_with_a_note_and_the_others_run() -> None:
    # Pinned 1-GPU jobs on both nodes leave 6 GPUs free but no whole free node:
    # allocation gives c its 4 GPUs, placement finds no aligned block for them.
    a = job("a", placement=(("n0", 0),), pinned=True, model=ZOO[1])
    b = job("b", placement=(("n1", 0),), pinned=True, model=ZOO[2])
    c = job("c", min_gpus=4, max_gpus=4, model=ZOO[0], arrival_s=1.0)
    d = job("d", max_gpus=1, model=ZOO[0], arrival_s=2.0)
    plan = POLICY.plan(snap(nodes(2, 4), a, b, c, d))
    assert [p.job_id for p in plan.jobs] == ["a", "b", "c", "d"]
    assert plan.job("c").gpus == 0 and plan.job("c").placement == ()
    assert "c: placement found no GPUs; it waits" in plan.notes
    assert plan.job("a").placement == (("n0", 0),) and plan.job("b").placement == (("n1", 0),)
    assert plan.job("d").gpus == 1
    assert plan == PowerFlowPolicy().plan(snap(nodes(2, 4), a, b, c, d))


def test_placement_answering_another_gpu_count_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The policy checks placement's answer: a job on more or fewer GPUs than planned."""
    import powerflow.core.policy.powerflow as module

    real = module.place_columns

    def short(*args: Any) -> PlacementResult:
        result = real(*args)
        return replace(result, assignments={"a": result.assignments["a"][:-1]})  # 1 of 2

    monkeypatch.setattr(module, "place_columns", short)
    with pytest.raises(PlacementError, match="placement returned"):
        PowerFlowPolicy().plan(snap(nodes(2, 4), job("a", min_gpus=2, max_gpus=2)))
