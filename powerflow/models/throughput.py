"""Step time of one training iteration, paper §4.1, vectorised over configurations.

Every function takes numpy arrays (or scalars) that broadcast: ``n`` GPUs in
total, ``r`` GPUs per node used, ``bs`` the local batch size and ``f_mhz`` the
core clock. The clock enters in GHz (see ``params.py``).
"""

from __future__ import annotations

import numpy as np

from powerflow.models.params import ThroughputParams
from powerflow.models.protocol import FloatArray


def t_io(p: ThroughputParams, r: FloatArray, bs: FloatArray) -> FloatArray:
    """Input pipeline time: grows with the node's total batch ``bs*r``, which
    is what competes for the node's storage bandwidth."""
    return np.asarray(p.a_io + p.b_io * bs * r, dtype=np.float64)


def t_grad(p: ThroughputParams, bs: FloatArray, f_mhz: FloatArray) -> FloatArray:
    """Forward and backward time: ``k_grad/f`` is the clock-bound part per
    sample, ``b_grad`` the part (memory, launch) the clock does not speed up."""
    f = f_mhz / 1000.0
    return np.asarray(p.a_grad + (p.b_grad + p.k_grad / f) * bs, dtype=np.float64)


def t_sync(p: ThroughputParams, n: FloatArray, r: FloatArray, f_mhz: FloatArray) -> FloatArray:
    """Gradient synchronisation time, the paper's three cases.

    0 on one GPU; ``alpha/f + (kappa/f + beta)*(n-2) + theta`` with the
    ``*_local`` parameters when all ``n >= 2`` GPUs share one node (``n == r``),
    and with the ``*_node`` parameters otherwise. The paper's multi-node line
    prints ``beta^local`` although its text defines ``beta^node`` for that
    case; we read it as ``beta^node`` (a typo), which the text supports.
    """
    f = f_mhz / 1000.0
    local = (
        p.alpha_sync_local / f
        + (p.kappa_sync_local / f + p.beta_sync_local) * (n - 2)
        + p.theta_sync_local
    )
    node = (
        p.alpha_sync_node / f
        + (p.kappa_sync_node / f + p.beta_sync_node) * (n - 2)
        + p.theta_sync_node
    )
    out = np.where(n <= 1, 0.0, np.where(n == r, local, node))
    return np.asarray(out, dtype=np.float64)


def _pnorm(a: FloatArray, b: FloatArray, gamma: float) -> FloatArray:
    """``(a**g + b**g)**(1/g)`` as ``hi * (1 + (lo/hi)**g)**(1/g)``: relative
    to the larger term, so large exponents neither overflow nor underflow,
    and with two powers per element instead of three."""
    hi = np.maximum(a, b)
    lo = np.minimum(a, b)
    q = lo / np.where(hi > 0, hi, 1.0)
    out = hi * (1.0 + q**gamma) ** (1.0 / gamma)
    return np.asarray(out, dtype=np.float64)


def combine(p: ThroughputParams, io: FloatArray, grad: FloatArray, sync: FloatArray) -> FloatArray:
    """``T_iter = ((T_IO^g1 + T_grad^g1)^(g2/g1) + T_sync^g2)^(1/g2)``.

    The paper prints the outer exponent as ``gamma2``; only ``1/gamma2``
    gives what its text says (the plain sum at ``gamma = 1``, the maximum as
    ``gamma -> inf``) and keeps the unit of time, so ``gamma2`` there is a typo.
    """
    return _pnorm(_pnorm(io, grad, p.gamma1), sync, p.gamma2)


def step_time(
    p: ThroughputParams, n: FloatArray, r: FloatArray, bs: FloatArray, f_mhz: FloatArray
) -> FloatArray:
    return combine(p, t_io(p, r, bs), t_grad(p, bs, f_mhz), t_sync(p, n, r, f_mhz))


def _pnorm_partials(
    a: FloatArray, b: FloatArray, out: FloatArray, gamma: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """d out/d a, d out/d b, d out/d gamma of ``out = (a^g + b^g)^(1/g)``."""
    safe = np.where(out > 0, out, 1.0)
    ra, rb = a / safe, b / safe
    wa, wb = ra**gamma, rb**gamma
    da = np.where(ra > 0, wa / np.where(ra > 0, ra, 1.0), 0.0)
    db = np.where(rb > 0, wb / np.where(rb > 0, rb, 1.0), 0.0)
    la = np.where(ra > 0, wa * np.log(np.where(ra > 0, ra, 1.0)), 0.0)
    lb = np.where(rb > 0, wb * np.log(np.where(rb > 0, rb, 1.0)), 0.0)
    dg = out / gamma * (la + lb)
    return da, db, dg


def log_step_time_jacobian(
    p: ThroughputParams, n: FloatArray, r: FloatArray, bs: FloatArray, f_mhz: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``log T_iter`` and its Jacobian in the order of ``ThroughputParams``.

    Analytic, so that a fit needs one model evaluation per step instead of
    one per parameter: it is what keeps one fit well under a second.
    """
    f = f_mhz / 1000.0
    io = t_io(p, r, bs)
    grad = t_grad(p, bs, f_mhz)
    sync = t_sync(p, n, r, f_mhz)
    inner = _pnorm(io, grad, p.gamma1)
    total = _pnorm(inner, sync, p.gamma2)
    d_inner, d_sync, d_g2 = _pnorm_partials(inner, sync, total, p.gamma2)
    d_io, d_grad, d_g1 = _pnorm_partials(io, grad, inner, p.gamma1)
    d_io, d_grad, d_g1 = d_io * d_inner, d_grad * d_inner, d_g1 * d_inner
    multi = n > 1
    local = (multi & (n == r)).astype(np.float64) * d_sync
    node = (multi & (n != r)).astype(np.float64) * d_sync
    ones = np.ones_like(total)
    cols = [
        d_io * ones,
        d_io * bs * r,
        d_grad * ones,
        d_grad * bs,
        d_grad * bs / f,
        local / f,
        local * (n - 2) / f,
        local * (n - 2),
        local * ones,
        node / f,
        node * (n - 2) / f,
        node * (n - 2),
        node * ones,
        d_g1 * ones,
        d_g2 * ones,
    ]
    jac = np.stack(np.broadcast_arrays(*cols), axis=-1) / total[..., None]
    return np.log(total), jac
