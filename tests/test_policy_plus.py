"""PowerFlow+'s options of ``PowerFlowPolicy``: the floor on returns and the rescale cost.

Each rule on a hand-built snapshot whose predictions the test computes itself
(``ScaledModel``: step time ``t1 * n**-a``), against the paper's greedy on the
same snapshot, which takes any doubling that saves any time.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import ScaledModel, efficient_clock, job, nodes, snapshots

from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.policy.curves import curves_of
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.returns import floor_of, returns_of
from powerflow.core.policy.snapshot import Budget, Job, Snapshot
from powerflow.core.policy.tables import build_tables
from powerflow.core.policy.validate import cluster_of
from powerflow.core.schedulers import (
    PLUS_BUDGET_PRICE,
    PLUS_PROFILING,
    PLUS_RESCALE_COST_S,
    PLUS_RESCALE_MARGIN,
    PLUS_SHORT_FIRST,
)
from powerflow.lab.schedulers import scheduler

GPN = 8


def _snapshot(*jobs: Job, eta: float = 1.0, count: int = 1) -> Snapshot:
    return Snapshot(nodes=nodes(count, GPN), jobs=jobs, budget=Budget(eta=eta), now_s=0.0)


def _gpus(policy: PowerFlowPolicy, snapshot: Snapshot, job_id: str) -> int:
    return policy.plan(snapshot).job(job_id).gpus


def _priority(model: ScaledModel, n: int) -> float:
    """The paper's cluster-normalised priority of a lone job's doubling 1 -> 2 ... n -> 2n
    (one job: ``JCT_total / E_total`` is its own JCT / energy on 1 GPU)."""
    probe = job("probe", model=model)
    f = float(efficient_clock(probe, 1, GPN, A100.clocks_mhz))

    def t(k: int) -> float:
        return float(model.step_time_s(k, min(k, GPN), 128, f))

    def e(k: int) -> float:
        return float(model.energy_per_iter_j(k, min(k, GPN), 128, f))

    return ((t(n) - t(2 * n)) / t(1)) / ((e(2 * n) - e(n)) / e(1))


FLAT = ScaledModel(t1=1.0, a=0.05, watts=300.0)
"""Doubling saves 3 % of the step time for nearly twice the energy."""
STEEP = ScaledModel(t1=1.0, a=0.9, watts=300.0)
"""Doubling saves 46 % of the step time for 7 % more energy."""


def test_the_models_give_the_returns_the_tests_rely_on() -> None:
    assert _priority(FLAT, 1) < 0.1
    assert all(_priority(STEEP, n) > 1.2 for n in (1, 2, 4))


def test_floor_refuses_a_doubling_of_tiny_gain_that_the_paper_takes() -> None:
    snapshot = _snapshot(job("flat", model=FLAT))
    assert _gpus(PowerFlowPolicy(), snapshot, "flat") == GPN  # any saving is taken
    assert _gpus(PowerFlowPolicy(min_return=1.0), snapshot, "flat") == 1


def test_floor_takes_doublings_of_large_gain() -> None:
    snapshot = _snapshot(job("steep", model=STEEP))
    assert _gpus(PowerFlowPolicy(min_return=1.0), snapshot, "steep") == GPN


def test_floor_between_two_returns_separates_them() -> None:
    """A floor between the two jobs' priorities stops the poor one and not the good one."""
    low, high = _priority(FLAT, 1), _priority(STEEP, 4)
    snapshot = _snapshot(job("flat", model=FLAT), job("steep", model=STEEP), count=2)
    policy = PowerFlowPolicy(min_return=math.sqrt(low * high))
    plan = policy.plan(snapshot)
    assert plan.job("flat").gpus == 1
    assert plan.job("steep").gpus == GPN


def test_floor_never_refuses_a_job_its_first_gpus() -> None:
    snapshot = _snapshot(*(job(f"j{i}", model=FLAT, arrival_s=float(i)) for i in range(3)))
    plan = PowerFlowPolicy(min_return=1e9).plan(snapshot)
    assert [jp.gpus for jp in plan.jobs] == [1, 1, 1]


def test_floor_holds_clocks_at_the_efficient_one_when_raises_return_little() -> None:
    one = job("one", model=FLAT, min_gpus=1, max_gpus=1)
    clock = efficient_clock(one, 1, GPN, A100.clocks_mhz)
    snapshot = _snapshot(one)
    assert PowerFlowPolicy().plan(snapshot).job("one").frequency_mhz > clock
    assert PowerFlowPolicy(min_return=1e6).plan(snapshot).job("one").frequency_mhz == clock


