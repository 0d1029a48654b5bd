"""PowerFlow+'s knobs are chosen on the tuning windows, by its JCT against AFS's at equal
energy: the figure the evaluation judges it by."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sweep_cases import assert_tuning_windows_only

from powerflow.cli import main
from powerflow.core import schedulers
from powerflow.core.errors import SimulationError
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim import experiments, plus_tuning, runner
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.tuning import Setting
from powerflow.lab.sim.windows import TUNING_WINDOWS


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_every_setting_and_afs_run_on_every_tuning_window_only() -> None:
    specs = plus_tuning.specs(SimConfig())
    assert_tuning_windows_only(specs)
    assert all(s.tag == plus_tuning.TAG for s in specs)
    plus = [s for s in specs if s.scheduler == "powerflow+"]
    afs = [s for s in specs if s.scheduler == "afs"]
    assert len(plus) + len(afs) == len(specs)
    per_window = len(plus_tuning.GRID) * len(plus_tuning.ETAS)
    assert len(plus) == per_window * len(TUNING_WINDOWS)
    assert {(s.policy_options, s.value) for s in plus} == {
        (g.options, eta) for g in plus_tuning.GRID for eta in plus_tuning.ETAS
    }
    assert len({s.value for s in afs}) >= 3  # a curve, not a point


def _outcome(
    scheduler: str,
    window: str,
    value: float,
    energy_j: float,
    jct_s: float,
    options: tuple[tuple[str, Any], ...] = (),
    restarts: int = 0,
) -> RunOutcome:
    spec = RunSpec(
        scheduler, value, TraceSpec(window=window), SimConfig(), tag=plus_tuning.TAG,
        policy_options=options,
    )  # fmt: skip
    metrics = {
        "avg_jct_s": jct_s,
        "total_energy_j": energy_j,
        "window_energy_j": energy_j,
        "restarts": restarts,
    }
    return RunOutcome(spec, metrics, Series(*(np.zeros(2) for _ in range(7))))


def test_the_setting_faster_than_afs_at_equal_energy_wins_even_if_slower_at_one_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AFS's curve: JCT 10 h at 100 J down to 5 h at 200 J (linear in between). Setting A
    runs 8 h at 100 J and 4 h at 200 J: AFS is 1.25x slower everywhere. Setting B is
    faster at the top budget (3.9 h) but spends 300 J for it, where AFS's curve does
    not reach, and its lower point is 9 h at 100 J: over the common range (100 to 200
    J) it is worse. JCT at a fixed budget alone would choose B."""
    a = Setting("powerflow+", (("budget_price", 0.1), ("rescale_margin", 1.0)))
    b = Setting("powerflow+", (("budget_price", 0.0), ("rescale_margin", 1.0)))
    monkeypatch.setattr(plus_tuning, "GRID", (a, b))
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    w = TUNING_WINDOWS[0].name
    h = 3600.0
    outcomes = [
        _outcome("afs", w, 1010.0, 100.0, 10 * h),
        _outcome("afs", w, 1410.0, 200.0, 5 * h),
        _outcome("powerflow+", w, 0.6, 100.0, 8 * h, a.options),
        _outcome("powerflow+", w, 1.0, 200.0, 4 * h, a.options),
        _outcome("powerflow+", w, 0.6, 100.0, 9 * h, b.options),
        _outcome("powerflow+", w, 1.0, 300.0, 3.9 * h, b.options),
    ]
    scored = plus_tuning.score(outcomes)
    assert [s.setting for s in scored] == [a, b]
    assert scored[0].score == pytest.approx(1.25)
    assert scored[0].ratios == (pytest.approx(1.25), pytest.approx(1.25))
    assert scored[1].score is not None and scored[1].score < 1.25
    rows = plus_tuning.rows(scored)
    assert [r["chosen"] for r in rows] == [True, False]
    assert plus_tuning.chosen(scored) == {"budget_price": 0.1, "rescale_margin": 1.0}


