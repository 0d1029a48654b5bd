"""The budget rule: absolute watts win, else eta * G * P_max with a stated P_max."""

from __future__ import annotations

import math

import numpy as np
import pytest
from policy_cases import ZOO, job, nodes

from powerflow.errors import SnapshotError
from powerflow.gpus import A100
from powerflow.policy.budget import limit_watts, resolve_limit_watts
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.snapshot import Budget, Job, Snapshot


def test_absolute_limit_wins_over_eta() -> None:
    assert resolve_limit_watts(Budget(eta=0.5, limit_watts=1234.0), 16, 300.0) == 1234.0


def test_eta_uses_all_gpus_and_the_given_p_max() -> None:
    assert resolve_limit_watts(Budget(eta=0.5, p_max_watts=200.0), 16, 999.0) == 1600.0
    assert resolve_limit_watts(Budget(eta=0.25), 8, 300.0) == 600.0


def test_no_eta_means_eta_one() -> None:
    assert resolve_limit_watts(Budget(), 4, 250.0) == 1000.0


@pytest.mark.parametrize("eta", [-0.1, 1.01, math.nan])
def test_eta_outside_unit_interval_is_refused(eta: float) -> None:
    with pytest.raises(SnapshotError, match="eta"):
        resolve_limit_watts(Budget(eta=eta), 8, 300.0)


@pytest.mark.parametrize(
    "budget", [Budget(limit_watts=-1.0), Budget(limit_watts=math.inf), Budget(p_max_watts=0.0)]
)
def test_nonsense_budgets_are_refused(budget: Budget) -> None:
    with pytest.raises(SnapshotError):
        resolve_limit_watts(budget, 8, 300.0)


def _per_gpu_top_power(j: Job, gpn: int) -> float:
    n = j.requested_gpus
    args = (n, min(n, gpn), -(-j.global_batch_size // n), A100.max_clock_mhz)
    return float(j.model.energy_per_iter_j(*args) / j.model.step_time_s(*args)) / n


def test_p_max_is_the_mean_per_gpu_power_of_the_jobs_at_the_top_clock() -> None:
    jobs = (
        job("a", model=ZOO[0], requested_gpus=2, global_batch_size=100),
        job("b", model=ZOO[1], requested_gpus=16, global_batch_size=64),
    )
    snap = Snapshot(nodes(2, 8), jobs, Budget(eta=0.7), now_s=0.0)
    p_max = np.mean([_per_gpu_top_power(j, 8) for j in jobs])
    expected = 0.7 * 16 * p_max
    assert limit_watts(snap) == pytest.approx(expected, rel=1e-12)
    # The policy resolves the same limit from its own tables.
    assert PowerFlowPolicy().plan(snap).limit_watts == pytest.approx(expected, rel=1e-12)


def test_without_jobs_p_max_is_the_board_limit() -> None:
    snap = Snapshot(nodes(3, 4), (), Budget(eta=0.5), now_s=0.0)
    assert limit_watts(snap) == 0.5 * 12 * A100.max_power_w
    assert PowerFlowPolicy().plan(snap).limit_watts == 0.5 * 12 * A100.max_power_w


def test_powered_down_nodes_still_count_in_g() -> None:
    on = nodes(2, 4)
    off = tuple(type(n)(n.name, n.gpus, n.gpu, powered_on=False) for n in on)
    budget = Budget(eta=0.5, p_max_watts=100.0)
    assert limit_watts(Snapshot(off, (), budget, 0.0)) == limit_watts(Snapshot(on, (), budget, 0.0))
