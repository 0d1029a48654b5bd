"""The simulator under a budget schedule: plans against the budget in force, edges
as scheduling events, the power series' limit following the windows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from powerflow.cli import main
from powerflow.core.budget_schedule import parse_schedule_data
from powerflow.core.gpus import A100
from powerflow.core.learning import OracleLearner
from powerflow.core.policy.budget import limit_w
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Plan, Snapshot
from powerflow.lab.schedulers import ORACLE, Configured
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.world import default_world

H = 3600.0
WINDOWS = '[{start: "01:00", end: "03:00", eta: 0.3}, {start: "23:00", end: "00:30", eta: 0.5}]'


@dataclass
class Recording:
    """PowerFlow checking every step against the limit, remembering what it was asked
    and what it planned."""

    inner: PowerFlowPolicy = field(default_factory=lambda: PowerFlowPolicy(strict_power=True))
    calls: list[tuple[Snapshot, Plan]] = field(default_factory=list)

    def plan(self, snapshot: Snapshot) -> Plan:
        plan = self.inner.plan(snapshot)
        self.calls.append((snapshot, plan))
        return plan


def test_the_simulator_plans_against_the_window_in_force_and_changes_at_its_edges() -> None:
    schedule = parse_schedule_data({"eta": "1.0", "schedule": WINDOWS})
    config = SimConfig(nodes=8, gpus_per_node=8, batch_s=60.0)
    world = default_world()
    jobs = load_jobs(TraceSpec(hours=0.75), config, world)
    policy = Recording()
    configured = Configured(policy, Budget(eta=1.0), ORACLE, "eta", 1.0)
    result = Simulation(
        jobs, configured, config, world, OracleLearner(), budget_schedule=schedule
    ).run()

    # every plan was made against the budget in force at its time
    for snapshot, plan in policy.calls:
        assert snapshot.budget == schedule.budget_at(snapshot.now_s)
        assert plan.limit_w == pytest.approx(limit_w(snapshot))
        assert plan.predicted_w <= plan.limit_w * (1 + 1e-9)
    # a call at each edge of the run, even within batch_s of the one before
    times = [s.now_s for s, _ in policy.calls]
    end = result.series.t_s[-1]
    days = range(int(end // (24 * H)) + 1)
    edges = [d * 24 * H + h * H for d in days for h in (0.5, 1, 3, 23)]
    edges = [t for t in edges if 0 < t <= end]
    assert len(edges) >= 3
    for edge in edges:
        assert edge in times
    # the series' limit follows the windows: low from 01:00, back up at 03:00
    series = result.series
    low = [p.limit_w for s, p in policy.calls if 1 * H <= s.now_s < 3 * H]
    high = [p.limit_w for s, p in policy.calls if 0.5 * H <= s.now_s < 1 * H]
    assert low and high and max(low) < 0.31 * min(high)
    at = {float(t): float(w) for t, w in zip(series.t_s, series.limit_w, strict=True)}
    assert at[1 * H] == pytest.approx(max(low)) and at[3 * H] > 3 * at[1 * H]
    before = series.limit_w[np.searchsorted(series.t_s, 1 * H) - 1]
    assert before > 3 * at[1 * H]  # the limit drops at the edge, not after it


def test_a_window_that_stops_every_job_pauses_the_run_until_its_end() -> None:
    """A zero window (valid: "no training at the peak") leaves the cluster idle while jobs
    wait; the run goes on at the window's end, not stopped as a policy that never
    schedules."""
    schedule = parse_schedule_data(
        {"eta": "1.0", "schedule": '[{start: "00:20", end: "03:00", powerLimitWatts: 0}]'}
    )
    config = SimConfig(nodes=8, gpus_per_node=8)
    world = default_world()
    jobs = load_jobs(TraceSpec(hours=0.5), config, world)
    configured = Configured(PowerFlowPolicy(), Budget(eta=1.0), ORACLE, "eta", 1.0)
    result = Simulation(
        jobs, configured, config, world, OracleLearner(), budget_schedule=schedule
    ).run()
    series = result.series
    paused = (series.t_s > 0.5 * H) & (series.t_s < 3 * H)
    assert paused.any() and np.all(series.power_w[paused] < series.power_w.max() / 10)
    assert all(j.finish_s > 3 * H for j in result.jobs if j.submit_s > 0.4 * H)


def test_simulate_cli_takes_a_schedule_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "schedule.yaml"
    path.write_text("- {start: '00:10', end: '00:40', eta: 0.3}\n")
    argv = ["simulate", "--scheduler", "powerflow", "--eta", "0.9", "--hours", "0.25"]
    argv += ["--nodes", "8", "--oracle", "--json", "--budget-schedule", str(path)]
    assert main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["eta"] == 0.9 and row["jobs"] > 0
    assert row["budget_schedule"] == "00:10-00:40 eta 0.3 (UTC)"
    assert row["limit_w"] == pytest.approx(0.3 * 64 * A100.p_max_w)  # the lowest


def test_simulate_cli_takes_the_budget_configmaps_data_as_kubectl_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kubectl get configmap powerflow-budget -o jsonpath='{.data}'``: strings, and the
    ``schedulingIntervalSeconds`` every ConfigMap of the chart holds (the simulator's
    interval is its own ``--interval``)."""
    data = {
        "eta": "0.9",
        "pMaxWatts": "300",
        "schedulingIntervalSeconds": "60",
        "schedule": '[{"start":"00:10","end":"00:40","eta":0.3}]',
    }
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(data))
    argv = ["simulate", "--scheduler", "powerflow", "--hours", "0.25", "--nodes", "8"]
    assert main([*argv, "--oracle", "--json", "--budget-schedule", str(path)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["budget_schedule"] == "00:10-00:40 eta 0.3 (UTC)"
    assert row["limit_w"] == pytest.approx(0.3 * 64 * 300)
    path.write_text(json.dumps({**data, "schedulingIntervalSeconds": "0"}))
    assert main([*argv, "--budget-schedule", str(path)]) == 2
    assert "schedulingIntervalSeconds 0 must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "extra", "words"),
    [
        ("- {start: '00:10', end: 20:00, eta: 0.3}\n", [], "end: 1200 is a number"),
        ("eta: 0.5\nschedule: []\n", ["--eta", "0.6"], "drop --eta"),
        ("eta: 0.5\nwindows: []\n", [], "unknown keys ['windows']"),
        ("[ {start: '08:00'\n", [], "not YAML or JSON: expected ',' or '}'"),
        # an empty file is a mistake (a wrong path, an unsaved editor), not "no windows"
        ("", [], "is empty"),
        ("# nothing but a comment\n", [], "is empty"),
    ],
)
def test_simulate_cli_refuses_a_bad_schedule_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, extra: list[str], words: str
) -> None:
    path = tmp_path / "schedule.yaml"
    path.write_text(text)
    argv = ["simulate", "--scheduler", "powerflow", *extra, "--budget-schedule", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and str(path) in err
    assert err.count("\n") == 1, err  # one line


def test_a_baseline_takes_no_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "schedule.yaml"
    path.write_text("[]\n")
    assert main(["simulate", "--scheduler", "gandiva", "--budget-schedule", str(path)]) == 2
    assert "gandiva has no power budget" in capsys.readouterr().err
