"""Fitting recovers parameters it was given, and priors carry what data lack."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from models_synth import TRUE, grid, sample

from powerflow.core.errors import ModelError
from powerflow.core.gpus import A100
from powerflow.core.learning import FittedLearner
from powerflow.core.models import energy, kernels, throughput
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.fitting import (
    MIN_SAMPLES,
    FitOptions,
    _energy_problem,
    _Problem,
    _time_problem,
    fit_profile,
    fit_with_prior,
    refit_online,
    rescale_prior,
)
from powerflow.core.models.metrics import accuracy, split
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.core.models.samples import Samples


@pytest.fixture(scope="module")
def profile() -> Samples:
    return sample(TRUE, grid(clock_step=2), noise=0.01, seed=1)


@pytest.fixture(scope="module")
def fitted(profile: Samples) -> ModelParams:
    return fit_profile(profile, A100)


# Parameters the dense profile pins down (the others trade off against each
# other, e.g. a_io against the overlap exponent, without changing predictions).
IDENTIFIED = {
    "throughput": ("a_grad", "b_grad", "k_grad", "sync_node_s", "sync_step_s", "gamma2"),
    "energy": ("p_grad_w", "p_sync_w", "p_static_w", "grad_low_slope", "sync_low_slope"),
}


def test_recovers_known_parameters(fitted: ModelParams) -> None:
    for group, names in IDENTIFIED.items():
        for name in names:
            got = getattr(getattr(fitted, group), name)
            want = getattr(getattr(TRUE, group), name)
            assert got == pytest.approx(want, rel=0.1), name


def test_predicts_its_own_family_to_the_noise_level(profile: Samples) -> None:
    train, test = split(profile, seed=3)
    acc = accuracy(FittedModel(fit_profile(train, A100)), test)
    # 1% Gaussian noise has a mean absolute value of 0.8%.
    assert acc.throughput_mape < 0.012
    assert acc.energy_mape < 0.012


def test_fit_is_deterministic(profile: Samples) -> None:
    small = profile.take(slice(0, None, 5))
    assert fit_profile(small, A100) == fit_profile(small, A100)


def test_too_few_samples_are_refused(profile: Samples) -> None:
    with pytest.raises(ModelError, match=str(MIN_SAMPLES)):
        fit_profile(profile.take(slice(0, MIN_SAMPLES - 1)), A100)


def _other_job(params: ModelParams, time_factor: float, power_factor: float) -> ModelParams:
    """The same shape at another size: a DNN that computes longer on the same
    GPU and interconnect (its synchronisation time unchanged)."""
    tp = params.throughput
    x = tp.to_vector()
    x[:5] *= time_factor  # a_io, b_io, a_grad, b_grad, k_grad
    ep = dataclasses.replace(
        params.energy,
        p_grad_w=params.energy.p_grad_w * power_factor,
        p_sync_w=params.energy.p_sync_w * power_factor,
        p_static_w=params.energy.p_static_w * power_factor,
    )
    return ModelParams("A100", type(tp).from_vector(x), ep, model="job")


def _sweep(params: ModelParams, bs: float, seed: int) -> Samples:
    f = np.asarray(A100.clocks_mhz, dtype=np.float64)
    one = np.ones_like(f)
    return sample(params, (one, one, bs * one, f), noise=0.01, seed=seed)


def test_rescaled_prior_takes_the_jobs_size() -> None:
    job = _other_job(TRUE, 2.5, 0.7)
    anchor = rescale_prior(TRUE, _sweep(job, 64.0, 0), A100)
    assert anchor.throughput.k_grad == pytest.approx(job.throughput.k_grad, rel=0.03)
    assert anchor.energy.p_static_w == pytest.approx(job.energy.p_static_w, rel=0.03)


def test_rescaled_prior_is_the_median_ratios_of_the_reference_model() -> None:
    """The compiled rescale against its definition, with the generic model."""
    job = _other_job(TRUE, 2.5, 0.7)
    s = Samples.concat([_sweep(job, 64.0, 0), sample(job, grid(clock_step=16), 0.01, seed=3)])
    anchor = rescale_prior(TRUE, s, A100)
    tp = TRUE.throughput
    k_t = np.median(s.step_time_s / throughput.step_time(tp, s.n, s.r, s.bs, s.f))
    compute = ("a_io", "b_io", "a_grad", "b_grad", "k_grad")
    want_t = dataclasses.replace(tp, **{k: getattr(tp, k) * k_t for k in compute})
    np.testing.assert_allclose(anchor.throughput.to_vector(), want_t.to_vector(), rtol=1e-12)
    grad, sync, it = throughput.power_phases(want_t, s.n, s.r, s.bs, s.f)
    e = energy.energy_per_iter(TRUE.energy, s.n, s.bs, s.f / A100.f0_mhz, grad, sync, it)
    k_e = np.median(s.energy_j / e)
    ep = TRUE.energy
    want_e = dataclasses.replace(
        ep,
        p_grad_w=ep.p_grad_w * k_e,
        p_sync_w=ep.p_sync_w * k_e,
        p_static_w=max(ep.p_static_w * k_e, 1.0),
    )
    np.testing.assert_allclose(anchor.energy.to_vector(), want_e.to_vector(), rtol=1e-12)
    assert anchor.model == TRUE.model and anchor.gpu == TRUE.gpu


def test_sweep_only_fit_borrows_multi_gpu_terms_from_the_prior() -> None:
    job = _other_job(TRUE, 2.5, 0.7)
    params = fit_with_prior(TRUE, _sweep(job, 64.0, 0), A100)
    # Everything, multi-GPU included, follows because the prior has the right shape.
    multi = sample(job, grid(clock_step=8), noise=0.0, seed=0)
    acc = accuracy(FittedModel(params), multi)
    assert acc.throughput_mape < 0.03 and acc.energy_mape < 0.03


def test_online_refit_learns_what_the_prior_got_wrong() -> None:
    tp = TRUE.throughput
    job = dataclasses.replace(
        TRUE,
        throughput=dataclasses.replace(
            tp,
            sync_node_s=3 * tp.sync_node_s,
            sync_step_s=3 * tp.sync_step_s,
            sync_local_s=3 * tp.sync_local_s,
        ),
    )
    everything = sample(job, grid(clock_step=8), noise=0.0, seed=0)
    multi = everything.take(everything.n > 1)
    sweep = _sweep(job, 64.0, 1)
    before = fit_with_prior(TRUE, sweep, A100)
    online = sample(job, grid(clock_step=16), noise=0.01, seed=2)
    after = refit_online(TRUE, Samples.concat([sweep, online]), A100, current=before)
    err_before = accuracy(FittedModel(before), multi).throughput_mape
    err_after = accuracy(FittedModel(after), multi).throughput_mape
    assert err_before > 0.1
    assert err_after < 0.03


def test_online_refit_learns_a_sync_term_the_prior_has_at_zero() -> None:
    """Dense-profile priors leave some sync terms at their bound of 0, where
    the solver's bounded coordinates are flat: once multi-GPU samples are in,
    each starts at least at its scale, so the job's own profiles can set it.
    A 1-GPU sweep cannot, so there it stays at the prior's 0."""
    job = dataclasses.replace(
        TRUE, throughput=dataclasses.replace(TRUE.throughput, sync_hop_s=0.002)
    )
    multi = sample(job, grid(clock_step=8), noise=0.0, seed=0)
    multi = multi.take(multi.n > 1)
    sweep = _sweep(job, 64.0, 1)
    before = fit_with_prior(TRUE, sweep, A100)
    assert before.throughput.sync_hop_s < 1e-6  # the prior's 0 (the solver keeps off the bound)
    online = sample(job, grid(clock_step=16), noise=0.01, seed=2)
    # with the learner's budget (15 evaluations), which a term at 0 never leaves
    options = FittedLearner.REFIT_OPTIONS
    after = refit_online(
        TRUE, Samples.concat([sweep, online]), A100, current=before, options=options
    )
    assert after.throughput.sync_hop_s == pytest.approx(0.002, rel=0.3)
    assert accuracy(FittedModel(after), multi).throughput_mape < 0.02


