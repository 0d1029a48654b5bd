"""The simulator on a cluster of another GPU type (the H100 SXM's ground truth):
its clocks, its budget, its ground truth, priors carried over, the same jobs."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from support.plan_recorder import Recorder

from powerflow.cli import main
from powerflow.core.gpus import A100, gpu_spec
from powerflow.core.learning import FittedLearner
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import held_out_prior, load_prior, prior_on
from powerflow.lab.groundtruth import ground_truth, one_gpu_sweep
from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ, clocks_on, scheduler
from powerflow.lab.sim import experiments
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.runner import RunSpec, TraceSpec, load_jobs
from powerflow.lab.sim.world import default_world

H100 = gpu_spec("H100-SXM")
TRACE = TraceSpec(hours=2)
CONFIG = SimConfig(nodes=8, gpu=H100)


def _run(
    name: str, value: float | None, *, oracle: bool = False
) -> tuple[dict[str, Any], set[int]]:
    spec = RunSpec(name, value, TRACE, CONFIG, oracle=oracle)
    configured = scheduler(name).configure(spec.knob_value, oracle=oracle)
    recorder = Recorder(configured.policy)
    configured = replace(configured, policy=recorder)
    jobs = load_jobs(TRACE, CONFIG)
    result = Simulation(jobs, configured, CONFIG, default_world(H100)).run()
    clocks = {jp.frequency_mhz for plan in recorder.plans for jp in plan.jobs if jp.gpus}
    return summarise(result), clocks


def test_the_baselines_clock_sweep_is_the_same_relative_clocks_snapped() -> None:
    assert clocks_on(A100, DEFAULT_FREQUENCIES_MHZ) == DEFAULT_FREQUENCIES_MHZ
    assert clocks_on(A100, experiments.QUICK_FREQUENCIES) == experiments.QUICK_FREQUENCIES
    sweep = clocks_on(H100, DEFAULT_FREQUENCIES_MHZ)
    assert sweep == (1425, 1560, 1680, 1830, 1980)
    assert set(sweep) <= set(H100.clocks_mhz)


def test_the_comparison_on_h100_sweeps_h100_clocks() -> None:
    specs = experiments.comparison(TRACE, CONFIG, quick=True, oracle=False)
    clocks = {s.value for s in specs if scheduler(s.scheduler).knob == "frequency_mhz"}
    assert clocks == {1560.0, 1980.0}


@pytest.mark.parametrize("oracle", [False, True], ids=["fitted", "oracle"])
def test_powerflow_on_h100_plans_h100_clocks_and_holds_the_budget(oracle: bool) -> None:
    metrics, clocks = _run("powerflow", 0.6, oracle=oracle)
    assert metrics["jobs"] == 108
    assert clocks <= set(H100.clocks_mhz)
    # the H100's range above the A100's top clock is used
    assert max(clocks) > A100.max_clock_mhz
    assert metrics["limit_w"] == pytest.approx(0.6 * CONFIG.total_gpus * H100.p_max_w)
    assert metrics["peak_power_w"] <= metrics["limit_w"]
    assert metrics["time_above_limit_s"] == 0.0


def test_a_baseline_on_h100_runs_at_the_h100s_top_clock() -> None:
    metrics, clocks = _run("gandiva", None)
    assert clocks == {H100.max_clock_mhz}
    assert metrics["jobs"] == 108


def test_the_same_jobs_need_the_same_iterations_and_finish_sooner_on_h100() -> None:
    a100_config = replace(CONFIG, gpu=A100)
    h100_jobs, a100_jobs = load_jobs(TRACE, CONFIG), load_jobs(TRACE, a100_config)
    assert h100_jobs == a100_jobs
    configured = scheduler("gandiva").configure(RunSpec("gandiva", config=CONFIG).knob_value)
    h100 = summarise(Simulation(h100_jobs, configured, CONFIG, default_world(H100)).run())
    top = scheduler("gandiva").configure(A100.max_clock_mhz)
    a100 = summarise(Simulation(a100_jobs, top, a100_config, default_world(A100)).run())
    assert h100["avg_jct_s"] < a100["avg_jct_s"]


def test_a_carried_over_prior_predicts_at_the_same_relative_clock() -> None:
    prior = load_prior("resnet50")
    on_h100 = prior_on(prior, H100)
    assert on_h100.gpu == "H100-SXM" and prior_on(prior, A100) is prior
    n, r, bs = np.array([1.0, 8.0, 16.0, 32.0]), np.array([1.0, 8.0, 4.0, 8.0]), np.full(4, 16.0)
    rho = H100.max_clock_mhz / A100.max_clock_mhz
    for f in (600.0, 1095.0, 1410.0):
        a100 = FittedModel(prior).step_time_s(n, r, bs, f)
        h100 = FittedModel(on_h100).step_time_s(n, r, bs, f * rho)
        np.testing.assert_allclose(h100, a100, rtol=1e-12)


def test_a_carried_over_prior_draws_the_types_watts() -> None:
    """Power (energy over step time) at the same relative clock scales by the ratio of
    the types' reference powers (in A100 watts an H100 job would be predicted at
    1/1.75 of its power)."""
    prior = load_prior("resnet50")
    on_a100, on_h100 = FittedModel.on(prior, A100), FittedModel.on(prior_on(prior, H100), H100)
    n, r, bs = np.array([1.0, 8.0, 32.0]), np.array([1.0, 8.0, 8.0]), np.full(3, 16.0)
    ratio = H100.p_max_w / A100.p_max_w
    assert ratio > 1.5
    for f_a100, f_h100 in ((1410.0, 1980.0), (A100.f0_mhz, H100.f0_mhz)):
        a100 = on_a100.energy_per_iter_j(n, r, bs, f_a100) / on_a100.step_time_s(n, r, bs, f_a100)
        h100 = on_h100.energy_per_iter_j(n, r, bs, f_h100) / on_h100.step_time_s(n, r, bs, f_h100)
        np.testing.assert_allclose(h100 / a100, ratio, rtol=0.02)


def test_fitted_jobs_on_h100_fit_from_the_carried_over_prior() -> None:
    truth = ground_truth("bert", H100)
    samples = one_gpu_sweep(truth, 32.0, rng=np.random.default_rng(0), noise=0.03)
    known = FittedLearner(H100, prior=held_out_prior).initial("bert", truth, samples)
    assert known.fits == 1 and known.failed_fits == 0
    assert known.params is not None and known.params.gpu == "H100-SXM"
    predicted = known.model.step_time_s(1, 1, 32, H100.clocks_mhz[-1])
    assert predicted == pytest.approx(float(truth.step_time_s(1, 1, 32, 1980)), rel=0.05)


def test_simulate_gpu_names_the_type_in_its_row(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scheduler", "gandiva", "--gpu", "NVIDIA H100 80GB HBM3"]
    assert main([*args, "--hours", "0.5", "--nodes", "8", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["gpu"] == "H100-SXM" and row["frequency_mhz"] == H100.max_clock_mhz


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--gpu", "L4"], "no ground truth for L4; the simulator has one for A100, H100-SXM"),
        (["--gpu", "H100-SXM", "--frequency", "1412"], "1412 is not a H100-SXM clock"),
    ],
)
def test_a_type_without_truth_or_a_foreign_clock_exits_2(
    args: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--scheduler", "gandiva", *args, "--hours", "0.5", "--nodes", "8"])
    assert code == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1
