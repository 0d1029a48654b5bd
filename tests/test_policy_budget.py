"""The budget rule: absolute watts win, else eta * G * P_max with a stated P_max."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from policy_cases import ZOO, job, nodes

from powerflow.core.errors import DataError, SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.policy.budget import limit_w, resolve_limit_w
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Snapshot
from powerflow.lab.baselines import AfsPolicy, GandivaPolicy, TiresiasPolicy
from powerflow.lab.groundtruth import reference_power_w


def test_absolute_limit_wins_over_eta() -> None:
    assert resolve_limit_w(Budget(eta=0.5, limit_w=1234.0), 16, 300.0) == 1234.0


def test_eta_uses_all_gpus_and_the_given_p_max() -> None:
    assert resolve_limit_w(Budget(eta=0.5, p_max_w=200.0), 16, 999.0) == 1600.0
    assert resolve_limit_w(Budget(eta=0.25), 8, 300.0) == 600.0


def test_no_eta_means_eta_one() -> None:
    assert resolve_limit_w(Budget(), 4, 250.0) == 1000.0


@pytest.mark.parametrize("eta", [-0.1, 1.01, math.nan])
def test_eta_outside_unit_interval_is_refused(eta: float) -> None:
    with pytest.raises(SnapshotError, match="eta"):
        resolve_limit_w(Budget(eta=eta), 8, 300.0)


@pytest.mark.parametrize(
    "budget", [Budget(limit_w=-1.0), Budget(limit_w=math.inf), Budget(p_max_w=0.0)]
)
def test_nonsense_budgets_are_refused(budget: Budget) -> None:
    with pytest.raises(SnapshotError):
        resolve_limit_w(budget, 8, 300.0)


def test_reference_power_is_recomputed_from_the_shipped_profiles() -> None:
    assert A100.reference_power_w == pytest.approx(reference_power_w(A100), abs=0.05)
    assert A100.p_max_w == A100.reference_power_w


def test_p_max_is_the_gpu_types_constant_whatever_the_models_and_jobs() -> None:
    """The same eta is the same watts with any models and any queue."""
    queues = [
        (),
        (job("a", model=ZOO[0], requested_gpus=2, global_batch_size=100),),
        (
            job("a", model=ZOO[1], requested_gpus=16, global_batch_size=64),
            job("b", model=ZOO[2], requested_gpus=1, global_batch_size=32),
        ),
    ]
    expected = 0.7 * 16 * A100.reference_power_w
    for jobs in queues:
        snap = Snapshot(nodes(2, 8), jobs, Budget(eta=0.7), now_s=0.0)
        assert limit_w(snap) == pytest.approx(expected, rel=1e-12)
        assert PowerFlowPolicy().plan(snap).limit_w == pytest.approx(expected, rel=1e-12)
        for policy in (TiresiasPolicy(), GandivaPolicy(), AfsPolicy()):
            assert policy.plan(snap).limit_w == pytest.approx(expected, rel=1e-12)


def test_p_max_watts_overrides_the_reference_power() -> None:
    snap = Snapshot(nodes(3, 4), (), Budget(eta=0.5, p_max_w=250.0), now_s=0.0)
    assert limit_w(snap) == 0.5 * 12 * 250.0
    assert PowerFlowPolicy().plan(snap).limit_w == 0.5 * 12 * 250.0


def test_a_gpu_without_reference_power_uses_its_board_limit() -> None:
    gpu = replace(A100, name="X", reference_power_w=None)
    assert gpu.p_max_w == gpu.max_power_w
    with pytest.raises(DataError, match="reference power"):
        replace(A100, reference_power_w=A100.max_power_w + 1)


def test_powered_down_nodes_still_count_in_g() -> None:
    on = nodes(2, 4)
    off = tuple(type(n)(n.name, n.gpus, n.gpu, powered_on=False) for n in on)
    budget = Budget(eta=0.5, p_max_w=100.0)
    assert limit_w(Snapshot(off, (), budget, 0.0)) == limit_w(Snapshot(on, (), budget, 0.0))
