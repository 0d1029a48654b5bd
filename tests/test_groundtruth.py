"""The ground truth behaves like hardware and reproduces the data it is built from."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import powerflow
from powerflow.core.errors import DataError
from powerflow.core.gpus import A100
from powerflow.core.models.protocol import PerfModel
from powerflow.lab.groundtruth import (
    MODEL_NAMES,
    dense_configs,
    dense_profile,
    ground_truth,
    measure,
    one_gpu_sweep,
    sweep_plan,
    trace_duration_error,
)
from powerflow.lab.groundtruth.frequency import knee_slopes, nondecreasing, voltage_knee_mhz
from powerflow.lab.groundtruth.shapes import pollux_sync_bs_elasticity
from powerflow.lab.groundtruth.sources import itp_trace, pollux_records

DATA = Path(powerflow.__file__).parent / "data"
CLOCKS = np.array(A100.clocks_mhz, dtype=np.float64)


def _table(model: str) -> list[tuple[int, int, float]]:
    """(global batch, GPUs, iterations/s) of every filled cell, read independently."""
    with (DATA / "profiles" / "a100-throughput" / f"{model}.csv").open() as fh:
        rows = list(csv.reader(fh))
    counts = [int(c) for c in rows[0][1:]]
    return [
        (int(row[0]), n, float(v))
        for row in rows[1:]
        for n, v in zip(counts, row[1:], strict=True)
        if v
    ]


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, int, int, float]:
    model = draw(st.sampled_from(MODEL_NAMES))
    n = draw(st.integers(1, 64))
    r = draw(st.integers(1, min(n, 8)))
    bs = draw(st.floats(1.0, 256.0))
    return model, n, r, bs


# -- reproduces the data -------------------------------------------------------


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_full_clock_packed_step_time_is_the_table(model: str) -> None:
    cells = _table(model)
    gb = np.array([c[0] for c in cells], dtype=np.float64)
    n = np.array([c[1] for c in cells], dtype=np.float64)
    its = np.array([c[2] for c in cells])
    step = ground_truth(model).step_time_s(n, np.minimum(n, 8), gb / n, 1410)
    np.testing.assert_allclose(1.0 / step, its, rtol=1e-12)


def test_the_missing_deepspeech2_cell_is_filled_between_its_neighbours() -> None:
    truth = ground_truth("deepspeech2")
    assert not any(gb == 32 and n == 64 for gb, n, _ in _table("deepspeech2"))
    filled = truth.step_time_s(64, 8, 0.5, 1410)
    assert np.isfinite(filled)
    # more GPUs on the same 32-sample batch: between the 32-GPU step and 2x it
    at_32 = truth.step_time_s(32, 8, 1.0, 1410)
    assert 0.5 * at_32 < filled < 2.0 * at_32


def test_itp_trace_durations_are_reproduced_up_to_whole_second_rounding() -> None:
    err = trace_duration_error()
    duration = itp_trace().duration_s
    assert len(err.relative) == len(duration) == 1901
    # durations are whole seconds and iteration counts whole numbers: the
    # prediction may be off by half a second plus half an iteration
    jobs = itp_trace()
    step = np.array(
        [
            ground_truth(m).step_time_s(n, min(n, 8), gb / n, 1410)
            for m, n, gb in zip(jobs.model_name, jobs.num_gpu, jobs.global_batch_size, strict=True)
        ]
    )
    assert np.all(err.relative * duration <= 0.5 + 0.5 * step + 1e-9 * duration)
    assert err.median < 1e-4


def test_a100_spec_matches_the_data() -> None:
    assert voltage_knee_mhz(A100) == A100.f0_mhz
    below, above = knee_slopes(A100)
    assert 0.8 < below < 1.2  # flat voltage: dynamic power linear in f
    assert above > 2.0  # voltage rising with f
    assert 52.0 <= A100.idle_power_w <= 53.0
    assert A100.max_power_w == 400.0


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(DataError, match="resnet50"):
        ground_truth("alexnet")


def test_satisfies_the_perf_model_protocol() -> None:
    assert isinstance(ground_truth("bert"), PerfModel)


# -- behaves like hardware over the whole supported range -----------------------


@settings(max_examples=60, deadline=None)
@given(configs())
def test_finite_positive_and_power_within_board_limits(cfg: tuple[str, int, int, float]) -> None:
    model, n, r, bs = cfg
    truth = ground_truth(model)
    step = truth.step_time_s(n, r, bs, CLOCKS)
    energy = truth.energy_per_iter_j(n, r, bs, CLOCKS)
    per_gpu = truth.power_w(n, r, bs, CLOCKS) / n
    assert step.dtype == np.float64 and energy.dtype == np.float64
    assert np.all(np.isfinite(step)) and np.all(step > 0)
    assert np.all(np.isfinite(energy)) and np.all(energy > 0)
    np.testing.assert_allclose(per_gpu * n * step, energy, rtol=1e-12)
    assert np.all(per_gpu >= A100.idle_power_w) and np.all(per_gpu <= A100.max_power_w)


@settings(max_examples=60, deadline=None)
@given(configs())
def test_step_time_strictly_decreases_with_clock(cfg: tuple[str, int, int, float]) -> None:
    model, n, r, bs = cfg
    step = ground_truth(model).step_time_s(n, r, bs, CLOCKS)
    assert np.all(np.diff(step) < 0)


@settings(max_examples=60, deadline=None)
@given(configs())
def test_energy_has_an_interior_minimum_over_clock(cfg: tuple[str, int, int, float]) -> None:
    model, n, r, bs = cfg
    energy = ground_truth(model).energy_per_iter_j(n, r, bs, CLOCKS)
    best = int(np.argmin(energy))
    assert 0 < best < len(CLOCKS) - 1
    # the default clock wastes a real share of energy (Perseus: 25-30%)
    assert energy[best] < 0.9 * energy[-1]


def test_clocks_outside_the_supported_range_are_clamped() -> None:
    truth = ground_truth("vgg16")
    np.testing.assert_array_equal(
        truth.step_time_s(4, 4, 16, [100.0, 2000.0]), truth.step_time_s(4, 4, 16, [210.0, 1410.0])
    )


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_packing_beats_spreading(model: str) -> None:
    truth = ground_truth(model)
    for n in (4, 8, 16, 32, 64):
        placements = [r for r in (8, 4, 2, 1) if r <= n]
        step = truth.step_time_s(n, np.array(placements), 256 / n, 1410)
        energy = truth.energy_per_iter_j(n, np.array(placements), 256 / n, 1410)
        assert np.all(np.diff(step) > 0), (n, step)
        assert np.all(np.diff(energy) > 0), (n, energy)


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_synchronisation_is_light_and_barely_clock_bound(model: str) -> None:
    truth = ground_truth(model)
    # same local batch: the 64-GPU job spends more of its step syncing
    per_gpu_1 = truth.power_w(1, 1, 16, 1410)
    per_gpu_64 = truth.power_w(64, 8, 16, 1410) / 64
    assert per_gpu_64 < per_gpu_1
    # its step slows down less when the clock drops
    slow_1 = truth.step_time_s(1, 1, 16, 210) / truth.step_time_s(1, 1, 16, 1410)
    slow_64 = truth.step_time_s(64, 8, 16, 210) / truth.step_time_s(64, 8, 16, 1410)
    assert slow_64 < slow_1
    assert truth.sync_time_s(1, 1, 16) == 0.0


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_local_batches_beyond_the_table_extrapolate_sanely(model: str) -> None:
    truth = ground_truth(model)
    lo, hi = min(truth.global_batch_sizes), max(truth.global_batch_sizes)
    for n, r in ((1, 1), (2, 1), (8, 8), (16, 2), (64, 8), (64, 1)):
        # outside the table's global batches more samples per GPU never finish
        # sooner (inside, the table itself is not always monotone)
        for bs in (lo / n * np.array([1 / 8, 1 / 4, 1 / 2, 1]), hi / n * np.array([1, 2, 8, 64])):
            step = truth.step_time_s(n, r, bs, 1410)
            assert np.all(np.isfinite(step)) and np.all(step > 0)
            assert np.all(np.diff(step) > 0), (n, r, bs, step)
    # far beyond the table the step is compute-bound: linear in the batch
    big = truth.step_time_s(1, 1, np.array([2048.0, 4096.0]), 1410)
    assert 1.9 < big[1] / big[0] < 2.0


def test_power_grows_sublinearly_with_local_batch() -> None:
    truth = ground_truth("resnet50")
    power = truth.power_w(1, 1, np.array([1.0, 4.0, 16.0, 64.0, 256.0]), 1410)
    assert np.all(np.diff(power) > 0)
    assert power[-1] / power[0] < 256 / 1


def test_invalid_configurations_are_refused() -> None:
    truth = ground_truth("gpt2")
    with pytest.raises(DataError):
        truth.step_time_s(4, 8, 32, 1410)  # r > n
    with pytest.raises(DataError):
        truth.step_time_s(16, 16, 8, 1410)  # r > 8 GPUs per node
    with pytest.raises(DataError):
        truth.energy_per_iter_j(2, 2, 0, 1410)


def test_prediction_over_100k_configurations_is_vectorised() -> None:
    rng = np.random.default_rng(7)
    count = 100_000
    n = 2.0 ** rng.integers(0, 7, count)
    r = np.minimum(n, 2.0 ** rng.integers(0, 4, count))
    bs = rng.uniform(1, 256, count)
    f = rng.choice(CLOCKS, count)
    truth = ground_truth("inception3")
    start = time.perf_counter()
    step = truth.step_time_s(n, r, bs, f)
    energy = truth.energy_per_iter_j(n, r, bs, f)
    assert time.perf_counter() - start < 2.0  # per-config Python loops would take far longer
    assert step.shape == energy.shape == (count,)


# -- what a profiler sees --------------------------------------------------------


def test_measurement_is_seeded() -> None:
    truth = ground_truth("bert")
    a = measure(truth, 8, 8, 8, CLOCKS, rng=np.random.default_rng(3))
    b = measure(truth, 8, 8, 8, CLOCKS, rng=np.random.default_rng(3))
    c = measure(truth, 8, 8, 8, CLOCKS, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(a.step_time_s, b.step_time_s)
    np.testing.assert_array_equal(a.energy_j, b.energy_j)
    assert not np.array_equal(a.step_time_s, c.step_time_s)


def test_measurement_noise_is_unbiased_with_the_requested_spread() -> None:
    truth = ground_truth("vgg16")
    count = 40_000
    s = measure(truth, 16, 8, np.full(count, 8.0), 1200, rng=np.random.default_rng(5), noise=0.05)
    for observed, true in (
        (s.step_time_s, truth.step_time_s(16, 8, 8, 1200)),
        (s.energy_j, truth.energy_per_iter_j(16, 8, 8, 1200)),
    ):
        ratio = observed / true
        assert abs(ratio.mean() - 1.0) < 2e-3  # standard error 2.5e-4
        assert 0.045 < ratio.std() < 0.055
    exact = measure(truth, 16, 8, 8, CLOCKS, rng=np.random.default_rng(5), noise=0.0)
    np.testing.assert_allclose(exact.step_time_s, truth.step_time_s(16, 8, 8, CLOCKS), rtol=1e-15)


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_dense_profile_covers_the_grid(model: str) -> None:
    truth = ground_truth(model)
    s = dense_profile(truth, rng=np.random.default_rng(0))
    assert 0 < len(s) < 20_000
    assert set(np.unique(s.f)) == set(CLOCKS)
    assert set(np.unique(s.n)) == {1, 2, 4, 8, 16, 32, 64}
    assert np.all(s.bs >= 1) and np.all(s.bs == np.round(s.bs))
    assert set(np.unique(s.n * s.bs)) == set(truth.global_batch_sizes)
    assert np.any(s.r < np.minimum(s.n, 8))  # some less-packed placements
    assert np.all(s.r <= np.minimum(s.n, 8))
    cfg = dense_configs(truth)
    np.testing.assert_array_equal(cfg[0], s.n)
    ratio = s.step_time_s / truth.step_time_s(s.n, s.r, s.bs, s.f)
    assert 0.95 < np.median(ratio) < 1.05


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_one_gpu_sweep_fits_in_four_minutes(model: str) -> None:
    truth = ground_truth(model)
    bs = float(truth.global_batch_sizes[0])
    clocks, iters = sweep_plan(truth, bs)
    assert clocks[-1] == A100.max_clock_mhz
    assert np.all(iters >= 1) and len(clocks) >= 20
    assert np.sum(iters * truth.step_time_s(1, 1, bs, clocks)) <= 240.0
    s = one_gpu_sweep(truth, bs, rng=np.random.default_rng(1))
    assert np.all(s.n == 1) and np.all(s.r == 1) and np.all(s.bs == bs)
    np.testing.assert_array_equal(s.f, clocks)


def test_sweep_samples_average_their_iterations() -> None:
    truth = ground_truth("resnet50")
    clocks, iters = sweep_plan(truth, 1.0)
    assert iters.min() > 10  # a fast job gets many iterations per clock
    errs_sweep, errs_single = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s = one_gpu_sweep(truth, 1.0, rng=rng, noise=0.05)
        single = measure(truth, 1, 1, 1.0, clocks, rng=rng, noise=0.05)
        true = truth.step_time_s(1, 1, 1.0, clocks)
        errs_sweep.append(np.std(s.step_time_s / true))
        errs_single.append(np.std(single.step_time_s / true))
    assert np.mean(errs_sweep) < 0.5 * np.mean(errs_single)


@pytest.mark.parametrize("pollux_model", ["bert", "deepspeech2", "cifar10", "imagenet"])
def test_sync_batch_elasticity_is_the_slope_of_a_fit_with_one_intercept_per_group(
    pollux_model: str,
) -> None:
    """The demeaned slope equals least squares with a column per (GPUs, nodes) group."""
    rec = pollux_records(pollux_model)
    keys = np.column_stack([rec.gpus, rec.nodes])
    groups = np.asarray(np.unique(keys, axis=0, return_inverse=True)[1]).ravel()
    design = np.zeros((len(groups), groups.max() + 2))
    design[np.arange(len(groups)), groups] = 1.0
    design[:, -1] = np.log(rec.local_bs)
    coef, *_ = np.linalg.lstsq(design, np.log(rec.sync_time_s), rcond=None)
    assert pollux_sync_bs_elasticity(pollux_model) == pytest.approx(coef[-1], rel=1e-12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=60))
def test_nondecreasing_fit_equals_scipys_isotonic_regression(values: list[float]) -> None:
    from scipy.optimize import isotonic_regression

    got = nondecreasing(np.asarray(values))
    want = isotonic_regression(np.asarray(values)).x
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    assert np.all(np.diff(got) >= 0)
