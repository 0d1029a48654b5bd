"""Predictions are finite and positive over the whole supported range, for
every shipped prior and for any parameters inside the fitting bounds."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from models_synth import TRUE

from powerflow.core.gpus import A100
from powerflow.core.models.derived import power_w
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.core.models.priors import generic_prior, shipped_priors

PARAMS = [TRUE, generic_prior(), *shipped_priors().values()]


@st.composite
def configs(draw: st.DrawFn) -> tuple[float, float, float, float]:
    n = 2 ** draw(st.integers(0, 6))
    r = draw(st.integers(1, min(n, 8)))
    bs = draw(st.floats(1.0, 1024.0))
    f = draw(st.sampled_from(A100.clocks_mhz))
    return float(n), float(r), bs, float(f)


def _params_in_bounds(cls: type[ThroughputParams] | type[EnergyParams]) -> st.SearchStrategy:  # type: ignore[type-arg]
    parts = []
    for name in cls.names():
        lo, hi = cls.BOUNDS[name]
        parts.append(st.floats(lo, hi if math.isfinite(hi) else 1e4))
    return st.tuples(*parts).map(lambda v: cls.from_vector(np.array(v)))


def _check(params: ModelParams, cfg: tuple[float, float, float, float]) -> None:
    t, e = FittedModel(params).predict(*cfg)
    assert np.isfinite(t) and np.isfinite(e)
    assert t > 0 and e > 0


@settings(max_examples=300, deadline=None)
@given(cfg=configs())
def test_shipped_priors_predict_finite_positive(cfg: tuple[float, float, float, float]) -> None:
    for params in PARAMS:
        _check(params, cfg)
        assert power_w(FittedModel(params), *cfg) < 2 * A100.max_power_w * cfg[0]


@settings(max_examples=300, deadline=None)
@given(
    cfg=configs(),
    tp=_params_in_bounds(ThroughputParams),
    ep=_params_in_bounds(EnergyParams),
)
def test_any_parameters_in_bounds_predict_finite_positive(
    cfg: tuple[float, float, float, float], tp: ThroughputParams, ep: EnergyParams
) -> None:
    _check(ModelParams("A100", tp, ep), cfg)


def test_whole_grid_at_once() -> None:
    n = 2.0 ** np.arange(7)
    r = np.arange(1, 9, dtype=np.float64)
    bs = np.array([1.0, 2.0, 7.0, 64.0, 333.0, 1024.0])
    f = np.asarray(A100.clocks_mhz, dtype=np.float64)
    nn, rr, bb, ff = np.meshgrid(n, r, bs, f, indexing="ij")
    ok = rr <= nn
    for params in PARAMS:
        t, e = FittedModel(params).predict(nn[ok], rr[ok], bb[ok], ff[ok])
        assert np.all(np.isfinite(t) & np.isfinite(e))
        assert np.all((t > 0) & (e > 0))
