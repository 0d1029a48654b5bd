"""Allocation by AFS-L's tournament (``PowerFlowPolicy.tournament``): AFS-L's choices
where nothing else binds, and PowerFlow's power checks, floor and rescale cost where
they do."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.errors import SnapshotError
from powerflow.core.policy.allocation import PowerModel, Returns, allocate
from powerflow.core.policy.curves import Curves, tie_ranks
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.tables import Tables
from powerflow.lab.baselines.kernels import afs_l_levels
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunSpec, TraceSpec, run_one


def _curves(
    ladders: list[list[float]],
    *,
    first: list[int] | None = None,
    age: list[float] | None = None,
    power_per_gpu: float = 200.0,
    energy: list[list[float]] | None = None,
) -> Curves:
    """Jobs in FIFO order (arrival = index): job ``j`` runs ``ladders[j][k]`` seconds
    more on ``first[j] * 2**k`` GPUs, at ``power_per_gpu`` watts a GPU."""
    jobs = len(ladders)
    first = first or [1] * jobs
    age = age or [0.0] * jobs
    start, sizes, counts, jct, joules = [], [], [], [], []
    for j, times in enumerate(ladders):
        start.append(len(counts))
        sizes.append(len(times))
        counts += [first[j] * 2**k for k in range(len(times))]
        jct += [age[j] + t for t in times]
        joules += (
            energy[j]
            if energy
            else [t * power_per_gpu * n for t, n in zip(times, counts[-len(times) :], strict=True)]
        )
    ints = np.asarray(counts, dtype=np.int64)
    rows = len(counts)
    tables = Tables(
        start=np.asarray(start, dtype=np.int64),
        sizes=np.asarray(sizes, dtype=np.int64),
        row_job=np.repeat(np.arange(jobs), sizes).astype(np.int64),
        counts=ints,
        gpus_per_node=np.minimum(ints, 8),
        local_batch=ints,
        efficient=np.zeros(rows, dtype=np.int64),
        efficient_step_time_s=np.ones(rows),
        efficient_energy_j=np.asarray(joules, dtype=np.float64),
        peak_w=ints * power_per_gpu,
        job_rows=(),
        width=1,
    )
    return Curves(
        tables=tables,
        tie_rank=tie_ranks([(float(j), f"j{j:03d}") for j in range(jobs)]),
        age_s=np.asarray(age, dtype=np.float64),
        row_age_s=np.zeros(rows),
        row_remaining=np.ones(rows),
        efficient=tables.efficient,
        jct_s=np.asarray(jct, dtype=np.float64),
        energy_j=np.asarray(joules, dtype=np.float64),
        power_w=ints * power_per_gpu,
    )


def _power(free: int, limit_w: float = 1e12) -> PowerModel:
    return PowerModel(gpus_per_node=8, idle_w=50.0, limit_w=limit_w, free_gpus=free)


def _levels(curves: Curves, candidates: list[int], power: PowerModel, **kw: object) -> list[int]:
    alloc = allocate(
        curves,
        candidates,
        power,
        energy_aware=True,
        elastic=True,
        strict=True,
        tournament=True,
        **kw,  # type: ignore[arg-type]
    )
    start = curves.tables.start
    return [alloc.rows[j] - int(start[j]) if j in alloc.rows else -1 for j in range(start.size)]


def test_where_nothing_else_binds_the_tournament_is_afs_l() -> None:
    """Random ladders (ties in remaining time included), first steps of 1, 2 or 4
    GPUs, GPUs short or plenty: each job's level is what the AFS baseline's compiled
    rounds give it on the same remaining times (the tables' JCT less the job's age)."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        jobs = int(rng.integers(1, 12))
        ladders = []
        for _ in range(jobs):
            levels = int(rng.integers(1, 6))
            t = float(rng.choice([100.0, 200.0, 400.0, rng.uniform(50, 5000)]))
            times = [t]
            for _ in range(levels - 1):
                times.append(times[-1] * float(rng.choice([0.5, 0.6, rng.uniform(0.5, 0.99)])))
            ladders.append(times)
        free = int(rng.integers(1, 40))
        first = [int(rng.choice([1, 1, 2, 4])) for _ in range(jobs)]
        age = [float(rng.choice([0.0, rng.uniform(0, 500)])) for _ in range(jobs)]
        curves = _curves(ladders, first=first, age=age)
        tables = curves.tables
        remaining = curves.jct_s - curves.age_s[tables.row_job]
        bounds = np.append(tables.start, tables.counts.size)
        want = afs_l_levels(tables.counts, remaining, bounds, free)
        order = list(rng.permutation(jobs))  # candidates in any order: FIFO is by rank
        assert _levels(curves, order, _power(free)) == want.tolist()


