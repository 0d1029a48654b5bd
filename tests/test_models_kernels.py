"""The compiled kernels against the readable reference (throughput.py, energy.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerflow.core.gpus import A100
from powerflow.core.models import energy, kernels, throughput
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams


def _random_model(seed: int) -> tuple[ModelParams, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(seed)
    m = 80
    n = 2.0 ** rng.integers(0, 7, m)
    r = np.minimum(n, 2.0 ** rng.integers(0, 4, m))
    bs = rng.uniform(1, 512, m)
    f = rng.choice(np.asarray(A100.clocks_mhz, dtype=np.float64), m)
    x = rng.uniform(0, 0.01, 12) * (rng.random(12) > 0.3)  # some terms exactly 0
    x[4] = max(x[4], 1e-6)
    x[9:11] = rng.choice([1.0, 12.0, *rng.uniform(1, 12, 2)], 2)  # the bounds included
    e = rng.uniform(0.0, 1.0, 12) * np.array([300, 0.5, 1, 1, 3, 3, 200, 1, 3, 3, 100, 1])
    e[2] += 1.0
    e[10] += 1.0
    params = ModelParams("A100", ThroughputParams.from_vector(x), EnergyParams.from_vector(e))
    return params, (n, r, bs, f)


def _reference(params: ModelParams, cols: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    n, r, bs, f = cols
    tp = params.throughput
    grad, sync, it = throughput.power_phases(tp, n, r, bs, f)
    return it, energy.energy_per_iter(params.energy, n, bs, f / A100.f0_mhz, grad, sync, it)


@pytest.mark.parametrize("seed", range(10))
def test_predictions_match_the_reference(seed: int) -> None:
    params, cols = _random_model(seed)
    want_t, want_e = _reference(params, cols)
    model = FittedModel(params)
    got_t, got_e = model.predict_columns(*cols)
    np.testing.assert_allclose(got_t, want_t, rtol=1e-13)
    np.testing.assert_allclose(got_e, want_e, rtol=1e-13)
    for both in (model.predict(*cols), model.predict_columns(*cols)):
        np.testing.assert_array_equal(both[0], got_t)
        np.testing.assert_array_equal(both[1], got_e)


@pytest.mark.parametrize("seed", range(10))
def test_the_grid_kernel_gives_the_very_floats_of_the_broadcast_grid(seed: int) -> None:
    """``predict_grid`` (what the policy's tables call) hoists what a row or a clock
    shares out of the points; every point must still equal ``predict``'s exactly."""
    params, (n, r, bs, _) = _random_model(seed)
    model = FittedModel(params)
    for clocks in (A100.clocks_mhz, A100.clocks_mhz[::7], (1410,), (210, 1005)):
        f = np.asarray(clocks, dtype=np.float64)
        want_t, want_e = model.predict(n[:, None], r[:, None], bs[:, None], f[None, :])
        got_t, got_e = model.predict_grid(n, r, bs, f)
        np.testing.assert_array_equal(got_t, want_t)
        np.testing.assert_array_equal(got_e, want_e)


def test_several_models_in_one_grid_call_give_each_models_own_grid() -> None:
    """``predict_grids`` (the policy's tables evaluate a decision's new models in
    one call) gives each model's rows exactly what its own ``predict_grid`` gives,
    a model with no rows included."""
    models = [FittedModel(_random_model(seed)[0]) for seed in range(4)]
    _, (n, r, bs, _) = _random_model(9)
    f = np.asarray(A100.clocks_mhz[::3], dtype=np.float64)
    bounds = [0, 30, 30, 55, 80]
    got_t, got_e = FittedModel.predict_grids(models, bounds, n, r, bs, f)
    for k, model in enumerate(models):
        rows = slice(bounds[k], bounds[k + 1])
        want_t, want_e = model.predict_grid(n[rows], r[rows], bs[rows], f)
        np.testing.assert_array_equal(got_t[rows], want_t)
        np.testing.assert_array_equal(got_e[rows], want_e)


def test_fitted_model_broadcasts_like_numpy() -> None:
    params, _ = _random_model(3)
    model = FittedModel(params)
    n = np.array([1.0, 2.0, 8.0, 16.0])[:, None]
    f = np.asarray(A100.clocks_mhz[::10], dtype=np.float64)[None, :]
    t, e = model.predict(n, np.minimum(n, 8), 32, f)
    assert t.shape == e.shape == (4, f.shape[1])
    cols = np.broadcast_arrays(n, np.minimum(n, 8), np.float64(32), f)
    want_t, want_e = _reference(params, tuple(c.ravel() for c in cols))
    np.testing.assert_allclose(t.ravel(), want_t, rtol=1e-13)
    np.testing.assert_allclose(e.ravel(), want_e, rtol=1e-13)
    assert model.step_time_s(1, 1, 32, 1410).shape == ()
    assert float(model.energy_per_iter_j(1, 1, 32, 1410)) == pytest.approx(float(e[0, -1]))


@pytest.mark.parametrize("seed", range(5))
def test_step_time_fit_evaluates_the_predictions_floats(seed: int) -> None:
    """The fit's log step times are the logs of ``predict``'s, bit for bit, and a
    row that repeats the one before it (copied, not evaluated) is what it would
    be evaluated: precomputing the rows' factors changes no float of a fit."""
    params, cols = _random_model(seed)
    rng = np.random.default_rng(seed)
    repeats = rng.integers(1, 4, len(cols[0]))  # runs of one to three equal rows
    n, r, bs, f = (np.repeat(c, repeats) for c in cols)
    data = kernels.time_data(np.stack([n, r, bs, f]))
    assert data[10].sum() == len(n) - len(cols[0])
    empty = np.empty(0)
    x = params.throughput.to_vector()
    pred, jac = kernels.residuals((kernels.TIME, data, np.zeros(len(n)), empty, empty), x)
    every = data.copy()
    every[10] = 0.0
    want, want_jac = kernels.residuals((kernels.TIME, every, np.zeros(len(n)), empty, empty), x)
    np.testing.assert_array_equal(pred, want)
    np.testing.assert_array_equal(jac, want_jac)
    t, _ = kernels.predict(x, params.energy.to_vector(), float(A100.f0_mhz), n, r, bs, f)
    np.testing.assert_array_equal(pred, [math.log(v) for v in t])  # libm's, as compiled


@pytest.mark.parametrize("seed", range(5))
def test_repeated_configurations_get_the_floats_of_their_evaluation(seed: int) -> None:
    """``predict_rows`` and ``energy_data`` copy a configuration that repeats the
    one before it: the same floats as ``predict`` and as each configuration
    evaluated on its own."""
    params, cols = _random_model(seed)
    repeats = np.random.default_rng(seed).integers(1, 4, len(cols[0]))
    n, r, bs, f = (np.repeat(c, repeats) for c in cols)
    tp, ep, f0 = params.throughput.to_vector(), params.energy.to_vector(), float(A100.f0_mhz)
    t, e = kernels.predict(tp, ep, f0, n, r, bs, f)
    rows = np.stack([n, r, bs, f])
    np.testing.assert_array_equal(kernels.predict_rows(tp, ep, f0, rows, False), t)
    np.testing.assert_array_equal(kernels.predict_rows(tp, ep, f0, rows, True), e)
    once = kernels.energy_data(tp, f0, np.stack(cols))
    np.testing.assert_array_equal(kernels.energy_data(tp, f0, rows), np.repeat(once, repeats, 1))


def test_energy_stage_data_are_the_step_time_terms() -> None:
    params, (n, r, bs, f) = _random_model(4)
    tp = params.throughput
    data = kernels.energy_data(tp.to_vector(), float(A100.f0_mhz), np.stack([n, r, bs, f]))
    want = [
        bs,
        f / A100.f0_mhz - 1.0,
        n * throughput.t_grad(tp, bs, f),
        n * throughput.t_sync(tp, n, r, f),
        n * throughput.step_time(tp, n, r, bs, f),
    ]
    np.testing.assert_allclose(data, np.stack(want), rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("seed", range(5))
def test_cholesky_solves_positive_definite_systems(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = 15
    j = rng.normal(size=(40, p)) * rng.uniform(1e-3, 1e3, p)
    a = j.T @ j + 1e-6 * np.eye(p)
    b = rng.normal(size=p)
    out = np.empty(p)
    assert kernels.cholesky_solve(a, b, np.empty((p, p)), out)
    np.testing.assert_allclose(a @ out, b, rtol=1e-6, atol=1e-9 * np.abs(b).max())
    np.testing.assert_allclose(out, np.linalg.solve(a, b), rtol=1e-6)


@pytest.mark.parametrize("bad", ["indefinite", "singular", "nan"])
def test_cholesky_reports_what_it_cannot_factor(bad: str) -> None:
    a = np.diag([2.0, 1.0, 3.0])
    a[1, 1] = {"indefinite": -1.0, "singular": 0.0, "nan": np.nan}[bad]
    assert not kernels.cholesky_solve(a, np.ones(3), np.empty((3, 3)), np.empty(3))


def _log_time_from_terms(x: np.ndarray, cols: tuple[np.ndarray, ...]) -> tuple[list, np.ndarray]:
    """``log T_iter`` and its Jacobian row by row from ``_terms`` and ``_sync_shape``
    themselves, every product in the order of the formula: what ``_log_time`` gives
    from ``time_data``'s precomputed factors."""
    n_, r_, bs_, f_ = cols
    pred, jac = [], np.zeros((len(n_), 12))
    for k, (n, r, bs, f) in enumerate(zip(n_, r_, bs_, f_, strict=True)):
        fg = f / 1000.0
        io, grad, sync = kernels._terms(x, n, r, bs, fg)
        inner, d_io, d_grad, dlog_g1 = kernels._pnorm_d(io, grad, x[9])
        if n <= 1.0:
            total, w = inner, 1.0 / inner
        else:
            total, d_inner, d_sync, dlog_g2 = kernels._pnorm_d(inner, sync, x[10])
            w, ds = d_inner / total, d_sync / total
            local, node, steps, hops = kernels._sync_shape(n, r)
            clock = (1.0 - x[8]) + x[8] / fg
            base = x[5] * local + x[6] * node + x[7] * steps + x[11] * hops
            jac[k, 5] = ds * (local * clock)
            jac[k, 6] = ds * (node * clock)
            jac[k, 7] = ds * (steps * clock)
            jac[k, 8] = ds * (base * (1.0 / fg - 1.0))
            jac[k, 10] = dlog_g2
            jac[k, 11] = ds * (hops * clock)
        jac[k, 0] = w * d_io
        jac[k, 1] = (bs * r) * (w * d_io)
        jac[k, 2] = w * d_grad
        jac[k, 3] = bs * (w * d_grad)
        jac[k, 4] = (bs / fg) * (w * d_grad)
        jac[k, 9] = w * inner * dlog_g1
        pred.append(math.log(total))
    return pred, jac


@pytest.mark.parametrize("seed", range(5))
def test_step_time_jacobian_is_the_formulas_bit_for_bit(seed: int) -> None:
    """The step-time stage's residuals and Jacobian from ``time_data`` are the
    floats the formula gives from ``_terms`` row by row, repeated rows included."""
    params, cols = _random_model(seed)
    repeats = np.random.default_rng(seed).integers(1, 3, len(cols[0]))
    cols = tuple(np.repeat(c, repeats) for c in cols)
    data = kernels.time_data(np.stack(cols))
    empty = np.empty(0)
    x = params.throughput.to_vector()
    pred, jac = kernels.residuals((kernels.TIME, data, np.zeros(len(cols[0])), empty, empty), x)
    want, want_jac = _log_time_from_terms(x, cols)
    np.testing.assert_array_equal(pred, want)
    np.testing.assert_array_equal(jac, want_jac)
