"""The engine's power caps, sweep peaks and measurements, against hand-computed cases.

A toy world whose GPU power grows with the clock (``250 W x f / f_max`` per
computing GPU, one iteration per second on one GPU at ``f_max``, so every
iteration costs 250 J at any clock) makes each number below a line of
arithmetic; ``FixedPolicy`` (from the engine's tests) stands in for a scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from test_sim_engine import FMAX, IDLE, FixedPolicy, ToyTruth, _job, _measure, _sweep

from powerflow.core.devices import Workload, capped_clock_mhz
from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100
from powerflow.core.learning import OracleLearner
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.core.policy.snapshot import Budget, Plan, Snapshot
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.lab.schedulers import ORACLE, Configured, Profiling
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.result import RunResult
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.world import World

TOP_W = 250.0  # W per computing GPU at the top clock


class ClockTruth(ToyTruth):
    """T = (f_max / f) / n s per iteration; each computing GPU draws 250 W x f / f_max."""

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        watts = TOP_W * np.asarray(f, float) / FMAX * np.asarray(n, float)
        return np.asarray(watts * self.step_time_s(n, r, bs, f))


WORLD = World(lambda name: ClockTruth(), _measure, _sweep, ("toy",), (("toy", 32),))


@dataclass
class CappedPolicy(FixedPolicy):
    """``FixedPolicy`` whose plans carry a per-GPU cap (and record what they saw)."""

    cap_w: float | None = None
    seen: list[Snapshot] | None = None

    def plan(self, snapshot: Snapshot) -> Plan:
        if self.seen is not None:
            self.seen.append(snapshot)
        plan = super().plan(snapshot)
        cap = self.cap_w
        jobs = tuple(replace(jp, power_cap_w=cap if jp.gpus else None) for jp in plan.jobs)
        return Plan(jobs, plan.limit_w, plan.predicted_w, plan.powered_down_nodes)


def _run(jobs: list[TraceJob], policy: FixedPolicy, profiling: Profiling = ORACLE) -> RunResult:
    # the paper's setting (the node on from the start, no boot): the hand computations
    cfg = SimConfig(
        nodes=1, gpus_per_node=4, restart_s=30.0, seed=0, batch_s=0.0, idle_nodes_off=False
    )
    configured = Configured(policy, Budget(eta=1.0), profiling, None, None)
    return Simulation(tuple(jobs), configured, cfg, WORLD, OracleLearner()).run()


def _capped_clock(cap_w: float) -> int:
    """The highest A100 clock whose toy power per GPU (250 W x f / 1410) fits ``cap_w``."""
    return max(c for c in A100.clocks_mhz if TOP_W * c / FMAX <= cap_w)


def test_a_capped_gpu_runs_at_the_highest_clock_that_fits_and_the_job_slows() -> None:
    limit = 2 * 200.0 + 2 * IDLE  # 2 computing GPUs at <= 200 W each, 2 idle
    job = _job(0, 100.0, 2, 1000.0)
    capped = summarise(_run([job], CappedPolicy(limit_w=limit, cap_w=200.0)))
    f = _capped_clock(200.0)
    assert f == 1125  # 250 x 1125 / 1410 = 199.5 W; 1140 MHz would draw 202.1 W
    assert f == capped_clock_mhz(
        ClockTruth(), Workload("toy", 2, 2, 32), A100.clocks_mhz, FMAX, 200
    )
    assert capped["avg_jct_s"] == pytest.approx(1000 * (FMAX / f) / 2)
    assert capped["active_energy_j"] == pytest.approx(1000 * TOP_W)  # 250 J per iteration
    assert capped["time_above_limit_s"] == 0.0
    # uncapped, the same job draws 2 x 250 W for 500 s: above the same limit
    free = summarise(_run([job], CappedPolicy(limit_w=limit)))
    assert free["avg_jct_s"] == pytest.approx(500.0)
    assert free["time_above_limit_s"] == pytest.approx(500.0)
    assert free["max_overshoot_w"] == pytest.approx(2 * (TOP_W - 200.0))


def test_a_cap_above_the_planned_clocks_power_changes_nothing() -> None:
    job = _job(0, 0.0, 1, 600.0)
    capped = summarise(_run([job], CappedPolicy(frequency_mhz=705, cap_w=200.0)))
    assert capped["avg_jct_s"] == pytest.approx(600 * FMAX / 705)  # 125 W fits 200 W


def test_the_snapshot_carries_the_measured_power_at_the_clock_really_run() -> None:
    seen: list[Snapshot] = []
    _run([_job(0, 0.0, 2, 5000.0), _job(1, 1000.0, 1, 10.0)], CappedPolicy(cap_w=200.0, seen=seen))
    later = next(s for s in seen if s.now_s >= 1000.0)
    view = next(j for j in later.jobs if j.id == "j0")
    assert view.measured_frequency_mhz == 1125  # the cap's clock, not the planned 1410
    # one noisy 60 s window: the truth's 2 x 199.5 W within the profiler's noise
    assert view.measured_power_w == pytest.approx(2 * TOP_W * 1125 / FMAX, rel=0.01)
    assert later.power_ratio == 1.0  # FixedPolicy's plans count no power (power_w None)
    assert seen[0].jobs[0].measured_power_w is None  # not measured before it ran
    assert seen[0].jobs[0].profiled_gpus is None  # this scheduler does not profile


def test_a_sweep_counts_its_hungriest_slice_against_the_limit() -> None:
    """Profiling on 2 GPUs sweeps up to 1410 MHz: 2 x 250 W at the top slice, though the
    sweep's mean (clocks averaging 810 MHz) is far lower; the limit sits in between."""
    profiling = Profiling(profile_s=240.0, fitted_models=False)
    limit = 2 * 240.0 + 2 * IDLE
    clocks = np.array(PAPER_SWEEP.clocks_mhz(A100), dtype=float)
    assert 2 * TOP_W * clocks.mean() / FMAX < 2 * 240.0 < 2 * TOP_W
    job = _job(0, 0.0, 2, 5000.0)
    res = _run([job], CappedPolicy(limit_w=limit, frequency_mhz=1005), profiling)
    m = summarise(res)
    assert m["time_above_limit_s"] == pytest.approx(240.0)  # the window; then 356 W at 1005
    assert m["max_overshoot_w"] == pytest.approx(2 * TOP_W - 2 * 240.0)
    # a cap of 240 W per GPU holds the sweep's top slices down to 1350 MHz: never above
    res = _run([job], CappedPolicy(limit_w=limit, frequency_mhz=1005, cap_w=240.0), profiling)
    assert summarise(res)["time_above_limit_s"] == 0.0


def test_a_cap_that_is_not_a_positive_number_is_refused() -> None:
    with pytest.raises(SimulationError, match="caps job j0"):
        _run([_job(0, 0.0, 1, 10.0)], CappedPolicy(cap_w=float("nan")))


def test_a_cap_below_the_gpus_lowest_limit_holds_at_that_limit() -> None:
    """The node agent clamps a cap into the board's range (A100: 100-400 W): a plan's
    80 W cap runs the GPU at the clock whose power fits 100 W, not 80 W."""
    assert A100.min_power_limit_w == 100.0
    job = _job(0, 0.0, 1, 600.0)
    capped = summarise(_run([job], CappedPolicy(cap_w=80.0)))
    assert capped["avg_jct_s"] == pytest.approx(600 * FMAX / _capped_clock(100.0))
