"""Zeus's ``eta_knob`` as the Zeus variants' knob: runs along it, its option, its labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerflow.cli import main
from powerflow.commands.comparison_files import pick_for_timeline
from powerflow.lab.schedulers import ZEUS_ETA_KNOB, ZEUS_ETA_KNOBS, scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.output import knob_text
from powerflow.lab.sim.plots import point_label
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec, run_one
from powerflow.lab.sim.synthetic import SyntheticSpec

TRACE = TraceSpec(synthetic=SyntheticSpec(jobs=30, mean_interval_s=300.0, job_size=1.0, seed=1))
CONFIG = SimConfig(nodes=2)


def _runs(name: str) -> dict[float, dict[str, float]]:
    return {k: run_one(RunSpec(name, k, TRACE, CONFIG)).metrics for k in ZEUS_ETA_KNOBS}


@pytest.mark.parametrize("name", ["gandiva+zeus", "tiresias+zeus"])
def test_energy_only_costs_less_energy_and_more_time_than_time_only(name: str) -> None:
    runs = _runs(name)
    assert runs[1.0]["total_energy_j"] < runs[0.0]["total_energy_j"]
    assert runs[1.0]["avg_jct_s"] > runs[0.0]["avg_jct_s"]


def test_gandiva_zeus_gpu_energy_never_rises_along_the_knob() -> None:
    # The GPUs' energy is what Zeus's cost weighs. The total is not monotone in
    # between (on seed 0, eta_knob 1 spends more than 0.75: slower jobs keep their
    # nodes powered longer), nor is Tiresias+Zeus's GPU energy (preemptions differ).
    runs = _runs("gandiva+zeus")
    active = [runs[k]["active_energy_j"] for k in sorted(ZEUS_ETA_KNOBS)]
    assert active == sorted(active, reverse=True)
    assert active[-1] < active[0]


def test_the_knob_reaches_the_policy_and_defaults_to_zeus_default() -> None:
    spec = scheduler("tiresias+zeus")
    assert spec.knob == "eta_knob" and spec.sweep == ZEUS_ETA_KNOBS
    assert spec.configure(0.25).policy.eta_knob == 0.25  # type: ignore[attr-defined]
    assert spec.configure().policy.eta_knob == ZEUS_ETA_KNOB  # type: ignore[attr-defined]
    assert spec.configure().value == ZEUS_ETA_KNOB
    clock = scheduler("gandiva+zeus-clock").configure(0.75).policy
    assert clock.eta_knob == 0.75 and clock.knob == "clock"  # type: ignore[attr-defined]


def test_labels_rows_and_plot_points_show_the_knob() -> None:
    assert RunSpec("gandiva+zeus", 0.25).label == "gandiva+zeus eta_knob=0.25"
    assert RunSpec("gandiva+zeus").label == "gandiva+zeus eta_knob=0.5"
    row = {"scheduler": "gandiva+zeus", "eta_knob": 0.75}
    assert knob_text(row) == "eta_knob 0.75" and point_label(row) == "eta_knob 0.75"


def test_cli_runs_a_zeus_variant_at_the_given_knob(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scheduler", "gandiva+zeus", "--eta-knob", "0.25", "--json"]
    assert main([*args, "--hours", "0.5", "--nodes", "2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["scheduler"] == "gandiva+zeus" and row["eta_knob"] == 0.25


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--scheduler", "gandiva+zeus", "--eta-knob", "1.5"], "--eta-knob must be in [0, 1]"),
        (["--scheduler", "gandiva+zeus", "--eta-knob", "-0.1"], "--eta-knob must be in [0, 1]"),
        (["--scheduler", "gandiva+zeus", "--eta-knob", "nan"], "--eta-knob must be in [0, 1]"),
        (["--scheduler", "gandiva+zeus", "--eta", "0.5"], "takes --eta-knob, not --eta"),
        (["--scheduler", "gandiva", "--eta-knob", "0.5"], "takes --frequency, not --eta-knob"),
        (["--scheduler", "powerflow", "--eta-knob", "0.5"], "takes --eta, not --eta-knob"),
        (["--eta-knob", "0.5"], "need --scheduler"),
    ],
)
def test_cli_refuses_a_bad_or_misplaced_knob(
    args: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args, "--hours", "0.5", "--nodes", "2"]) == 2
    assert match in capsys.readouterr().err


def _outcome(name: str, value: float, energy: float) -> RunOutcome:
    metrics = {"total_energy_j": energy, "avg_jct_s": 1.0}
    return RunOutcome(RunSpec(name, value), metrics, Series(*(np.zeros(2) for _ in range(7))))


def test_the_timeline_picks_runs_near_zeus_default_not_the_first_zeus_run() -> None:
    outcomes = [
        _outcome("gandiva+zeus", 1.0, 10.0),
        _outcome("gandiva+zeus", 0.5, 20.0),
        _outcome("gandiva", 1020.0, 11.0),
        _outcome("gandiva", 1410.0, 19.0),
    ]
    chosen = {o.spec.scheduler: o.spec.value for o in pick_for_timeline(outcomes)}
    assert chosen == {"gandiva+zeus": 0.5, "gandiva": 1410.0}


def test_the_timeline_passes_over_a_budget_below_the_cap_floor_where_it_can() -> None:
    """PowerFlow's eta 0.3 is nearest Gandiva+Zeus's energy, but its budget is below
    every GPU at its lowest power cap (64 x 8 A100: 100 W each, 51.2 kW): the
    comparison does not compare it, so the figure shows eta 0.6. A scheduler with no
    other run keeps its only one."""
    limits = {0.3: 46_000.0, 0.6: 92_000.0}
    outcomes = [
        _outcome("gandiva+zeus", 0.5, 20.0),
        *(
            RunOutcome(
                RunSpec("powerflow", eta),
                {"total_energy_j": energy, "avg_jct_s": 1.0, "limit_w": limits[eta]},
                Series(*(np.zeros(2) for _ in range(7))),
            )
            for eta, energy in ((0.3, 20.0), (0.6, 30.0))
        ),
    ]
    assert [o.below_cap_floor for o in outcomes[1:]] == [True, False]
    chosen = {o.spec.scheduler: o.spec.value for o in pick_for_timeline(outcomes)}
    assert chosen == {"gandiva+zeus": 0.5, "powerflow": 0.6}
    only = {o.spec.value for o in pick_for_timeline(outcomes[:2])}
    assert only == {0.5, 0.3}
