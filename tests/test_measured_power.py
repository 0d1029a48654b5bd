"""The engine's one-row power reading is ``measure``'s, draw for draw."""

from __future__ import annotations

import numpy as np
import pytest
from test_baselines_equivalence import Toy

from powerflow.core.errors import DataError
from powerflow.lab.groundtruth import MODEL_NAMES, ground_truth, measure
from powerflow.lab.groundtruth.measure import measured_power_w, noisy_power_w
from powerflow.lab.sim.rates import TruthRates


@pytest.mark.parametrize("name", MODEL_NAMES[:4])
def test_measured_power_is_measures_reading(name: str) -> None:
    truth = ground_truth(name)
    toy = Toy(0.4, 0.1, 2.0, 0.3, 250.0)  # not a GroundTruth: the model's two calls
    for model in (truth, toy):
        for seed, (n, r, bs, f, it) in enumerate(
            [(1, 1, 64.0, 1410.0, 1.0), (8, 4, 16.0, 1005.0, 37.5), (16, 8, 8.0, 810.0, 1e4)]
        ):
            plain, lean = np.random.default_rng(seed), np.random.default_rng(seed)
            sample = measure(model, n, r, bs, f, rng=plain, noise=0.03, iterations=it)
            want = float(sample.energy_j[0] / sample.step_time_s[0])
            got = measured_power_w(model, n, r, bs, f, rng=lean, noise=0.03, iterations=it)
            assert got == want
            assert lean.random() == plain.random()  # the same draws were taken


def test_measured_power_refuses_what_samples_refuse() -> None:
    truth = ground_truth(MODEL_NAMES[0])
    rng = np.random.default_rng(0)
    with pytest.raises(DataError, match="GPUs per node"):
        measured_power_w(truth, 2, 4, 32.0, 1410.0, rng=rng, noise=0.03, iterations=1.0)
    with pytest.raises(DataError, match="at least one iteration"):
        measured_power_w(truth, 1, 1, 32.0, 1410.0, rng=rng, noise=0.03, iterations=0.5)
    with pytest.raises(DataError, match="noise"):
        measured_power_w(truth, 1, 1, 32.0, 1410.0, rng=rng, noise=-1.0, iterations=1.0)


@pytest.mark.parametrize("name", MODEL_NAMES[:4])
def test_a_reading_from_known_rates_is_the_truths_reading(name: str) -> None:
    """``noisy_power_w`` on ``TruthRates.clean``'s step time and energy (filled for every
    clock at once, or at a clock the GPU does not list) reads what ``measured_power_w``
    reads from the truth itself, draw for draw."""
    truth = ground_truth(name)
    rates = TruthRates(ground_truth, truth.gpu.clocks_mhz)
    for seed, (n, r, bs, f, it) in enumerate(
        [
            (1, 1, 64.0, 1410, 1.0),
            (8, 4, 16.0, 1005, 37.5),
            (16, 8, 8.0, 810, 1e4),
            (2, 2, 8.0, 1207, 3.0),
        ]
    ):
        rates.rate(name, n, r, bs, f)
        clean = rates.clean(name, n, r, bs, f)
        plain, lean = np.random.default_rng(seed), np.random.default_rng(seed)
        want = measured_power_w(truth, n, r, bs, float(f), rng=plain, noise=0.03, iterations=it)
        got = noisy_power_w(clean, n, r, bs, float(f), rng=lean, noise=0.03, iterations=it)
        assert got == want
        assert lean.random() == plain.random()
    with pytest.raises(DataError, match="GPUs per node"):
        noisy_power_w((1.0, 1.0), 2, 4, 32.0, 1410.0, rng=plain, noise=0.03, iterations=1.0)
    with pytest.raises(DataError, match="at least one iteration"):
        noisy_power_w((1.0, 1.0), 1, 1, 32.0, 1410.0, rng=plain, noise=0.03, iterations=0.5)