def test_budget_price_raises_the_floor_as_the_budget_tightens() -> None:
    assert floor_of(0.5, 1.0, 1.0) == 0.5
    assert floor_of(0.5, 1.0, 0.5) == pytest.approx(1.5)
    assert floor_of(0.0, 2.0, 0.25) == pytest.approx(6.0)
    assert floor_of(0.0, 1.0, 0.0) == math.inf
    # A doubling of priority ~1.2 (between the floors at eta 1 and at eta 0.25):
    model = ScaledModel(t1=1.0, a=0.45, watts=300.0)
    assert 0.5 < _priority(model, 1) < 2.0
    lone = job("m", model=model, max_gpus=2)
    policy = PowerFlowPolicy(budget_price=0.7)
    assert _gpus(policy, _snapshot(lone, eta=1.0), "m") == 2
    assert _gpus(policy, _snapshot(lone, eta=0.25), "m") == 1
    assert _gpus(PowerFlowPolicy(), _snapshot(lone, eta=0.25), "m") == 2


def _running(model: ScaledModel, gain_s: float, on: int) -> Job:
    """A job on ``on`` GPUs whose doubling saves ``gain_s`` seconds of JCT at its efficient
    clock (the remaining iterations chosen for that)."""
    probe = job("r", model=model)
    f = float(efficient_clock(probe, on, GPN, A100.clocks_mhz))
    step = model.step_time_s(on, on, 128, f) - model.step_time_s(2 * on, 2 * on, 128, f)
    return job(
        "r",
        model=model,
        remaining_iterations=gain_s / float(step),
        placement=tuple(("n0", g) for g in range(on)),
        frequency_mhz=int(f),
    )


def test_hysteresis_keeps_a_count_when_the_gain_is_below_the_restart_cost() -> None:
    snapshot = _snapshot(_running(STEEP, 20.0, on=2))
    assert _gpus(PowerFlowPolicy(), snapshot, "r") > 2  # 20 s saved: the paper doubles
    assert _gpus(PowerFlowPolicy(rescale_cost_s=30.0), snapshot, "r") == 2


def test_a_gain_above_the_restart_cost_rescales_unless_the_margin_asks_for_more() -> None:
    snapshot = _snapshot(_running(STEEP, 45.0, on=2))
    assert _gpus(PowerFlowPolicy(rescale_cost_s=30.0), snapshot, "r") > 2
    assert _gpus(PowerFlowPolicy(rescale_cost_s=30.0, rescale_margin=1.0), snapshot, "r") == 2


def test_the_rescale_cost_favours_keeping_a_running_job_over_shrinking_it() -> None:
    """Two equal jobs, GPUs for only one of them on 4 (a pinned job holds 2 of 8): the
    paper's tie-break (arrival) gives the 4 GPUs to the earlier job, which makes the
    running one shrink; with the rescale cost the running one keeps them."""
    model = ScaledModel(t1=1.0, a=0.9, watts=300.0)
    pinned = job(
        "pinned",
        model=model,
        placement=(("n0", 0), ("n0", 1)),
        frequency_mhz=A100.max_clock_mhz,
        pinned=True,
    )
    early = job("early", model=model, arrival_s=0.0, remaining_iterations=2000.0)
    late = job(
        "late",
        model=model,
        arrival_s=1.0,
        remaining_iterations=2000.0,
        placement=tuple(("n0", g) for g in range(4, 8)),
        frequency_mhz=A100.max_clock_mhz,
    )
    snapshot = _snapshot(pinned, early, late)
    paper = PowerFlowPolicy().plan(snapshot)
    assert (paper.job("early").gpus, paper.job("late").gpus) == (4, 2)
    plus = PowerFlowPolicy(rescale_cost_s=30.0).plan(snapshot)
    assert (plus.job("early").gpus, plus.job("late").gpus) == (2, 4)


def _long_and_short(max_gpus: int | None = None) -> tuple[Job, Job]:
    """Two jobs of one model (equal ``dJCT / dE`` at every step), the longer one earlier:
    the paper's tie-break (arrival) serves it first."""
    kw: dict[str, object] = {} if max_gpus is None else {"max_gpus": max_gpus}
    return (
        job("long", model=STEEP, arrival_s=0.0, remaining_iterations=20_000.0, **kw),
        job("short", model=STEEP, arrival_s=1.0, remaining_iterations=2_000.0, **kw),
    )


def test_short_first_gives_the_one_doubling_left_to_the_shorter_job() -> None:
    """Pinned jobs hold 5 of 8 GPUs: both jobs start on 1, and one GPU is left for one
    1 -> 2 doubling. The paper's greedy gives it to the earlier (longer) job; the
    short-first factor to the shorter."""
    pinned = (
        job("p4", model=STEEP, placement=tuple(("n0", g) for g in range(4)), pinned=True,
            frequency_mhz=A100.max_clock_mhz),
        job("p1", model=STEEP, placement=(("n0", 4),), pinned=True,
            frequency_mhz=A100.max_clock_mhz),
    )  # fmt: skip
    snapshot = _snapshot(*pinned, *_long_and_short())
    paper = PowerFlowPolicy().plan(snapshot)
    assert (paper.job("long").gpus, paper.job("short").gpus) == (2, 1)
    for exponent in (0.5, 1.0):
        plus = PowerFlowPolicy(short_first=exponent).plan(snapshot)
        assert (plus.job("long").gpus, plus.job("short").gpus) == (1, 2)


