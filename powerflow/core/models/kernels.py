"""Compiled evaluation of the paper's models and their Levenberg-Marquardt fit.

Why compiled: the simulator fits a few thousand 100-row problems and predicts
a few hundred configurations tens of thousands of times per run. In numpy
each evaluation takes ~30 calls on 100-element arrays, each costing more in
call overhead than in arithmetic, and a fit ~5 such evaluations wrapped in a
Python damping loop. Here one kernel call runs a whole fit stage.

One implementation of each formula: the step-time terms and p-norms
(``_terms``, ``_pnorm_d``) and the energy (``_energy``) serve the
predictions (``predict``), the fits' residuals and Jacobians
(``residuals``, ``solve``) and the energy stage's data (``energy_data``)
alike; the step-time fit evaluates ``_terms`` on factors of each row that
``time_data`` works out once per fit. ``throughput.py`` and
``energy.py`` stay the readable, broadcasting reference, and the tests pin
these kernels to them (``tests/test_models_kernels.py``).

Few and plain functions: numba compiles each function, and each caller
again with its callees linked in, at a few tenths of a second apiece, and
numpy calls inside a kernel (``np.median``, ``np.diff``, ufuncs) each cost
seconds more; loops compile fast.

Every array is a C-contiguous float64 array; the fitted vectors are in the
field order of ``ThroughputParams`` (12) and ``EnergyParams`` (12). Kernels
cannot raise catchable errors, so none divides by a value that can be 0 and
the Cholesky solve reports failure as a flag.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from powerflow.core.jit import njit
from powerflow.core.models.protocol import FloatArray

IntArray = npt.NDArray[np.int64]

TIME = 0
"""``kind`` of the step-time stage: ``data`` from ``time_data``."""
ENERGY = 1
"""``kind`` of the energy stage: ``data`` rows from ``energy_data``."""
PARAMS = 12
"""Length of both fitted vectors: the residual kernels fill Jacobians this wide."""

# --- the model --------------------------------------------------------------


@njit
def _pnorm_d(a: float, b: float, g: float) -> tuple[float, float, float, float]:
    """``(a^g + b^g)^(1/g)``, its partials in ``a`` and ``b`` and its
    log-derivative in ``g``, relative to the larger term so that no power
    overflows (``a``, ``b`` >= 0, ``g`` >= 1).

    With ``q = lo/hi``: ``hi*(1 + q^g)^(1/g)``. ``q^g``, ``q^(g-1)`` and
    the root come from one ``log(q)`` and two ``exp`` instead of three
    ``pow`` (the fits spend most of their time here).
    """
    a_hi = a >= b
    hi = a if a_hi else b
    lo = b if a_hi else a
    q = lo / hi if hi > 0.0 else 0.0
    if q > 0.0:
        log_q = math.log(q)
        qg = math.exp(g * log_q)
        q_g1 = qg / q  # q^(g-1)
        xlogy = qg * log_q
    else:
        qg = 0.0
        q_g1 = 1.0 if g == 1.0 else 0.0
        xlogy = 0.0
    s = 1.0 + qg
    log_s = math.log1p(qg)
    root = math.exp(log_s / g)
    d_hi = root / s
    d_lo = d_hi * q_g1
    dlog_g = (xlogy / s - log_s / g) / g
    if a_hi:
        return hi * root, d_hi, d_lo, dlog_g
    return hi * root, d_lo, d_hi, dlog_g


@njit
def _sync_shape(n: float, r: float) -> tuple[float, float, float, float]:
    """``throughput.sync_shape`` of one multi-GPU configuration: ring traffic
    inside and across nodes, ``log2(n)`` latency steps and the intra-node
    ring's ``2(r-1)`` hops."""
    r = min(r, n)
    k = math.ceil(n / r - 1e-9)
    return 2.0 * (r - 1.0) / r, 2.0 * (k - 1.0) / k, math.log2(n), 2.0 * (r - 1.0)