def test_a_setting_with_no_ratio_ranks_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """PowerFlow+'s energies all above AFS's: no equal-energy ratio, no score."""
    a = Setting("powerflow+", (("budget_price", 0.0), ("rescale_margin", 0.0)))
    b = Setting("powerflow+", (("budget_price", 0.2), ("rescale_margin", 0.0)))
    monkeypatch.setattr(plus_tuning, "GRID", (a, b))
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    w = TUNING_WINDOWS[0].name
    outcomes = [
        _outcome("afs", w, 1010.0, 100.0, 10.0),
        _outcome("afs", w, 1410.0, 200.0, 5.0),
        _outcome("powerflow+", w, 0.6, 500.0, 1.0, a.options),
        _outcome("powerflow+", w, 1.0, 600.0, 0.5, a.options),
        _outcome("powerflow+", w, 0.6, 150.0, 9.0, b.options),
        _outcome("powerflow+", w, 1.0, 200.0, 6.0, b.options),
    ]
    scored = plus_tuning.score(outcomes)
    assert [s.setting for s in scored] == [b, a]
    assert scored[1].score is None and scored[1].ratios == (None, None)


def test_of_settings_within_the_tie_of_the_best_the_one_with_fewest_restarts_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scores 0.1 % above B (a tie) with twice B's restarts: B is chosen; C, 2 % below
    the best, ranks after both even with no restart at all."""
    a = Setting("powerflow+", (("budget_price", 0.05), ("rescale_margin", 0.0)))
    b = Setting("powerflow+", (("budget_price", 0.05), ("rescale_margin", 2.0)))
    c = Setting("powerflow+", (("budget_price", 0.2), ("rescale_margin", 2.0)))
    monkeypatch.setattr(plus_tuning, "GRID", (a, b, c))
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    w = TUNING_WINDOWS[0].name
    afs = [_outcome("afs", w, 1010.0, 100.0, 10.0), _outcome("afs", w, 1410.0, 200.0, 5.0)]
    mine = [
        _outcome("powerflow+", w, eta, energy, jct * factor, setting.options, restarts)
        for setting, factor, restarts in ((a, 1.0, 200), (b, 1.001, 100), (c, 1.02, 0))
        for eta, energy, jct in ((0.6, 100.0, 8.0), (1.0, 200.0, 4.0))
    ]
    scored = plus_tuning.score(afs + mine)
    assert [s.setting for s in scored] == [b, a, c]
    assert scored[0].restarts == 200 and scored[1].restarts == 400
    assert scored[1].score is not None and scored[0].score is not None
    assert scored[1].score > scored[0].score >= scored[1].score * (1 - plus_tuning.TIE)


def test_each_ratio_keeps_its_windows_column_and_equal_restarts_go_by_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs on the second tuning window only: its ratios sit in its own columns, the
    first window's read None. A and B tie with equal restarts: the higher score wins."""
    a = Setting("powerflow+", (("budget_price", 0.0), ("rescale_margin", 1.0)))
    b = Setting("powerflow+", (("budget_price", 0.05), ("rescale_margin", 1.0)))
    monkeypatch.setattr(plus_tuning, "GRID", (a, b))
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:2])
    w = TUNING_WINDOWS[1].name
    afs = [_outcome("afs", w, 1010.0, 100.0, 10.0), _outcome("afs", w, 1410.0, 200.0, 5.0)]
    mine = [
        _outcome("powerflow+", w, eta, energy, jct * factor, setting.options, 10)
        for setting, factor in ((a, 1.001), (b, 1.0))
        for eta, energy, jct in ((0.6, 100.0, 8.0), (1.0, 200.0, 4.0))
    ]
    scored = plus_tuning.score(afs + mine)
    assert [s.setting for s in scored] == [b, a]
    assert scored[0].ratios[:2] == (None, None)
    assert scored[0].ratios[2:] == (pytest.approx(1.25), pytest.approx(1.25))
    row = plus_tuning.rows(scored)[0]
    assert row[f"afs_over_plus_{w}_total_energy_j"] == pytest.approx(1.25)
    assert row[f"afs_over_plus_{TUNING_WINDOWS[0].name}_total_energy_j"] is None


