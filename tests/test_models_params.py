"""Fitted parameters survive JSON and refuse malformed input."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from models_synth import TRUE

from powerflow.core.errors import ModelError
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams


def _in_bounds(cls: type[ThroughputParams] | type[EnergyParams]) -> st.SearchStrategy[np.ndarray]:
    parts = []
    for name in cls.names():
        lo, hi = cls.BOUNDS[name]
        parts.append(st.floats(lo, hi if math.isfinite(hi) else 1e3, allow_nan=False))
    return st.tuples(*parts).map(np.array)


@settings(max_examples=50, deadline=None)
@given(tp=_in_bounds(ThroughputParams), ep=_in_bounds(EnergyParams))
def test_json_round_trip_is_exact(tp: np.ndarray, ep: np.ndarray) -> None:
    params = ModelParams(
        "A100", ThroughputParams.from_vector(tp), EnergyParams.from_vector(ep), model="x"
    )
    again = ModelParams.from_json(params.to_json())
    assert again == params


def test_round_trip_without_model_label() -> None:
    params = ModelParams("A100", TRUE.throughput, TRUE.energy)
    assert ModelParams.from_json(params.to_json()) == params


def _doc() -> dict[str, object]:
    doc: dict[str, object] = json.loads(TRUE.to_json())
    return doc


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(version=99),
        lambda d: d.pop("gpu"),
        lambda d: d["throughput"].pop("gamma1"),
        lambda d: d["energy"].update(unknown=1.0),
        lambda d: d["throughput"].update(gamma1=0.5),
        lambda d: d["energy"].update(p_static_w="hot"),
        lambda d: d.update(throughput=[1, 2, 3]),
    ],
    ids=["version", "no-gpu", "missing", "extra", "out-of-bounds", "not-a-number", "not-a-dict"],
)
def test_malformed_parameters_are_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    doc = _doc()
    mutate(doc)
    with pytest.raises(ModelError):
        ModelParams.from_json(json.dumps(doc))


def test_version_1_parameters_are_refused_with_a_reason() -> None:
    """Stored params of the paper's linear sync form (status.model.params of a
    job fitted before the ring all-reduce form) cannot be translated: the
    error says so, and the operator refits such a job from its prior."""
    old = {
        "version": 1,
        "gpu": "A100",
        "throughput": {
            **{k: 0.01 for k in ("a_io", "b_io", "a_grad", "b_grad", "k_grad")},
            **{
                f"{c}_sync_{w}": 0.001
                for c in ("alpha", "kappa", "beta", "theta")
                for w in ("local", "node")
            },
            "gamma1": 2.0,
            "gamma2": 1.5,
        },
        "energy": json.loads(TRUE.to_json())["energy"],
    }
    with pytest.raises(ModelError, match=r"version 1.*refit"):
        ModelParams.from_json(json.dumps(old))


@pytest.mark.parametrize("version", [2, 3])
def test_parameters_fitted_with_the_overhead_at_compute_power_are_refused(version: int) -> None:
    """Versions 2 and 3 charged the fixed per-step time ``a_grad`` at the
    compute power; version 4 charges it at the light power, so their energy
    parameters would predict other joules under the same numbers. Refused
    with the reason, the operator refits such a job from its prior."""
    doc = json.loads(TRUE.to_json())
    assert doc["version"] == 4
    doc["version"] = version
    with pytest.raises(ModelError, match=rf"version {version}.*overhead.*refit"):
        ModelParams.from_json(json.dumps(doc))


@pytest.mark.parametrize("text", ["not json", "[1, 2]"])
def test_non_object_json_is_refused(text: str) -> None:
    with pytest.raises(ModelError):
        ModelParams.from_json(text)


def test_vector_of_wrong_length_is_refused() -> None:
    with pytest.raises(ModelError):
        ThroughputParams.from_vector(np.ones(3))


@pytest.mark.parametrize("cls", [ThroughputParams, EnergyParams])
def test_names_and_checks_are_the_fields_and_bounds(
    cls: type[ThroughputParams] | type[EnergyParams],
) -> None:
    """The field names and bounds looked up once per class are the dataclass's,
    in order, and every field is checked, at every validation."""
    assert cls.names() == tuple(f.name for f in dataclasses.fields(cls))
    x = cls(**{name: lo for name, (lo, _) in cls.BOUNDS.items()}).to_vector()
    for _ in range(2):
        for j, name in enumerate(cls.names()):
            lo, hi = cls.BOUNDS[name]
            for bad in (lo - 1.0, hi * 2.0 if math.isfinite(hi) else math.inf, math.nan):
                y = x.copy()
                y[j] = bad
                with pytest.raises(ModelError, match=rf"\.{name}="):
                    cls.from_vector(y).validate()
