"""Simulated GPUs behave like the ground truth's hardware under NVML-style control."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import sys
import threading

import numpy as np
import pytest

from powerflow.core.devices import GpuNotSupported, Workload, capped_clock_mhz
from powerflow.core.errors import DataError, SimulationError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.groundtruth import ground_truth
from powerflow.lab.simulated_gpus import SimulatedGpus

BERT = Workload("bert", n=4, gpus_per_node=4, local_batch_size=32)
RESNET = Workload("resnet50", n=1, gpus_per_node=1, local_batch_size=128)


def _true_power_w(w: Workload, frequency_mhz: float) -> float:
    truth = ground_truth(w.model_name)
    return float(truth.power_w(w.n, w.gpus_per_node, w.local_batch_size, frequency_mhz)) / w.n


def _true_step_s(w: Workload, frequency_mhz: float) -> float:
    truth = ground_truth(w.model_name)
    return float(truth.step_time_s(w.n, w.gpus_per_node, w.local_batch_size, frequency_mhz))


def test_energy_counter_is_monotonic_and_the_integral_of_power() -> None:
    gpus = SimulatedGpus(2, seed=11)
    gpus.assign(0, BERT)
    rng = np.random.default_rng(0)
    previous = [gpus.total_energy_mj(g) for g in (0, 1)]
    for dt in rng.uniform(0.05, 3.0, size=200):
        gpus.advance(float(dt))
        for g in (0, 1):
            now = gpus.total_energy_mj(g)
            # the counter is whole mJ, the power whole mW: each step's integral
            # matches to within their rounding
            assert now >= previous[g]
            assert abs((now - previous[g]) - gpus.power_mw(g) * dt) <= 0.5 * dt + 1.0
            previous[g] = now


@pytest.mark.parametrize("clock", [600, 1005, 1410])
@pytest.mark.parametrize("workload", [BERT, RESNET], ids=["bert", "resnet50"])
def test_power_speed_and_energy_match_the_ground_truth_at_a_locked_clock(
    workload: Workload, clock: int
) -> None:
    gpus = SimulatedGpus(1, seed=clock)
    gpus.assign(0, workload)
    gpus.lock_clocks_mhz(0, clock, clock)
    e0 = gpus.total_energy_mj(0)
    powers = []
    for _ in range(300):
        gpus.advance(1.0)
        powers.append(gpus.power_mw(0) / 1000.0)
    assert gpus.sm_clock_mhz(0) == clock
    truth_w = _true_power_w(workload, clock)
    spread = np.std(powers) / np.sqrt(len(powers))
    assert 0 < spread < 0.01 * truth_w  # noisy, but averages out
    assert abs(np.mean(powers) - truth_w) < 4 * spread
    iterations = gpus.iterations_completed(0)
    assert iterations == pytest.approx(300.0 / _true_step_s(workload, clock), rel=0.01)
    energy_per_iter_j = (gpus.total_energy_mj(0) - e0) / 1000.0 / iterations
    truth = ground_truth(workload.model_name)
    per_gpu_j = (
        float(
            truth.energy_per_iter_j(
                workload.n, workload.gpus_per_node, workload.local_batch_size, clock
            )
        )
        / workload.n
    )
    assert energy_per_iter_j == pytest.approx(per_gpu_j, rel=0.01)


def test_a_lock_between_supported_clocks_rounds_down_and_clamps() -> None:
    gpus = SimulatedGpus(1)
    gpus.assign(0, RESNET)
    gpus.lock_clocks_mhz(0, 1000, 1000)
    assert gpus.sm_clock_mhz(0) == 990
    gpus.lock_clocks_mhz(0, 2000, 5000)
    assert gpus.sm_clock_mhz(0) == A100.max_clock_mhz
    gpus.lock_clocks_mhz(0, 50, 100)
    assert gpus.sm_clock_mhz(0) == A100.min_clock_mhz
    gpus.reset_clocks(0)
    assert gpus.sm_clock_mhz(0) == A100.max_clock_mhz  # unlocked, busy: full clock


def test_a_power_cap_lowers_the_clock_until_the_true_power_fits() -> None:
    gpus = SimulatedGpus(1, seed=2)
    gpus.assign(0, BERT)
    full_w = _true_power_w(BERT, A100.max_clock_mhz)
    cap_w = 0.6 * full_w
    assert A100.min_power_limit_w is not None and cap_w > A100.min_power_limit_w
    gpus.set_power_limit_w(0, cap_w)
    clock = gpus.sm_clock_mhz(0)
    assert clock < A100.max_clock_mhz
    assert _true_power_w(BERT, clock) <= cap_w < _true_power_w(BERT, clock + 15)
    powers = []
    for _ in range(200):
        gpus.advance(1.0)
        powers.append(gpus.power_mw(0) / 1000.0)
    assert np.mean(powers) < cap_w
    # a lock below the capped clock wins; lifting the cap restores full speed
    gpus.lock_clocks_mhz(0, 600, 600)
    assert gpus.sm_clock_mhz(0) == 600
    gpus.reset_clocks(0)
    gpus.reset_power_limit(0)
    assert gpus.sm_clock_mhz(0) == A100.max_clock_mhz


def test_capped_clock_rule() -> None:
    truth = ground_truth("bert")
    clocks = A100.clocks_mhz
    assert capped_clock_mhz(truth, BERT, clocks, 1410, None) == 1410
    assert capped_clock_mhz(truth, BERT, clocks, 1000, None) == 990
    assert capped_clock_mhz(truth, BERT, clocks, 100, None) == 210  # below every clock
    assert capped_clock_mhz(truth, BERT, clocks, 1410, 10.0) == 210  # nothing fits: slowest
    capped = capped_clock_mhz(truth, BERT, clocks, 1410, 180.0)
    assert _true_power_w(BERT, capped) <= 180.0 < _true_power_w(BERT, capped + 15)


def test_idle_gpus_draw_idle_power_at_the_lowest_clock() -> None:
    gpus = SimulatedGpus(1, seed=4)
    gpus.assign(0, RESNET)
    gpus.advance(5.0)
    gpus.clear(0)
    assert gpus.workload(0) is None and gpus.iterations_completed(0) == 0
    powers = []
    for _ in range(100):
        gpus.advance(1.0)
        powers.append(gpus.power_mw(0) / 1000.0)
    assert np.mean(powers) == pytest.approx(A100.idle_power_w, rel=0.01)
    assert gpus.sm_clock_mhz(0) == A100.min_clock_mhz
    gpus.lock_clocks_mhz(0, 900, 1200)
    assert gpus.sm_clock_mhz(0) == 900  # an idle locked GPU holds the lower bound


def test_assign_restarts_the_iteration_count() -> None:
    gpus = SimulatedGpus(1, seed=6)
    gpus.assign(0, RESNET)
    gpus.advance(30.0)
    assert gpus.iterations_completed(0) > 100
    gpus.assign(0, BERT)
    assert gpus.workload(0) == BERT and gpus.iterations_completed(0) == 0


def test_same_seed_same_readings_other_seed_other_readings() -> None:
    def run(seed: int) -> list[int]:
        gpus = SimulatedGpus(3, seed=seed)
        gpus.assign(1, BERT)
        out = []
        for step in range(20):
            gpus.advance(0.5 + step / 10)
            out += [gpus.total_energy_mj(g) for g in range(3)] + [gpus.iterations_completed(1)]
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_an_injected_clock_drives_time_like_advance() -> None:
    now = [100.0]
    follows = SimulatedGpus(2, seed=9, clock=lambda: now[0])
    manual = SimulatedGpus(2, seed=9)
    for g in (follows, manual):
        g.assign(0, RESNET)
    for dt in (1.0, 0.25, 3.0):
        now[0] += dt
        manual.advance(dt)
        for g in (0, 1):
            assert follows.total_energy_mj(g) == manual.total_energy_mj(g)
            assert follows.power_mw(g) == manual.power_mw(g)
    assert follows.now_s == 104.25 and manual.now_s == 4.25
    with pytest.raises(SimulationError, match="follow their clock"):
        follows.advance(1.0)


def test_bad_driving_is_refused() -> None:
    gpus = SimulatedGpus(1)
    with pytest.raises(SimulationError):
        gpus.advance(-1.0)
    with pytest.raises(DataError, match="unknown model"):
        gpus.assign(0, Workload("alexnet", 1, 1, 32))
    with pytest.raises(DataError, match="GPUs per node"):
        gpus.assign(0, Workload("bert", 2, 4, 32))
    with pytest.raises(DataError, match="batch"):
        gpus.assign(0, Workload("bert", 1, 1, 0))
    assert gpus.workload(0) is None  # a refused workload leaves the GPU as it was
    with pytest.raises(SimulationError):
        SimulatedGpus(0)


def test_a_driver_restart_restores_defaults_and_zeroes_the_counter() -> None:
    gpus = SimulatedGpus(1, seed=1)
    gpus.assign(0, RESNET)
    gpus.lock_clocks_mhz(0, 900, 900)
    gpus.set_power_limit_w(0, 150.0)
    gpus.advance(5.0)
    gpus.restart_driver()
    assert gpus.total_energy_mj(0) == 0
    assert gpus.power_limit_w(0) == A100.max_power_w
    assert gpus.sm_clock_mhz(0) == A100.max_clock_mhz
    assert gpus.workload(0) == RESNET


def test_a_gpu_without_power_management_refuses_power_limits() -> None:
    spec = dataclasses.replace(A100, min_power_limit_w=None)
    gpus = SimulatedGpus(1, gpu=spec)
    for call in (
        lambda: gpus.power_limit_w(0),
        lambda: gpus.power_limit_range_w(0),
        lambda: gpus.set_power_limit_w(0, 200.0),
        lambda: gpus.reset_power_limit(0),
    ):
        with pytest.raises(GpuNotSupported, match=r"GPU 0 \(GPU-.*\): A100 has no settable"):
            call()
    gpus.advance(1.0)  # everything else still works
    assert gpus.total_energy_mj(0) > 0


def test_gpu_spec_checks_its_power_limit_range() -> None:
    with pytest.raises(DataError, match="min power limit"):
        GpuSpec("X", (100, 200), 200, 10.0, 100.0, 150, min_power_limit_w=120.0)
    with pytest.raises(DataError, match="min power limit"):
        GpuSpec("X", (100, 200), 200, 10.0, 100.0, 150, min_power_limit_w=0.0)


def test_threads_sharing_the_gpus_keep_each_gpus_state_whole() -> None:
    """The node agent (its own thread) and the workers (the kubelet's) share one node's
    GPUs: the agent reads power and energy while a worker's GPU is cleared. A GPU cleared
    while another thread runs the GPUs forward must stay cleared: idle, with no iterations
    (a half-applied update would credit the old job's iterations to it)."""
    ticks = itertools.count()
    clock_lock = threading.Lock()

    def clock() -> float:
        # a thread-safe fake clock that moves 1 s per reading (several iterations)
        with clock_lock:
            return float(next(ticks))

    count = 32
    gpus = SimulatedGpus(count, seed=3, clock=clock)
    done = threading.Event()

    def read(worker: int) -> None:
        g = worker
        while not done.is_set():
            gpus.power_mw(g)
            gpus.total_energy_mj(g)
            g = (g + 1) % count

    def clear_all() -> None:
        for g in range(count):
            gpus.clear(g)
        done.set()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a loaded machine does
    try:
        for _ in range(5):
            for g in range(count):
                gpus.assign(g, RESNET)
            done.clear()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                jobs = [pool.submit(read, w) for w in range(3)] + [pool.submit(clear_all)]
                for job in jobs:
                    job.result()
            assert [gpus.iterations_completed(g) for g in range(count)] == [0] * count
    finally:
        sys.setswitchinterval(switch)
