"""The twin's scheduler filters nodes by a pod's node selector and required node
affinity as kube-scheduler's NodeAffinity plugin does (``powerflow.lab.twin.affinity``;
the cases follow the Kubernetes API reference of ``NodeSelectorTerm`` and
``NodeSelectorRequirement``), so a gang the operator pins to one GPU type is never
bound to another type's node, whatever the extender answers."""

from __future__ import annotations

from typing import Any

import pytest
from powerflow.operator.workers import pool_affinity

from powerflow.core import contract
from powerflow.lab.twin.affinity import REASON, matches
from powerflow.lab.twin.scheduler import feasible


def node(name: str, gpus: int = 8, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {contract.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(affinity: Any = None, selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {contract.GPU_RESOURCE: "1"}}}]
    }
    if affinity is not None:
        spec["affinity"] = affinity
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": spec}


def required(*terms: Any) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


A100 = node("a", **{contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB", "zone": "z1", "rack": "7"})
H100 = node("h", **{contract.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", "zone": "z2"})
BARE = node("b")


@pytest.mark.parametrize(
    ("affinity", "selector", "passes"),
    [
        (None, None, {"a", "h", "b"}),  # no constraint
        (None, {"zone": "z1"}, {"a"}),  # every selector label, equal
        (None, {"zone": "z1", "rack": "8"}, set()),
        (required({"matchExpressions": [expr("zone", "In", "z1", "z2")]}), None, {"a", "h"}),
        (required({"matchExpressions": [expr("zone", "NotIn", "z1")]}), None, {"h", "b"}),
        (required({"matchExpressions": [expr("rack", "Exists")]}), None, {"a"}),
        (required({"matchExpressions": [expr("rack", "DoesNotExist")]}), None, {"h", "b"}),
        (required({"matchExpressions": [expr("rack", "Gt", "6")]}), None, {"a"}),
        (required({"matchExpressions": [expr("rack", "Lt", "7")]}), None, set()),
        (required({"matchExpressions": [expr("zone", "Gt", "1")]}), None, set()),  # not integers
        # a term's requirements are ANDed, the terms ORed
        (
            required({"matchExpressions": [expr("zone", "In", "z1"), expr("rack", "In", "8")]}),
            None,
            set(),
        ),
        (
            required(
                {"matchExpressions": [expr("zone", "In", "z2")]},
                {"matchExpressions": [expr("rack", "Exists")]},
            ),
            None,
            {"a", "h"},
        ),
        (required({}), None, set()),  # an empty term matches no node
        (required({"matchFields": [expr("metadata.name", "In", "b")]}), None, {"b"}),
        (required({"matchFields": [expr("metadata.name", "NotIn", "b")]}), None, {"a", "h"}),
        # selector and affinity both hold
        (required({"matchExpressions": [expr("zone", "Exists")]}), {"rack": "7"}, {"a"}),
        # preferred affinity only scores
        (
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            None,
            {"a", "h", "b"},
        ),
    ],
)
def test_selector_and_required_affinity_filter_as_kube_scheduler(
    affinity: Any, selector: dict[str, str] | None, passes: set[str]
) -> None:
    p = pod(affinity, selector)
    assert {n["metadata"]["name"] for n in (A100, H100, BARE) if matches(p, n)} == passes
    names, why = feasible(p, [A100, H100, BARE], {})
    assert set(names) == passes
    if len(passes) < 3:
        assert f"{3 - len(passes)} {REASON}" in why, why


def test_a_worker_the_operator_pins_to_a_pool_is_feasible_on_that_pools_nodes_only() -> None:
    """The operator's own affinity (``pool_affinity``), with a template's term kept."""
    template = required({"matchExpressions": [expr("zone", "Exists")]})["nodeAffinity"]
    for product, on in (("NVIDIA-H100-80GB-HBM3", ["h"]), ("", [])):
        p = pod(pool_affinity({"nodeAffinity": template}, product))
        assert feasible(p, [A100, H100, BARE], {})[0] == on
    assert feasible(pod(pool_affinity(None, "")), [A100, H100, BARE], {})[0] == ["b"]
