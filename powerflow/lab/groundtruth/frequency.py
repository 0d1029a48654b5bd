"""How compute time and power of training change with the core clock (A100).

Source: the Perseus A100-SXM sweeps (GPT-3 175B and Bloom, every pipeline
stage, forward and backward, 855-1410 MHz in 15 MHz steps), summed over all of
them so that per-stage noise averages out. Everything is relative to the
default clock, so the absolute numbers (whose energy/time exceeds the 400 W
board limit) never enter.

- ``time_factor(f)``: compute time at ``f`` over compute time at the default
  clock. Measured curve, made monotone by isotonic regression (the raw sums
  wobble by 0.1% in the throttled top 30 MHz) plus a ramp of 0.1% over the
  measured range so that it strictly decreases. Below the lowest measured clock
  it continues as ``tau(f_lo) * (a * f_lo / f + 1 - a)``: a compute-bound share
  ``a`` whose time goes as ``1/f`` and the rest clock-independent, with ``a``
  the elasticity of the measured curve below the voltage knee (about 0.9: that
  part of the sweep is almost purely compute-bound).
- ``dynamic_power_factor(f)``: power above idle at ``f`` over power above idle at
  the default clock, made monotone (isotonic). Below the lowest measured clock
  the voltage is flat (the sweep shows it: below the knee, dynamic power grows
  with elasticity 1.0 in ``f``), so dynamic power continues linearly in ``f``
  towards zero.
- ``voltage_knee_mhz()``: the clock where dynamic power switches from linear
  (flat voltage) to steep (voltage rising with ``f``): a continuous two-slope
  fit of log dynamic power against log ``f``, scanned over the measured clocks.
  It gives 1095 MHz (slopes 0.99 below, 2.55 above), which is ``A100.f0_mhz``.

Another GPU type (one whose top clock is not the sweep's 1410 MHz) has no sweep
of its own: its curves are the A100's at the same fraction of the top clock
(``f / f_max``), so its knee sits at the A100's fraction too (1095 / 1410 of
its top clock: 1538 MHz on an H100 SXM, whose catalogue ``f0`` is the nearest
supported clock, 1545 MHz). An assumption: no public sweep of another type's
clock was found, and the A100's shape is what the H100 would show if its
voltage-frequency curve were the A100's stretched to its clocks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.lab.groundtruth.sources import perseus_sweep

# Total width of the ramp that breaks the ties isotonic regression leaves in the
# throttled top of the sweep; small against the 50% change over the range.
_STRICT_RAMP = 1e-3


@dataclass(frozen=True, eq=False)
class FrequencyCurves:
    """Tabulated relative curves over the measured clocks, plus their extensions."""

    default_mhz: float
    freq_mhz: FloatArray  # increasing, measured clocks
    time_rel: FloatArray  # strictly decreasing, 1 at the default clock
    dyn_power_rel: FloatArray  # non-decreasing, 1 at the default clock
    compute_bound_share: float  # ``a`` of the extension below the sweep

    def time_factor(self, f: ArrayLike) -> FloatArray:
        f = np.asarray(f, dtype=np.float64)
        lo = self.freq_mhz[0]
        inside = np.interp(f, self.freq_mhz, self.time_rel)
        a = self.compute_bound_share
        below = self.time_rel[0] * (a * lo / np.maximum(f, 1e-9) + 1.0 - a)
        return np.asarray(np.where(f < lo, below, inside), dtype=np.float64)

    def dynamic_power_factor(self, f: ArrayLike) -> FloatArray:
        f = np.asarray(f, dtype=np.float64)
        lo = self.freq_mhz[0]
        inside = np.interp(f, self.freq_mhz, self.dyn_power_rel)
        below = self.dyn_power_rel[0] * f / lo
        return np.asarray(np.where(f < lo, below, inside), dtype=np.float64)


def _hinge_knee(freq: FloatArray, dyn_power: FloatArray) -> tuple[float, float, float]:
    """(knee, slope below, slope above) of the best continuous two-slope log-log fit."""
    x, y = np.log(freq), np.log(dyn_power)
    best: tuple[float, float, float, float] | None = None
    for f0 in freq[3:-3]:
        design = np.column_stack([np.ones_like(x), x, np.maximum(0.0, x - np.log(f0))])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(np.sum((design @ coef - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, float(f0), float(coef[1]), float(coef[1] + coef[2]))
    if best is None:
        raise DataError("frequency sweep too short to locate the voltage knee")
    return best[1], best[2], best[3]


def _dynamic_power(gpu: GpuSpec) -> tuple[FloatArray, FloatArray]:
    sweep = perseus_sweep()
    power = sweep.energy_j / sweep.time_s
    dyn = power - gpu.idle_power_w
    if np.any(dyn <= 0):
        raise DataError("frequency sweep power does not exceed idle power")
    return sweep.freq_mhz, dyn


SWEEP_GPU = A100
"""The type the sweep was measured on; others map onto it by relative clock."""


def _measured(gpu: GpuSpec) -> bool:
    """Whether the sweep ends at ``gpu``'s default clock (else it is mapped)."""
    return bool(np.isclose(perseus_sweep().freq_mhz[-1], gpu.default_clock_mhz))


