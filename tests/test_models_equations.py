"""The paper's equations behave as §4 says they should."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from models_synth import TRUE, grid
from scipy.optimize import approx_fprime

from powerflow.core.gpus import A100
from powerflow.core.models import energy, throughput
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import EnergyParams, ThroughputParams
from powerflow.core.models.protocol import PerfModel

TP = TRUE.throughput
EP = TRUE.energy


def test_sync_is_zero_on_one_gpu_and_uses_local_or_node_terms() -> None:
    only_node = dataclasses.replace(TP, sync_local_s=0.0, sync_step_s=0.0)
    n = np.array([1.0, 4.0, 4.0, 8.0])
    r = np.array([1.0, 4.0, 2.0, 2.0])
    s = throughput.t_sync(only_node, n, r, np.full(4, 1410.0))
    assert s[0] == 0.0 and s[1] == 0.0  # one GPU; one node with no local cost
    assert s[2] > 0.0 and s[3] > s[2]  # two nodes, then four: more inter-node traffic


def _only(name: str, value: float = 0.01) -> ThroughputParams:
    """``TP`` with one sync term set and the others 0, the clock share 0."""
    zero = {
        "sync_local_s": 0.0,
        "sync_node_s": 0.0,
        "sync_step_s": 0.0,
        "sync_hop_s": 0.0,
        "sync_clock_share": 0.0,
    }
    return dataclasses.replace(TP, **{**zero, name: value})


def test_sync_traffic_terms_follow_the_ring_all_reduce() -> None:
    """Each GPU sends 2(m-1)/m of the gradient around a ring of m: the
    intra-node term follows the GPUs per node, the inter-node term the nodes,
    and neither grows without bound with n (the paper's linear form did)."""
    n = np.array([2.0, 4.0, 8.0, 16.0, 64.0])
    packed = np.minimum(n, 8.0)
    f = np.full(5, 1410.0)
    want_local = 0.01 * 2 * (packed - 1) / packed
    np.testing.assert_allclose(throughput.t_sync(_only("sync_local_s"), n, packed, f), want_local)
    k = np.ceil(n / packed)
    want_node = 0.01 * 2 * (k - 1) / k
    np.testing.assert_allclose(throughput.t_sync(_only("sync_node_s"), n, packed, f), want_node)
    np.testing.assert_allclose(
        throughput.t_sync(_only("sync_step_s"), n, packed, f), 0.01 * np.log2(n)
    )
    # each of the intra-node ring's 2(r-1) hops pays a latency (alpha-beta model)
    hops = throughput.t_sync(_only("sync_hop_s"), n, packed, f)
    np.testing.assert_allclose(hops, 0.01 * 2 * (packed - 1))
    spread = throughput.t_sync(_only("sync_hop_s"), n, np.minimum(n, 2.0), f)
    np.testing.assert_allclose(spread, np.full(5, 0.02))  # two per node: 2 hops
    many = throughput.t_sync(_only("sync_node_s"), np.array([1024.0]), np.array([8.0]), f[:1])
    assert many[0] < 0.02  # at most twice the gradient, however many nodes


def test_sync_grows_with_gpus_and_nodes_for_any_parameters() -> None:
    rng = np.random.default_rng(0)
    n = 2.0 ** np.arange(1, 8)
    for _ in range(20):
        p = dataclasses.replace(
            TP,
            sync_local_s=float(rng.uniform(0, 0.02)),
            sync_node_s=float(rng.uniform(0, 0.02)),
            sync_step_s=float(rng.uniform(0, 0.02)),
            sync_hop_s=float(rng.uniform(0, 0.005)),
            sync_clock_share=float(rng.uniform(0, 1)),
        )
        packed = throughput.t_sync(p, n, np.minimum(n, 8.0), np.full(7, 1410.0))
        assert np.all(np.diff(packed) >= 0)  # more GPUs never sync faster
        spread = throughput.t_sync(p, n, np.minimum(n, 2.0), np.full(7, 1410.0))
        one_per_node = throughput.t_sync(p, n, np.ones(7), np.full(7, 1410.0))
        # fewer GPUs per node: intra-node traffic traded for inter-node traffic
        assert np.all(np.diff(spread) >= 0) and np.all(np.diff(one_per_node) >= 0)


def test_sync_clock_share_is_the_part_that_follows_the_clock() -> None:
    n, r = np.array([4.0, 16.0]), np.array([4.0, 8.0])
    fixed = dataclasses.replace(TP, sync_clock_share=0.0)
    np.testing.assert_allclose(
        throughput.t_sync(fixed, n, r, np.full(2, 600.0)),
        throughput.t_sync(fixed, n, r, np.full(2, 1410.0)),
    )
    bound = dataclasses.replace(TP, sync_clock_share=1.0)
    np.testing.assert_allclose(
        throughput.t_sync(bound, n, r, np.full(2, 500.0)),
        2.0 * throughput.t_sync(bound, n, r, np.full(2, 1000.0)),
    )


def test_sync_gets_faster_with_the_clock() -> None:
    n, r = np.array([4.0, 16.0]), np.array([4.0, 8.0])
    slow = throughput.t_sync(TP, n, r, np.full(2, 600.0))
    fast = throughput.t_sync(TP, n, r, np.full(2, 1410.0))
    assert np.all(fast < slow)


def test_overlap_spans_sum_to_max() -> None:
    a, b, c = np.array([0.1]), np.array([0.3]), np.array([0.2])
    no_overlap = dataclasses.replace(TP, gamma1=1.0, gamma2=1.0)
    assert throughput.combine(no_overlap, a, b, c)[0] == pytest.approx(0.6)
    full = dataclasses.replace(TP, gamma1=12.0, gamma2=12.0)
    got = throughput.combine(full, a, b, c)[0]
    assert 0.3 < got < 0.3 * 1.01
    mid = dataclasses.replace(TP, gamma1=2.0, gamma2=2.0)
    assert 0.3 < throughput.combine(mid, a, b, c)[0] < 0.6


def test_large_gammas_neither_overflow_nor_underflow() -> None:
    p = dataclasses.replace(TP, gamma1=12.0, gamma2=12.0)
    tiny = np.array([1e-40])
    assert np.isfinite(throughput.combine(p, tiny, tiny, np.zeros(1))).all()
    assert throughput.combine(p, tiny, tiny, np.zeros(1))[0] > 0


@pytest.mark.parametrize("which", ["grad", "sync", "static"])
def test_powers_are_continuous_and_smooth_at_the_knee(which: str) -> None:
    def power(f_rel: float) -> float:
        x = np.array([f_rel])
        if which == "grad":
            return float(energy.p_grad(EP, np.array([64.0]), x)[0])
        if which == "sync":
            return float(energy.p_sync(EP, x)[0])
        return float(energy.p_static(EP, x)[0])

    eps = 1e-7
    assert power(1 - eps) == pytest.approx(power(1 + eps), rel=1e-5)
    if which != "static":  # dynamic power is C1 at the knee (see energy.py)
        left = (power(1 - eps) - power(1 - 2 * eps)) / eps
        right = (power(1 + 2 * eps) - power(1 + eps)) / eps
        assert left == pytest.approx(right, rel=1e-3)


def test_static_power_is_flat_below_the_knee_and_rises_above() -> None:
    f_rel = np.array([0.3, 0.9, 1.1, 1.3])
    p = energy.p_static(EP, f_rel)
    assert p[0] == p[1] and p[1] < p[2] < p[3]


def test_grad_power_is_sublinear_in_batch() -> None:
    f_rel = np.ones(3)
    p = energy.p_grad(EP, np.array([8.0, 16.0, 32.0]), f_rel)
    assert p[0] < p[1] < p[2]
    assert p[2] / p[1] < 2.0 and p[2] - p[1] < 2 * (p[1] - p[0])


def test_fitted_model_is_a_perf_model_and_broadcasts() -> None:
    m = FittedModel(TRUE)
    assert isinstance(m, PerfModel)
    n = np.array([[1.0], [8.0]])
    f = np.array([600.0, 1050.0, 1410.0])
    t = m.step_time_s(n, np.minimum(n, 8), 32, f)
    e = m.energy_per_iter_j(n, np.minimum(n, 8), 32, f)
    assert t.shape == e.shape == (2, 3)
    t2, e2 = m.predict(n, np.minimum(n, 8), 32, f)
    assert np.array_equal(t, t2) and np.array_equal(e, e2)
    assert np.all(np.diff(t, axis=1) < 0)  # a faster clock is faster
    assert m.step_time_s(1, 1, 32, 1410).shape == ()


def test_analytic_jacobians_match_finite_differences() -> None:
    n, r, bs, f = grid(clock_step=20)
    _, jac = throughput.log_step_time_jacobian(TP, n, r, bs, f)
    for row in range(0, len(n), 7):

        def log_t(x: np.ndarray, row: int = row) -> float:
            p = ThroughputParams.from_vector(x)
            return float(np.log(throughput.step_time(p, n[row], r[row], bs[row], f[row])))

        x0 = TP.to_vector()
        num = approx_fprime(x0, log_t, 1e-7 * np.maximum(np.abs(x0), 1e-6))
        np.testing.assert_allclose(jac[row], num, rtol=2e-3, atol=1e-3 * np.abs(num).max())
    grad_s = throughput.t_grad(TP, bs, f)
    sync_s = throughput.t_sync(TP, n, r, f)
    it = throughput.step_time(TP, n, r, bs, f)
    f_rel = f / A100.f0_mhz
    _, jac = energy.log_energy_jacobian(EP, n, bs, f_rel, grad_s, sync_s, it)
    for row in range(0, len(n), 7):

        def log_e(x: np.ndarray, row: int = row) -> float:
            p = EnergyParams.from_vector(x)
            e = energy.energy_per_iter(
                p, n[row], bs[row], f_rel[row], grad_s[row], sync_s[row], it[row]
            )
            return float(np.log(e))

        x0 = EP.to_vector()
        num = approx_fprime(x0, log_e, 1e-7 * np.maximum(np.abs(x0), 1e-3))
        np.testing.assert_allclose(jac[row], num, rtol=2e-3, atol=1e-4 * np.abs(num).max())


def test_the_per_step_overhead_draws_the_light_power() -> None:
    """``a_grad`` (launches, optimizer step, host work: fixed per step) is
    charged at the synchronisation power, the rest of ``T_grad`` at the
    compute power: on one GPU and on 16, a model's joules per iteration are
    exactly that sum, and raising ``a_grad`` by one second adds ``n`` times
    the light plus static power, not the compute power."""
    model = FittedModel(TRUE)
    for n, r, bs in ((1.0, 1.0, 64.0), (16.0, 8.0, 4.0)):
        f = 1230.0
        f_rel = f / A100.f0_mhz
        grad = throughput.t_grad(TP, bs, f)
        sync = throughput.t_sync(TP, n, r, f)
        it = throughput.step_time(TP, n, r, bs, f)
        p_grad = energy.p_grad(EP, bs, f_rel)
        p_light = energy.p_sync(EP, f_rel)
        want = n * (
            p_grad * (grad - TP.a_grad)
            + p_light * (sync + TP.a_grad)
            + energy.p_static(EP, f_rel) * it
        )
        assert float(model.energy_per_iter_j(n, r, bs, f)) == pytest.approx(float(want), rel=1e-12)
    assert TP.a_grad > 0 and float(energy.p_grad(EP, 64.0, 1.0)) > float(energy.p_sync(EP, 1.0))
