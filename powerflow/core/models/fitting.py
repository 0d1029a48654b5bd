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
loop (``kernels.solve``) on the same objective as
``least_squares(method="trf", loss="soft_l1", bounds=...)``, which stays
available as ``method="trf"`` and which the tests pin it against. Bounds
become a change of variables (``kernels.to_free``) and the soft-L1 loss a
transform of the residuals with exactly the same cost. Why: the simulator
fits a few thousand 100-row problems per run, where ``trf`` spent ~6 ms per
call in per-iteration Python (SVDs, step selection, wrapper setup) around
~0.2 ms of model evaluation. The whole loop, model and Jacobian included,
is one compiled call per stage; ``trf`` evaluates the same compiled
residuals (``kernels.residuals``), so both solvers see one model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import ModelError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models import kernels
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.core.models.protocol import FloatArray
from powerflow.core.models.samples import Samples

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
    energy_prior_weight: float = 0.2
    """The same for the energy stage. Stronger than the time stage's: a
    1-GPU sweep at one batch size barely separates the static, compute and
    light powers (they differ only in their clock shapes), and at 0.05 the
    fit to inception3's sweep doubled its static power, 25% off on
    multi-GPU energy with its own prior; 0.2 gives 3.7-5.9% for every model
    (own prior) and leaves the learner's error after profiles unchanged
    (``python -m benchmarks models``/``learner``, docs/models.md)."""
    seed: int = 0
    tol: float = 1e-8
    """``ftol``/``xtol`` (scipy's default): stop when an accepted step lowers
    the cost, or a step moves the parameters, by less than this, relatively.
    A warm-started online refit can stop far earlier (see ``refit_online``)."""
    method: str = "lm"
    """``"lm"``: the module's Levenberg-Marquardt (see the module docstring);
    ``"trf"``: ``scipy.optimize.least_squares``' trust-region reflective."""


