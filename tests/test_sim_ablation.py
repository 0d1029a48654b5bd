"""The ablation: from the paper's setting to this evaluation's, one change per row."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from powerflow.lab.baselines import GandivaPolicy, TiresiasPolicy, ZeusPolicy
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim import ablation
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.experiments import comparison
from powerflow.lab.sim.priors import HELD_OUT, RECURRING
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome, TraceSpec, with_options


def test_each_row_changes_one_thing_and_runs_the_whole_comparison() -> None:
    trace, config = TraceSpec(), SimConfig()
    specs = ablation.ablation_specs(trace, config)
    base = comparison(trace, config, oracle=False)
    rows = {k: [s for s in specs if s.tag == f"ablation={k}"] for k in range(1, 5)}
    assert all(len(r) == len(base) for r in rows.values())
    assert len(specs) == 4 * len(base)
    idle = [{s.config.idle_nodes_off for s in rows[k]} for k in range(1, 5)]
    assert idle == [{False}, {True}, {True}, {True}]
    fitted = [{s.priors for s in rows[k] if s.fits_models} for k in range(1, 5)]
    assert fitted == [{RECURRING}, {RECURRING}, {RECURRING}, {HELD_OUT}]
    for k in (1, 2):  # the published knobs, the Zeus variants' inner policies too
        for s in rows[k]:
            policy = with_options(scheduler(s.scheduler).configure(s.value), dict(s.policy_options))
            inner = policy.policy.inner if isinstance(policy.policy, ZeusPolicy) else policy.policy
            if isinstance(inner, TiresiasPolicy):
                assert (inner.queue_thresholds_gpu_s, inner.promote_knob) == (
                    (3250.0, 7200.0),
                    None,
                )
            if isinstance(inner, GandivaPolicy):
                assert inner.max_jobs_per_gpu == 2
            if isinstance(policy.policy, ZeusPolicy):
                assert policy.policy.eta_knob == s.value  # the sweep's eta_knob kept
            elif s.value is not None and isinstance(inner, TiresiasPolicy | GandivaPolicy):
                assert inner.frequency_mhz == int(s.value)  # the sweep's clock kept
    # rows 3 and 4 run the tuned defaults: no option given
    assert all(not s.policy_options for k in (3, 4) for s in rows[k])


def _outcome(
    spec_tag: str, name: str, value: float | None, energy: float, jct: float
) -> RunOutcome:
    spec = replace(comparison(TraceSpec(), SimConfig(), oracle=False)[0], tag=spec_tag)
    spec = replace(spec, scheduler=name, value=value)
    # in-window energy: a tenth of the total, but PowerFlow+'s runs spend half as much
    window = energy / (20 if name == "powerflow+" else 10)
    metrics = {"total_energy_j": energy, "window_energy_j": window, "avg_jct_s": jct}
    return RunOutcome(spec, metrics, Series(*(np.zeros(2) for _ in range(7))))


def test_the_toughest_baseline_is_the_lowest_ratio_and_a_missing_one_is_not_counted() -> None:
    tag = "ablation=2"
    outcomes = [
        _outcome(tag, "powerflow", 0.6, 10.0, 4.0),
        _outcome(tag, "powerflow", 1.0, 20.0, 2.0),
        _outcome(tag, "powerflow+", 0.6, 10.0, 2.0),
        _outcome(tag, "powerflow+", 1.0, 20.0, 1.0),
        _outcome(tag, "gandiva", 1110, 10.0, 8.0),
        _outcome(tag, "gandiva", 1410, 20.0, 4.0),
        _outcome(tag, "afs", 1110, 10.0, 5.0),
        _outcome(tag, "afs", 1410, 20.0, 2.5),
        _outcome(tag, "tiresias", 1410, 99.0, 1.0),  # far outside: n/a
    ]
    (entry,) = [e for e in ablation.summary(outcomes) if e["row"] == 2]
    assert entry["powerflow"]["gandiva"] == pytest.approx(2.0)
    assert entry["powerflow"]["tiresias"] is None
    assert entry["powerflow_vs_best"] == {"baseline": "afs", "ratio": pytest.approx(1.25)}
    assert entry["powerflow+_vs_best"] == {"baseline": "afs", "ratio": pytest.approx(2.5)}
    empty = next(e for e in ablation.summary(outcomes) if e["row"] == 1)
    assert empty["powerflow_vs_best"] is None
    # in window, PowerFlow's energies are the others' over ten; PowerFlow+'s (0.5-1.0)
    # meet AFS's (1.0-2.0) at one point, 1.0: AFS 5.0 h against PowerFlow+'s 1.0 h
    assert entry["powerflow_vs_best@window_energy_j"] == entry["powerflow_vs_best"]
    assert entry["powerflow+@window_energy_j"]["afs"] == pytest.approx(5.0)
    assert entry["powerflow+_vs_best@window_energy_j"] == {
        "baseline": "afs",
        "ratio": pytest.approx(5.0),
    }
    words = ablation.lines(ablation.summary(outcomes))
    assert (
        "powerflow 1.25x vs afs, in window 1.25x vs afs;"
        " powerflow+ 2.50x vs afs, in window 5.00x vs afs" in words[2]
    )
    assert "powerflow n/a, in window n/a" in words[1]


def test_the_report_embeds_the_ablation_where_it_was_written(tmp_path: Path) -> None:
    from powerflow.lab.sim.report import _ablation

    assert _ablation(tmp_path / "ablation") == []
    (tmp_path / "ablation").mkdir()
    words = ["Ablation (...):", "- 1. paper setting: powerflow 1.10x vs afs"]
    (tmp_path / "ablation" / "ablation.json").write_text(json.dumps({"headline": words}))
    section = _ablation(tmp_path / "ablation")
    assert section[0] == "## Ablation" and all(w in section for w in words)
