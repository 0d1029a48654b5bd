"""The cluster ratio both backends report to the power loop (``Snapshot.power_ratio``)."""

from __future__ import annotations

import math

import pytest
from powerflow.operator.actions import Observed
from powerflow.operator.controller import as_planned
from powerflow.operator.learning import MeasuredPower
from powerflow.operator.reconcile import reconcile
from support.operator_pass import pass_inputs
from test_operator_profiling import (
    BUDGET,
    MODEL,
    NODES,
    WINDOW,
    KeepPolicy,
    allocation,
    body,
    running_pods,
)

from powerflow.core.policy.power_ratio import BELIEVED, MAX_RATIO, WINDOW_S, RatioWindow
from powerflow.core.policy.snapshot import JobPlan


def test_the_ratio_is_the_largest_of_the_last_hour_then_forgotten() -> None:
    w = RatioWindow()
    assert w.ratio(0.0) == 1.0  # nothing measured: plan with the limit itself
    w.add(0.0, [(110.0, 100.0), (90.0, 100.0)])  # the cluster's sum: 200 / 200
    w.add(600.0, [(120.0, 100.0)])
    w.add(1200.0, [(95.0, 100.0)])
    assert w.ratio(1200.0) == pytest.approx(1.2)
    assert w.ratio(600.0 + WINDOW_S) == pytest.approx(1.2)  # still within the hour
    assert w.ratio(600.0 + WINDOW_S + 1) == pytest.approx(0.95)
    assert w.ratio(1200.0 + WINDOW_S + 1) == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -5.0])
def test_a_bad_reading_is_left_out_not_the_whole_sample(bad: float) -> None:
    w = RatioWindow()
    w.add(0.0, [(bad, 100.0), (120.0, 100.0), (50.0, bad)])
    assert w.ratio(0.0) == pytest.approx(1.2)
    w2 = RatioWindow()
    w2.add(0.0, [(bad, 100.0)])
    assert w2.ratio(0.0) == 1.0


def test_an_outlier_is_left_out_and_named_and_the_ratio_is_bounded() -> None:
    """One job measured at 10^9 times its plan (a lying agent) moves nothing and is
    returned; jobs all a little over their plans together reach at most MAX_RATIO."""
    w = RatioWindow()
    lo, hi = BELIEVED
    pairs = [(100.0, 100.0), (1e11, 100.0), (100.0 * lo * 0.99, 100.0), (110.0, 100.0)]
    assert w.add(0.0, pairs) == [1, 2]
    assert w.ratio(0.0) == pytest.approx(1.05)
    assert w.add(1.0, [(100.0 * hi, 100.0)] * 3) == []  # believed: 2x, each within range
    assert w.ratio(1.0) == MAX_RATIO


def test_only_jobs_running_as_planned_count() -> None:
    planned = {
        "ml/a": JobPlan("ml/a", 4, 1350, 64, power_w=800.0),
        "ml/b": JobPlan("ml/b", 4, 1350, 64, power_w=800.0),
        "ml/c": JobPlan("ml/c", 2, 1410, 32, power_w=500.0),
        "ml/d": JobPlan("ml/d", 2, 1410, 32),  # no power counted (a baseline's plan)
    }
    measured = {
        "ml/a": MeasuredPower(4, 4, 64, 1350, 880.0),  # as planned
        "ml/b": MeasuredPower(4, 4, 64, 1200, 700.0),  # a cap held it lower
        "ml/c": MeasuredPower(1, 1, 64, 1410, 300.0),  # measured before it grew
        "ml/d": MeasuredPower(2, 2, 32, 1410, 500.0),
        "ml/e": MeasuredPower(2, 2, 32, 1410, 500.0),  # not in the plan
    }
    assert as_planned(planned, measured) == [("ml/a", 880.0, 800.0)]


def test_reconcile_hands_the_ratio_to_the_policy() -> None:
    status = {"phase": "Running", "allocation": allocation(complete=True)}
    policy = KeepPolicy()
    obs = Observed(body(status), running_pods())
    reconcile([obs], NODES, BUDGET, 1000.0, policy, lambda j: MODEL,
              **pass_inputs(profiling_window_s=WINDOW, power_ratio=1.25))  # fmt: skip
    assert policy.snapshots[-1].power_ratio == 1.25


def test_an_outlier_is_an_event_once_per_job_and_configuration() -> None:
    """The controller records a job measured far off its plan as a ``PowerOutlier``
    Warning and a count, once while the job stays at that configuration (its watts move
    with every window), again when it runs elsewhere; the ratio leaves it out."""
    from powerflow.operator.controller import Controller, OperatorConfig
    from powerflow.operator.kube import ClusterState
    from powerflow.operator.metrics import Metrics

    metrics = Metrics()
    controller = Controller(None, OperatorConfig(), None, None, metrics=metrics)  # type: ignore[arg-type]
    controller._planned = {"ml/a": JobPlan("ml/a", 4, 1350, 64, power_w=800.0)}
    job = {"metadata": {"namespace": "ml", "name": "a", "uid": "u-a"}}
    state = ClusterState((Observed(job, ()),), (), None)
    for watts in (1e9, 2e9, 3e9):  # a lying agent's windows, each a little different
        measured = {"ml/a": MeasuredPower(4, 4, 64, 1350, watts)}
        assert controller._power_ratio(measured, 0.0, state) == 1.0
    outliers = [e for e in controller._events if e[2] == "PowerOutlier"]
    assert len(outliers) == 1 and outliers[0][0]["metadata"]["uid"] == "u-a"
    assert metrics.registry.get_sample_value("powerflow_power_outliers_total") == 1
    controller._planned = {"ml/a": JobPlan("ml/a", 8, 1350, 32, power_w=1600.0)}
    controller._power_ratio({"ml/a": MeasuredPower(8, 4, 32, 1350, 1e9)}, 1.0, state)
    assert metrics.registry.get_sample_value("powerflow_power_outliers_total") == 2
