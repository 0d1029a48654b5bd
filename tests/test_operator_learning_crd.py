"""The CRD holds what the online refit writes in ``status.model``, and shows it in
``kubectl get dlj -o wide``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from powerflow.operator.learning import (
    MAX_TYPES,
    MeasuredPower,
    SampleStore,
    measured_status,
    params_status,
)
from powerflow.operator.profiled import BY_TYPE, MAX_COUNTS, with_profiled
from powerflow.operator.profiled import MAX_TYPES as PROFILED_TYPES
from prometheus_client import CollectorRegistry
from support.crd_schema import crd_validator

from powerflow.core import contract
from powerflow.core.gpus import GPU_SPECS
from powerflow.core.models.params import EnergyParams, ModelParams, ThroughputParams
from powerflow.core.models.priors import load_prior, prior_on

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "dljob.yaml"


def version() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    (v,) = doc["spec"]["versions"]
    return v


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft4Validator:
    return crd_validator(CRD, contract.VERSION)


def example() -> dict[str, Any]:
    paths = sorted((ROOT / "examples").glob("*dljob*.yaml"))
    doc: dict[str, Any] = yaml.safe_load(paths[0].read_text())
    return doc


def test_samples_and_fit_error_are_wide_columns() -> None:
    columns = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    samples, error = columns["Samples"], columns["Fit-Error-%"]
    assert (samples["jsonPath"], samples["type"]) == (".status.model.samples", "integer")
    assert (error["jsonPath"], error["type"]) == (".status.model.fitErrorPercent", "number")
    assert samples["priority"] == error["priority"] == 1  # -o wide only
    default = [c for n, c in columns.items() if n not in ("Samples", "Fit-Error-%")]
    assert all(c.get("priority", 0) == 0 for c in default)  # the plain view is unchanged


def test_params_schema_names_every_model_parameter() -> None:
    schema = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    params = schema["properties"]["model"]["properties"]["params"]["properties"]
    assert set(params) == {"version", "gpu", "model", "throughput", "energy"}
    assert tuple(params["throughput"]["properties"]) == ThroughputParams.names()
    assert tuple(params["energy"]["properties"]) == EnergyParams.names()


def test_what_the_store_writes_validates(validator: jsonschema.Draft4Validator) -> None:
    """The fields of a real fit, and of a prior without a model name, fit the schema."""
    store = SampleStore(registry=CollectorRegistry())
    doc = example()
    doc["metadata"] = {"name": "job", "namespace": "ml", "uid": "u"}
    store.refresh([doc])
    fields = store.status_fields()["ml/job"]
    params = {**params_status(load_prior("resnet50")), "model": "resnet50"}
    status = {"model": {**fields, "params": params, "fits": 2, "fitErrorPercent": 3.5}}
    assert validator.is_valid(doc | {"status": status})
    unnamed = ModelParams(**{**load_prior("resnet50").__dict__, "model": None})
    status["model"]["params"] = params_status(unnamed)
    assert "model" not in status["model"]["params"]
    assert validator.is_valid(doc | {"status": status})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.update(fitErrorPercent=-1),
        lambda m: m.update(fits=-1),
        lambda m: m["params"].update(extra=1),
        lambda m: m["params"]["throughput"].update(a_io="x"),
    ],
    ids=["negative-error", "negative-fits", "unknown-field", "not-a-number"],
)
def test_schema_rejects_bad_model_status(
    mutate: Any, validator: jsonschema.Draft4Validator
) -> None:
    model = {"samples": 1, "fits": 1, "fitErrorPercent": 1.0}
    model["params"] = copy.deepcopy(params_status(load_prior("resnet50")))
    mutate(model)
    assert not validator.is_valid(example() | {"status": {"model": model}})


def test_measured_power_in_status_validates_and_bad_ones_are_refused(
    validator: jsonschema.Draft4Validator,
) -> None:
    """``status.model.measuredPower`` as the store writes it is valid; a partial or
    negative one is refused by the API server's schema."""
    measured = MeasuredPower(
        n=8, gpus_per_node=4, local_batch_size=32, frequency_mhz=1410, watts=2e3
    )
    good = {"samples": 3, "measuredPower": measured_status(measured)}
    assert validator.is_valid(example() | {"status": {"model": good}})
    for bad in (
        {k: v for k, v in good["measuredPower"].items() if k != "watts"},
        {**good["measuredPower"], "watts": -1.0},
        {**good["measuredPower"], "gpus": 0},
    ):
        assert not validator.is_valid(example() | {"status": {"model": {"measuredPower": bad}}})


def test_the_fits_on_other_types_have_the_params_schema() -> None:
    model = version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["model"]
    other = model["properties"]["otherGpuTypes"]["items"]["properties"]["params"]
    assert other == model["properties"]["params"]


def test_fits_on_other_types_and_counts_per_type_validate_as_the_operator_writes_them(
    validator: jsonschema.Draft4Validator,
) -> None:
    h100 = GPU_SPECS["H100-SXM"]
    params = params_status(prior_on(load_prior("resnet50"), h100))
    others = [{"gpu": "H100-SXM", "params": params, "fits": 3}]
    counts = with_profiled({BY_TYPE: with_profiled(None, "A100", 4)}, "H100-SXM", 8)
    model = {"otherGpuTypes": others, BY_TYPE: counts, "profiledGpuCounts": [2]}
    assert validator.is_valid(example() | {"status": {"model": model}})


@pytest.mark.parametrize(
    "model",
    [
        {"otherGpuTypes": [{"params": {"gpu": "A100"}}]},
        {"otherGpuTypes": [{"gpu": "x" * 64, "params": {"gpu": "A100"}}]},
        {"otherGpuTypes": [{"gpu": f"T{i}", "params": {}} for i in range(MAX_TYPES + 1)]},
        {"otherGpuTypes": [{"gpu": "A100", "params": {}, "extra": 1}]},
        {"otherGpuTypes": [{"gpu": "A100", "params": {}, "fits": -1}]},
        {BY_TYPE: [{"gpu": "A100", "gpuCounts": [0]}]},
        {BY_TYPE: [{"gpu": "A100"}]},
        {BY_TYPE: [{"gpu": "A100", "gpuCounts": list(range(1, MAX_COUNTS + 2))}]},
        {BY_TYPE: [{"gpu": f"T{i}", "gpuCounts": [1]} for i in range(PROFILED_TYPES + 1)]},
    ],
    ids=[
        "no-type",
        "long-type",
        "too-many-fits",
        "unknown-field",
        "negative-fits",
        "zero-count",
        "no-counts",
        "too-many-counts",
        "too-many-types",
    ],
)
def test_schema_bounds_what_status_holds_per_type(
    model: dict[str, Any], validator: jsonschema.Draft4Validator
) -> None:
    assert not validator.is_valid(example() | {"status": {"model": model}})
