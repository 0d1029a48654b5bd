"""The wire models decode as Go's encoding/json does and encode as kube-scheduler expects."""

from __future__ import annotations

import pydantic
import pytest
from extender_bodies import node, pod
from powerflow.extender.objects import (
    node_gpus,
    parse_block,
    placement_annotation,
    pod_gpus,
    pod_info,
)
from powerflow.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    HostPriority,
    dump,
    filter_result,
)

from powerflow.core.contract import PLACEMENT_ANNOTATION


def test_keys_fold_case_and_unknown_keys_are_ignored() -> None:
    args = ExtenderArgs.model_validate({"pod": {"a": 1}, "NODENAMES": ["x"], "Extra": 2})
    assert args.Pod == {"a": 1} and args.NodeNames == ["x"] and args.Nodes is None
    binding = ExtenderBindingArgs.model_validate({"podname": "p", "PODUID": "u", "node": "n"})
    assert (binding.PodName, binding.PodUID, binding.Node, binding.PodNamespace) == (
        "p",
        "u",
        "n",
        "",
    )


def test_the_last_of_duplicate_keys_wins_as_in_go() -> None:
    args = ExtenderArgs.model_validate({"NodeNames": ["a"], "nodenames": ["b"]})
    assert args.NodeNames == ["b"]


def test_null_leaves_the_zero_value() -> None:
    assert ExtenderBindingArgs.model_validate({"PodName": None}).PodName == ""


def test_type_mismatch_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError):
        ExtenderArgs.model_validate({"NodeNames": "a"})


def test_filter_result_answers_in_the_mode_asked() -> None:
    nodes = [node("a"), node("b")]
    by_name = ExtenderArgs.model_validate({"Pod": {}, "NodeNames": ["a", "b"]})
    out = dump(filter_result(by_name, ["b"], {"a": "why"}))
    assert out == {
        "Nodes": None,
        "NodeNames": ["b"],
        "FailedNodes": {"a": "why"},
        "FailedAndUnresolvableNodes": None,
        "Error": "",
    }
    full = ExtenderArgs.model_validate(
        {"Pod": {}, "Nodes": {"metadata": {"resourceVersion": "7"}, "items": nodes}}
    )
    out = dump(filter_result(full, ["b"], {}))
    assert out["Nodes"] == {"metadata": {"resourceVersion": "7"}, "items": [nodes[1]]}
    assert out["NodeNames"] is None and out["FailedNodes"] is None


def test_scores_are_bounded_by_max_extender_priority() -> None:
    assert dump(HostPriority(Host="a", Score=10)) == {"Host": "a", "Score": 10}
    with pytest.raises(pydantic.ValidationError):
        HostPriority(Host="a", Score=11)


def test_object_readers() -> None:
    assert node_gpus(node("a", gpus=4)) == 4
    assert node_gpus(node("cpu", gpus=0)) == 0
    assert pod_gpus(pod("p", gpus=2)) == 2
    two = pod("p", gpus=1)
    two["spec"]["containers"].append(two["spec"]["containers"][0])
    assert pod_gpus(two) == 2
    info = pod_info(pod("w", job="j", workers=8, gpus=1, namespace="ml", generation="3"))
    assert (str(info.gang), info.workers, info.bound) == ("ml/j@3", 8, False)
    assert pod_info(pod("plain")).gang is None


def test_placement_annotation_round_trips() -> None:
    block = (("a", 0), ("a", 1), ("b", 0), ("b", 1))
    text = placement_annotation("a", block)
    assert parse_block(text) == block
    bound = pod("w", job="j", workers=4, node_name="a")
    bound["metadata"]["annotations"][PLACEMENT_ANNOTATION] = text
    assert pod_info(bound).block == block
    for junk in (
        None,
        "",
        "{",
        "[]",
        '{"block": 3}',
        '{"block": [["a"]]}',
        '{"block": [[1, "x"]]}',
    ):
        assert parse_block(junk) == ()