@njit
def _terms(x: FloatArray, n: float, r: float, bs: float, fg: float) -> tuple[float, float, float]:
    """``T_IO``, ``T_grad``, ``T_sync`` of one configuration (``fg`` in GHz;
    ``T_sync`` is 0 on one GPU)."""
    io = x[0] + x[1] * (bs * r)
    grad = x[2] + x[3] * bs + x[4] * (bs / fg)
    if n <= 1.0:
        return io, grad, 0.0
    local, node, steps, hops = _sync_shape(n, r)
    clock = (1.0 - x[8]) + x[8] / fg
    return io, grad, (x[5] * local + x[6] * node + x[7] * steps + x[11] * hops) * clock


@njit
def _step_time(x: FloatArray, io: float, grad: float, sync: float, n: float) -> float:
    inner = _pnorm_d(io, grad, x[9])[0]
    if n <= 1.0:
        return inner
    return _pnorm_d(inner, sync, x[10])[0]


@njit
def _energy(
    p: FloatArray, bs: float, xr: float, g: float, s: float, i: float
) -> tuple[float, float, float, float, float, float]:
    """Joules per iteration from the GPU-seconds ``g``, ``s``, ``i`` spent
    computing, synchronising and in all, at ``xr = f/f0 - 1``; then the
    factors its Jacobian needs: ``log(bs + theta)``, the batch factor
    ``util``, the grad and sync clock shapes ``kappa`` and the static factor."""
    xh = xr if xr >= 0.0 else 0.0
    x2, x3 = xr * xh, xr * xr * xh
    log_bs = math.log(bs + p[2])
    util = 1.0 + p[1] * log_bs
    k_grad = 1.0 + (xr * p[3] + x2 * p[4] + x3 * p[5])
    k_sync = 1.0 + (xr * p[7] + x2 * p[8] + x3 * p[9])
    static = 1.0 + p[11] * xh
    total = p[0] * (g * k_grad) * util + p[6] * (s * k_sync) + p[10] * (i * static)
    return float(total), log_bs, util, k_grad, k_sync, static


