"""Derived quantities agree with the model they derive from, for any PerfModel."""

from __future__ import annotations

import numpy as np
import pytest
from models_synth import TRUE

from powerflow.core.errors import ModelError
from powerflow.core.gpus import A100
from powerflow.core.models.derived import (
    most_efficient_clock_mhz,
    pareto_frontier,
    power_w,
    remaining_energy_j,
    remaining_jct_s,
)
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.protocol import PerfModel
from powerflow.lab import groundtruth as gt

MODELS: list[PerfModel] = [FittedModel(TRUE), gt.ground_truth("gpt2")]
IDS = ["fitted", "oracle"]


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_power_and_remaining_quantities(model: PerfModel) -> None:
    n, r, bs, f = np.array([1.0, 8.0, 16.0]), np.array([1.0, 8.0, 4.0]), 16.0, 1200.0
    t = model.step_time_s(n, r, bs, f)
    e = model.energy_per_iter_j(n, r, bs, f)
    np.testing.assert_allclose(power_w(model, n, r, bs, f) * t, e)
    k = np.array([10.0, 1e3, 1e6])
    np.testing.assert_allclose(remaining_jct_s(model, k, n, r, bs, f), k * t)
    np.testing.assert_allclose(remaining_energy_j(model, k, n, r, bs, f), k * e)
    # Power per GPU stays between idle-ish and the board limit.
    per_gpu = power_w(model, n, r, bs, f) / n
    assert np.all((per_gpu > 20) & (per_gpu <= A100.max_power_w))


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_most_efficient_clock_is_the_energy_minimum(model: PerfModel) -> None:
    n = np.array([1.0, 4.0, 16.0])
    r = np.minimum(n, 8)
    bs = 64.0 / n
    best = most_efficient_clock_mhz(model, A100, n, r, bs)
    assert best.shape == (3,)
    assert set(best) <= set(A100.clocks_mhz)
    e_best = model.energy_per_iter_j(n, r, bs, best)
    for clock in A100.clocks_mhz:
        assert np.all(e_best <= model.energy_per_iter_j(n, r, bs, clock))
    # Neither extreme: static power punishes the lowest clock, voltage the highest.
    assert np.all((best > A100.min_clock_mhz) & (best < A100.max_clock_mhz))


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_pareto_frontier_is_the_undominated_set(model: PerfModel) -> None:
    front = pareto_frontier(model, A100, global_batch_size=64)
    assert len(front.n) >= 3
    assert np.all(np.diff(front.step_time_s) > 0) and np.all(np.diff(front.energy_j) < 0)
    counts = np.array([1.0, 2, 4, 8, 16, 32, 64])
    clocks = np.asarray(A100.clocks_mhz, dtype=np.float64)
    n, f = (a.ravel() for a in np.meshgrid(counts, clocks, indexing="ij"))
    t = model.step_time_s(n, np.minimum(n, 8), 64 / n, f)
    e = model.energy_per_iter_j(n, np.minimum(n, 8), 64 / n, f)
    for ft, fe in zip(front.step_time_s, front.energy_j, strict=True):
        assert not np.any((t < ft) & (e < fe))  # nothing beats a frontier point
    for ct, ce in zip(t, e, strict=True):  # every configuration is matched by one
        assert np.any((front.step_time_s <= ct) & (front.energy_j <= ce))


def test_pareto_frontier_needs_a_feasible_gpu_count() -> None:
    with pytest.raises(ModelError):
        pareto_frontier(FittedModel(TRUE), A100, global_batch_size=1, gpu_counts=(2, 4))
