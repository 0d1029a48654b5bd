"""What a profiler sees when it runs a ground-truth job: noisy samples.

Noise model: each iteration's step time and energy are the truth times
independent log-normal factors ``exp(sigma * z - sigma**2 / 2)`` (``z``
standard normal), so that each factor has mean exactly 1 (the samples are
unbiased in the mean) and a relative spread of about ``sigma`` (``noise``).
Time and energy get independent factors: NVML's energy counter and the wall
clock err independently. A sample that averages ``k`` iterations has its
``sigma`` divided by ``sqrt(k)`` (the log-normal of the mean of ``k`` such
iterations, to first order).
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray, PerfModel
from powerflow.core.models.samples import Samples
from powerflow.lab.groundtruth.truth import GroundTruth, _memo_key

# The dense profile must stay cheap to fit: above this many rows it keeps
# every other clock.
DENSE_ROW_LIMIT = 20_000


def _factor(rng: np.random.Generator, sigma: FloatArray, half_var: FloatArray) -> FloatArray:
    """One log-normal factor per row; ``half_var`` is ``0.5 * sigma**2``."""
    return np.exp(sigma * rng.standard_normal(sigma.shape) - half_var)


def measure(
    truth: PerfModel,
    n: ArrayLike,
    r: ArrayLike,
    bs: ArrayLike,
    f: ArrayLike,
    *,
    rng: np.random.Generator,
    noise: float = 0.03,
    iterations: ArrayLike = 1,
) -> Samples:
    """One sample per configuration (arguments broadcast, then flatten).

    ``iterations`` is how many iterations each sample averages (noise shrinks
    as ``1/sqrt(iterations)``). ``truth`` may be any ``PerfModel`` (a fitted
    model too), not only a ``GroundTruth``.
    """
    if not noise >= 0:
        raise DataError("noise must be >= 0")
    if isinstance(iterations, (int, float)):  # one count for every sample
        if iterations < 1:
            raise DataError("each sample averages at least one iteration")
        # the value noise / np.sqrt(it_) has in every row (sqrt and division
        # are correctly rounded, on a number as on an array)
        each = noise / np.sqrt(np.float64(iterations))
        key = _memo_key(n, r, bs, f) if isinstance(truth, GroundTruth) else None
        if key is not None:
            assert isinstance(truth, GroundTruth)
            make = lambda: _clean(truth, *_columns(n, r, bs, f))  # noqa: E731
            rows = cast(_Clean | None, truth.measured(key, make))
            if rows is not None:
                return _noisy_rows(rows, np.full(2 * len(rows.n), each), rng)
        n_, r_, bs_, f_ = _columns(n, r, bs, f)
        sigma = np.full(len(n_), each)
    else:
        n_, r_, bs_, f_, it_ = _columns(n, r, bs, f, iterations)
        if np.any(it_ < 1):
            raise DataError("each sample averages at least one iteration")
        sigma = noise / np.sqrt(it_)
    step, energy = _noisy(truth, n_, r_, bs_, f_, sigma, rng)
    return Samples(n_, r_, bs_, f_, step, energy)


class _Clean(NamedTuple):
    """A measurement's rows before its noise: the configuration columns (copies: the
    caller's arrays may change later) and the true values, time's rows then energy's
    (2k values). Both factors come from one draw of 2k normals: the very numbers that
    a draw of k for time and then one of k for energy give, as ``_noisy`` draws them
    (tests/test_sim_fastpaths.py checks it).

    Kept with the truth per configuration (``GroundTruth.measured``; the noise, which
    depends on how many iterations a sample averages, is worked out per measurement),
    so that a measurement of rows seen before is its draws alone: 6.7 us against 34 us
    for a profile's 12 rows, 7.2 us against 33 us for a pre-run (``timeit``); the
    simulator's ``measure`` and ``one_gpu_sweep`` take 0.069 s and 0.035 s of a fitted
    run of the default trace against 0.135 s and 0.100 s (``process_time`` around each
    inside ``run_one(RunSpec("powerflow", 0.6))``, best of 6 runs each, alternated)."""

    n: FloatArray
    r: FloatArray
    bs: FloatArray
    f: FloatArray
    truth: FloatArray


def _clean(
    truth: GroundTruth, n: FloatArray, r: FloatArray, bs: FloatArray, f: FloatArray
) -> _Clean | None:
    """The rows and the truth there; None for no rows, or rows that ``Samples``
    refuses (``measure``'s own path then reports them)."""
    step, energy = truth.step_and_energy(n, r, bs, f)
    config = np.array((n, r, bs, f), dtype=np.float64)
    if not (config.size and np.isfinite(config).all() and (config > 0).all() and not np.any(r > n)):
        return None
    rows = _Clean(config[0], config[1], config[2], config[3], np.concatenate((step, energy)))
    for column in rows:
        column.flags.writeable = False
    return rows


def _noisy_rows(rows: _Clean, sigma: FloatArray, rng: np.random.Generator) -> Samples:
    """``measure``'s samples of ``rows`` with noise ``sigma`` (2k values, time's rows
    then energy's): ``_noisy``'s draws and arithmetic, and the checks ``Samples``
    makes (of the noisy values: the rows' own passed once)."""
    k = len(rows.n)
    noisy = rows.truth * np.exp(sigma * rng.standard_normal(2 * k) - 0.5 * sigma**2)
    step, energy = noisy[:k], noisy[k:]
    cols = (rows.n.copy(), rows.r.copy(), rows.bs.copy(), rows.f.copy(), step, energy)
    if not (noisy.min() > 0.0 and noisy.max() < math.inf):
        return Samples(*cols)  # refused, as measure refuses them
    return Samples._trusted(*cols)


def _noisy(
    truth: PerfModel,
    n: FloatArray,
    r: FloatArray,
    bs: FloatArray,
    f: FloatArray,
    sigma: FloatArray,
    rng: np.random.Generator,
) -> tuple[FloatArray, FloatArray]:
    """The truth's step times and energies at the rows, each times its own
    log-normal factor: time's draws first, then energy's."""
    if isinstance(truth, GroundTruth):
        step, energy = truth.step_and_energy(n, r, bs, f)
    else:
        step = truth.step_time_s(n, r, bs, f)
        energy = truth.energy_per_iter_j(n, r, bs, f)
    half_var = 0.5 * sigma**2
    step = step * _factor(rng, sigma, half_var)
    return step, energy * _factor(rng, sigma, half_var)


def measured_power_w(
    truth: PerfModel,
    n: float,
    r: float,
    bs: float,
    f: float,
    *,
    rng: np.random.Generator,
    noise: float,
    iterations: float,
) -> float:
    """``measure`` of one configuration, read as the job's power (energy over
    step time): what the simulator's node agent reports after each restart.

    The same draws and arithmetic as ``measure`` on one row, and the checks
    ``Samples`` makes, without building the columns and the ``Samples``: the
    simulator reads one power per restart, 11,596 times in an AFS run of the
    default trace, where that was most of the reading's cost.
    """
    if not noise >= 0:
        raise DataError("noise must be >= 0")
    if iterations < 1:
        raise DataError("each sample averages at least one iteration")
    n_, r_, bs_, f_ = (np.array([x], dtype=np.float64) for x in (n, r, bs, f))
    sigma = np.full(1, noise / np.sqrt(np.float64(iterations)))
    step, energy = _noisy(truth, n_, r_, bs_, f_, sigma, rng)
    return _power(n, r, bs, f, float(step[0]), float(energy[0]))


def noisy_power_w(
    clean: tuple[float, float],
    n: float,
    r: float,
    bs: float,
    f: float,
    *,
    rng: np.random.Generator,
    noise: float,
    iterations: float,
) -> float:
    """``measured_power_w`` of a configuration whose true step time and energy per
    iteration (``clean``) the caller has already (the very floats the truth gives there): the same
    draws, arithmetic and checks, without evaluating the truth again. The simulator
    measures every job that starts running at its planned clock, a configuration whose
    rates it has just read (``TruthRates.clean``)."""
    if not noise >= 0:
        raise DataError("noise must be >= 0")
    if iterations < 1:
        raise DataError("each sample averages at least one iteration")
    step_s, energy_j = clean
    # On numpy scalars rather than one-element arrays: the same draws and the same
    # ufuncs, so the same floats (tests/test_measured_power.py), in 3.1 us against
    # 8.2 us a reading (``timeit``, best of 7): about 0.1 s of the 20k readings of a
    # fitted run of the default trace.
    sigma = noise / np.sqrt(np.float64(iterations))
    half_var = 0.5 * sigma**2  # as _noisy: time's draw first, then energy's
    normal = rng.standard_normal
    step = np.float64(step_s) * np.exp(sigma * normal() - half_var)
    energy = np.float64(energy_j) * np.exp(sigma * normal() - half_var)
    return _power(n, r, bs, f, float(step), float(energy))


def _power(n: float, r: float, bs: float, f: float, step_s: float, energy_j: float) -> float:
    """A reading's power, after the checks ``Samples`` makes of its row."""
    values = (float(n), float(r), float(bs), float(f), step_s, energy_j)
    if not all(map(math.isfinite, values)):
        raise DataError("samples contain NaN or infinite values")
    if not all(v > 0 for v in values):
        raise DataError("samples must be positive")
    if r > n:
        raise DataError("GPUs per node cannot exceed the GPUs of the job")
    return energy_j / step_s


def _columns(*args: ArrayLike) -> list[FloatArray]:
    """The arguments broadcast to one shape and flattened, as float64.

    The simulator measures thousands of times with numbers and equal-length
    1-D arrays only; those are expanded directly (``np.full``, or the array
    itself, contiguous), which gives the values ``np.broadcast_arrays`` gives at a
    fraction of its cost. Anything else takes ``np.broadcast_arrays``.
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in args]
    sizes = {a.shape for a in arrays if a.ndim}
    if len(sizes) == 1:
        (shape,) = sizes
        if len(shape) == 1:
            (size,) = shape
            return [a.ravel() if a.ndim else np.full(size, a) for a in arrays]
    return [x.ravel() for x in np.broadcast_arrays(*arrays)]


def dense_configs(truth: GroundTruth) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(n, r, bs, f) of the dense profile, before noise.

    n = 1, 2, 4, ..., 64; r = min(n, 8), half and a quarter of it (when >= 1);
    local batch = each global batch / n when that is a whole number; every
    supported clock (every other one if the grid would exceed the row limit).
    """
    per_node = truth.gpus_per_node
    rows: list[tuple[int, int, int]] = []
    for k in range(7):
        n = 2**k
        packed = min(n, per_node)
        placements = sorted({p for p in (packed, packed // 2, packed // 4) if p >= 1}, reverse=True)
        for gb in truth.global_batch_sizes:
            if gb % n:
                continue
            rows.extend((n, r, gb // n) for r in placements)
    clocks = np.array(truth.gpu.clocks_mhz, dtype=np.float64)
    stride = 1
    while len(rows) * len(clocks[::-stride]) > DENSE_ROW_LIMIT:
        stride += 1
    clocks = clocks[::-stride][::-1]  # always keep the default (top) clock
    cfg = np.array(rows, dtype=np.float64)
    reps = len(clocks)
    return (
        np.repeat(cfg[:, 0], reps),
        np.repeat(cfg[:, 1], reps),
        np.repeat(cfg[:, 2], reps),
        np.tile(clocks, len(cfg)),
    )


def dense_profile(truth: GroundTruth, *, rng: np.random.Generator, noise: float = 0.03) -> Samples:
    """The full grid a careful offline profiler records, one iteration-averaged
    sample per configuration (each sample is one measurement of ``noise``)."""
    return measure(truth, *dense_configs(truth), rng=rng, noise=noise)


def _gpu_of(truth: PerfModel, gpu: GpuSpec | None) -> GpuSpec:
    if gpu is not None:
        return gpu
    return truth.gpu if isinstance(truth, GroundTruth) else A100


def sweep_plan(
    truth: PerfModel, bs: float, duration_s: float = 240.0, *, gpu: GpuSpec | None = None
) -> tuple[FloatArray, FloatArray]:
    """(clocks, iterations per clock) of the one-GPU pre-run.

    The run walks the clocks from the top down and gives each an equal slice of
    ``duration_s``; a slice ends at the last iteration boundary within its
    share, so a clock gets ``max(1, floor(share / step time))`` iterations. When
    that overruns ``duration_s`` (slow jobs at low clocks), it visits every
    second (third, ...) clock instead, always keeping the top one. The clocks
    are ``gpu``'s (default: the ground truth's own GPU, else the A100).
    """
    if not duration_s > 0:
        raise DataError("sweep duration must be positive")
    if isinstance(truth, GroundTruth):  # one plan per batch size, remembered
        return truth.sweep_plan(bs, duration_s, gpu, _sweep_plan)
    return _sweep_plan(truth, bs, duration_s, gpu)


def _sweep_plan(
    truth: PerfModel, bs: float, duration_s: float, gpu: GpuSpec | None
) -> tuple[FloatArray, FloatArray]:
    clocks = np.array(_gpu_of(truth, gpu).clocks_mhz, dtype=np.float64)
    for stride in range(1, len(clocks) + 1):
        chosen = clocks[::-stride][::-1]
        step = truth.step_time_s(1, 1, bs, chosen)
        share = duration_s / len(chosen)
        iters = np.maximum(1.0, np.floor(share / step))
        if np.sum(iters * step) <= duration_s or len(chosen) <= 2:
            return chosen, iters
    raise AssertionError("unreachable: the last stride keeps one clock")


def one_gpu_sweep(
    truth: PerfModel,
    bs: float,
    *,
    rng: np.random.Generator,
    noise: float = 0.03,
    duration_s: float = 240.0,
    gpu: GpuSpec | None = None,
) -> Samples:
    """The paper's 4-minute pre-run on one GPU: one sample per visited clock,
    the mean of that clock's iterations (``sweep_plan`` says which clocks and how many)."""
    if isinstance(truth, GroundTruth) and noise >= 0:
        # One run sweeps each batch size's same rows again and again: their
        # truth is kept with it, and only the draws are new.
        make = lambda: _sweep_rows(truth, bs, duration_s, gpu, noise)  # noqa: E731
        key = ("one_gpu_sweep", float(bs), float(duration_s), gpu, float(noise))
        kept = cast(tuple[_Clean, FloatArray] | None, truth.measured(key, make))
        if kept is not None:
            return _noisy_rows(*kept, rng)
    clocks, iters = sweep_plan(truth, bs, duration_s, gpu=gpu)
    return measure(truth, 1, 1, bs, clocks, rng=rng, noise=noise, iterations=iters)


def _sweep_rows(
    truth: GroundTruth, bs: float, duration_s: float, gpu: GpuSpec | None, noise: float
) -> tuple[_Clean, FloatArray] | None:
    """``one_gpu_sweep``'s rows before its draws, and their noise (time's rows then
    energy's): ``measure``'s, one count of iterations per clock (None where ``measure``
    would refuse them)."""
    clocks, iters = sweep_plan(truth, bs, duration_s, gpu=gpu)
    n_, r_, bs_, f_, it_ = _columns(1, 1, bs, clocks, iters)
    if np.any(it_ < 1):
        return None
    rows = _clean(truth, n_, r_, bs_, f_)
    if rows is None:
        return None
    sigma = noise / np.sqrt(it_)
    return rows, np.concatenate((sigma, sigma))
