"""Accuracy of a model against samples: the paper's 90/10 MAPE (Table 2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import ModelError
from powerflow.core.models.protocol import PerfModel
from powerflow.core.models.samples import Samples


@dataclass(frozen=True)
class Accuracy:
    """Mean absolute percentage errors, as fractions (0.05 = 5%)."""

    throughput_mape: float
    energy_mape: float


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean of ``|pred - meas| / meas``. MAPE of throughput equals MAPE of
    step time only to first order, so callers pass what they mean."""
    if len(measured) == 0:
        raise ModelError("MAPE of an empty set")
    return float(np.mean(np.abs(predicted - measured) / measured))


def accuracy(model: PerfModel, samples: Samples) -> Accuracy:
    """Throughput (iterations/s) and energy-per-iteration MAPE on ``samples``."""
    t = model.step_time_s(samples.n, samples.r, samples.bs, samples.f)
    e = model.energy_per_iter_j(samples.n, samples.r, samples.bs, samples.f)
    return Accuracy(
        throughput_mape=mape(1.0 / t, 1.0 / samples.step_time_s),
        energy_mape=mape(e, samples.energy_j),
    )


def split(
    samples: Samples, *, train_fraction: float = 0.9, seed: int = 0
) -> tuple[Samples, Samples]:
    """A seeded random train/held-out split (the paper's 90/10)."""
    if not 0 < train_fraction < 1:
        raise ModelError(f"train fraction must be in (0, 1), got {train_fraction}")
    order = np.random.default_rng(seed).permutation(len(samples))
    cut = round(train_fraction * len(samples))
    cut = min(max(cut, 1), len(samples) - 1)
    return samples.take(np.sort(order[:cut])), samples.take(np.sort(order[cut:]))
