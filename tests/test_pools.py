"""The pooling rule (``powerflow.core.policy.pools``) and the taint rule
(``powerflow.core.taints``)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerflow.core.policy.pools import (
    NodeShape,
    Pool,
    main_pool,
    plan_nodes,
    pools,
    taken_by_others,
    usable_gpus,
)
from powerflow.core.taints import hard_taints, node_ready, tolerates, untolerated

A100, H100 = "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(
    ("allocatable", "held", "usable"),
    [(8, 0, 8), (7, 0, 4), (4, 0, 4), (3, 0, 2), (1, 0, 1), (0, 0, 0), (8, 1, 4), (8, 8, 0),
     (8, 9, 0), (16, 2, 8), (6, 2, 4)],
)  # fmt: skip
def test_usable_count_is_the_largest_power_of_two_left(
    allocatable: int, held: int, usable: int
) -> None:
    assert usable_gpus(allocatable, held) == usable


@settings(max_examples=200, derandomize=True)
@given(allocatable=st.integers(0, 1 << 12), held=st.integers(0, 1 << 12))
def test_usable_count_leaves_room_for_the_held_gpus(allocatable: int, held: int) -> None:
    usable = usable_gpus(allocatable, held)
    assert usable == 0 or usable & (usable - 1) == 0
    if usable:
        assert held <= allocatable - usable and 2 * usable > allocatable - held


def test_mixed_sizes_and_a_degraded_node_pool_by_capacity_and_product() -> None:
    shapes = [
        NodeShape("a", A100, 8),
        NodeShape("b", A100, 8),
        NodeShape("c", A100, 7),  # a GPU went unhealthy: a 4-GPU node now
        NodeShape("d", A100, 4),
        NodeShape("e", H100, 8),
        NodeShape("f", A100, 8, held=2),  # others' GPUs are taken within the node
        NodeShape("g", A100, 0),
    ]
    assert pools(shapes) == (
        Pool(A100, 8, ("a", "b", "f")),  # 24 GPUs: the main pool
        Pool(H100, 8, ("e",)),  # 8 GPUs, on larger nodes
        Pool(A100, 4, ("c", "d")),  # 8 GPUs
    )


def test_the_main_pool_has_the_most_gpus_then_larger_nodes_then_product() -> None:
    assert main_pool([]) is None
    assert main_pool([NodeShape("x", A100, 0)]) is None
    four = [NodeShape(f"s{i}", A100, 4) for i in range(5)]  # 20 GPUs
    eight = [NodeShape(f"b{i}", A100, 8) for i in range(2)]  # 16 GPUs
    assert main_pool(four + eight) == Pool(A100, 4, tuple(f"s{i}" for i in range(5)))
    tie = [NodeShape(f"t{i}", A100, 4) for i in range(4)]  # 16 GPUs, smaller nodes
    assert main_pool(tie + eight) == Pool(A100, 8, ("b0", "b1"))
    other = [NodeShape(f"h{i}", H100, 8) for i in range(2)]
    assert main_pool(other + eight) == Pool(A100, 8, ("b0", "b1"))  # name order breaks ties


def test_the_main_pool_does_not_flip_when_others_fill_its_nodes() -> None:
    """The reviewer's case: two 8-GPU A100 nodes full of others' pods and an idle 4-GPU
    T4. Pooled by free GPUs, the T4 became the main pool (4 GPUs against 0), and every
    A100 node was "never able" to host a gang of 8."""
    idle = [NodeShape("a", A100, 8), NodeShape("b", A100, 8), NodeShape("t", "Tesla-T4", 4)]
    busy = [NodeShape("a", A100, 8, held=8), NodeShape("b", A100, 8, held=8), idle[2]]
    assert main_pool(busy) == main_pool(idle) == Pool(A100, 8, ("a", "b"))
    pool = Pool(A100, 8, ("a", "b"))
    # Others' GPUs are taken within the node: the plan, which needs equal nodes, leaves
    # out a node they hold any of its pool's GPUs of, until they go.
    assert plan_nodes(pool, idle) == ("a", "b")
    assert plan_nodes(pool, busy) == ()
    assert plan_nodes(pool, [NodeShape("a", A100, 8, held=1), idle[1]]) == ("b",)
    # 7 allocatable: a 4-GPU node; 3 GPUs held by others fit in the 3 above its 4.
    degraded = Pool(A100, 4, ("c",))
    assert main_pool([NodeShape("c", A100, 7, held=3)]) == degraded
    assert plan_nodes(degraded, [NodeShape("c", A100, 7, held=3)]) == ("c",)
    assert plan_nodes(degraded, [NodeShape("c", A100, 7, held=4)]) == ()


@settings(max_examples=100, derandomize=True)
@given(
    shapes=st.lists(
        st.builds(
            NodeShape,
            name=st.text("abcdef", min_size=1, max_size=3),
            product=st.sampled_from([A100, H100, ""]),
            allocatable=st.integers(0, 16),
            held=st.integers(0, 16),
        ),
        max_size=12,
        unique_by=lambda s: s.name,
    ),
    seed=st.randoms(use_true_random=False),
)
def test_pools_partition_the_gpu_nodes_whatever_their_order_or_load(
    shapes: list[NodeShape], seed: random.Random
) -> None:
    found = pools(shapes)
    shuffled = list(shapes)
    seed.shuffle(shuffled)
    assert pools(shuffled) == found
    assert pools(dataclasses.replace(s, held=0) for s in shuffled) == found  # load: no change
    names = [n for p in found for n in p.nodes]
    assert sorted(names) == sorted(s.name for s in shapes if s.allocatable)
    by_name = {s.name: s for s in shapes}
    for pool in found:
        assert list(pool.nodes) == sorted(pool.nodes)
        assert {(by_name[n].product, by_name[n].capacity) for n in pool.nodes} == {pool.key}
        planned = plan_nodes(pool, shuffled)
        assert list(planned) == sorted(planned) and set(planned) <= set(pool.nodes)
        assert {n for n in pool.nodes if not taken_by_others(pool, by_name[n])} == set(planned)
    assert [p.gpus for p in found] == sorted((p.gpus for p in found), reverse=True)


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


@pytest.mark.parametrize(
    ("toleration", "matches"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "yes"}, True),  # empty operator is Equal; empty effect: all
        ({"key": "gpu", "operator": "Equal", "value": "no"}, False),
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "Gt", "value": "yes"}, False),
        ({"key": 5, "operator": "Exists"}, True),  # a mistyped key reads as empty
        ("junk", False),
    ],
)
def test_toleration_matching_follows_the_api(toleration: object, matches: bool) -> None:
    assert tolerates(toleration, taint("gpu", "yes")) is matches


def test_only_hard_taints_that_nothing_tolerates_keep_pods_off() -> None:
    node = {
        "spec": {
            "taints": [
                taint("gpu", "yes"),
                taint("maint", effect="NoExecute"),
                taint("soft", effect="PreferNoSchedule"),
                "junk",
            ]
        }
    }
    hard = hard_taints(node)
    assert [t["key"] for t in hard] == ["gpu", "maint"]
    assert untolerated(hard, []) == ["gpu=yes:NoSchedule", "maint:NoExecute"]
    assert untolerated(hard, [{"key": "gpu", "operator": "Exists"}]) == ["maint:NoExecute"]
    assert untolerated(hard, [{"operator": "Exists"}]) == []
    assert hard_taints({"spec": {"taints": "x"}}) == () and hard_taints(None) == ()


def test_readiness_reads_the_last_ready_condition() -> None:
    def node(*statuses: str) -> dict[str, object]:
        return {"status": {"conditions": [{"type": "Ready", "status": s} for s in statuses]}}

    assert node_ready(node("True")) and not node_ready(node("False"))
    assert not node_ready(node("Unknown")) and node_ready(node("False", "True"))
    assert node_ready({"status": {}}) and node_ready({"status": {"conditions": "x"}})