class _Problem:
    """One stage's residuals: the compiled model (``kernels``, ``kind``) on
    fixed ``data`` against the measured log values, plus a weak pull of
    every parameter towards ``prior`` relative to its size.

    Called as a function it returns the residuals and their analytic
    Jacobian at ``x``, once per point: ``least_squares`` asks for both at the
    same ``x`` one after the other.
    """

    def __init__(
        self,
        kind: int,
        data: FloatArray,
        log_measured: FloatArray,
        prior: FloatArray | None,
        floor: FloatArray,
        weight: float,
    ) -> None:
        empty = np.empty(0)
        anchor = np.ascontiguousarray(prior) if prior is not None and weight > 0 else empty
        pull = weight / np.maximum(np.abs(anchor), floor[: len(anchor)])
        self.stage: kernels.Stage = (kind, data, log_measured, anchor, pull)
        self._key: bytes | None = None
        self._cache: tuple[FloatArray, FloatArray] = (empty, np.empty((0, 0)))

    def __call__(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        key = x.tobytes()
        if key != self._key:
            x = np.ascontiguousarray(x, dtype=np.float64)
            self._key = key
            self._cache = kernels.residuals(self.stage, x)
        return self._cache

    def fun(self, x: FloatArray) -> FloatArray:
        return self(x)[0]

    def jac(self, x: FloatArray) -> FloatArray:
        return self(x)[1]


ProblemFactory = Callable[[Samples], _Problem]


def _solve(
    problem: _Problem,
    x0: FloatArray,
    bounds: tuple[FloatArray, FloatArray],
    scale: FloatArray,
    opts: FitOptions,
    max_nfev: int,
) -> tuple[FloatArray, float]:
    lo, hi = bounds
    if opts.method == "lm":
        if opts.loss not in ("soft_l1", "linear"):
            raise ModelError(
                f"method 'lm' supports the soft_l1 and linear losses, not {opts.loss!r}"
            )
        free = (lo, hi, scale, opts.loss == "soft_l1", float(opts.f_scale))
        x0 = np.ascontiguousarray(x0, dtype=np.float64)
        return kernels.solve(problem.stage, free, x0, int(max_nfev), float(opts.tol))
    if opts.method != "trf":
        raise ModelError(f"unknown fitting method {opts.method!r} (lm or trf)")
    # The lab's reference solver: scipy is not in the components' image (docs/image.md).
    from scipy.optimize import least_squares

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


# --- stage 1: step time -------------------------------------------------------


def _time_problem(prior: FloatArray | None, opts: FitOptions) -> ProblemFactory:
    def make(s: Samples) -> _Problem:
        log_t = np.log(s.step_time_s)
        data = kernels.time_data(s.configurations)
        return _Problem(kernels.TIME, data, log_t, prior, _T_FLOOR, opts.prior_weight)

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
    # One unit of ring traffic or latency step, so that the three sync terms
    # add up to about sync_ref at the median GPU count.
    per_unit = sync_ref / (2.0 + np.log2(max(n_ref, 2.0)))

    starts = []
    for g1, g2, frac in shapes[:count]:
        p = ThroughputParams(
            a_io=0.02 * t_ref,
            b_io=0.02 * t_ref / bs_ref,
            a_grad=0.05 * t_ref,
            b_grad=(0.93 - frac) * t_ref / bs_ref,
            k_grad=frac * t_ref * f_ref / bs_ref,
            sync_local_s=0.5 * per_unit,
            sync_node_s=per_unit,
            sync_step_s=0.5 * per_unit,
            sync_clock_share=0.15,
            gamma1=g1,
            gamma2=g2,
            sync_hop_s=0.1 * per_unit,
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


def _energy_problem(
    x_t: FloatArray, gpu: GpuSpec, prior: FloatArray | None, opts: FitOptions
) -> ProblemFactory:
    """The energy stage with the step-time parameters held at ``x_t``."""

    def make(s: Samples) -> _Problem:
        data = kernels.energy_data(x_t, float(gpu.f0_mhz), s.configurations)
        log_e = np.log(s.energy_j)
        weight = opts.energy_prior_weight
        return _Problem(kernels.ENERGY, data, log_e, prior, _E_FLOOR, weight)

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
        t_prior, e_prior = _rescaled(prior, samples, gpu)
        t_starts.append(t_prior)
    x_t = _fit_stage(
        _time_problem(t_prior, options), samples, t_starts, _T_BOUNDS, _T_FLOOR, options
    )
    e_starts = _energy_starts(samples, options.starts, options.seed)
    if e_prior is not None:
        e_starts.append(e_prior)
    x_e = _fit_stage(
        _energy_problem(x_t, gpu, e_prior, options),
        samples,
        e_starts,
        _E_BOUNDS,
        _E_FLOOR,
        options,
    )
    return _params(gpu, x_t, x_e, model)


def _params(gpu: GpuSpec, x_t: FloatArray, x_e: FloatArray, model: str | None) -> ModelParams:
    # Positionally, in field order: ``from_vector`` without its per-call
    # field lookup (the kernels return vectors of exactly these lengths).
    tp = ThroughputParams(*x_t.tolist())
    return ModelParams(gpu.name, tp, EnergyParams(*x_e.tolist()), model)


_T_BOUNDS = ThroughputParams.bounds()
_T_FLOOR = ThroughputParams.scale_floor()
_E_BOUNDS = EnergyParams.bounds()
_E_FLOOR = EnergyParams.scale_floor()
_SYNC_SECONDS = frozenset({"sync_local_s", "sync_node_s", "sync_step_s", "sync_hop_s"})
_T_LIFT = np.array(
    [
        floor if name in _SYNC_SECONDS else -np.inf
        for name, floor in zip(ThroughputParams.names(), _T_FLOOR, strict=True)
    ]
)
"""Least start of each synchronisation term once multi-GPU samples are in
(its scale floor, 1 ms; no bound on the others): see ``fit_with_prior``."""
_COMPUTE_TERMS = frozenset({"a_io", "b_io", "a_grad", "b_grad", "k_grad"})
_TIMED = np.array([name in _COMPUTE_TERMS for name in ThroughputParams.names()])
_POWERS = np.array(
    [name in ("p_grad_w", "p_sync_w", "p_static_w") for name in EnergyParams.names()]
)


@functools.lru_cache(maxsize=64)
def _prior_vectors(prior: ModelParams) -> tuple[FloatArray, FloatArray]:
    """``ModelParams.vectors`` of a prior, packed once: every fit of a model's jobs
    rescales the same prior (``_rescaled`` returns new arrays)."""
    return prior.vectors()


def _rescaled(prior: ModelParams, samples: Samples, gpu: GpuSpec) -> tuple[FloatArray, FloatArray]:
    """``rescale_prior`` as the two parameter vectors (what the fits use)."""
    if prior.gpu != gpu.name:
        raise ModelError(f"prior is for {prior.gpu}, samples are for {gpu.name}")
    x_t, x_e = _prior_vectors(prior)
    s = samples
    cols = s.configurations
    f0 = float(gpu.f0_mhz)
    pred_t = kernels.predict_rows(x_t, x_e, f0, cols, False)
    # Compute and input terms scale with the job; synchronisation stays in
    # seconds: it is set by the gradient size and the interconnect, not by
    # how fast this job computes (leave-one-out on the ground truth: keeping
    # it absolute more than halves the multi-GPU error of the generic prior).
    x_t = np.where(_TIMED, x_t * _median(s.step_time_s / pred_t), x_t)
    pred_e = kernels.predict_rows(x_t, x_e, f0, cols, True)
    scaled = np.maximum(x_e * _median(s.energy_j / pred_e), _E_BOUNDS[0])
    return x_t, np.where(_POWERS, scaled, x_e)


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
    x_t, x_e = _rescaled(prior, samples, gpu)
    return _params(gpu, x_t, x_e, prior.model)


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
    t_anchor, e_anchor = _rescaled(prior, samples, gpu)
    t_start, e_start = (t_anchor, e_anchor) if warm_start is None else warm_start.vectors()
    if samples.n.max() > 1.0:
        # A term at its bound of 0 cannot leave it: the solver's bounded
        # coordinates are flat there (``kernels.to_free``). Priors fitted to
        # dense profiles leave some sync terms at 0 (those profiles span
        # every batch size, a job's own profiles one), so once samples can
        # show synchronisation each term starts at least at its scale; the
        # pull to the prior still brings back what they do not support.
        # Not with 1-GPU samples only: nothing there could move it back.
        t_start = np.maximum(t_start, _T_LIFT)
    x_t = _fit_stage(
        _time_problem(t_anchor, options), samples, [t_start], _T_BOUNDS, _T_FLOOR, options
    )
    x_e = _fit_stage(
        _energy_problem(x_t, gpu, e_anchor, options),
        samples,
        [e_start],
        _E_BOUNDS,
        _E_FLOOR,
        options,
    )
    return _params(gpu, x_t, x_e, model or prior.model)


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