def test_a_step_over_the_power_limit_ends_that_job_and_others_go_on() -> None:
    """Without a limit the short job climbs to 4 GPUs; at 560 W its doubling to 4
    GPUs (650 W with the long job's first GPU) is refused: it stays on 2, and the
    long job keeps its first step."""
    curves = _curves([[100.0, 50.0, 25.0], [1000.0]], power_per_gpu=100.0)
    # One node on, 100 W a busy GPU and 50 W an idle one: 3 busy GPUs draw 550 W, 5
    # draw 650 W.
    assert _levels(curves, [0, 1], _power(8, limit_w=1e12)) == [2, 0]
    assert _levels(curves, [0, 1], _power(8, limit_w=560.0)) == [1, 0]
    # After the refusal the rounds go on: the second job's doubling (to 2 GPUs, 600 W
    # with the others) still fits under 660 W, and the third job's first step does not.
    three = _curves([[100.0, 50.0, 25.0], [1000.0, 600.0], [2000.0]], power_per_gpu=100.0)
    assert _levels(three, [0, 1, 2], _power(8, limit_w=660.0)) == [1, 1, 0]


def test_the_floor_ends_a_job_s_doublings_but_never_refuses_a_first_step() -> None:
    # job 0's doubling saves 1 s for 1,000 J (0.001 s/J); job 1's saves 500 s for 100 J
    curves = _curves(
        [[100.0, 99.0], [1000.0, 500.0]],
        energy=[[1000.0, 2000.0], [1000.0, 1100.0]],
    )
    rules = Returns(np.full(2, -1, dtype=np.int64), min_ratio=0.01)
    assert _levels(curves, [0, 1], _power(8)) == [1, 1]
    assert _levels(curves, [0, 1], _power(8), returns=rules) == [0, 1]
    everything = Returns(np.full(2, -1, dtype=np.int64), min_ratio=1e9)
    assert _levels(curves, [0, 1], _power(8), returns=everything) == [0, 0]


def test_the_rescale_cost_keeps_a_running_job_on_its_count() -> None:
    """Job 0 runs on 2 GPUs (row 1). With 6 GPUs, AFS-L alone would move it to 4; a
    restart of 300 s makes the move (its doubling from 2 to 4 now saves less than the
    restart) lose against staying on 2."""
    ladders = [[1000.0, 600.0, 400.0], [1000.0, 600.0]]
    curves = _curves(ladders)
    assert _levels(curves, [0, 1], _power(6)) == [2, 1]
    current = np.asarray([1, -1], dtype=np.int64)
    rules = Returns(current, restart_s=300.0, restart_w=50.0)
    assert _levels(curves, [0, 1], _power(6), returns=rules) == [1, 1]


def test_a_restart_counts_in_the_remaining_times_the_rounds_compare() -> None:
    """One free GPU, two first steps: job 0 (1,000 s left on 1 GPU) would win it over
    job 1 (1,050 s), but it runs on 2 GPUs now, so on 1 it first pays a 100 s restart
    and job 1, the shorter then, wins."""
    curves = _curves([[1000.0, 600.0], [1050.0]])
    assert _levels(curves, [0, 1], _power(1)) == [0, -1]
    current = np.asarray([1, -1], dtype=np.int64)
    rules = Returns(current, restart_s=100.0, restart_w=50.0)
    assert _levels(curves, [0, 1], _power(1), returns=rules) == [-1, 0]


def test_the_option_needs_elastic_allocation_and_no_short_first() -> None:
    assert PowerFlowPolicy(tournament=True).tournament
    with pytest.raises(SnapshotError, match="tournament"):
        PowerFlowPolicy(tournament=True, elastic=False)
    with pytest.raises(SnapshotError, match="tournament"):
        PowerFlowPolicy(tournament=True, short_first=0.5)
    curves = _curves([[10.0]])
    with pytest.raises(ValueError, match="tournament"):
        allocate(curves, [0], _power(8), energy_aware=True, elastic=False, tournament=True)


def test_powerflow_plus_runs_with_the_tournament_and_it_changes_its_plans() -> None:
    """The option reaches the allocation: PowerFlow+ with the tournament (as
    ``plus-tuning --grid tournament`` runs it) schedules the same jobs otherwise than
    with its heap, within its limit."""
    trace, config = TraceSpec(hours=0.25), SimConfig(nodes=2)
    heap = (("short_first", 0.0),)
    rows = [
        run_one(RunSpec("powerflow+", 0.6, trace, config, policy_options=options)).row()
        for options in (heap, (*heap, ("tournament", True)))
    ]
    assert rows[0]["jobs"] == rows[1]["jobs"] > 0
    assert rows[0]["avg_jct_s"] != rows[1]["avg_jct_s"]
    assert [r["time_above_limit_s"] for r in rows] == [0.0, 0.0]
