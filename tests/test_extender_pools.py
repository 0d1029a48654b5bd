"""Where a new gang's block may go: the main pool, the candidates, schedulable nodes only.

Not every GPU node: cordoned, tainted and NotReady nodes are left out, and so are
nodes kube-scheduler did not send as candidates; nodes of different sizes are pooled
rather than every pod refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from extender_bodies import node, pod
from powerflow.extender.objects import pod_info
from powerflow.extender.state import ClusterState

A100, H100 = "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"


def cordoned(name: str, gpus: int = 8) -> dict[str, Any]:
    body = node(name, gpus)
    body["spec"]["unschedulable"] = True
    return body


def tainted(name: str, key: str = "dedicated", effect: str = "NoSchedule") -> dict[str, Any]:
    body = node(name)
    body["spec"]["taints"] = [{"key": key, "value": "x", "effect": effect}]
    return body


def not_ready(name: str) -> dict[str, Any]:
    body = node(name)
    body["status"]["conditions"][0]["status"] = "False"
    return body


def worker(job: str, i: int, workers: int, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return pod(f"{job}-{i}", job=job, workers=workers, gpus=gpus, index=i, **kw)


def state_of(*nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> ClusterState:
    state = ClusterState()
    state.replace(list(nodes), list(pods))
    return state


def run_gang(state: ClusterState, job: str, workers: int, gpus: int = 1) -> Counter[str]:
    """Filter and bind each worker with every known node as a candidate; where they went."""
    placed: Counter[str] = Counter()
    for i in range(workers):
        info = pod_info(worker(job, i, workers, gpus))
        answer = state.filter(info, sorted(state.nodes))
        assert answer.admitted, answer
        state.begin_bind(info, answer.admitted[0])
        state.end_bind(info, answer.admitted[0])
        placed[answer.admitted[0]] += gpus
    return placed


def test_a_cordoned_empty_node_is_never_chosen() -> None:
    state = state_of(cordoned("a"), node("b"))
    first = pod_info(worker("j", 0, 8))
    answer = state.filter(first, ["a", "b"])
    assert answer.admitted == ["b"]
    assert "cordoned" not in str(answer.failed)
    assert {n for n, _ in state.gangs[first.gang].block} == {"b"}  # type: ignore[index]


def test_untolerated_taints_and_not_ready_nodes_are_never_chosen() -> None:
    state = state_of(tainted("a"), not_ready("b"), tainted("c", effect="PreferNoSchedule"))
    assert run_gang(state, "j", 8) == {"c": 8}
    # Nothing else is left that this gang may use: unresolvable, with the reason.
    answer = state.filter(pod_info(worker("k", 0, 8)), ["a", "b", "c"])
    assert answer.admitted == [] and set(answer.unresolvable) == {"a", "b"}
    assert "taint dedicated=x:NoSchedule" in answer.unresolvable["a"]
    assert "not Ready" in answer.unresolvable["b"]
    assert set(answer.failed) == {"c"}  # full now, free again once the gang ends


def test_a_pod_that_tolerates_the_taint_may_use_the_node() -> None:
    state = state_of(tainted("a", key="nvidia.com/gpu"), tainted("b"))
    # Every GPU node's usual taint is in the pool; "dedicated" is not.
    body = worker("j", 0, 8)
    body["spec"]["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists"})
    answer = state.filter(pod_info(body), ["a", "b"])
    assert answer.admitted == ["a"]
    # Without the toleration the same pod may not go there.
    plain = state.filter(pod_info(worker("k", 0, 8)), ["a", "b"])
    assert plain.admitted == [] and "does not tolerate" in plain.unresolvable["a"]


def test_a_single_node_block_is_chosen_among_the_candidates() -> None:
    busy = [pod(f"x{i}", gpus=1, node_name="a", job="x", workers=4) for i in range(4)]
    state = state_of(node("a"), node("b"), pods=tuple(busy))
    info = pod_info(worker("j", 0, 4))
    # Best fit would pick a (4 of its 8 GPUs free), but the scheduler's filters passed only b.
    assert state.filter(info, ["b"]).admitted == ["b"]


def test_a_multi_node_block_needs_every_node_among_the_candidates() -> None:
    state = state_of(*(node(f"n{i}") for i in range(4)))
    info = pod_info(worker("j", 0, 2, gpus=8))
    answer = state.filter(info, ["n1", "n2", "n3"])  # n0 failed the scheduler's own filters
    assert answer.admitted == ["n2", "n3"]
    assert {n for n, _ in state.gangs[info.gang].block} == {"n2", "n3"}  # type: ignore[index]


@pytest.mark.parametrize("change", [cordoned, not_ready, tainted])
def test_a_reservation_on_a_node_that_turns_unusable_before_any_worker_bound_is_chosen_again(
    change: Callable[[str], dict[str, Any]],
) -> None:
    state = state_of(node("a"), node("b"))
    first = pod_info(worker("j", 0, 8))
    where = state.filter(first, ["a", "b"]).admitted
    assert where == ["a"]
    state.upsert_node(change("a"))
    assert state.filter(first, ["b"]).admitted == ["b"]
    assert {n for n, _ in state.gangs[first.gang].block} == {"b"}  # type: ignore[index]


def test_a_deleted_node_gives_its_unbound_gpus_back_and_late_workers_go_elsewhere() -> None:
    state = state_of(node("a"), node("b"), node("c"))
    members = [pod_info(worker("j", i, 16)) for i in range(16)]
    for info in members[:4]:
        chosen = state.filter(info, ["a", "b", "c"]).admitted[0]
        state.begin_bind(info, chosen)
        state.end_bind(info, chosen)
    gang = state.gangs[members[0].gang]  # type: ignore[index]
    (bound,) = {state.pods[i.key].node for i in members[:4]}
    other = ({n for n, _ in gang.block} - {bound}).pop()
    state.delete_node(node(other))
    rest = [state.filter(i, ["a", "b", "c"]).admitted for i in members[4:]]
    assert all(r and other not in r for r in rest)


def test_mixed_node_sizes_and_a_degraded_node_place_gangs() -> None:
    # Before pools: "buddy placement needs equal nodes" for every PowerFlow pod.
    state = state_of(node("a", 8), node("b", 8), node("c", 4), node("d", 7), node("e", 4))
    assert run_gang(state, "big", 16) == {"a": 8, "b": 8}
    # The main pool (8-GPU nodes: 16 GPUs, against 12 in 4-GPU ones) is full now.
    answer = state.filter(pod_info(worker("k", 0, 4)), sorted(state.nodes))
    assert answer.admitted == []
    assert set(answer.unresolvable) == {"c", "d", "e"}
    assert "not in PowerFlow's GPU pool (NVIDIA-A100-SXM4-40GB, 8 per node)" in str(answer)


def test_the_main_pool_follows_the_most_usable_gpus() -> None:
    # 4-GPU pool: c, d (7 allocatable), e, f = 16 GPUs, against 8 in 8-GPU nodes. The
    # 8-GPU node serves the 4-GPU pool too (as a 4-GPU node: the plan counts no more).
    state = state_of(node("a", 8), node("c", 4), node("d", 7), node("e", 4), node("f", 4))
    big = run_gang(state, "j", 16)
    assert sorted(big.values()) == [4, 4, 4, 4]
    rest = run_gang(state, "k", 4)
    assert len(rest) == 1 and not rest.keys() & big.keys()
    assert state.filter(pod_info(worker("m", 0, 1)), sorted(state.nodes)).admitted == []


def test_products_are_not_mixed_within_a_pool() -> None:
    state = state_of(node("a", 8, A100), node("b", 8, H100), node("c", 8, A100))
    assert run_gang(state, "j", 16) == {"a": 8, "c": 8}


def test_others_gpu_pods_count_as_taken_on_a_node_of_the_pool() -> None:
    foreign = pod("notebook", gpus=6, node_name="a")
    state = state_of(node("a", 8), node("b", 8), node("c", 8), pods=(foreign,))
    # a: 2 GPUs left, taken first by a gang of 2 (best fit), never by one of 4.
    assert run_gang(state, "two", 2) == {"a": 2}
    assert "a" not in run_gang(state, "four", 4)


def test_nodes_that_can_never_host_the_gang_are_unresolvable() -> None:
    state = state_of(node("a", 4), node("b", 4), cordoned("c", 4))
    too_big = state.filter(pod_info(worker("j", 0, 2, gpus=8)), ["a", "b", "c"])
    assert too_big.failed == {} and set(too_big.unresolvable) == {"a", "b", "c"}
    assert "can never fit" in too_big.unresolvable["a"]
    run_gang(state, "full", 8)
    waiting = state.filter(pod_info(worker("k", 0, 4)), ["a", "b", "c"])
    # a and b could host it once the gang that fills them ends; c is cordoned.
    assert set(waiting.failed) == {"a", "b"} and set(waiting.unresolvable) == {"c"}


def test_a_node_with_an_absurd_gpu_count_is_no_gpu_node() -> None:
    """``10**400`` allocatable GPUs once made a pool of 2**1328-GPU nodes (and a set of
    that many indices for the first node a pod could not use)."""
    absurd = node("x", 8)
    absurd["status"]["allocatable"]["nvidia.com/gpu"] = str(10**400)
    state = state_of(absurd, node("a", 8), cordoned("b"))
    assert run_gang(state, "j", 8) == {"a": 8}
    assert state.pool_view().members == {"a"}


def test_nodes_that_others_fill_are_failed_not_unresolvable() -> None:
    """The reviewer's probe: two 8-GPU A100 nodes full of lower-priority pods of others and
    an idle 4-GPU T4 node. Pooled by free GPUs, the T4 became the main pool, so a gang of 8
    "could never fit" anywhere and kube-scheduler's preemption never freed the A100s."""
    foreign = (
        pod("f1", gpus=8, node_name="a", phase="Running"),
        pod("f2", gpus=8, node_name="b", phase="Running"),
    )
    nodes = (node("a", 8), node("b", 8), node("t", 4, product="Tesla-T4"))
    state = state_of(*nodes, pods=foreign)
    answer = state.filter(pod_info(worker("j", 0, 8)), ["a", "b", "t"])
    assert answer.admitted == []
    assert set(answer.failed) == {"a", "b"} and set(answer.unresolvable) == {"t"}
    assert "not in PowerFlow's GPU pool (NVIDIA-A100-SXM4-40GB, 8 per node)" in str(answer)


def test_the_main_pool_does_not_change_as_others_pods_come_and_go() -> None:
    nodes = (node("a", 8), node("b", 8), node("t", 4, product="Tesla-T4"))
    state = state_of(*nodes)
    idle = state.pool_view().pool
    assert idle is not None and idle.key == (A100, 8) and idle.nodes == ("a", "b")
    for name in ("a", "b"):
        state.upsert_pod(pod(f"other-{name}", gpus=8, node_name=name, phase="Running"))
        assert state.pool_view().pool == idle
    assert state.pool_view().taken == {"a": 8, "b": 8}
    state.delete_pod(pod("other-a", gpus=8, node_name="a", phase="Running"))
    assert state.pool_view().pool == idle and state.pool_view().taken == {"b": 8}
    # The freed node takes the gang; the T4 node never does.
    assert run_gang(state, "j", 8) == {"a": 8}