def test_the_defaults_are_the_settings_the_three_grids_chose_in_turn() -> None:
    # the knobs grid chose the price (with the margin that the short-first grid's
    # reference keeps), the short-first grid the exponent and the final margin
    reference = dict(plus_tuning.SHORT_FIRST_GRID[0].options)
    first = {
        "budget_price": schedulers.PLUS_BUDGET_PRICE,
        "rescale_margin": reference["rescale_margin"],
        "short_first": reference["short_first"],
    }
    first_grid = Setting("powerflow+", (*first.items(), *plus_tuning.FIRST_LADDER))
    assert first_grid in plus_tuning.GRID
    # the first grid's ladder is one the profiling grid weighs against PowerFlow+'s own
    ladders = [
        tuple(o for o in s.options if o[0] in runner.PROFILING_OPTIONS)
        for s in plus_tuning.PROFILING_GRID
    ]
    assert plus_tuning.FIRST_LADDER in ladders
    last = {
        "short_first": schedulers.PLUS_SHORT_FIRST,
        "rescale_margin": schedulers.PLUS_RESCALE_MARGIN,
    }
    assert Setting("powerflow+", tuple(last.items())) in plus_tuning.SHORT_FIRST_GRID
    assert last["short_first"] > 0  # the factor is on in PowerFlow+
    policy = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6).policy
    chosen = {"budget_price": schedulers.PLUS_BUDGET_PRICE, **last}
    assert {k: getattr(policy, k) for k in chosen} == chosen


def test_sweep_plus_tuning_prints_and_writes_the_ranked_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tuple(
        Setting("powerflow+", (("budget_price", p), ("rescale_margin", 1.0))) for p in (0.0, 0.2)
    )
    monkeypatch.setattr(plus_tuning, "GRID", grid)
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    monkeypatch.setattr(plus_tuning, "DEFAULT_FREQUENCIES_MHZ", (1110, 1410))
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)  # the command's plumbing, faster
    out = tmp_path / "out"
    args = ["sweep", "plus-tuning", "--quick", "--workers", "1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "plus_tuning.json").read_text())
    assert sorted(r["setting"] for r in rows) == sorted(s.label for s in grid)
    assert sum(r["chosen"] for r in rows) == 1 and rows[0]["chosen"]
    assert f"powerflow+: chosen {rows[0]['setting']}" in printed
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 2 + 2 * len(plus_tuning.ETAS)
    window = TUNING_WINDOWS[0].name
    assert runs[0].startswith("window,") and all(r.startswith(f"{window},") for r in runs[1:])


def test_the_profiling_grid_runs_each_ladder_with_the_chosen_knobs_on_the_tuning_windows() -> None:
    specs = plus_tuning.specs(SimConfig(), grid=plus_tuning.PROFILING_GRID)
    plus = [s for s in specs if s.scheduler == "powerflow+"]
    assert {s.trace.window for s in specs} == {w.name for w in TUNING_WINDOWS}
    assert len(plus) == len(plus_tuning.PROFILING_GRID) * len(plus_tuning.ETAS) * len(
        TUNING_WINDOWS
    )
    # profiling options, and the knobs the first grid chose (the short-first factor
    # came after the ladder); the budget price stays PowerFlow+'s
    reference = plus_tuning.SHORT_FIRST_GRID[0].options
    for spec in plus:
        profiling = {k for k, _ in spec.policy_options if k in runner.PROFILING_OPTIONS}
        assert profiling == set(runner.PROFILING_OPTIONS)
        assert {o for o in spec.policy_options if o[0] not in profiling} == set(reference)
    # today's PowerFlow+ profiling is one of the candidates, so the grid can confirm it
    current = schedulers.PLUS_PROFILING
    assert any(
        {k: v for k, v in s.options if k in runner.PROFILING_OPTIONS}
        == {
            "prerun_s": current.prerun_s,
            "profile_s": current.profile_s,
            "sweep_stride": current.sweep.stride,
            "sweep_lowest": current.sweep.lowest_fraction,
        }
        for s in plus_tuning.PROFILING_GRID
    )


def test_profiling_options_set_a_runs_profiling_and_leave_its_policy() -> None:
    configured = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6)
    options = {"prerun_s": 240.0, "profile_s": 126.5, "sweep_stride": 8, "sweep_lowest": 0.25}
    changed = runner.with_options(configured, options)
    assert changed.policy == configured.policy
    assert changed.profiling.prerun_s == 240.0 and changed.profiling.profile_s == 126.5
    assert changed.profiling.sweep.stride == 8
    assert changed.profiling.sweep.lowest_fraction == 0.25
    assert changed.profiling.fitted_models
    both = runner.with_options(configured, {**options, "budget_price": 0.2})
    assert both.profiling == changed.profiling
    assert both.policy == runner.with_options(configured, {"budget_price": 0.2}).policy
    assert both.policy != configured.policy


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sweep_stride": 2.5}, "whole number"),
        ({"sweep_stride": 0}, "stride"),
        ({"sweep_lowest": 1.5}, "lowest"),
        ({"profile_clocks": 3}, "no option"),
    ],
)
def test_bad_profiling_options_are_refused_in_one_line(
    options: dict[str, Any], message: str
) -> None:
    configured = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6)
    with pytest.raises(SimulationError, match=message):
        runner.with_options(configured, options)


