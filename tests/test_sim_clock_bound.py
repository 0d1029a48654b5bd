"""What a clock per job can add to AFS's allocation: the study that bounds PowerFlow+'s
clock lever against AFS, scored on the tuning windows at equal energy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from powerflow.cli import main
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot
from powerflow.core.schedulers import ORACLE
from powerflow.lab.baselines import AfsPolicy, ZeusPolicy
from powerflow.lab.groundtruth.built import ground_truth
from powerflow.lab.schedulers import ZEUS_PROFILING, scheduler
from powerflow.lab.sim import clock_bound, experiments
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import EVALUATION_WINDOWS, TUNING_WINDOWS


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_afs_and_both_variants_run_on_every_tuning_window_only() -> None:
    specs = clock_bound.specs(SimConfig())
    evaluation = {w.name for w in EVALUATION_WINDOWS}
    assert {s.trace.window for s in specs} == {w.name for w in TUNING_WINDOWS}
    assert not any(s.trace.window in evaluation for s in specs)
    assert all(s.tag == clock_bound.TAG for s in specs)
    for window in TUNING_WINDOWS:
        mine = [s for s in specs if s.trace.window == window.name]
        assert len({s.value for s in mine if s.scheduler == "afs"}) >= 3  # a curve
        for name in clock_bound.VARIANTS:
            assert sorted(s.value for s in mine if s.scheduler == name) == sorted(clock_bound.KNOBS)


def test_the_bound_charges_no_profiling_and_zeus_its_own() -> None:
    """The bound is per-job clocks for free; Zeus as it ships pays its profiling."""
    assert scheduler("afs+clock-bound").profiling == ORACLE
    assert scheduler("afs+zeus").profiling == ZEUS_PROFILING
    for name in clock_bound.VARIANTS:
        assert not scheduler(name).compared  # experiments, not in the comparison


def _snapshot() -> Snapshot:
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    jobs = tuple(
        Job(
            id=f"j{k}",
            model=ground_truth(name),
            requested_gpus=4,
            global_batch_size=64,
            remaining_iterations=1000.0,
            arrival_s=float(k),
        )
        for k, name in enumerate(("resnet50", "bert", "vgg16"))
    )
    return Snapshot(nodes, jobs, Budget(eta=1.0), 10.0)


def test_the_bound_keeps_afs_s_allocation_and_sets_each_job_s_cheapest_zeus_clock() -> None:
    snap = _snapshot()
    afs = AfsPolicy().plan(snap)
    zeus = ZeusPolicy(AfsPolicy(), eta_knob=1.0, knob="clock")
    bound = scheduler("afs+clock-bound").configure(1.0).policy
    got = bound.plan(snap)
    assert [(p.job_id, p.gpus, p.placement) for p in got.jobs] == [
        (p.job_id, p.gpus, p.placement) for p in afs.jobs
    ]
    assert got == zeus.plan(snap)
    clocks = {p.frequency_mhz for p in got.jobs if p.gpus}
    assert clocks and max(clocks) < A100.max_clock_mhz  # least energy: below the top clock
    top = scheduler("afs+clock-bound").configure(0.0).policy.plan(snap)
    assert {p.frequency_mhz for p in top.jobs if p.gpus} == {A100.max_clock_mhz}


def _outcome(name: str, window: str, value: float, energy_j: float, jct_s: float) -> RunOutcome:
    spec = RunSpec(name, value, TraceSpec(window=window), SimConfig(), tag=clock_bound.TAG)
    metrics = {"avg_jct_s": jct_s, "total_energy_j": energy_j, "window_energy_j": energy_j / 2}
    return RunOutcome(spec, metrics, Series(*(np.zeros(2) for _ in range(7))))


def test_each_variant_scores_afs_s_jct_over_its_own_at_equal_energy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AFS: 10 h at 100 J to 5 h at 200 J. The bound is 1.25x faster on the first window
    and 0.8x on the second (geometric mean 1); Zeus's energies never meet AFS's."""
    monkeypatch.setattr(clock_bound, "WINDOWS", TUNING_WINDOWS[:2])
    a, b = (w.name for w in TUNING_WINDOWS[:2])
    h = 3600.0
    outcomes = [
        _outcome("afs", w, f, e, j * h)
        for w in (a, b)
        for f, e, j in ((1020.0, 100.0, 10.0), (1410.0, 200.0, 5.0))
    ]
    outcomes += [
        _outcome("afs+clock-bound", a, 1.0, 100.0, 8 * h),
        _outcome("afs+clock-bound", a, 0.0, 200.0, 4 * h),
        _outcome("afs+clock-bound", b, 1.0, 100.0, 12.5 * h),
        _outcome("afs+clock-bound", b, 0.0, 200.0, 6.25 * h),
        _outcome("afs+zeus", a, 1.0, 500.0, 1 * h),
        _outcome("afs+zeus", a, 0.0, 600.0, 0.5 * h),
    ]
    bound, zeus = clock_bound.score(outcomes)
    assert bound.variant == "afs+clock-bound" and zeus.variant == "afs+zeus"
    assert bound.ratios == pytest.approx((1.25, 1.25, 0.8, 0.8))
    assert bound.geomean == pytest.approx((1.0, 1.0))
    assert zeus.ratios == (None, None, None, None) and zeus.geomean == (None, None)
    rows = clock_bound.rows([bound, zeus])
    assert rows[0]["afs_over_variant_total_energy_j"] == pytest.approx(1.0)
    assert rows[0][f"afs_over_variant_{a}_window_energy_j"] == pytest.approx(1.25)
    assert rows[1]["afs_over_variant_total_energy_j"] is None


def test_sweep_clock_bound_prints_and_writes_each_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(clock_bound, "WINDOWS", TUNING_WINDOWS[:1])
    monkeypatch.setattr(clock_bound, "KNOBS", (0.0, 1.0))
    monkeypatch.setattr(clock_bound, "DEFAULT_FREQUENCIES_MHZ", (1110, 1410))
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)  # the command's plumbing, faster
    out = tmp_path / "out"
    args = ["sweep", "clock-bound", "--quick", "--workers", "1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "clock_bound.json").read_text())
    assert [r["variant"] for r in rows] == list(clock_bound.VARIANTS)
    assert "per-job clocks on AFS's allocation" in printed
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 2 + 2 * 2
