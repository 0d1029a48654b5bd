"""The baselines' knobs are chosen on the tuning windows, by the baseline's own objective."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sweep_cases import assert_tuning_windows_only

from powerflow.cli import main
from powerflow.lab.baselines.gandiva import GANDIVA_JOBS_PER_GPU, GandivaPolicy
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim import experiments, tuning
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome
from powerflow.lab.sim.windows import TUNING_WINDOWS


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_every_setting_runs_on_every_tuning_window_and_never_on_an_evaluation_one() -> None:
    specs = tuning.tuning_specs(SimConfig())
    assert_tuning_windows_only(specs)
    assert all(s.tag == "tune" and s.value == tuning.CLOCK_MHZ for s in specs)
    settings = {(s.scheduler, s.policy_options) for s in specs}
    assert settings == {(g.scheduler, g.options) for grid in tuning.GRIDS.values() for g in grid}
    assert len(specs) == len(settings) * len(TUNING_WINDOWS)


def _outcome(setting: tuning.Setting, window: str, jct_h: float) -> RunOutcome:
    from dataclasses import replace

    spec = tuning.tuning_specs(SimConfig())[0]
    spec = replace(
        spec,
        scheduler=setting.scheduler,
        policy_options=setting.options,
        trace=replace(spec.trace, window=window),
    )
    series = Series(*(np.zeros(2) for _ in range(7)))
    return RunOutcome(spec, {"avg_jct_s": jct_h * 3600}, series)


def test_each_window_weighs_the_same_and_the_lowest_mean_ratio_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A: 10 % faster on a short-JCT window, 5 % slower on a long one; B the
    reverse. Summed JCTs would pick B (the long window dominates); per-window
    ratios pick A."""
    a = tuning.Setting("gandiva", (("max_jobs_per_gpu", 1),))
    b = tuning.Setting("gandiva", (("max_jobs_per_gpu", 2),))
    monkeypatch.setitem(tuning.GRIDS, "gandiva", (a, b))
    monkeypatch.setitem(tuning.GRIDS, "tiresias", ())
    w1, w2 = TUNING_WINDOWS[0].name, TUNING_WINDOWS[1].name
    outcomes = [
        _outcome(a, w1, 1.0),
        _outcome(b, w1, 1.1),
        _outcome(a, w2, 105.0),
        _outcome(b, w2, 100.0),
    ]
    scored = tuning.score(outcomes)["gandiva"]
    assert [s.setting for s in scored] == [a, b]
    assert scored[0].score == pytest.approx((1.0 + 1.05) / 2)
    assert scored[1].score == pytest.approx((1.1 + 1.0) / 2)
    assert scored[0].jct_h == (1.0, 105.0)
    rows = tuning.rows(tuning.score(outcomes))
    assert [r["chosen"] for r in rows] == [True, False]


def test_the_defaults_are_the_settings_tuning_chose() -> None:
    assert GandivaPolicy().max_jobs_per_gpu == GANDIVA_JOBS_PER_GPU == 3
    policy = scheduler("gandiva").configure(1410.0).policy
    assert isinstance(policy, GandivaPolicy) and policy.max_jobs_per_gpu == 3


def test_sweep_tuning_prints_and_writes_the_ranked_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tuple(tuning.Setting("gandiva", (("max_jobs_per_gpu", k),)) for k in (1, 2))
    monkeypatch.setattr(tuning, "GRIDS", {"gandiva": grid})
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)  # the command's plumbing, faster
    out = tmp_path / "out"
    args = ["sweep", "tuning", "--quick", "--workers", "1", "--out", str(out)]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows].count("max_jobs_per_gpu=1") == 1
    assert sum(r["chosen"] for r in rows) == 1 and rows[0]["chosen"]
    assert rows[0]["score"] <= rows[1]["score"] and rows[0]["score"] >= 1.0
    for w in TUNING_WINDOWS:
        assert all(r[f"avg_jct_h_{w.name}"] > 0 for r in rows)
    assert json.loads((out / "tuning.json").read_text()) == rows
    assert (out / "tuning.csv").read_text().startswith("scheduler,setting,score")
