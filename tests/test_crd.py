"""The DLJob CRD is a valid, structural CRD, and the shipped examples satisfy it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from powerflow.operator.allocation import JobAllocation, status_fields
from powerflow.operator.jobs import BOUNDS
from support.crd_schema import crd_validator

from powerflow.core import contract

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "dljob.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*dljob*.yaml"))


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft4Validator:
    return crd_validator(CRD, contract.VERSION)


def test_crd_is_valid_kubernetes_strictly() -> None:
    kubernetes_validate.validate(load(CRD), kubernetes_validate.latest_version(), strict=True)


def test_crd_names_match_the_contract() -> None:
    crd = load(CRD)
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{contract.PLURAL}.{contract.GROUP}"
    assert crd["spec"]["group"] == contract.GROUP
    assert (names["kind"], names["plural"]) == (contract.KIND, contract.PLURAL)
    assert contract.SHORT_NAME in names["shortNames"]
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION and "status" in version["subresources"]
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Phase", "GPUs", "MHz", "Progress", "Watts", "Age"} <= columns


def test_printer_columns_point_into_the_schema() -> None:
    version = load(CRD)["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        node = schema
        path = column["jsonPath"].lstrip(".").split(".")
        if path[0] == "metadata":
            continue
        for part in path:
            node = node["properties"][part]
        assert node["type"] in ("string", "integer", "number"), column


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path, validator: jsonschema.Draft4Validator) -> None:
    doc = load(path)
    assert (doc["apiVersion"], doc["kind"]) == (contract.API_VERSION, contract.KIND)
    validator.validate(doc)
    # The embedded worker template must itself be a valid PodTemplateSpec.
    pod_template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": doc["spec"]["template"],
    }
    kubernetes_validate.validate(pod_template, kubernetes_validate.latest_version(), strict=True)


def test_examples_cover_resnet50_and_gpt2() -> None:
    models = {load(p)["spec"].get("model") for p in EXAMPLES}
    assert {"resnet50", "gpt2"} <= models


def test_budget_configmap_example() -> None:
    doc = load(ROOT / "examples" / "budget-configmap.yaml")
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    assert doc["metadata"]["name"] == contract.BUDGET_CONFIGMAP
    assert "eta" in doc["data"] or "powerLimitWatts" in doc["data"]


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda s: s.pop("iterations"), "required"),
        (lambda s: s["gpus"].update(requested=0), "minimum"),
        (lambda s: s.update(globalBatchSize="64"), "type"),
        (lambda s: s.update(gpuz=3), "unknown field"),
        (lambda s: s["restart"].update(limit=-1), "minimum"),
        (lambda s: s.update(model="bad name!"), "pattern"),
    ],
)
def test_schema_rejects(mutate: Any, why: str, validator: jsonschema.Draft4Validator) -> None:
    doc = copy.deepcopy(load(EXAMPLES[0]))
    doc["spec"].setdefault("restart", {})
    mutate(doc["spec"])
    assert not validator.is_valid(doc), why


def test_schema_rejects_unknown_phase(validator: jsonschema.Draft4Validator) -> None:
    doc = load(EXAMPLES[0])
    assert validator.is_valid(doc | {"status": {"phase": "Running"}})
    assert not validator.is_valid(doc | {"status": {"phase": "Sleeping"}})


def test_template_keeps_unknown_fields(validator: jsonschema.Draft4Validator) -> None:
    doc = load(EXAMPLES[0])
    doc["spec"]["template"]["spec"]["anythingGoes"] = {"x": 1}
    assert validator.is_valid(doc)


def test_status_holds_the_profiling_fields(validator: jsonschema.Draft4Validator) -> None:
    doc = load(EXAMPLES[0])
    status = {
        "phase": "Profiling",
        "allocation": {"gpus": 4, "profilingUntil": "2025-01-01T00:04:00.300Z"},
        "model": {"profiledGpuCounts": [1, 4]},
    }
    assert validator.is_valid(doc | {"status": status})
    status["model"] = {"profiledGpuCounts": [0]}
    assert not validator.is_valid(doc | {"status": status})


def test_status_holds_the_allocation_the_job_controller_reads(
    validator: jsonschema.Draft4Validator,
) -> None:
    """What the allocator writes into ``status.allocation`` (``status_fields``) is in
    the schema: an API server would prune a field it lacks, and the job controller
    would then take the cap or the planned block away from the pods."""
    doc = load(EXAMPLES[0])
    granted = JobAllocation(3, 4, 16, 1200, 212.3, (("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)))
    allocation = status_fields(granted) | {"nodes": ["n1", "n2"], "complete": True}
    assert validator.is_valid(doc | {"status": {"allocation": allocation}})
    # No cap, no block: null in the merge patch, so absent from the stored status.
    bare = {k: v for k, v in status_fields(JobAllocation()).items() if v is not None}
    assert set(bare) == {"gpus", "frequencyMHz", "localBatchSize", "generation"}
    assert validator.is_valid(doc | {"status": {"allocation": bare}})
    schema = load(CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    block = schema["properties"]["status"]["properties"]["allocation"]["properties"]["block"]
    assert block["maxItems"] == BOUNDS["gpus.max"][1]  # one GPU a worker
    for bad in (
        {"powerCapWatts": 0},
        {"block": [{"node": "n1"}]},
        {"block": [{"node": "n1", "gpu": -1}]},
        {"clockMhz": 1200},  # not a field: the clock is frequencyMHz
    ):
        assert not validator.is_valid(doc | {"status": {"allocation": allocation | bad}}), bad


def _spec_integers(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every integer field under ``spec`` by dotted path."""
    found: dict[str, dict[str, Any]] = {}
    for name, sub in (node.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        if sub.get("type") == "integer":
            found[where] = sub
        found.update(_spec_integers(sub, where))
    return found


SPEC_INTEGERS = _spec_integers(
    load(CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
)


def test_every_spec_integer_is_bounded_as_the_operator_bounds_it() -> None:
    """The schema and ``jobs.BOUNDS`` agree, so bodies that bypassed the schema (an
    older CRD) are refused alike, and nothing the schema admits overflows the operator."""
    assert set(SPEC_INTEGERS) == set(BOUNDS)
    for path, node in SPEC_INTEGERS.items():
        assert (node["minimum"], node["maximum"]) == BOUNDS[path], path


@pytest.mark.parametrize("path", sorted(SPEC_INTEGERS))
def test_schema_refuses_out_of_range_integers(
    path: str, validator: jsonschema.Draft4Validator
) -> None:
    low, high = BOUNDS[path]
    for value, ok in (
        (low - 1, False),
        (low, True),
        (high, True),
        (high + 1, False),
        (10**18, False),
    ):
        doc = copy.deepcopy(load(EXAMPLES[0]))
        node = doc["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        if path.startswith("gpus.") and ok:  # keep the other two counts valid alongside
            node.update({k: value for k in ("requested", "min", "max")})
        assert validator.is_valid(doc) is ok, (path, value)


def test_schema_holds_the_refusal_backoff(validator: jsonschema.Draft4Validator) -> None:
    doc = load(EXAMPLES[0])
    status = {"createRefusals": 2, "lastCreateRefusalTime": "2025-01-01T00:00:00Z"}
    assert validator.is_valid(doc | {"status": status})
    assert not validator.is_valid(doc | {"status": {"createRefusals": -1}})
