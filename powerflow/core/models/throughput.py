"""Step time of one training iteration, paper §4.1, vectorised over configurations.

The synchronisation term departs from the paper (see ``t_sync``).

Every function takes numpy arrays (or scalars) that broadcast: ``n`` GPUs in
total, ``r`` GPUs per node used, ``bs`` the local batch size and ``f_mhz`` the
core clock. The clock enters in GHz (see ``params.py``).
"""

from __future__ import annotations

import numpy as np

from powerflow.core.models.params import ThroughputParams
from powerflow.core.models.protocol import FloatArray


def t_io(p: ThroughputParams, r: FloatArray, bs: FloatArray) -> FloatArray:
    """Input pipeline time: grows with the node's total batch ``bs*r``, which
    is what competes for the node's storage bandwidth."""
    return np.asarray(p.a_io + p.b_io * bs * r, dtype=np.float64)


def t_grad(p: ThroughputParams, bs: FloatArray, f_mhz: FloatArray) -> FloatArray:
    """Forward and backward time: ``k_grad/f`` is the clock-bound part per
    sample, ``b_grad`` the part (memory, launch) the clock does not speed up."""
    f = f_mhz / 1000.0
    return np.asarray(p.a_grad + (p.b_grad + p.k_grad / f) * bs, dtype=np.float64)


def ring_share(n: FloatArray) -> FloatArray:
    """Per-GPU traffic of a ring all-reduce over ``n`` members relative to the
    buffer, ``2(n-1)/n``: 0 for one member, 1 for two, towards 2 for many."""
    n = np.asarray(n, dtype=np.float64)
    return np.asarray(2.0 * (n - 1.0) / np.maximum(n, 1.0), dtype=np.float64)


def nodes(n: FloatArray, r: FloatArray) -> FloatArray:
    """Nodes a job of ``n`` GPUs spans at ``r`` GPUs per node."""
    return np.asarray(np.ceil(np.asarray(n) / np.asarray(r) - 1e-9), dtype=np.float64)


