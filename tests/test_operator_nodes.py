"""The operator's GPU inventory (``operator/nodes.py``): pools, foreign GPU pods, taints."""

from __future__ import annotations

from typing import Any

from powerflow.operator.nodes import cluster_nodes, fleet_nodes, foreign_gpus

from powerflow.core import contract
from powerflow.core.gpus import A100, gpu_for_product
from powerflow.core.policy.snapshot import Node

A100_LABEL, H100_LABEL = "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: Any, product: str = A100_LABEL, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {contract.GPU_PRODUCT_LABEL: product}},
        "spec": spec,
        "status": {
            "allocatable": {contract.GPU_RESOURCE: gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str, node_name: str, gpus: int, *, job: str | None = None, **kw: Any) -> Any:
    labels = {contract.JOB_LABEL: job} if job else {}
    limits = {contract.GPU_RESOURCE: str(gpus)}
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": limits}}]},
        "status": {"phase": kw.get("phase", "Running")},
    }


def test_mixed_node_sizes_plan_on_the_pool_with_the_most_usable_gpus() -> None:
    # Before pooling, unequal nodes kept only the most common shape by raw count.
    bodies = [node("a", "8"), node("b", "8"), node("c", "7"), node("d", "4"), node("e", "4")]
    bodies += [node("f", "4"), node("h", "8", H100_LABEL)]
    kept, left = cluster_nodes(bodies)
    # 4-GPU pool: c (7 allocatable -> 4 usable), d, e, f = 16 GPUs; the 8-GPU A100s: 16 too,
    # and larger nodes win the tie.
    assert kept == (Node("a", 8, A100), Node("b", 8, A100))
    assert left == ("c", "d", "e", "f", "h")
    kept, left = cluster_nodes([*bodies, node("g", "4")])  # now 20 GPUs of 4-GPU nodes
    assert [n.name for n in kept] == ["c", "d", "e", "f", "g"]
    assert {n.gpus for n in kept} == {4} and left == ("a", "b", "h")


def test_foreign_gpu_pods_take_gpus_off_their_node() -> None:
    bodies = [node(n, "8") for n in ("a", "b", "c")]
    pods = [
        pod("notebook", "a", 1),  # a GPU of a's 8 taken: a is left out of the plan
        pod("worker-0", "b", 8, job="train"),  # PowerFlow's own: planned, not foreign
        pod("done", "c", 8, phase="Succeeded"),  # finished: holds nothing
        pod("pending", "", 8),  # not bound: holds nothing
    ]
    assert foreign_gpus(pods) == {"a": 1}
    kept, left = cluster_nodes(bodies, pods)
    # a stays in the main pool (not "another pool"); the plan needs equal nodes, so it
    # counts a again once the notebook ends.
    assert kept == (Node("b", 8, A100), Node("c", 8, A100)) and left == ()
    kept, left = cluster_nodes(bodies, [pod("big", "a", 8)])
    assert [n.name for n in kept] == ["b", "c"] and left == ()
    # A 7-GPU node is a 4-GPU node: GPUs others hold beyond its 4 take none of them.
    kept, _ = cluster_nodes([node("d", "7")], [pod("p", "d", 3)])
    assert kept == (Node("d", 4, A100),)
    assert cluster_nodes([node("d", "7")], [pod("p", "d", 4)]) == ((), ())


def test_the_plan_shape_does_not_flip_with_others_load() -> None:
    """Pooled by free GPUs, two A100 nodes full of others' pods made an idle T4 node the
    main pool: the plan's shape changed with foreign load (and the extender called the
    A100 nodes "never able" to host a gang, so preemption could not free them)."""
    bodies = [node("a", "8"), node("b", "8"), node("t", "4", "Tesla-T4")]
    idle = cluster_nodes(bodies)
    assert idle == ((Node("a", 8, A100), Node("b", 8, A100)), ("t",))
    full = [pod("f1", "a", 8), pod("f2", "b", 8)]
    assert cluster_nodes(bodies, full) == ((), ("t",))
    assert cluster_nodes(bodies, full[:1]) == ((Node("b", 8, A100),), ("t",))
    assert cluster_nodes(bodies, []) == idle


def test_cordoned_not_ready_and_untolerated_nodes_are_left_out() -> None:
    tainted = node(
        "t", "8", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
    )
    soft = node("s", "8", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    managed = node("m", "8", taints=[{"key": contract.GPU_RESOURCE, "effect": "NoSchedule"}])
    sick = node("n", "8")
    sick["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    bodies = [node("a", "8"), node("c", "8", unschedulable=True), tainted, soft, sick, managed]
    # By default only the GPU node pools' own taint is tolerated (ExtendedResourceToleration).
    kept, _ = cluster_nodes(bodies)
    assert [n.name for n in kept] == ["a", "m", "s"]
    kept, _ = cluster_nodes(bodies, tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert [n.name for n in kept] == ["a", "s", "t"]


def test_unreadable_quantities_and_bodies_are_no_gpus() -> None:
    bodies = [node("a", "8"), node("b", "lots"), node("c", True), {"metadata": "x"}, "junk"]
    bodies += [node("d", str(10**400)), node("e", 1 << 20), node("f", "-8")]
    assert cluster_nodes(bodies, ["junk", {"spec": "x"}]) == ((Node("a", 8, A100),), ())  # type: ignore[list-item]


def test_fleet_nodes_plan_every_pool_of_a_known_type_the_main_pool_first() -> None:
    """The operator plans every pool whose type is known (``FleetPolicy``), each with
    its own type; a pool of unknown type beside it stays out, as every other pool does
    when the main pool's type is unknown."""
    bodies = [node("a", "8"), node("b", "8"), node("h", "8", H100_LABEL)]
    bodies += [node("c", "4"), node("t", "4", "Tesla-T4-Unknown")]
    kept, left = fleet_nodes(bodies)
    h100 = gpu_for_product(H100_LABEL)
    assert kept == (
        Node("a", 8, A100), Node("b", 8, A100), Node("h", 8, h100), Node("c", 4, A100)
    )  # fmt: skip
    assert left == ("t",)
    # The one-pool view is unchanged: the main pool alone.
    assert cluster_nodes(bodies) == ((Node("a", 8, A100), Node("b", 8, A100)), ("c", "h", "t"))
    # A main pool of unknown type is planned alone, for GPU counts only.
    unknown = [node(n, "8", "Tesla-T4-Unknown") for n in ("u1", "u2")] + [node("a", "8")]
    kept, left = fleet_nodes(unknown)
    assert [n.name for n in kept] == ["u1", "u2"] and left == ("a",)
    # One pool: exactly ``cluster_nodes``.
    same = [node("a", "8"), node("b", "8")]
    assert fleet_nodes(same) == cluster_nodes(same)
    # Others' pods take a pool's node out of the plan, as in the main pool.
    kept, left = fleet_nodes(bodies, [pod("notebook", "h", 1)])
    assert "h" not in {n.name for n in kept} and left == ("t",)


def test_fleet_nodes_plan_one_pool_per_type_and_size() -> None:
    """Two product labels of one type and size: the policy plans one spec per (type,
    size) and the extender a gang within one pool, so the second is left out."""
    other = "A100-SXM4-40GB"  # the NVML name without its vendor: the A100 too
    assert gpu_for_product(other) == A100
    bodies = [node("a", "8"), node("b", "8"), node("p", "8", other)]
    kept, left = fleet_nodes(bodies)
    assert [n.name for n in kept] == ["a", "b"] and left == ("p",)