def _clock_ratio(gpu: GpuSpec) -> float:
    """``gpu``'s top clock over the sweep GPU's: how the mapped clock axis stretches."""
    return gpu.default_clock_mhz / SWEEP_GPU.default_clock_mhz


def voltage_knee_mhz(gpu: GpuSpec) -> int:
    """The voltage knee the sweep shows (the ``f0_mhz`` a ``GpuSpec`` should carry);
    on a mapped type the A100's knee at the same fraction of the top clock."""
    if not _measured(gpu):
        return round(_hinge_knee(*_dynamic_power(SWEEP_GPU))[0] * _clock_ratio(gpu))
    freq, dyn = _dynamic_power(gpu)
    return round(_hinge_knee(freq, dyn)[0])


def knee_slopes(gpu: GpuSpec) -> tuple[float, float]:
    """Log-log slopes of dynamic power below and above the knee (about 1 and 2.5)."""
    freq, dyn = _dynamic_power(gpu)
    _, below, above = _hinge_knee(freq, dyn)
    return below, above


def nondecreasing(values: FloatArray) -> FloatArray:
    """The least-squares non-decreasing fit of ``values`` (equal weights): pool
    adjacent violators, each pool at its mean.

    Why not ``scipy.optimize.isotonic_regression``: importing ``scipy.optimize``
    costs every simulation process 0.3 s for two fits of under 50 points (and
    the components' image has no scipy); ``tests/test_groundtruth.py`` checks
    this against it.
    """
    means: list[float] = []
    sizes: list[int] = []
    for value in np.asarray(values, dtype=np.float64).tolist():
        mean, size = value, 1
        while means and means[-1] > mean:
            before, count = means.pop(), sizes.pop()
            mean = (before * count + mean * size) / (count + size)
            size += count
        means.append(mean)
        sizes.append(size)
    out: FloatArray = np.repeat(np.asarray(means, dtype=np.float64), sizes)
    return out


@functools.cache
def frequency_curves(gpu: GpuSpec) -> FrequencyCurves:
    """The relative curves on ``gpu``: measured on the A100 (idle power of ``gpu``
    subtracted), or on another type the A100's with its clock axis stretched to
    ``gpu``'s top clock (the relative values, hence the shape, unchanged)."""
    if not _measured(gpu):
        a100 = frequency_curves(SWEEP_GPU)
        return FrequencyCurves(
            float(gpu.default_clock_mhz),
            a100.freq_mhz / SWEEP_GPU.default_clock_mhz * gpu.default_clock_mhz,
            a100.time_rel,
            a100.dyn_power_rel,
            a100.compute_bound_share,
        )
    freq, dyn = _dynamic_power(gpu)
    time = perseus_sweep().time_s
    ref = float(gpu.default_clock_mhz)
    time_rel = time / time[-1]
    # The fit is non-decreasing: flip the clock axis.
    time_rel = nondecreasing(time_rel[::-1])[::-1]
    time_rel = time_rel + _STRICT_RAMP * (freq[-1] - freq) / (freq[-1] - freq[0])
    time_rel = time_rel / time_rel[-1]
    dyn_rel = nondecreasing(dyn / dyn[-1])
    dyn_rel = dyn_rel / dyn_rel[-1]

    knee = voltage_knee_mhz(gpu)
    low = freq <= knee
    slope = -np.polyfit(np.log(freq[low]), np.log(time_rel[low]), 1)[0]
    share = float(np.clip(slope, 0.05, 1.0))
    return FrequencyCurves(ref, freq, time_rel, dyn_rel, share)