def test_prior_for_another_gpu_is_refused(profile: Samples) -> None:
    other = dataclasses.replace(A100, name="B100")
    with pytest.raises(ModelError, match="B100"):
        fit_with_prior(TRUE, profile, other)


def test_fewer_starts_still_fit(profile: Samples) -> None:
    params = fit_profile(profile, A100, options=FitOptions(starts=1))
    acc = accuracy(FittedModel(params), profile)
    assert acc.throughput_mape < 0.02 and acc.energy_mape < 0.02


# --- the fast path: same model, same objective, cheaper ---------------------


def _random_problem(seed: int) -> tuple[Samples, ThroughputParams, EnergyParams]:
    rng = np.random.default_rng(seed)
    m = 60
    n = np.asarray(2.0 ** rng.integers(0, 6, m) if seed % 3 else np.ones(m), dtype=np.float64)
    r = np.minimum(n, 2.0 ** rng.integers(0, 4, m))
    bs = rng.uniform(1, 256, m)
    f = rng.choice(np.asarray(A100.clocks_mhz, dtype=np.float64), m)
    x = rng.uniform(0, 0.01, 12) * (rng.random(12) > 0.2)  # some terms exactly 0
    x[4] = max(x[4], 1e-6)
    x[9:11] = rng.uniform(1, 6, 2)  # the gammas; x[11] the hop latency
    e = rng.uniform(0.0, 1.0, 12) * np.array([300, 0.5, 1, 1, 3, 3, 200, 1, 3, 3, 100, 1])
    e[2] += 1.0
    e[10] += 1.0
    ones = np.ones(m)
    return (
        Samples(n, r, bs, f, ones, ones),
        ThroughputParams.from_vector(x),
        EnergyParams.from_vector(e),
    )