def sync_shape(
    n: FloatArray, r: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """The four placement features ``T_sync`` weighs: intra-node ring
    traffic ``2(r-1)/r``, inter-node ring traffic ``2(k-1)/k`` over the
    ``k`` nodes, ``log2(n)`` latency steps and the ``2(r-1)`` hops of the
    intra-node ring (each 0 on one GPU)."""
    n = np.asarray(n, dtype=np.float64)
    multi = n > 1
    per_node = np.minimum(r, n)
    local = np.where(multi, ring_share(per_node), 0.0)
    node = np.where(multi, ring_share(nodes(n, r)), 0.0)
    steps = np.where(multi, np.log2(np.maximum(n, 1.0)), 0.0)
    hops = np.where(multi, 2.0 * (per_node - 1.0), 0.0)
    return local, node, steps, hops


def sync_clock_factor(p: ThroughputParams, f_mhz: FloatArray) -> FloatArray:
    """``(1 - s) + s/f`` (f in GHz): the share ``s`` of synchronisation that
    runs at core clock (reductions, launches); the rest waits on the links."""
    f = np.asarray(f_mhz, dtype=np.float64) / 1000.0
    return np.asarray((1.0 - p.sync_clock_share) + p.sync_clock_share / f, dtype=np.float64)


def t_sync(p: ThroughputParams, n: FloatArray, r: FloatArray, f_mhz: FloatArray) -> FloatArray:
    """Gradient synchronisation time: a hierarchical ring all-reduce.

    ``(sync_local_s*2(r-1)/r + sync_node_s*2(k-1)/k + sync_step_s*log2(n)
    + sync_hop_s*2(r-1)) * sync_clock_factor`` on ``n`` GPUs over
    ``k = ceil(n/r)`` nodes; 0 on one GPU.

    Why not the paper's ``alpha/f + (kappa/f + beta)*(n-2) + theta`` (one
    set per placement case): it grows linearly in ``n``, so a fit to a few
    GPU counts either overshoots at 64 GPUs or flattens the speed-up, and its
    eight coefficients have no meaning that carries from one DNN to another.
    Here the terms are what NCCL's ring does: each GPU sends ``2(m-1)/m`` times
    the gradient over the ring of its ``m`` peers, inside a node (NVLink) and
    across nodes (InfiniBand), and each doubling of the ring adds latency. The
    per-term seconds are set by the gradient size and the links, not by how
    fast the job computes, so a prior from other DNNs lends them as they are
    (``fitting.rescale_prior``); the clock share is a property of the GPU.

    ``sync_hop_s``: a ring of ``m`` GPUs takes ``2(m-1)`` steps in sequence,
    each paying a latency (the alpha of the alpha-beta cost model), so inside
    a node the exposed sync also grows linearly with the GPUs per node. On
    the ground truth's one-node profiles it does (resnet50 at global batch
    64: 2.1, 4.1, 12.4 ms at 2, 4, 8 GPUs), which the saturating traffic
    term and ``log2(n)`` cannot follow; without this term, a job profiled at
    2-16 GPUs extrapolated worse to 32 (``python -m benchmarks learner``,
    docs/models.md).
    """
    local, node, steps, hops = sync_shape(n, r)
    base = (
        p.sync_local_s * local + p.sync_node_s * node + p.sync_step_s * steps + p.sync_hop_s * hops
    )
    return np.asarray(base * sync_clock_factor(p, f_mhz), dtype=np.float64)


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


def power_phases(
    p: ThroughputParams, n: FloatArray, r: FloatArray, bs: FloatArray, f_mhz: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """GPU-heavy seconds, GPU-light seconds and the step time, as the energy
    model charges them (``energy.energy_per_iter``): heavy is ``T_grad``
    without its fixed per-step part ``a_grad``, light is ``T_sync`` plus
    ``a_grad``.

    Why ``a_grad`` is light: the per-step overhead (kernel launches, the
    optimizer step, host work) leaves the GPU mostly waiting, as
    synchronisation does; charged at the per-sample compute power it made
    a job's power wrong wherever the local batch is small (many GPUs). The
    learner's energy error after profiles fell from 3.2% to 1.6% with this
    attribution (``python -m benchmarks learner``, docs/models.md).
    """
    grad = t_grad(p, bs, f_mhz)
    sync = t_sync(p, n, r, f_mhz)
    it = combine(p, t_io(p, r, bs), grad, sync)
    return grad - p.a_grad, sync + p.a_grad, it


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
    local, node, steps, hops = sync_shape(n, r)
    clock = sync_clock_factor(p, f_mhz)
    base = (
        p.sync_local_s * local + p.sync_node_s * node + p.sync_step_s * steps + p.sync_hop_s * hops
    )
    sync = base * clock
    inner = _pnorm(io, grad, p.gamma1)
    total = _pnorm(inner, sync, p.gamma2)
    d_inner, d_sync, d_g2 = _pnorm_partials(inner, sync, total, p.gamma2)
    d_io, d_grad, d_g1 = _pnorm_partials(io, grad, inner, p.gamma1)
    d_io, d_grad, d_g1 = d_io * d_inner, d_grad * d_inner, d_g1 * d_inner
    d_sync = np.where(np.asarray(n) > 1, d_sync, 0.0)
    ones = np.ones_like(total)
    cols = [
        d_io * ones,
        d_io * bs * r,
        d_grad * ones,
        d_grad * bs,
        d_grad * bs / f,
        d_sync * local * clock,
        d_sync * node * clock,
        d_sync * steps * clock,
        d_sync * base * (1.0 / f - 1.0),
        d_g1 * ones,
        d_g2 * ones,
        d_sync * hops * clock,
    ]
    jac = np.stack(np.broadcast_arrays(*cols), axis=-1) / total[..., None]
    return np.log(total), jac