@njit
def predict(
    tp: FloatArray,
    ep: FloatArray,
    f0_mhz: float,
    n: FloatArray,
    r: FloatArray,
    bs: FloatArray,
    f: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Step time and energy per iteration of each configuration."""
    m = n.shape[0]
    t_out = np.empty(m)
    e_out = np.empty(m)
    for k in range(m):
        io, grad, sync = _terms(tp, n[k], r[k], bs[k], f[k] / 1000.0)
        it = _step_time(tp, io, grad, sync, n[k])
        t_out[k] = it
        xr = f[k] / f0_mhz - 1.0
        # a_grad (tp[2]) draws the light power: ``throughput.power_phases``
        heavy, light = grad - tp[2], sync + tp[2]
        e_out[k] = _energy(ep, bs[k], xr, n[k] * heavy, n[k] * light, n[k] * it)[0]
    return t_out, e_out


class GridRows(NamedTuple):
    """Rows ``(n[i], r[i], bs[i])`` (1-D) at the clocks ``f`` (1-D), and the
    (rows, clocks) arrays their step times and energies go to (``_grid_rows``)."""

    n: FloatArray
    r: FloatArray
    bs: FloatArray
    f: FloatArray
    t_out: FloatArray
    e_out: FloatArray


@njit
def predict_grid(
    tp: FloatArray,
    ep: FloatArray,
    f0_mhz: float,
    n: FloatArray,
    r: FloatArray,
    bs: FloatArray,
    f: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """``predict`` of every configuration ``(n[i], r[i], bs[i])`` at every clock
    ``f[j]``, as (rows, clocks) arrays: what the policy's tables ask.

    The very floats ``predict`` gives on the broadcast grid: each point runs the
    same operations on the same operands in the same order. What depends only on
    the row (``T_IO``, the clock-free part of ``T_grad``, the synchronisation
    terms before their clock factor, the batch factor of the energy) or only on
    the clock (the clock factors) is computed once per row or per clock instead of
    once per point, which is the same value each time; and no broadcast grid of
    arguments is built.
    """
    grid = GridRows(
        n, r, bs, f, np.empty((n.shape[0], f.shape[0])), np.empty((n.shape[0], f.shape[0]))
    )
    _grid_rows(tp, ep, f0_mhz, grid, 0, n.shape[0])
    return grid.t_out, grid.e_out


@njit
def predict_grids(
    tps: FloatArray,
    eps: FloatArray,
    f0s_mhz: FloatArray,
    bounds: IntArray,
    n: FloatArray,
    r: FloatArray,
    bs: FloatArray,
    f: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """``predict_grid`` of several models in one call: model ``k`` (row ``k`` of
    ``tps``, ``eps`` and ``f0s_mhz``) predicts rows ``bounds[k]`` to
    ``bounds[k + 1] - 1``, with the same code (``_grid_rows``), so the same floats
    as one ``predict_grid`` call per model. The policy's tables ask this of the
    few models of the jobs a decision evaluates, one call per decision instead of
    one per model."""
    grid = GridRows(
        n, r, bs, f, np.empty((n.shape[0], f.shape[0])), np.empty((n.shape[0], f.shape[0]))
    )
    for k in range(tps.shape[0]):
        _grid_rows(tps[k], eps[k], f0s_mhz[k], grid, bounds[k], bounds[k + 1])
    return grid.t_out, grid.e_out


@njit
def _grid_rows(
    tp: FloatArray,
    ep: FloatArray,
    f0_mhz: float,
    grid: GridRows,
    lo: int,
    hi: int,
) -> None:
    """Rows ``lo`` to ``hi - 1`` of ``predict_grid``, written into ``grid``'s outputs."""
    n, r, bs, f, t_out, e_out = grid
    cols = f.shape[0]
    fg = np.empty(cols)
    clock = np.empty(cols)
    k_grad = np.empty(cols)
    k_sync = np.empty(cols)
    static = np.empty(cols)
    for j in range(cols):
        fg[j] = f[j] / 1000.0
        clock[j] = (1.0 - tp[8]) + tp[8] / fg[j]
        # ``_energy``'s clock shapes at ``xr = f/f0 - 1``
        xr = f[j] / f0_mhz - 1.0
        xh = xr if xr >= 0.0 else 0.0
        x2, x3 = xr * xh, xr * xr * xh
        k_grad[j] = 1.0 + (xr * ep[3] + x2 * ep[4] + x3 * ep[5])
        k_sync[j] = 1.0 + (xr * ep[7] + x2 * ep[8] + x3 * ep[9])
        static[j] = 1.0 + ep[11] * xh
    for i in range(lo, hi):
        ni, ri, bi = n[i], r[i], bs[i]
        # ``_terms`` without the clock
        io = tp[0] + tp[1] * (bi * ri)
        grad0 = tp[2] + tp[3] * bi
        base = 0.0
        if ni > 1.0:
            local, node, steps, hops = _sync_shape(ni, ri)
            base = tp[5] * local + tp[6] * node + tp[7] * steps + tp[11] * hops
        util = 1.0 + ep[1] * math.log(bi + ep[2])
        for j in range(cols):
            grad = grad0 + tp[4] * (bi / fg[j])
            sync = base * clock[j] if ni > 1.0 else 0.0
            it = _step_time(tp, io, grad, sync, ni)
            t_out[i, j] = it
            heavy, light = grad - tp[2], sync + tp[2]
            g, s, a = ni * heavy, ni * light, ni * it
            e_out[i, j] = (
                ep[0] * (g * k_grad[j]) * util + ep[6] * (s * k_sync[j]) + ep[10] * (a * static[j])
            )


@njit
def _repeats(cols: FloatArray, k: int) -> bool:
    """Whether configuration ``k`` of ``cols`` (rows ``n, r, bs, f``) is the one before it."""
    if k == 0:
        return False
    same = cols[0, k] == cols[0, k - 1] and cols[1, k] == cols[1, k - 1]
    return bool(same and cols[2, k] == cols[2, k - 1] and cols[3, k] == cols[3, k - 1])


@njit
def predict_rows(
    tp: FloatArray, ep: FloatArray, f0_mhz: float, cols: FloatArray, energy: bool
) -> FloatArray:
    """``predict``'s step times, or with ``energy`` its energies, of the
    configurations ``cols`` (rows ``n, r, bs, f``): the prior's rescaling
    needs one of the two at a time. A configuration that repeats the one
    before it (a profile measures each clock several times) gets a copy of
    its value, which is what evaluating it would give. With the prediction of
    only the half it uses: 0.676 s of CPU against 0.698 s for the learner's
    5,135 calls (``FittedLearner.initial`` and ``update``, ``time.process_time``
    around each) in ``run_one(RunSpec("powerflow", 0.6))``, three runs each."""
    m = cols.shape[1]
    out = np.empty(m)
    for k in range(m):
        if _repeats(cols, k):
            out[k] = out[k - 1]
            continue
        n, r, bs, f = cols[0, k], cols[1, k], cols[2, k], cols[3, k]
        io, grad, sync = _terms(tp, n, r, bs, f / 1000.0)
        it = _step_time(tp, io, grad, sync, n)
        if not energy:
            out[k] = it
            continue
        xr = f / f0_mhz - 1.0
        heavy, light = grad - tp[2], sync + tp[2]
        out[k] = _energy(ep, bs, xr, n * heavy, n * light, n * it)[0]
    return out


@njit
def energy_data(tp: FloatArray, f0_mhz: float, cols: FloatArray) -> FloatArray:
    """The energy stage's ``data`` from the time stage's (rows ``n, r, bs, f``):
    rows ``bs``, ``f/f0 - 1`` and the GPU-seconds GPU-heavy, GPU-light and
    in all under the step-time parameters ``tp`` (``throughput.power_phases``);
    a configuration that repeats the one before it gets a copy of its column."""
    m = cols.shape[1]
    out = np.empty((5, m))
    for k in range(m):
        if _repeats(cols, k):
            for j in range(5):
                out[j, k] = out[j, k - 1]
            continue
        n, r, bs, f = cols[0, k], cols[1, k], cols[2, k], cols[3, k]
        io, grad, sync = _terms(tp, n, r, bs, f / 1000.0)
        out[0, k] = bs
        out[1, k] = f / f0_mhz - 1.0
        out[2, k] = n * (grad - tp[2])
        out[3, k] = n * (sync + tp[2])
        out[4, k] = n * _step_time(tp, io, grad, sync, n)
    return out


@njit
def time_data(cols: FloatArray) -> FloatArray:
    """The step-time stage's ``data`` from configurations (rows ``n, r, bs, f``):
    what its terms take from a row regardless of the parameters, worked out
    once per fit instead of at every evaluation, in rows

    ``n``, ``bs*r``, ``bs``, ``f`` in GHz, ``bs/f``, ``1/f - 1`` (the clock
    share's factor), the four sync shapes (``_sync_shape``; 0 on one GPU),
    and 1 where the row repeats the configuration before it (else 0).

    Why the last row: a profile records each clock's configuration several
    times (one sample per measurement window), so a refit's rows repeat the
    row before them about a third of the time; ``_log_time`` copies such a
    row's prediction and Jacobian, the very floats it would compute. With
    the factors, this takes the step-time stages of the 3,548 fits of
    ``powerflow simulate --scheduler powerflow --eta 0.6`` from 0.39 s to
    0.29 s of CPU, and the run's fitting from 0.92 s to 0.82 s
    (``time.process_time`` around the learner's calls, three runs each).
    """
    m = cols.shape[1]
    out = np.zeros((11, m))
    for k in range(m):
        n, r, bs, f = cols[0, k], cols[1, k], cols[2, k], cols[3, k]
        fg = f / 1000.0
        out[0, k] = n
        out[1, k] = bs * r
        out[2, k] = bs
        out[3, k] = fg
        out[4, k] = bs / fg
        out[5, k] = 1.0 / fg - 1.0
        if n > 1.0:
            out[6, k], out[7, k], out[8, k], out[9, k] = _sync_shape(n, r)
        if _repeats(cols, k):
            out[10, k] = 1.0
    return out


@njit
def _log_time(x: FloatArray, data: FloatArray, pred: FloatArray, jac: FloatArray) -> None:
    """``log T_iter`` and its Jacobian (rows ``0..m-1`` of ``pred`` and ``jac``)
    on ``time_data``; a repeated row is a copy of the row before it."""
    for k in range(data.shape[1]):
        if data[10, k] != 0.0:
            pred[k] = pred[k - 1]
            for j in range(PARAMS):
                jac[k, j] = jac[k - 1, j]
            continue
        n, bsr, bs, fg, bs_fg = data[0, k], data[1, k], data[2, k], data[3, k], data[4, k]
        # ``_terms`` on the row's precomputed factors
        io = x[0] + x[1] * bsr
        grad = x[2] + x[3] * bs + x[4] * bs_fg
        inner, d_io, d_grad, dlog_g1 = _pnorm_d(io, grad, x[9])
        if n <= 1.0:
            total, w = inner, 1.0 / inner
            for j in (5, 6, 7, 8, 10, 11):
                jac[k, j] = 0.0
        else:
            local, node, steps, hops = data[6, k], data[7, k], data[8, k], data[9, k]
            clock = (1.0 - x[8]) + x[8] / fg
            base = x[5] * local + x[6] * node + x[7] * steps + x[11] * hops
            total, d_inner, d_sync, dlog_g2 = _pnorm_d(inner, base * clock, x[10])
            w = d_inner / total
            ds = d_sync / total
            jac[k, 5] = ds * (local * clock)
            jac[k, 6] = ds * (node * clock)
            jac[k, 7] = ds * (steps * clock)
            jac[k, 8] = ds * (base * data[5, k])
            jac[k, 10] = dlog_g2
            jac[k, 11] = ds * (hops * clock)
        jac[k, 0] = w * d_io
        jac[k, 1] = bsr * (w * d_io)
        jac[k, 2] = w * d_grad
        jac[k, 3] = bs * (w * d_grad)
        jac[k, 4] = bs_fg * (w * d_grad)
        jac[k, 9] = w * inner * dlog_g1
        pred[k] = math.log(total)


@njit
def _log_energy(p: FloatArray, data: FloatArray, pred: FloatArray, jac: FloatArray) -> None:
    """``log E_iter`` and its Jacobian (rows ``0..m-1`` of ``pred`` and ``jac``)."""
    for k in range(data.shape[1]):
        bs, xr, g, s, i = data[0, k], data[1, k], data[2, k], data[3, k], data[4, k]
        total, log_bs, util, k_grad, k_sync, static = _energy(p, bs, xr, g, s, i)
        inv = 1.0 / total
        xh = xr if xr >= 0.0 else 0.0
        shape = (xr, xr * xh, xr * xr * xh)
        gw = p[0] * (g * k_grad) * inv
        jac[k, 0] = (g * k_grad) * util * inv
        jac[k, 1] = gw * log_bs
        jac[k, 2] = gw * p[1] / (bs + p[2])
        grad_w = g * (p[0] * inv) * util
        sync_w = s * (p[6] * inv)
        for j in range(3):
            jac[k, 3 + j] = shape[j] * grad_w
            jac[k, 7 + j] = shape[j] * sync_w
        jac[k, 6] = (s * k_sync) * inv
        jac[k, 10] = (i * static) * inv
        jac[k, 11] = i * xh * (p[10] * inv)
        pred[k] = math.log(total)


# --- the objective ----------------------------------------------------------

Stage = tuple[int, FloatArray, FloatArray, FloatArray, FloatArray]
"""One fit stage: ``(kind, data, log_measured, prior, pull)``; ``prior`` and
``pull`` are empty for a fit without prior."""
Free = tuple[FloatArray, FloatArray, FloatArray, bool, float]
"""How the solver sees the parameters: ``(lo, hi, scale, soft, f_scale)``,
the bounds, each parameter's scale and whether the soft-L1 loss (with that
``f_scale``) replaces the linear one."""


@njit
def _residuals(stage: Stage, x: FloatArray, res: FloatArray, jac: FloatArray) -> None:
    """Log errors, then (with a prior) one row per parameter pulling it to
    the prior by ``pull`` per unit of deviation."""
    kind, data, log_measured, prior, pull = stage
    m = log_measured.shape[0]
    if kind == TIME:
        _log_time(x, data, res, jac)
    else:
        _log_energy(x, data, res, jac)
    for k in range(m):
        res[k] -= log_measured[k]
    p = x.shape[0]
    if prior.shape[0] == 0:
        return
    for j in range(p):
        res[m + j] = pull[j] * (x[j] - prior[j])
        for c in range(p):
            jac[m + j, c] = 0.0
        jac[m + j, j] = pull[j]


@njit
def residuals(stage: Stage, x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The stage's residuals and their Jacobian at ``x``."""
    rows = stage[2].shape[0] + stage[3].shape[0]
    res = np.empty(rows)
    jac = np.empty((rows, x.shape[0]))
    _residuals(stage, x, res, jac)
    return res, jac


# --- free coordinates and the loss ------------------------------------------


@njit
def _width(lo: FloatArray, hi: FloatArray, scale: FloatArray) -> FloatArray:
    """Per parameter: ``hi - lo`` where both bounds are finite, else its scale."""
    out = np.empty(lo.shape[0])
    for j in range(lo.shape[0]):
        out[j] = hi[j] - lo[j] if math.isfinite(hi[j]) else scale[j]
    return out


@njit
def to_free(x: FloatArray, lo: FloatArray, hi: FloatArray, scale: FloatArray) -> FloatArray:
    """``u`` with ``from_free(u) = x`` for ``x`` within the bounds.

    ``x = lo + s*softplus(u)`` where only the lower bound is finite (``s``
    the parameter's scale) and ``x = lo + (hi-lo)*sigmoid(u)`` where both
    are: every ``u`` is feasible, and near the start a unit step in ``u``
    moves ``x`` by about its scale. ``x`` goes strictly inside first, as
    ``trf`` starts: on a bound the map is flat.
    """
    width = _width(lo, hi, scale)
    u = np.empty(x.shape[0])
    for j in range(x.shape[0]):
        q = max((x[j] - lo[j]) / width[j], 1e-6)
        if math.isfinite(hi[j]):
            qt = min(q, 1.0 - 1e-6)
            u[j] = math.log(qt) - math.log1p(-qt)
        elif q > 30.0:
            u[j] = q
        else:
            u[j] = math.log(math.expm1(q))
    return u


@njit
def _from_free(
    u: FloatArray, lo: FloatArray, hi: FloatArray, width: FloatArray, x: FloatArray, dx: FloatArray
) -> None:
    for j in range(u.shape[0]):
        if u[j] >= 0.0:
            sig = 1.0 / (1.0 + math.exp(-u[j]))
        else:
            sig = math.exp(u[j]) / (1.0 + math.exp(u[j]))
        if math.isfinite(hi[j]):
            x[j] = lo[j] + width[j] * sig
            dx[j] = width[j] * (sig * (1.0 - sig))
        else:
            x[j] = lo[j] + width[j] * (max(u[j], 0.0) + math.log1p(math.exp(-abs(u[j]))))
            dx[j] = width[j] * sig


@njit
def from_free(
    u: FloatArray, lo: FloatArray, hi: FloatArray, scale: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``x(u)`` and ``dx/du`` (see ``to_free``)."""
    x = np.empty(u.shape[0])
    dx = np.empty(u.shape[0])
    _from_free(u, lo, hi, _width(lo, hi, scale), x, dx)
    return x, dx


@njit
def _free_eval(
    stage: Stage,
    free: Free,
    width: FloatArray,
    u: FloatArray,
    x: FloatArray,
    dx: FloatArray,
    res: FloatArray,
    jac: FloatArray,
) -> None:
    """Residuals (loss applied) and Jacobian in the free coordinates ``u``
    (``x`` and ``dx`` are workspace).

    The soft-L1 loss is a transform of the residuals,
    ``r' = r*sqrt(2/(1 + sqrt(1 + (r/f)^2)))``, whose plain sum of squares is
    exactly ``least_squares``' soft-L1 cost; its derivative is
    ``dr'/dr = 1/(root*c)``.
    """
    lo, hi, _, soft, f_scale = free
    _from_free(u, lo, hi, width, x, dx)
    _residuals(stage, x, res, jac)
    for k in range(res.shape[0]):
        d = 1.0
        if soft:
            z = res[k] / f_scale
            root = math.sqrt(1.0 + z * z)
            c = math.sqrt(2.0 / (1.0 + root))
            res[k] *= c
            d = 1.0 / (root * c)
        for j in range(u.shape[0]):
            jac[k, j] *= dx[j] * d


@njit
def free_residuals(stage: Stage, free: Free, u: FloatArray) -> tuple[FloatArray, FloatArray]:
    """What the solver minimises: residuals in ``u``, loss applied, and their
    Jacobian (for the tests; ``solve`` evaluates it in place)."""
    p = u.shape[0]
    rows = stage[2].shape[0] + stage[3].shape[0]
    res = np.empty(rows)
    jac = np.empty((rows, p))
    x, dx = np.empty(p), np.empty(p)
    lo, hi, scale, _, _ = free
    _free_eval(stage, free, _width(lo, hi, scale), u, x, dx, res, jac)
    return res, jac


# --- the solver -------------------------------------------------------------


@njit
def cholesky_solve(a: FloatArray, b: FloatArray, low: FloatArray, out: FloatArray) -> bool:
    """Solve ``a @ out = b`` for a symmetric ``a`` by Cholesky (``low`` is
    workspace of ``a``'s shape); False, with ``out`` undefined, when ``a`` is
    not numerically positive definite (LAPACK ``dposv``'s ``info != 0``)."""
    p = a.shape[0]
    for j in range(p):
        d = a[j, j]
        for c in range(j):
            d -= low[j, c] * low[j, c]
        if not d > 0.0:  # also NaN
            return False
        d = math.sqrt(d)
        low[j, j] = d
        for i in range(j + 1, p):
            v = a[i, j]
            for c in range(j):
                v -= low[i, c] * low[j, c]
            low[i, j] = v / d
    for i in range(p):
        v = b[i]
        for c in range(i):
            v -= low[i, c] * out[c]
        out[i] = v / low[i, i]
    for i in range(p - 1, -1, -1):
        v = out[i]
        for c in range(i + 1, p):
            v -= low[c, i] * out[c]
        out[i] = v / low[i, i]
    return True


@njit
def _dot(a: FloatArray, b: FloatArray) -> float:
    v = 0.0
    for k in range(a.shape[0]):
        v += a[k] * b[k]
    return v


@njit
def _normal_equations(jac: FloatArray, res: FloatArray, a: FloatArray, g: FloatArray) -> None:
    """``a = J'J`` and ``g = J'r`` of the Jacobian ``jac`` and residuals ``res``.

    Row by row: each entry sums over the rows in order, the inner loop runs
    along a row of J, and zero entries (sync columns of one-GPU rows, the
    prior's off-diagonal) add nothing, so they are skipped. The loops run to
    the constant ``PARAMS``, not to the array's width: with trip counts known
    when it compiles, LLVM unrolls them, and the fits' solves take 13% less
    CPU (0.39 s to 0.34 s on the 7,096 of ``powerflow simulate --scheduler
    powerflow --eta 0.6``), the same floats.
    """
    for i in range(PARAMS):
        g[i] = 0.0
        for j in range(PARAMS):
            a[i, j] = 0.0
    for k in range(res.shape[0]):
        for i in range(PARAMS):
            v = jac[k, i]
            if v != 0.0:
                g[i] += v * res[k]
                for j in range(i, PARAMS):
                    a[i, j] += v * jac[k, j]
    for i in range(PARAMS):
        for j in range(i):
            a[i, j] = a[j, i]


@njit
def solve(
    stage: Stage, free: Free, x0: FloatArray, max_nfev: int, tol: float
) -> tuple[FloatArray, float]:
    """Minimise the stage's cost from ``x0`` within the bounds; ``x`` and the cost.

    Levenberg's damping ``(J'J + mu*I) h = -J'r`` in the free coordinates
    with Nielsen's update of ``mu`` (Madsen, Nielsen & Tingleff, "Methods
    for non-linear least squares problems", 2004, algorithm 3.16); ``u`` is
    unit-scaled by ``to_free``, so the identity is the right metric. Stops
    after ``max_nfev`` evaluations, when an accepted step lowers the cost by
    under ``tol`` relatively, or when a step is shorter than
    ``tol*(tol + |u|)`` (``least_squares``' ``ftol``/``xtol``).
    """
    p = x0.shape[0]
    if p != PARAMS:
        # the residual kernels and the normal equations index PARAMS columns unchecked
        raise ValueError("solve: x0 must hold PARAMS values")
    rows = stage[2].shape[0] + stage[3].shape[0]
    lo, hi, scale, _, _ = free
    width = _width(lo, hi, scale)
    x = np.empty(p)
    for j in range(p):
        x[j] = min(max(x0[j], lo[j]), hi[j])
    u = to_free(x, lo, hi, scale)
    dx = np.empty(p)
    res, jac = np.empty(rows), np.empty((rows, p))
    res_new, jac_new = np.empty(rows), np.empty((rows, p))
    a, g = np.empty((p, p)), np.empty(p)
    damped, low = np.empty((p, p)), np.empty((p, p))
    h, u_new, minus_g = np.empty(p), np.empty(p), np.empty(p)
    for i in range(p):
        u_new[i] = u[i]
    cost = mu = 0.0
    nu = 2.0
    nfev = 0
    # One place evaluates and one builds the normal equations (the first
    # point is accepted as it is): numba compiles each call site's callee
    # code again.
    while True:
        _free_eval(stage, free, width, u_new, x, dx, res_new, jac_new)
        nfev += 1
        cost_new = 0.5 * _dot(res_new, res_new)
        first = nfev == 1
        if first or cost_new < cost:  # not cost_new < cost also rejects NaN
            small = False
            if not first:
                predicted = 0.0
                for i in range(p):
                    predicted += h[i] * (mu * h[i] - g[i])
                gain = (cost - cost_new) / max(0.5 * predicted, 1e-300)
                small = cost - cost_new <= tol * cost
                mu *= max(1.0 / 3.0, 1.0 - (2.0 * gain - 1.0) ** 3)
                nu = 2.0
            u, u_new = u_new, u
            res, res_new = res_new, res
            jac, jac_new = jac_new, jac
            cost = cost_new
            if small or nfev >= max_nfev:
                break  # done at this point: its normal equations would go unused
            _normal_equations(jac, res, a, g)
            if first:
                top = 0.0
                for i in range(p):
                    top = max(top, a[i, i])
                mu = 1e-3 * max(top, 1e-12)
        else:
            mu, nu = mu * nu, nu * 2.0
        if nfev >= max_nfev:
            break
        solved = False
        while math.isfinite(mu) and not solved:
            for i in range(p):
                minus_g[i] = -g[i]
                for j in range(p):
                    damped[i, j] = a[i, j]
                damped[i, i] += mu
            solved = cholesky_solve(damped, minus_g, low, h)
            if not solved:  # not positive definite at this damping: damp more
                mu, nu = mu * nu, nu * 2.0
        if not solved or math.sqrt(_dot(h, h)) <= tol * (tol + math.sqrt(_dot(u, u))):
            break
        for i in range(p):
            u_new[i] = u[i] + h[i]
    _from_free(u, lo, hi, width, x, dx)
    for j in range(p):
        x[j] = min(max(x[j], lo[j]), hi[j])
    return x, cost