def test_profiling_options_for_a_run_that_profiles_nothing_are_refused() -> None:
    oracle = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6, oracle=True)
    with pytest.raises(SimulationError, match="profiles nothing"):
        runner.with_options(oracle, {"profile_s": 69.0})


def test_sweep_plus_tuning_grid_profiling_ranks_the_ladders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ladders = plus_tuning.PROFILING_GRID[-2:]
    monkeypatch.setattr(plus_tuning, "PROFILING_GRID", ladders)
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    monkeypatch.setattr(plus_tuning, "DEFAULT_FREQUENCIES_MHZ", (1110, 1410))
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)  # the command's plumbing, faster
    out = tmp_path / "out"
    args = ["sweep", "plus-tuning", "--grid", "profiling", "--quick", "--workers", "1"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "plus_tuning.json").read_text())
    assert sorted(r["setting"] for r in rows) == sorted(s.label for s in ladders)
    assert "powerflow+ (profiling)" in printed
    assert f"powerflow+: chosen {rows[0]['setting']}" in printed
    # each ladder really ran with its own profiling: different clocks, different energy
    with (out / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 + 2 * len(plus_tuning.ETAS)
    by_ladder: dict[str, set[str]] = {}
    for run in runs:
        if run["scheduler"] == "powerflow+":
            by_ladder.setdefault(run["setting"], set()).add(run["total_energy_j"])
    assert set(by_ladder) == {s.label for s in ladders}
    first, second = by_ladder.values()
    assert first != second


def test_the_short_first_grid_holds_powerflow_plus_and_its_reference_and_builds_each() -> None:
    grid = plus_tuning.grid_named("short-first")
    assert grid == plus_tuning.SHORT_FIRST_GRID
    configured = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6)
    built = [runner.with_options(configured, dict(s.options)).policy for s in grid]
    # the reference: the factor off, at the first grid's margin
    assert (built[0].short_first, built[0].rescale_margin) == (0.0, 2.0)
    assert configured.policy in built  # PowerFlow+ as it runs is one of the settings
    assert [p.short_first for p in built] == [0.0, 0.5, 0.5, 0.5, 1.0, 1.0]
    assert [p.rescale_margin for p in built] == [2.0, 2.0, 4.0, 8.0, 2.0, 2.0]
    assert [p.short_first_clocks for p in built] == [False] * 5 + [True]
    # the budget price stays PowerFlow+'s
    assert {p.budget_price for p in built} == {configured.policy.budget_price}


