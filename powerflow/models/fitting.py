"""Fitting the paper's models to profile samples by bounded robust least squares.

Two stages, because the energy terms need the step-time terms but not the
other way round: first the throughput parameters against measured step time,
then the energy parameters against measured energy with the step-time terms
held at their fitted values. Each stage minimises log residuals
(``log(pred/measured)``, i.e. relative errors, so a 10 ms and a 1 s job weigh
the same) under a soft-L1 loss that shrugs off outlier measurements.

Energy is fitted directly as joules per iteration rather than as average
power: the policy consumes ``E_iter``, and fitting it directly lets the energy
parameters absorb part of the step-time model's residual error instead of
compounding it (fitting power and multiplying by the predicted step time
adds both errors). On the six ground-truth models the held-out energy MAPE is
4.76% fitted directly against 4.82% fitted as average power (seed 0).

Three entry points for the three situations the system is in:

* ``fit_profile``: a dense profile (many ``n``, placements, batches, clocks);
  several deterministic starts ranked on a subsample, the best one polished
  on all rows.
* ``fit_with_prior``: sparse data, e.g. the 4-minute pre-run that sweeps the
  clock on ONE GPU. Terms the data cannot determine (synchronisation, the
  placement term of ``T_IO``, how power grows with batch size) stay near a
  prior: the residuals include a weak pull of every parameter towards the
  prior, relative to its size. The prior is first rescaled to the job (one
  time factor, one power factor) so that it lends its shape, not its size.
* ``refit_online``: the same with a warm start from the current parameters
  and one start: cheap enough to run at every new batch of online samples.

The solver (``FitOptions.method``): by default a small Levenberg-Marquardt
loop (``_levenberg_marquardt``) on the same objective as
``least_squares(method="trf", loss="soft_l1", bounds=...)``, which stays
available as ``method="trf"`` and which the tests pin it against. Bounds
become a change of variables (``_Unbounded``) and the soft-L1 loss a
transform of the residuals with exactly the same cost. Why: the simulator
fits a few thousand 100-row problems per run, where ``trf`` spent ~6 ms per
call in per-iteration Python (SVDs, step selection, wrapper setup) around
~0.2 ms of model evaluation. With the step-time and energy Jacobians also
evaluated from precomputed designs (``_TimeModel``, ``_EnergyModel``), one
prior-anchored fit of a 1-GPU sweep takes 2.2 ms of CPU instead of 6.9 (a
refit 3.5 ms instead of 10.5), and a dense-profile fit 0.12-0.20 s instead
of 0.25-0.71 s with the same held-out errors (``python -m benchmarks
models``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.linalg.lapack import dposv
from scipy.optimize import least_squares
from scipy.special import expit, xlogy

from powerflow.errors import ModelError
from powerflow.gpus import GpuSpec
from powerflow.models import throughput
from powerflow.models.fitted import predict_flat
from powerflow.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.models.protocol import FloatArray
from powerflow.models.samples import Samples

MIN_SAMPLES = 10
"""Fewest samples any fit accepts: below this even a prior-anchored fit is noise."""


@dataclass(frozen=True)
class FitOptions:
    """Knobs of the optimiser; the defaults meet the targets in ``benchmarks/``."""

    starts: int = 4
    """Deterministic starts of ``fit_profile`` (per stage)."""
    rank_rows: int = 400
    """Rows of the subsample on which the starts are ranked."""
    rank_nfev: int = 30
    polish_nfev: int = 100
    loss: str = "soft_l1"
    f_scale: float = 0.05
    """Residual (log error) beyond which the loss grows linearly."""
    prior_weight: float = 0.05
    """Weight of a 100% deviation from the prior, against one log residual."""
    seed: int = 0
    tol: float = 1e-8
    """``ftol``/``xtol`` (scipy's default): stop when an accepted step lowers
    the cost, or a step moves the parameters, by less than this, relatively.
    A warm-started online refit can stop far earlier (see ``refit_online``)."""
    method: str = "lm"
    """``"lm"``: the module's Levenberg-Marquardt (see the module docstring);
    ``"trf"``: ``scipy.optimize.least_squares``' trust-region reflective."""


class _Problem:
    """Residuals and their analytic Jacobian, evaluated once per point.

    ``model(x)`` returns the predicted log values and their Jacobian;
    ``least_squares`` asks for both at the same ``x`` one after the other.
    """

    def __init__(
        self,
        model: Callable[[FloatArray], tuple[FloatArray, FloatArray]],
        log_measured: FloatArray,
        prior: FloatArray | None,
        floor: FloatArray,
        weight: float,
    ) -> None:
        self._model = model
        self._log_measured = log_measured
        self._prior = prior if weight > 0 else None
        self._pull = weight / np.maximum(np.abs(prior), floor) if prior is not None else None
        self._pull_jac = np.diag(self._pull) if self._pull is not None else None
        self._key: bytes | None = None
        self._cache: tuple[FloatArray, FloatArray] = (np.empty(0), np.empty((0, 0)))

    def _eval(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        key = x.tobytes()
        if key != self._key:
            pred, jac = self._model(x)
            res = pred - self._log_measured
            if self._prior is not None and self._pull is not None:
                res = np.concatenate([res, self._pull * (x - self._prior)])
                jac = np.concatenate([jac, self._pull_jac])
            self._key, self._cache = key, (res, jac)
        return self._cache

    def __call__(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        return self._eval(x)

    def fun(self, x: FloatArray) -> FloatArray:
        return self._eval(x)[0]

    def jac(self, x: FloatArray) -> FloatArray:
        return self._eval(x)[1]


ProblemFactory = Callable[[Samples], _Problem]


def _solve(
    problem: _Problem,
    x0: FloatArray,
    bounds: tuple[FloatArray, FloatArray],
    scale: FloatArray,
    opts: FitOptions,
    max_nfev: int,
) -> tuple[FloatArray, float]:
    if opts.method == "lm":
        free = _Unbounded(problem, bounds, scale, opts.loss, opts.f_scale)
        u, cost = _levenberg_marquardt(free, free.to_u(np.clip(x0, *bounds)), max_nfev, opts.tol)
        x, _ = free.to_x(u)
        return np.clip(x, *bounds), cost
    if opts.method != "trf":
        raise ModelError(f"unknown fitting method {opts.method!r} (lm or trf)")
    lo, hi = bounds
    x0 = np.clip(x0, lo, hi)
    res = least_squares(
        problem.fun,
        x0,
        jac=problem.jac,
        bounds=(lo, hi),
        x_scale=scale,
        loss=opts.loss,
        f_scale=opts.f_scale,
        max_nfev=max_nfev,
        method="trf",
        ftol=opts.tol,
        xtol=opts.tol,
    )
    return np.asarray(res.x, dtype=np.float64), float(res.cost)


class _Unbounded:
    """The bounded problem in free coordinates ``u``, for MINPACK's ``lm``.

    ``x = lo + s*softplus(u)`` where only the lower bound is finite and
    ``x = lo + (hi-lo)*sigmoid(u)`` where both are, ``s`` the parameter's
    scale: every ``u`` is feasible, and near the start a unit step in ``u``
    moves ``x`` by about its scale. The soft-L1 loss becomes a transform of
    the residuals, ``r' = r*sqrt(2/(1 + sqrt(1 + (r/f)^2)))``, whose plain
    sum of squares is exactly ``least_squares``' soft-L1 cost, so ``lm``
    (which knows only the linear loss) minimises the same objective as
    ``trf`` did.
    """

    def __init__(
        self,
        problem: _Problem,
        bounds: tuple[FloatArray, FloatArray],
        scale: FloatArray,
        loss: str,
        f_scale: float,
    ) -> None:
        if loss not in ("soft_l1", "linear"):
            raise ModelError(f"method 'lm' supports the soft_l1 and linear losses, not {loss!r}")
        lo, hi = bounds
        self._problem = problem
        self._lo = lo
        self._two = np.isfinite(hi)
        self._width = np.where(self._two, hi - lo, scale)
        self._soft = loss == "soft_l1"
        self._f = f_scale

    def to_u(self, x: FloatArray) -> FloatArray:
        q = (x - self._lo) / self._width
        # Strictly inside, as trf starts: a parameter exactly on its bound
        # would sit where the map is flat.
        q = np.maximum(q, 1e-6)
        u_one = np.log(np.expm1(np.minimum(q, 700.0)))
        u_one = np.where(q > 30.0, q, u_one)
        qt = np.clip(q, 1e-6, 1.0 - 1e-6)
        u_two = np.log(qt) - np.log1p(-qt)
        return np.asarray(np.where(self._two, u_two, u_one), dtype=np.float64)

    def to_x(self, u: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``x(u)`` and ``dx/du``."""
        sig = expit(u)
        shape = np.where(self._two, sig, np.logaddexp(0.0, u))
        slope = np.where(self._two, sig * (1.0 - sig), sig)
        return self._lo + self._width * shape, self._width * slope

    def __call__(self, u: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Residuals and Jacobian in ``u`` (loss applied)."""
        x, dx = self.to_x(u)
        res, jac = self._problem(x)
        jac = jac * dx
        if self._soft:
            # r' = r*c with c = sqrt(2/(1 + root)), root = sqrt(1 + (r/f)^2);
            # dr'/dr = r*rho'/r' = 1/(root*c) with rho' = 1/root.
            root = np.sqrt(1.0 + (res / self._f) ** 2)
            c = np.sqrt(2.0 / (1.0 + root))
            res, jac = res * c, jac * (1.0 / (root * c))[:, None]
        return res, jac


def _levenberg_marquardt(
    fun: Callable[[FloatArray], tuple[FloatArray, FloatArray]],
    u0: FloatArray,
    max_nfev: int,
    tol: float,
) -> tuple[FloatArray, float]:
    """Minimise ``|r(u)|^2 / 2`` from ``u0``; returns ``u`` and that cost.

    Levenberg's damping ``(J'J + mu*I) h = -J'r`` with Nielsen's update of
    ``mu`` (Madsen, Nielsen & Tingleff, "Methods for non-linear least
    squares problems", 2004, algorithm 3.16); ``u`` is unit-scaled by
    ``_Unbounded``, so the identity is the right metric. Stops after
    ``max_nfev`` evaluations, when an accepted step lowers the cost by under
    ``tol`` relatively, or when a step is shorter than ``tol*(tol + |u|)``
    (``least_squares``' ``ftol``/``xtol``). Why not ``least_squares``: on
    the simulator's 100-row problems its ``trf`` spends ~6 ms per call in
    Python bookkeeping (SVDs, step selection, wrapper setup) around ~0.1 ms
    evaluations, and even its MINPACK ``lm`` ~0.8 ms per call; this loop
    costs a 15 x 15 solve per step.
    """
    u = u0
    r, jac = fun(u)
    cost = 0.5 * float(r @ r)
    a, g = jac.T @ jac, jac.T @ r
    eye = np.eye(len(u))
    mu = 1e-3 * max(float(np.max(np.diag(a))), 1e-12)
    nu = 2.0
    nfev = 1
    while nfev < max_nfev and math.isfinite(mu):
        # LAPACK's Cholesky solve directly: numpy's solve costs 3x as much
        # in wrapper overhead on a 15 x 15 system.
        _, h, info = dposv(a + mu * eye, -g)
        if info != 0:  # not positive definite at this damping: damp more
            mu, nu = mu * nu, nu * 2.0
            continue
        if math.sqrt(float(h @ h)) <= tol * (tol + math.sqrt(float(u @ u))):
            break
        u_new = u + h
        r_new, jac_new = fun(u_new)
        nfev += 1
        cost_new = 0.5 * float(r_new @ r_new)
        if not cost_new < cost:  # also rejects NaN
            mu, nu = mu * nu, nu * 2.0
            continue
        gain = (cost - cost_new) / max(0.5 * float(h @ (mu * h - g)), 1e-300)
        small = cost - cost_new <= tol * cost
        u, r, jac, cost = u_new, r_new, jac_new, cost_new
        a, g = jac.T @ jac, jac.T @ r
        mu *= max(1.0 / 3.0, 1.0 - (2.0 * gain - 1.0) ** 3)
        nu = 2.0
        if small:
            break
    return u, cost


# --- stage 1: step time -------------------------------------------------------


def _pnorm_d(
    a: FloatArray, b: FloatArray, g: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(a^g + b^g)^(1/g)``, its partials in ``a`` and ``b`` and its
    log-derivative in ``g``, relative to the larger term like
    ``throughput._pnorm`` (``a``, ``b`` >= 0, not both 0)."""
    a_hi = a >= b
    hi = np.where(a_hi, a, b)
    q = np.where(a_hi, b, a) / hi
    qg = q**g
    s = 1.0 + qg
    root = s ** (1.0 / g)
    d_hi = root / s
    d_lo = d_hi * q ** (g - 1.0)
    dlog_g = (xlogy(qg, q) / s - np.log(s) / g) / g
    return hi * root, np.where(a_hi, d_hi, d_lo), np.where(a_hi, d_lo, d_hi), dlog_g


class _TimeModel:
    """``throughput.log_step_time_jacobian`` for fixed samples, from a vector.

    Every term of ``T_iter`` is linear in its parameters, so the data-only
    factors (``bs*r``, ``bs/f``, the placement masks, ``n-2``) form fixed
    design matrices and each evaluation is three matrix products and two
    p-norms: about a sixth of the generic function's numpy calls on the
    100-row problems of the simulator (pinned equal to it in the tests).
    """

    def __init__(self, s: Samples) -> None:
        f = s.f / 1000.0
        one = np.ones_like(f)
        self._io = np.stack([one, s.bs * s.r], axis=1)
        self._grad = np.stack([one, s.bs, s.bs / f], axis=1)
        multi = s.n > 1
        local = (multi & (s.n == s.r))[:, None]
        node = (multi & (s.n != s.r))[:, None]
        base = np.stack([1.0 / f, (s.n - 2.0) / f, s.n - 2.0, one], axis=1)
        self._sync = np.concatenate([base * local, base * node], axis=1)
        # Without a multi-GPU row T_sync is 0 and T_iter is the inner norm.
        self._multi = bool(multi.any())

    def __call__(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        io = self._io @ x[0:2]
        grad = self._grad @ x[2:5]
        inner, d_io, d_grad, dlog_g1 = _pnorm_d(io, grad, float(x[13]))
        jac = np.zeros((len(io), 15))
        if self._multi:
            total, d_inner, d_sync, dlog_g2 = _pnorm_d(inner, self._sync @ x[5:13], float(x[14]))
            w = d_inner / total
            jac[:, 5:13] = self._sync * (d_sync / total)[:, None]
            jac[:, 14] = dlog_g2
        else:
            total, w = inner, 1.0 / inner
        jac[:, 0:2] = self._io * (w * d_io)[:, None]
        jac[:, 2:5] = self._grad * (w * d_grad)[:, None]
        jac[:, 13] = w * inner * dlog_g1
        return np.log(total), jac


def _time_problem(prior: FloatArray | None, opts: FitOptions) -> ProblemFactory:
    def make(s: Samples) -> _Problem:
        floor = ThroughputParams.scale_floor()
        return _Problem(_TimeModel(s), np.log(s.step_time_s), prior, floor, opts.prior_weight)

    return make


def _time_starts(s: Samples, count: int, seed: int) -> list[FloatArray]:
    """Starting points scaled to the data: compute dominates one GPU, sync
    fills the gap to the slowest multi-GPU rows, overlap varies."""
    one = s.n == s.n.min()
    t_ref = float(np.median(s.step_time_s[one]))
    bs_ref = float(np.median(s.bs[one]))
    f_ref = float(np.median(s.f[one])) / 1000.0
    multi = s.n > 1
    sync_ref = 0.2 * t_ref
    if multi.any():
        # Per-sample step time at n > 1 beyond the 1-GPU compute at that batch.
        excess = s.step_time_s[multi] - t_ref * s.bs[multi] / bs_ref
        sync_ref = float(np.clip(np.median(excess), 0.05 * t_ref, 2.0 * t_ref))
    n_ref = float(np.median(s.n[multi])) if multi.any() else 4.0
    shapes = [(1.0, 1.0, 0.7), (2.0, 2.0, 0.5), (1.5, 4.0, 0.85), (4.0, 1.5, 0.6)]
    rng = np.random.default_rng(seed)
    while len(shapes) < count:
        g1, g2, frac = rng.uniform(1.0, 5.0), rng.uniform(1.0, 5.0), rng.uniform(0.3, 0.95)
        shapes.append((float(g1), float(g2), float(frac)))
    per_unit = sync_ref / (1.0 + max(n_ref - 2.0, 0.0))

    def per(share: float) -> float:
        return share * per_unit

    starts = []
    for g1, g2, frac in shapes[:count]:
        p = ThroughputParams(
            a_io=0.02 * t_ref,
            b_io=0.02 * t_ref / bs_ref,
            a_grad=0.05 * t_ref,
            b_grad=(0.93 - frac) * t_ref / bs_ref,
            k_grad=frac * t_ref * f_ref / bs_ref,
            alpha_sync_local=per(0.3) * f_ref,
            kappa_sync_local=per(0.1) * f_ref,
            beta_sync_local=per(0.1),
            theta_sync_local=per(0.3),
            alpha_sync_node=per(0.6) * f_ref,
            kappa_sync_node=per(0.2) * f_ref,
            beta_sync_node=per(0.2),
            theta_sync_node=per(0.6),
            gamma1=g1,
            gamma2=g2,
        )
        starts.append(p.to_vector())
    return starts


def _scale_of(x: FloatArray, floor: FloatArray) -> FloatArray:
    return np.maximum(np.abs(x), floor)


def _fit_stage(
    make: ProblemFactory,
    s: Samples,
    starts: Sequence[FloatArray],
    bounds: tuple[FloatArray, FloatArray],
    floor: FloatArray,
    opts: FitOptions,
) -> FloatArray:
    """Rank the starts on a subsample, polish the best on every row."""
    best = starts[0]
    if len(starts) > 1:
        sub = s
        if len(s) > opts.rank_rows:
            rows = np.random.default_rng(opts.seed).choice(len(s), opts.rank_rows, replace=False)
            sub = s.take(np.sort(rows))
        rank = make(sub)
        best_cost = np.inf
        for x0 in starts:
            x, cost = _solve(rank, x0, bounds, _scale_of(x0, floor), opts, opts.rank_nfev)
            if cost < best_cost:
                best, best_cost = x, cost
    x, _ = _solve(make(s), best, bounds, _scale_of(best, floor), opts, opts.polish_nfev)
    return x


# --- stage 2: energy ----------------------------------------------------------


class _EnergyModel:
    """``energy.log_energy_jacobian`` for fixed samples and step-time terms.

    ``kappa = 1 + s*x + c2*x^2 + c3*x^3`` (the cubic terms above the knee
    only) is linear in its shape parameters, so each clock shape is one
    product with a fixed ``(x, x^2, x^3)`` design (pinned equal to the
    generic function in the tests).
    """

    def __init__(self, tp: ThroughputParams, gpu: GpuSpec, s: Samples) -> None:
        grad = throughput.t_grad(tp, s.bs, s.f)
        sync = throughput.t_sync(tp, s.n, s.r, s.f)
        it = throughput.combine(tp, throughput.t_io(tp, s.r, s.bs), grad, sync)
        x = s.f / gpu.f0_mhz - 1.0
        xh = np.where(x >= 0.0, x, 0.0)
        self._shape = np.stack([x, x * xh, x * x * xh], axis=1)
        self._xh = xh
        self._bs = s.bs
        self._g = s.n * grad
        self._s = s.n * sync
        self._i = s.n * it

    def __call__(self, p: FloatArray) -> tuple[FloatArray, FloatArray]:
        p_grad, alpha, theta = float(p[0]), float(p[1]), float(p[2])
        p_sync, p_static, slope = float(p[6]), float(p[10]), float(p[11])
        log_bs = np.log(self._bs + theta)
        util = 1.0 + alpha * log_bs
        gk = self._g * (1.0 + self._shape @ p[3:6])
        sk = self._s * (1.0 + self._shape @ p[7:10])
        ist = self._i * (1.0 + slope * self._xh)
        total = p_grad * gk * util + p_sync * sk + p_static * ist
        inv = 1.0 / total
        gw = p_grad * gk * inv
        jac = np.empty((len(total), 12))
        jac[:, 0] = gk * util * inv
        jac[:, 1] = gw * log_bs
        jac[:, 2] = gw * alpha / (self._bs + theta)
        jac[:, 3:6] = self._shape * (self._g * (p_grad * inv) * util)[:, None]
        jac[:, 6] = sk * inv
        jac[:, 7:10] = self._shape * (self._s * (p_sync * inv))[:, None]
        jac[:, 10] = ist * inv
        jac[:, 11] = self._i * self._xh * (p_static * inv)
        return np.log(total), jac


def _energy_problem(
    tp: ThroughputParams, gpu: GpuSpec, prior: FloatArray | None, opts: FitOptions
) -> ProblemFactory:
    def make(s: Samples) -> _Problem:
        floor = EnergyParams.scale_floor()
        model = _EnergyModel(tp, gpu, s)
        return _Problem(model, np.log(s.energy_j), prior, floor, opts.prior_weight)

    return make


def _energy_starts(s: Samples, count: int, seed: int) -> list[FloatArray]:
    p_avg = float(np.median(s.energy_j / (s.n * s.step_time_s)))
    bs_ref = float(np.median(s.bs))
    shapes = [(0.4, 0.8, 0.3), (0.25, 0.6, 0.0), (0.5, 1.0, 1.0), (0.35, 0.4, 0.5)]
    rng = np.random.default_rng(seed)
    while len(shapes) < count:
        shapes.append(
            (float(rng.uniform(0.15, 0.6)), float(rng.uniform(0.2, 1.0)), float(rng.uniform(0, 2)))
        )
    starts = []
    for static_share, slope, curv in shapes[:count]:
        alpha = 0.1
        util = 1.0 + alpha * np.log(bs_ref + 1.0)
        p = EnergyParams(
            p_grad_w=(1.0 - static_share) * p_avg / util,
            grad_log_alpha=alpha,
            grad_log_theta=1.0,
            grad_low_slope=slope,
            grad_high_c2=curv,
            grad_high_c3=curv,
            p_sync_w=0.5 * (1.0 - static_share) * p_avg,
            sync_low_slope=slope,
            sync_high_c2=curv,
            sync_high_c3=curv,
            p_static_w=max(static_share * p_avg, 1.0),
            static_high_slope=0.5,
        )
        starts.append(p.to_vector())
    return starts


# --- entry points -------------------------------------------------------------


def _check(samples: Samples) -> None:
    if len(samples) < MIN_SAMPLES:
        raise ModelError(f"need at least {MIN_SAMPLES} samples to fit, got {len(samples)}")


def fit_profile(
    samples: Samples,
    gpu: GpuSpec,
    *,
    prior: ModelParams | None = None,
    options: FitOptions = FitOptions(),
    model: str | None = None,
) -> ModelParams:
    """Fit both models to a dense profile from data-scaled starts.

    ``prior`` (optional) adds its weak pull and one more start per stage;
    without it the data alone decide.
    """
    _check(samples)
    t_starts = _time_starts(samples, options.starts, options.seed)
    t_prior = e_prior = None
    if prior is not None:
        prior = rescale_prior(prior, samples, gpu)
        t_prior, e_prior = prior.throughput.to_vector(), prior.energy.to_vector()
        t_starts.append(t_prior)
    x_t = _fit_stage(
        _time_problem(t_prior, options),
        samples,
        t_starts,
        ThroughputParams.bounds(),
        ThroughputParams.scale_floor(),
        options,
    )
    tp = ThroughputParams.from_vector(x_t)
    e_starts = _energy_starts(samples, options.starts, options.seed)
    if e_prior is not None:
        e_starts.append(e_prior)
    x_e = _fit_stage(
        _energy_problem(tp, gpu, e_prior, options),
        samples,
        e_starts,
        EnergyParams.bounds(),
        EnergyParams.scale_floor(),
        options,
    )
    return ModelParams(gpu.name, tp, EnergyParams.from_vector(x_e), model)


_COMPUTE_TERMS = frozenset({"a_io", "b_io", "a_grad", "b_grad", "k_grad"})


def _median(a: FloatArray) -> float:
    """``np.median`` of a 1-D array (the same value), without its wrappers:
    a tenth of the cost on a hundred samples."""
    s = np.sort(a)
    m = len(s)
    return 0.5 * float(s[(m - 1) // 2] + s[m // 2])


def rescale_prior(prior: ModelParams, samples: Samples, gpu: GpuSpec) -> ModelParams:
    """The prior with its compute times scaled by one factor and its powers by
    another, each the median ratio of measured to predicted: a prior from
    another DNN then lends its shape (how time splits into terms, how power
    moves with the clock) without imposing its size."""
    if prior.gpu != gpu.name:
        raise ModelError(f"prior is for {prior.gpu}, samples are for {gpu.name}")
    s = samples
    pred_t = throughput.step_time(prior.throughput, s.n, s.r, s.bs, s.f)
    k_t = _median(samples.step_time_s / pred_t)
    tp = prior.throughput
    x = tp.to_vector()
    # Compute and input terms scale with the job; synchronisation stays in
    # seconds: it is set by the gradient size and the interconnect, not by
    # how fast this job computes (leave-one-out on the ground truth: keeping
    # it absolute more than halves the multi-GPU error of the generic prior).
    timed = np.array([name in _COMPUTE_TERMS for name in tp.names()])
    x[timed] *= k_t
    tp = ThroughputParams.from_vector(x)
    scaled = replace(prior, throughput=tp)
    _, pred_e = predict_flat(scaled, gpu.f0_mhz, s.n, s.r, s.bs, s.f)
    k_e = _median(samples.energy_j / pred_e)
    ep = prior.energy
    ep = replace(
        ep,
        p_grad_w=ep.p_grad_w * k_e,
        p_sync_w=ep.p_sync_w * k_e,
        p_static_w=max(ep.p_static_w * k_e, 1.0),
    )
    return replace(scaled, energy=ep)


def fit_with_prior(
    prior: ModelParams,
    samples: Samples,
    gpu: GpuSpec,
    *,
    warm_start: ModelParams | None = None,
    options: FitOptions = FitOptions(),
    model: str | None = None,
) -> ModelParams:
    """Fit sparse samples (e.g. the 1-GPU clock sweep) anchored to a prior.

    The rescaled prior is both the anchor and, unless ``warm_start`` is
    given, the single start. Parameters the samples say nothing about (all
    synchronisation terms when every sample has ``n = 1``) stay at the
    anchor; as multi-GPU samples arrive they take over.
    """
    _check(samples)
    anchor = rescale_prior(prior, samples, gpu)
    start = warm_start if warm_start is not None else anchor
    x_t = _fit_stage(
        _time_problem(anchor.throughput.to_vector(), options),
        samples,
        [start.throughput.to_vector()],
        ThroughputParams.bounds(),
        ThroughputParams.scale_floor(),
        options,
    )
    tp = ThroughputParams.from_vector(x_t)
    x_e = _fit_stage(
        _energy_problem(tp, gpu, anchor.energy.to_vector(), options),
        samples,
        [start.energy.to_vector()],
        EnergyParams.bounds(),
        EnergyParams.scale_floor(),
        options,
    )
    return ModelParams(gpu.name, tp, EnergyParams.from_vector(x_e), model or prior.model)


def refit_online(
    prior: ModelParams,
    samples: Samples,
    gpu: GpuSpec,
    *,
    current: ModelParams | None = None,
    options: FitOptions = FitOptions(polish_nfev=60),
) -> ModelParams:
    """Refit on all samples seen so far, warm-started from ``current``.

    Called whenever online samples accumulate; the prior stays the anchor so
    that terms still unobserved (e.g. multi-node sync on a job that has only
    run on one node) keep sensible values.
    """
    return fit_with_prior(
        prior, samples, gpu, warm_start=current, options=options, model=prior.model
    )