def test_short_first_clocks_raise_the_shorter_job_s_clock_first() -> None:
    """Two one-GPU jobs under a limit that holds only some raises: the paper's greedy
    raises both alike; with the factor on raises too, the shorter job's clock goes
    higher and the longer one's lower, within the same limit."""
    snapshot = _snapshot(*_long_and_short(max_gpus=1), eta=0.3)
    paper = PowerFlowPolicy().plan(snapshot)
    assert paper.job("long").frequency_mhz == paper.job("short").frequency_mhz
    doublings_only = PowerFlowPolicy(short_first=1.0).plan(snapshot)
    assert doublings_only == paper  # no doubling here: the same plan
    plus = PowerFlowPolicy(short_first=1.0, short_first_clocks=True).plan(snapshot)
    assert plus.job("short").frequency_mhz > paper.job("short").frequency_mhz
    assert plus.job("long").frequency_mhz < paper.job("long").frequency_mhz
    assert plus.predicted_w <= plus.limit_w


@pytest.mark.parametrize(
    "options",
    [
        {"short_first": -0.5},
        {"short_first": float("nan")},
        {"min_return": -1.0},
        {"budget_price": float("nan")},
        {"rescale_cost_s": -30.0},
        {"rescale_margin": float("inf")},
        {"min_return": 1.0, "energy_aware": False},
    ],
)
def test_bad_options_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(SnapshotError):
        PowerFlowPolicy(**options)  # type: ignore[arg-type]


def test_default_options_are_the_paper_s_greedy() -> None:
    """The new options default to off: the paper's plan, field for field."""
    snapshot = _snapshot(job("flat", model=FLAT), job("steep", model=STEEP), count=2)
    off = PowerFlowPolicy(min_return=0.0, budget_price=0.0, rescale_cost_s=0.0, short_first=0.0)
    assert off.plan(snapshot) == PowerFlowPolicy().plan(snapshot)
    clocks_alone = PowerFlowPolicy(short_first_clocks=True)  # nothing without an exponent
    assert clocks_alone.plan(snapshot) == PowerFlowPolicy().plan(snapshot)
    assert np.isfinite(PowerFlowPolicy().plan(snapshot).predicted_w)


def test_the_registry_builds_powerflow_plus_from_the_same_policy() -> None:
    plus, paper = scheduler("powerflow+"), scheduler("powerflow")
    assert (plus.knob, plus.sweep) == (paper.knob, paper.sweep)
    assert not plus.is_baseline
    # PowerFlow+ profiles as the operator does: no offline pre-run, a short sweep of the
    # clocks a plan can use; the paper's keeps its pre-run and its 21-clock, 240 s sweep
    assert plus.profiling == PLUS_PROFILING != paper.profiling
    assert (plus.profiling.prerun_s, plus.profiling.fitted_models) == (0.0, True)
    assert plus.profiling.sweep.clocks_mhz(A100) == tuple(range(750, 1411, 60))
    assert (paper.profiling.prerun_s, paper.profiling.profile_s) == (240.0, 240.0)
    assert len(paper.profiling.sweep.clocks_mhz(A100)) == 21
    built = plus.configure(0.6)
    assert built.budget == Budget(eta=0.6)
    assert built.policy == PowerFlowPolicy(
        budget_price=PLUS_BUDGET_PRICE,
        rescale_cost_s=PLUS_RESCALE_COST_S,
        rescale_margin=PLUS_RESCALE_MARGIN,
        short_first=PLUS_SHORT_FIRST,
    )
    assert paper.configure(0.6).policy == PowerFlowPolicy()  # the paper's, untouched


@settings(max_examples=60, deadline=None)
@given(snapshots(), st.data())
def test_each_running_job_s_current_row_is_the_row_of_the_count_it_holds(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    held = [data.draw(st.integers(0, 16)) for _ in snapshot.jobs]
    jobs = [
        replace(j, placement=tuple(("x", g) for g in range(n)))
        for j, n in zip(snapshot.jobs, held, strict=True)
    ]
    cluster = cluster_of(snapshot)
    tables = build_tables(jobs, cluster, cluster.gpu.clocks_mhz, True)
    curves = curves_of(tables, jobs, snapshot.now_s)
    returns = returns_of(0.0, 30.0, 50.0, curves, jobs)
    assert returns is not None
    for j, n in enumerate(held):
        rows = [r for r in tables.rows(j) if tables.counts[r] == n]
        assert returns.current[j] == (rows[0] if n and rows else -1)