def test_sweep_plus_tuning_oracle_scores_powerflow_plus_with_the_ground_truth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--oracle``: PowerFlow+ schedules with the ground truth (no profiling) and its
    oracle runs are the setting's curve, scored against AFS as the grid scores."""
    monkeypatch.setattr(plus_tuning, "TOURNAMENT_GRID", plus_tuning.TOURNAMENT_GRID[:1])
    monkeypatch.setattr(plus_tuning, "WINDOWS", TUNING_WINDOWS[:1])
    monkeypatch.setattr(plus_tuning, "DEFAULT_FREQUENCIES_MHZ", (1110, 1410))
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)
    out = tmp_path / "out"
    args = ["sweep", "plus-tuning", "--grid", "tournament", "--oracle", "--quick"]
    assert main([*args, "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tournament, oracle" in printed
    assert "with the ground truth: best" in printed and "chosen" not in printed
    with (out / "runs.csv").open() as f:
        runs = [r for r in csv.DictReader(f) if r["scheduler"] == "powerflow+"]
    assert len(runs) == len(plus_tuning.ETAS)
    assert {(r["oracle"], r["profiling_phases"]) for r in runs} == {("True", "0")}
    (row,) = json.loads((out / "plus_tuning.json").read_text())
    assert row["score"] is not None  # the oracle runs were scored, not set apart
    assert main(["sweep", "tuning", "--oracle", "--quick", "--out", str(tmp_path / "x")]) == 2
    assert "--oracle is plus-tuning's, not tuning's" in capsys.readouterr().err


def test_score_refuses_oracle_and_fitted_runs_of_powerflow_plus_together() -> None:
    trace = TraceSpec(window=TUNING_WINDOWS[0].name)

    def run(oracle: bool) -> Any:
        spec = RunSpec(plus_tuning.PLUS, 0.6, trace, SimConfig(), oracle=oracle)
        return SimpleNamespace(spec=spec, row=lambda: {"restarts": 0})

    with pytest.raises(ValueError, match="all oracle runs or none"):
        plus_tuning.score([run(True), run(False)])


def test_the_tournament_grid_holds_powerflow_plus_and_builds_each() -> None:
    grid = plus_tuning.grid_named("tournament")
    assert grid == plus_tuning.TOURNAMENT_GRID
    configured = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6)
    built = [runner.with_options(configured, dict(s.options)).policy for s in grid]
    assert built[0] == configured.policy  # the reference: PowerFlow+ as it runs
    assert [p.tournament for p in built] == [False, True, True, True]
    assert [p.short_first for p in built[1:]] == [0.0] * 3
    assert [p.rescale_margin for p in built[1:]] == [2.0, 8.0, 32.0]
    assert {p.budget_price for p in built} == {configured.policy.budget_price}


def test_powerflow_plus_counts_the_run_s_own_restart_cost() -> None:
    plus = schedulers.POWERFLOW_SCHEDULERS["powerflow+"].configure(0.6)
    assert plus.policy.rescale_cost_s == SimConfig().restart_s  # the default: as built
    assert runner.with_restart_estimate(plus, plus.policy.rescale_cost_s) is plus
    dear = runner.with_restart_estimate(plus, 120.0)
    assert dear.policy.rescale_cost_s == 120.0
    assert dear.policy == runner.with_options(plus, {"rescale_cost_s": 120.0}).policy
    assert dear.profiling == plus.profiling
    # a study of a wrong estimate keeps its own
    wrong = runner.with_options(plus, {"rescale_cost_s": 10.0})
    assert runner.with_restart_estimate(wrong, 120.0, (("rescale_cost_s", 10.0),)) is wrong
    # a policy that counts no restart (the paper's) and a baseline stay as they are
    paper = schedulers.POWERFLOW_SCHEDULERS["powerflow"].configure(0.6)
    assert runner.with_restart_estimate(paper, 120.0) is paper
    afs = scheduler("afs").configure(1410.0)
    assert runner.with_restart_estimate(afs, 120.0) is afs


def test_a_run_with_dear_restarts_plans_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = runner.Simulation

    def recording(jobs: Any, configured: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(configured.policy.rescale_cost_s)
        return real(jobs, configured, *args, **kwargs)

    monkeypatch.setattr(runner, "Simulation", recording)
    config = SimConfig(nodes=2, restart_s=120.0)
    runner.simulate(RunSpec("powerflow+", 0.6, TraceSpec(hours=0.05), config))
    runner.simulate(
        RunSpec(
            "powerflow+",
            0.6,
            TraceSpec(hours=0.05),
            config,
            policy_options=(("rescale_cost_s", 5.0),),
        )
    )
    assert seen == [120.0, 5.0]