def _bare_model(problem: _Problem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stage's predicted log values and Jacobian: its compiled residuals
    with the measurements zeroed and no prior."""
    kind, data, log_measured, *_ = problem.stage
    empty = np.empty(0)
    bare = (kind, data, np.zeros(len(log_measured)), empty, empty)
    return kernels.residuals(bare, np.ascontiguousarray(x, dtype=np.float64))


@pytest.mark.parametrize("seed", range(12))
def test_fast_models_match_the_generic_jacobians(seed: int) -> None:
    s, tp, ep = _random_problem(seed)
    want, want_jac = throughput.log_step_time_jacobian(tp, s.n, s.r, s.bs, s.f)
    got, got_jac = _bare_model(_time_problem(None, FitOptions())(s), tp.to_vector())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_jac, want_jac, rtol=1e-9, atol=1e-12)
    grad, sync, it = throughput.power_phases(tp, s.n, s.r, s.bs, s.f)
    f_rel = s.f / A100.f0_mhz
    want, want_jac = energy.log_energy_jacobian(ep, s.n, s.bs, f_rel, grad, sync, it)
    problem = _energy_problem(tp.to_vector(), A100, None, FitOptions())(s)
    got, got_jac = _bare_model(problem, ep.to_vector())
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got_jac, want_jac, rtol=1e-9, atol=1e-14)


def test_residuals_add_the_prior_pull() -> None:
    s, tp, _ = _random_problem(1)
    s = Samples(s.n, s.r, s.bs, s.f, np.exp(np.linspace(-3.0, -1.0, len(s))), s.energy_j)
    prior = TRUE.throughput.to_vector()
    x = tp.to_vector()
    problem = _time_problem(prior, FitOptions(prior_weight=0.05))(s)
    res, jac = problem(x)
    pred, pred_jac = _bare_model(problem, x)
    m = len(s)
    np.testing.assert_array_equal(res[:m], pred - np.log(s.step_time_s))
    np.testing.assert_array_equal(jac[:m], pred_jac)
    pull = 0.05 / np.maximum(np.abs(prior), ThroughputParams.scale_floor())
    np.testing.assert_allclose(res[m:], pull * (x - prior), rtol=1e-15)
    np.testing.assert_array_equal(jac[m:], np.diag(pull))
    assert problem.fun(x) is res and problem.jac(x) is jac  # one evaluation per point
    plain = _time_problem(prior, FitOptions(prior_weight=0.0))(s)
    assert len(plain.fun(x)) == m


def _energy_stage(seed: int) -> tuple[_Problem, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    s, tp, ep = _random_problem(seed)
    truth = FittedModel(ModelParams("A100", tp, ep)).predict(s.n, s.r, s.bs, s.f)
    noisy = np.random.default_rng(seed).normal(0.0, 0.1, len(s))
    s = Samples(s.n, s.r, s.bs, s.f, truth[0], truth[1] * np.exp(noisy))
    problem = _energy_problem(tp.to_vector(), A100, TRUE.energy.to_vector(), FitOptions())(s)
    return problem, ep.to_vector(), EnergyParams.bounds()


def test_free_coordinates_keep_the_bounds_and_the_soft_l1_cost() -> None:
    problem, x, (lo, hi) = _energy_stage(4)
    scale = np.abs(x) + 1.0
    u = kernels.to_free(x, lo, hi, scale)
    back, _ = kernels.from_free(u, lo, hi, scale)
    np.testing.assert_allclose(back, x, rtol=1e-9)
    for edge_u in (np.full(len(x), -800.0), np.full(len(x), 800.0)):
        edge, _ = kernels.from_free(edge_u, lo, hi, scale)
        assert np.all(edge >= lo) and np.all(edge <= hi)
    res, _ = kernels.free_residuals(problem.stage, (lo, hi, scale, True, 0.05), u)
    z = (problem.fun(back) / 0.05) ** 2
    assert 0.5 * res @ res == pytest.approx(0.5 * 0.05**2 * np.sum(2 * (np.sqrt(1 + z) - 1)))
    linear, _ = kernels.free_residuals(problem.stage, (lo, hi, scale, False, 0.05), u)
    np.testing.assert_array_equal(linear, problem.fun(back))


@pytest.mark.parametrize("soft", [True, False])
def test_free_jacobian_matches_finite_differences(soft: bool) -> None:
    problem, x, (lo, hi) = _energy_stage(5)
    scale = np.abs(x) + 1.0
    u = kernels.to_free(x, lo, hi, scale)
    free = (lo, hi, scale, soft, 0.05)
    _, jac = kernels.free_residuals(problem.stage, free, u)
    step = 1e-6
    for j in range(len(u)):
        du = np.zeros_like(u)
        du[j] = step
        up, _ = kernels.free_residuals(problem.stage, free, u + du)
        down, _ = kernels.free_residuals(problem.stage, free, u - du)
        np.testing.assert_allclose(jac[:, j], (up - down) / (2 * step), rtol=1e-5, atol=1e-8)


def test_lm_reaches_the_optimum_of_trf() -> None:
    """The default solver stops where scipy's trf (tight tolerance) does: the
    same predictions on every configuration, single- and multi-GPU."""
    job = _other_job(TRUE, 2.5, 0.7)
    sweep = _sweep(job, 64.0, 0)
    online = sample(job, grid(clock_step=16), noise=0.01, seed=2)
    data = Samples.concat([sweep, online])
    everything = sample(job, grid(clock_step=8), noise=0.0, seed=0)
    cols = (everything.n, everything.r, everything.bs, everything.f)
    for samples in (sweep, data):
        lm = FittedModel(fit_with_prior(TRUE, samples, A100)).predict(*cols)
        trf = FittedModel(
            fit_with_prior(TRUE, samples, A100, options=FitOptions(method="trf"))
        ).predict(*cols)
        for a, b in zip(lm, trf, strict=True):
            assert np.max(np.abs(a / b - 1)) < 0.005


def test_solve_refuses_a_start_of_another_width() -> None:
    """The residual kernels and the normal equations index ``PARAMS`` columns without
    bounds checks: a shorter start vector is an error, not a read past its end."""
    problem, x, (lo, hi) = _energy_stage(6)
    scale = np.abs(x) + 1.0
    free = (lo, hi, scale, True, 0.05)
    x_out, _ = kernels.solve(problem.stage, free, np.ascontiguousarray(x), 5, 1e-3)
    assert x_out.shape == x.shape == (kernels.PARAMS,)
    with pytest.raises(ValueError, match="PARAMS"):
        kernels.solve(problem.stage, free, np.ascontiguousarray(x[:-1]), 5, 1e-3)
