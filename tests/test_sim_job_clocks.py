"""What a clock per job can add to AFS's allocation: the study that bounds PowerFlow+'s
clock lever against AFS, scored on the tuning windows at equal energy."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from sweep_cases import assert_tuning_windows_only

from powerflow.cli import main
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot
from powerflow.core.schedulers import ORACLE
from powerflow.lab.baselines import AfsPolicy, ZeusPolicy
from powerflow.lab.groundtruth.built import ground_truth
from powerflow.lab.schedulers import ZEUS_PROFILING, scheduler
from powerflow.lab.sim import experiments, job_clocks
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.result import Series
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import TUNING_WINDOWS


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_afs_and_both_variants_run_on_every_tuning_window_only() -> None:
    specs = job_clocks.specs(SimConfig())
    assert_tuning_windows_only(specs)
    assert all(s.tag == job_clocks.TAG for s in specs)
    for window in TUNING_WINDOWS:
        mine = [s for s in specs if s.trace.window == window.name]
        assert len({s.value for s in mine if s.scheduler == "afs"}) >= 3  # a curve
        for name in job_clocks.VARIANTS:
            assert sorted(s.value for s in mine if s.scheduler == name) == sorted(job_clocks.KNOBS)


def test_job_clocks_charge_no_profiling_and_zeus_its_own() -> None:
    """Per-job clocks for free, against Zeus as it ships, which pays its profiling."""
    assert scheduler("afs+job-clocks").profiling == ORACLE
    assert scheduler("afs+zeus").profiling == ZEUS_PROFILING
    for name in job_clocks.VARIANTS:
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


def test_job_clocks_keep_afs_s_allocation_and_set_each_job_s_cheapest_zeus_clock() -> None:
    snap = _snapshot()
    afs = AfsPolicy().plan(snap)
    zeus = ZeusPolicy(AfsPolicy(), eta_knob=1.0, knob="clock")
    got = scheduler("afs+job-clocks").configure(1.0).policy.plan(snap)
    assert [(p.job_id, p.gpus, p.placement) for p in got.jobs] == [
        (p.job_id, p.gpus, p.placement) for p in afs.jobs
    ]
    assert got == zeus.plan(snap)
    clocks = {p.frequency_mhz for p in got.jobs if p.gpus}
    assert clocks and max(clocks) < A100.max_clock_mhz  # least energy: below the top clock
    top = scheduler("afs+job-clocks").configure(0.0).policy.plan(snap)
    assert {p.frequency_mhz for p in top.jobs if p.gpus} == {A100.max_clock_mhz}


def _outcome(name: str, window: str, value: float, energy_j: float, jct_s: float) -> RunOutcome:
    spec = RunSpec(name, value, TraceSpec(window=window), SimConfig(), tag=job_clocks.TAG)
    metrics = {"avg_jct_s": jct_s, "total_energy_j": energy_j, "window_energy_j": energy_j / 2}
    return RunOutcome(spec, metrics, Series(*(np.zeros(2) for _ in range(7))))


def test_each_variant_scores_afs_s_jct_over_its_own_at_equal_energy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AFS: 10 h at 100 J to 5 h at 200 J. On the first window the variant runs 8 h at
    100 J and 5 h at 200 J: 1.25x faster at one end, level at the other, and the score
    is the ratio's mean between (not its max or min). On the second it is 1.25x slower
    everywhere. Zeus's energies never meet AFS's."""
    monkeypatch.setattr(job_clocks, "WINDOWS", TUNING_WINDOWS[:2])
    a, b = (w.name for w in TUNING_WINDOWS[:2])
    h = 3600.0
    outcomes = [
        _outcome("afs", w, f, e, j * h)
        for w in (a, b)
        for f, e, j in ((1020.0, 100.0, 10.0), (1410.0, 200.0, 5.0))
    ]
    outcomes += [
        _outcome("afs+job-clocks", a, 1.0, 100.0, 8 * h),
        _outcome("afs+job-clocks", a, 0.0, 200.0, 5 * h),
        _outcome("afs+job-clocks", b, 1.0, 100.0, 12.5 * h),
        _outcome("afs+job-clocks", b, 0.0, 200.0, 6.25 * h),
        _outcome("afs+zeus", a, 1.0, 500.0, 1 * h),
        _outcome("afs+zeus", a, 0.0, 600.0, 0.5 * h),
    ]
    mine, zeus = job_clocks.score(outcomes)
    assert mine.variant == "afs+job-clocks" and zeus.variant == "afs+zeus"
    t = np.linspace(0.0, 1.0, 201)  # the common range, as compare._ratios samples it
    first = float(np.mean((10 - 5 * t) / (8 - 3 * t)))
    assert 1.0 < first < 1.25
    assert mine.ratios == pytest.approx((first, first, 0.8, 0.8))
    assert mine.geomean == pytest.approx((math.sqrt(first * 0.8),) * 2)
    assert zeus.ratios == (None, None, None, None) and zeus.geomean == (None, None)
    rows = job_clocks.rows([mine, zeus])
    assert rows[0]["afs_over_variant_total_energy_j"] == pytest.approx(math.sqrt(first * 0.8))
    assert rows[0][f"afs_over_variant_{b}_window_energy_j"] == pytest.approx(0.8)
    assert rows[1]["afs_over_variant_total_energy_j"] is None


def test_sweep_job_clocks_prints_and_writes_each_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(job_clocks, "WINDOWS", TUNING_WINDOWS[:1])
    monkeypatch.setattr(job_clocks, "KNOBS", (0.0, 1.0))
    monkeypatch.setattr(job_clocks, "DEFAULT_FREQUENCIES_MHZ", (1110, 1410))
    monkeypatch.setattr(experiments, "QUICK_HOURS", 0.5)  # the command's plumbing, faster
    out = tmp_path / "out"
    args = ["sweep", "job-clocks", "--quick", "--workers", "1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "job_clocks.json").read_text())
    assert [r["variant"] for r in rows] == list(job_clocks.VARIANTS)
    assert "per-job clocks on AFS's allocation" in printed
    with (out / "runs.csv").open() as fh:
        runs = list(csv.DictReader(fh))
    assert len(runs) == 2 + 2 * 2
    assert {r["window"] for r in runs} == {TUNING_WINDOWS[0].name}
    phases = {(r["scheduler"], int(r["profiling_phases"])) for r in runs}
    assert {p for name, p in phases if name == "afs+job-clocks"} == {0}  # nothing charged
    assert min(p for name, p in phases if name == "afs+zeus") > 0  # Zeus profiles
