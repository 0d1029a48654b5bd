"""Gang placement through the extender's state: what kube-scheduler would end up doing.

``schedule`` plays kube-scheduler for one pod: filter, prioritize, take the
best admitted node (first on ties, as any tie-break would do), bind. The
decisions themselves come from the core's buddy allocation; these tests pin
what the extender makes of them for whole gangs.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from extender_bodies import dljob, node, pod
from powerflow.extender.objects import GangKey, pod_info
from powerflow.extender.state import ClusterState, NotSynced
from powerflow.operator.workers import planned_block_annotation

from powerflow.core.contract import (
    API_VERSION,
    KIND,
    PLACEMENT_ANNOTATION,
    PLANNED_BLOCK_ANNOTATION,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(nodes: int, gpus: int = 8, ttl_s: float = 60.0) -> tuple[ClusterState, FakeClock]:
    clock = FakeClock()
    state = ClusterState(ttl_s=ttl_s, clock=clock)
    state.replace([node(f"n{i}", gpus) for i in range(nodes)], [])
    return state, clock


def schedule(state: ClusterState, body: dict[str, Any]) -> str | None:
    """One scheduling cycle and its bind, as kube-scheduler runs them against the extender."""
    info = pod_info(body)
    candidates = sorted(state.nodes)
    answer = state.filter(info, candidates)
    if not answer.admitted:
        return None
    assert set(answer.admitted) | set(answer.failed) | set(answer.unresolvable) == set(candidates)
    scores = dict(state.prioritize(info, answer.admitted))
    best = max(answer.admitted, key=lambda n: scores[n])
    state.begin_bind(info, best)
    state.end_bind(info, best)
    return best


def gang(job: str, workers: int, gpus: int = 1, **kw: Any) -> list[dict[str, Any]]:
    prefix = f"{job}-g{kw['generation']}" if "generation" in kw else job
    return [
        pod(f"{prefix}-{i}", job=job, workers=workers, gpus=gpus, index=i, **kw)
        for i in range(workers)
    ]


def test_gang_of_four_on_eight_gpu_nodes_lands_on_one_node() -> None:
    state, _ = cluster(4)
    placed = [schedule(state, p) for p in gang("a", 4)]
    assert None not in placed
    assert len(set(placed)) == 1


def test_sixteen_workers_take_two_whole_nodes() -> None:
    state, _ = cluster(4)
    placed = Counter(schedule(state, p) for p in gang("big", 16))
    assert None not in placed
    assert sorted(placed.values()) == [8, 8]


def test_filter_admits_only_the_block_and_says_why_for_the_rest() -> None:
    state, _ = cluster(4)
    first = pod_info(gang("a", 4)[0])
    answer = state.filter(first, sorted(state.nodes))
    assert len(answer.admitted) == 1 and answer.failed == {}
    # Outside the block no eviction can make room for this worker: unresolvable.
    assert set(answer.unresolvable) == set(state.nodes) - set(answer.admitted)
    assert all("block reserved for gang default/a" in why for why in answer.unresolvable.values())


def test_gang_fills_a_node_before_the_next() -> None:
    state, _ = cluster(4)
    order = [schedule(state, p) for p in gang("big", 16)]
    # Prioritize prefers the fuller node of the block: the first eight land together.
    assert len(set(order[:8])) == 1
    assert len(set(order[8:])) == 1


def test_fragmentation_cannot_strand_gpus_on_two_partly_used_nodes() -> None:
    # Jobs of 4, 2, 2, 4, 1, 1, 2 GPUs (16 in all) on 8-GPU nodes: a first-fit or
    # spreading scheduler leaves two half-used nodes; buddy allocation with
    # best fit packs them into exactly two full nodes.
    state, _ = cluster(4)
    sizes = [4, 2, 2, 4, 1, 1, 2]
    used: Counter[str] = Counter()
    for j, size in enumerate(sizes):
        for p in gang(f"j{j}", size):
            placed = schedule(state, p)
            assert placed is not None
            used[placed] += 1
    assert sorted(used.values()) == [8, 8]
    partial = [n for n, u in used.items() if 0 < u < 8]
    assert len(partial) <= 1


def test_fragmentation_with_finished_jobs_leaves_at_most_one_partial_node() -> None:
    state, _ = cluster(4)
    bodies = {j: gang(f"j{j}", 2) for j in range(8)}
    for members in bodies.values():
        for p in members:
            schedule(state, p)
    # Every other job finishes: 4 two-GPU holes spread over two nodes.
    for j in range(0, 8, 2):
        for p in bodies[j]:
            state.delete_pod(p)
    for p in gang("new", 4):
        assert schedule(state, p) is not None
    per_node = Counter(i.node for i in state.pods.values())
    assert sum(per_node.values()) == 12
    assert all(count % 2 == 0 for count in per_node.values())


def test_concurrent_gangs_do_not_overlap() -> None:
    state, _ = cluster(4)
    a, b, c = gang("a", 8), gang("b", 4), gang("c", 4)
    # Interleave the gangs' workers, as the scheduler's queue may.
    slots_seen: dict[str, set[tuple[str, int]]] = {}
    for trio in zip(a[:4], b, c, strict=True):
        for p in trio:
            assert schedule(state, p) is not None
    for p in a[4:]:
        assert schedule(state, p) is not None
    for key, g in state.gangs.items():
        slots_seen[key.job] = set(g.block)
    assert len(slots_seen["a"]) == 8 and len(slots_seen["b"]) == 4 and len(slots_seen["c"]) == 4
    assert not slots_seen["a"] & slots_seen["b"]
    assert not slots_seen["a"] & slots_seen["c"]
    assert not slots_seen["b"] & slots_seen["c"]
    per_node = Counter(i.node for i in state.pods.values())
    assert max(per_node.values()) <= 8
    # b and c share one node; a has its own.
    assert sorted(per_node.values()) == [8, 8]


def test_pending_reservation_blocks_other_gangs_until_it_expires() -> None:
    state, clock = cluster(1, ttl_s=60.0)
    stuck = gang("stuck", 8)
    assert schedule(state, stuck[0]) is not None  # reserves the whole node, 1 of 8 bound
    other = pod_info(gang("other", 8)[0])
    before = state.filter(other, ["n0"])
    assert before.admitted == []
    assert "no aligned block of 8 free GPUs" in before.failed["n0"]
    clock.now += 61
    # The stuck gang keeps the GPU of its bound worker only: 7 left, not 8.
    assert state.filter(other, ["n0"]).admitted == []
    assert state.expired_total == 1
    assert len(state.gangs[pod_info(stuck[0]).gang].block) == 1  # type: ignore[index]
    smaller = pod_info(gang("small", 4)[0])
    assert state.filter(smaller, ["n0"]).admitted == ["n0"]


def test_reservation_without_bound_workers_expires_entirely() -> None:
    state, clock = cluster(1, ttl_s=30.0)
    first = pod_info(gang("ghost", 8)[0])
    assert state.filter(first, ["n0"]).admitted == ["n0"]
    clock.now += 29
    assert state.filter(pod_info(gang("x", 1)[0]), ["n0"]).admitted == []
    clock.now += 2
    assert state.filter(pod_info(gang("x", 1)[0]), ["n0"]).admitted == ["n0"]
    assert first.gang not in state.gangs


def test_late_worker_of_expired_gang_still_gets_gpus() -> None:
    state, clock = cluster(2, ttl_s=10.0)
    members = gang("slow", 4)
    for p in members[:2]:
        assert schedule(state, p) is not None
    clock.now += 11
    # Another gang arrives after expiry; then the late workers.
    for p in gang("next", 4):
        assert schedule(state, p) is not None
    for p in members[2:]:
        assert schedule(state, p) is not None
    assert len(state.pods) == 8
    per_node = Counter(i.node for i in state.pods.values())
    assert max(per_node.values()) <= 8


def test_complete_gang_never_expires_and_a_replaced_worker_returns_to_its_block() -> None:
    state, clock = cluster(2, ttl_s=10.0)
    members = gang("done", 4)
    nodes = {schedule(state, p) for p in members}
    clock.now += 100
    state.delete_pod(members[1])  # the operator restarts one worker
    assert schedule(state, members[1]) in nodes


def test_gang_is_forgotten_when_its_pods_are_gone() -> None:
    state, _ = cluster(1)
    members = gang("j", 8)
    for p in members:
        schedule(state, p)
    for p in members:
        state.delete_pod(p)
    assert state.gangs == {}
    assert state.filter(pod_info(gang("k", 8)[0]), ["n0"]).admitted == ["n0"]


def test_rescale_generation_is_a_new_gang() -> None:
    state, _ = cluster(2)
    old = gang("j", 4, generation="1")
    for p in old:
        schedule(state, p)
    new = gang("j", 8, generation="2")
    new_nodes = {schedule(state, p) for p in new}
    old_nodes = {pod_info(p).node or state.pods[pod_info(p).key].node for p in old}
    assert len(new_nodes) == 1 and new_nodes != old_nodes


def test_other_pods_gpus_are_respected() -> None:
    state, _ = cluster(2)
    foreign = pod("foreign", gpus=4, node_name="n0")
    state.upsert_pod(foreign)
    placed = Counter(schedule(state, p) for p in gang("j", 4))
    # Best fit: the 4 free GPUs of n0, keeping n1 empty (it can be powered down).
    assert placed == {"n0": 4}
    placed = Counter(schedule(state, p) for p in gang("k", 8))
    assert placed == {"n1": 8}


def test_non_power_of_two_gang_is_refused_clearly() -> None:
    state, _ = cluster(2)
    with pytest.raises(Exception, match="power-of-two"):
        state.filter(pod_info(gang("odd", 3)[0]), ["n0", "n1"])


def test_unsynced_state_refuses_to_decide() -> None:
    state = ClusterState()
    with pytest.raises(NotSynced, match="not been listed"):
        state.filter(pod_info(gang("a", 1)[0]), ["n0"])


def test_bind_to_a_node_outside_the_block_is_refused() -> None:
    state, _ = cluster(2)
    info = pod_info(gang("a", 4)[0])
    admitted = state.filter(info, ["n0", "n1"]).admitted
    other = ({"n0", "n1"} - set(admitted)).pop()
    with pytest.raises(Exception, match="no room left"):
        state.begin_bind(info, other)


def test_a_watch_event_older_than_the_bind_never_unbinds_a_worker() -> None:
    """The watch lags the extender's own bind: the pod's pre-bind body (its ADDED or an
    earlier MODIFIED) can arrive after ``end_bind``. A bound pod never becomes unbound
    (``spec.nodeName`` is immutable once set), so that body must not drop the worker
    from its gang: if it did, the reservation's expiry in that window shrank the block
    below the workers bound there (negative room), and filter admitted a node that
    bind then refused ("no aligned block"), as the twin's mini trace showed."""
    state, clock = cluster(2, ttl_s=120.0)
    members = gang("bert", 16, generation="9")
    first = schedule(state, members[0])
    assert first is not None and schedule(state, members[1]) == first
    state.upsert_pod(members[0])  # the lagging pre-bind event of the worker just bound
    clock.now += 121  # the reservation lapses while the lagging event is applied
    assert schedule(state, members[2]) is not None
    bound = dict(members[0], spec=dict(members[0]["spec"], nodeName=first))
    state.upsert_pod(bound)  # the bind's own event, at last
    key = pod_info(members[0]).gang
    assert key is not None
    assert min(state.room(state.gangs[key]).values()) >= 0
    assert state.pods[pod_info(members[0]).key].node == first
    for p in members[3:]:
        assert schedule(state, p) is not None


def test_a_gang_whose_binds_all_failed_still_expires() -> None:
    """Every worker's bind was attempted (so each was assumed) and every one failed: the
    gang has no worker placed, so its reservation lapses after the TTL like any pending
    one; it is not settled (kept for ever) by binds that did not happen."""
    state, clock = cluster(1, ttl_s=30.0)
    members = [pod_info(body) for body in gang("failing", 8)]
    for body in gang("failing", 8):
        state.upsert_pod(body)  # the watch sees the pending workers
    for info in members:  # kube-scheduler binds asynchronously: all are in flight at once
        assert state.filter(info, ["n0"]).admitted == ["n0"]
        state.begin_bind(info, "n0")
    for info in members:
        state.end_bind(info, None)  # the API refused every binding
    clock.now += 31
    other = pod_info(gang("other", 8)[0])
    assert state.filter(other, ["n0"]).admitted == ["n0"]
    assert members[0].gang not in state.gangs
    assert state.expired_total == 1


def test_a_pod_deleted_while_its_bind_was_in_flight_holds_no_gpus() -> None:
    """The watch delivers the pod's deletion (a rescale) before the extender handles its
    bind's 201: the bind must not put the pod back in the cache, where no event would ever
    remove it and its GPUs (and its gang's block) would stay taken."""
    state, _ = cluster(1)
    body = gang("gone", 8)[0]
    state.upsert_pod(body)
    info = pod_info(body)
    assert state.filter(info, ["n0"]).admitted == ["n0"]
    state.begin_bind(info, "n0")
    state.delete_pod({**body, "spec": {**body["spec"], "nodeName": "n0"}})
    state.end_bind(info, "n0")  # the binding was committed (201) before the deletion
    assert state.pods == {} and state.gangs == {}
    assert state.filter(pod_info(gang("next", 8)[0]), ["n0"]).admitted == ["n0"]


def owned(body: dict[str, Any], uid: str) -> dict[str, Any]:
    """The worker as the operator creates it: its DLJob is its controller."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": "a", "uid": uid, "controller": True}
    body["metadata"]["ownerReferences"] = [ref]
    return body


def test_a_pod_no_dljob_controls_takes_no_gpu_of_that_jobs_gang() -> None:
    """A tenant's pod that copies a job's label and generation is a gang of its own: the
    job's workers still find their whole block."""
    state, _ = cluster(1)
    workers = [owned(p, "uid-a") for p in gang("a", 4, generation="1")]
    assert schedule(state, workers[0]) == "n0"
    stray = gang("a", 4, generation="1")[1]
    stray["metadata"]["name"] = "stray"
    assert schedule(state, stray) == "n0"  # the node's other four GPUs
    assert [schedule(state, w) for w in workers[1:]] == ["n0"] * 3
    assert sorted(key.owner for key in state.gangs) == ["", "uid-a"]
    assert len(state.gangs[GangKey("default", "a", "1", "uid-a")].block) == 4


def test_an_adopted_gang_is_no_larger_than_its_dljobs_allocation() -> None:
    """After a restart, bound workers whose annotations claim a gang of eight and a block
    of eight GPUs, while their DLJob's allocation says four: four are reserved, so the
    node's other GPUs stay free for other gangs."""
    block = json.dumps({"node": "n0", "block": [["n0", i] for i in range(8)]})
    pods = []
    for body in gang("a", 8, generation="1")[:2]:
        owned(body, "uid-a")
        body["metadata"]["annotations"][PLACEMENT_ANNOTATION] = block
        body["spec"]["nodeName"] = "n0"
        pods.append(body)
    job = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "a", "namespace": "default", "uid": "uid-a"},
        "status": {"allocation": {"generation": 1, "gpus": 4}},
    }
    state, _ = cluster(1)
    state.replace([node("n0", 8)], pods, [job])
    (adopted,) = state.gangs.values()
    assert adopted.workers == 4 and len(adopted.block) == 4
    assert schedule(state, pod("other-0", job="other", workers=4)) == "n0"


def planned(body: dict[str, Any], *slots: tuple[str, int]) -> dict[str, Any]:
    """The worker as the operator creates it: with its plan's block."""
    block = planned_block_annotation(slots)
    body["metadata"]["annotations"][PLANNED_BLOCK_ANNOTATION] = block
    return body


def test_a_gang_takes_its_planned_block_when_it_is_free() -> None:
    """Best fit alone puts a 2-GPU gang on the busier n0; the plan says n1's last two."""
    state, _ = cluster(2)
    for p in gang("a", 4):
        schedule(state, p)
    placed = [schedule(state, planned(p, ("n1", 6), ("n1", 7))) for p in gang("b", 2)]
    assert placed == ["n1", "n1"]
    assert set(state.gangs[GangKey("default", "b", "")].block) == {("n1", 6), ("n1", 7)}


@pytest.mark.parametrize(
    "slots",
    [
        (("n0", 0), ("n0", 1)),  # held by a
        (("n1", 1), ("n1", 2)),  # not an aligned block
        (("n1", 6),),  # not the gang's size
        (("n9", 0), ("n9", 1)),  # no such node
    ],
)
def test_a_planned_block_that_is_taken_or_not_a_block_is_ignored(
    slots: tuple[tuple[str, int], ...],
) -> None:
    state, _ = cluster(2)
    for p in gang("a", 4):
        schedule(state, p)
    placed = [schedule(state, planned(p, *slots)) for p in gang("b", 2)]
    assert placed == ["n0", "n0"]  # the extender's own best fit
    assert set(state.gangs[GangKey("default", "b", "")].block) == {("n0", 4), ("n0", 5)}


def test_a_planned_block_of_whole_nodes_is_taken_out_of_the_pools_alignment() -> None:
    """The plan pairs n1 and n2 (it left out n0, partly held by other pods); in the
    extender's order the aligned pairs are (n0, n1) and (n2, n3), so aligned only there,
    the hint was ignored and the gang went to n2 and n3, away from the plan."""
    state, _ = cluster(4)
    state.upsert_pod(pod("foreign", gpus=1, node_name="n0"))  # n0 partly held
    slots = [(n, i) for n in ("n1", "n2") for i in range(8)]
    placed = [schedule(state, planned(p, *slots)) for p in gang("b", 2, gpus=8)]
    assert placed == ["n1", "n2"]
    assert set(state.gangs[GangKey("default", "b", "")].block) == set(slots)


@pytest.mark.parametrize(
    "slots",
    [
        [*(("n1", i) for i in range(8)), *((n, i) for n in ("n2", "n3") for i in range(4))],
        [(n, i) for n in ("n1", "n9") for i in range(8)],  # no such node
        [(n, i) for n in ("n0", "n1") for i in range(8)],  # n0 partly held
    ],
    ids=["halves", "unknown", "held"],
)
def test_a_planned_block_of_nodes_that_is_not_whole_nodes_is_ignored(
    slots: list[tuple[str, int]],
) -> None:
    """Not whole nodes, or not all free: the extender's own best fit."""
    state, _ = cluster(4)
    state.upsert_pod(pod("foreign", gpus=1, node_name="n0"))
    placed = [schedule(state, planned(p, *slots)) for p in gang("b", 2, gpus=8)]
    assert placed == ["n2", "n3"]  # the extender's own best fit


def test_a_planned_block_on_a_cordoned_node_is_ignored() -> None:
    state, _ = cluster(2)
    cordoned = node("n1")
    cordoned["spec"] = {"unschedulable": True}
    state.upsert_node(cordoned)
    placed = [schedule(state, planned(p, ("n1", 0), ("n1", 1))) for p in gang("b", 2)]
    assert placed == ["n0", "n0"]


def _generation_one(*, bound: bool) -> tuple[ClusterState, tuple[tuple[str, int], ...]]:
    """DLJob ``a``'s generation 1, two workers: bound, or filtered once (its block reserved,
    nothing bound); the state and that block."""
    state, _ = cluster(1)
    first = dljob("a", gpus=2, generation=1)
    state.upsert_job(first)
    old = gang("a", 2, owner=first)
    if bound:
        assert [schedule(state, p) for p in old] == ["n0", "n0"]
    else:
        for body in old:
            state.upsert_pod(body)
        assert state.filter(pod_info(old[0]), ["n0"]).admitted == ["n0"]
    (reserved,) = state.gangs.values()
    return state, reserved.block


def _generation_two(state: ClusterState, block: tuple[tuple[str, int], ...]) -> GangKey:
    """Generation 2 of ``a``, planned on ``block``, scheduled whole; its gang's key."""
    second = dljob("a", gpus=2, generation=2)
    state.upsert_job(second)
    new = [planned(p, *block) for p in gang("a", 2, owner=second, generation="2")]
    assert [schedule(state, p) for p in new] == ["n0", "n0"]
    key = pod_info(new[0]).gang
    assert key is not None and key.generation == "2"
    return key


def test_a_new_generation_takes_its_planned_block_from_the_last_ones_unplaced_gang() -> None:
    """The operator deleted generation 1's pending workers and created generation 2's,
    planned on the same GPUs; the scheduler asked about a worker of 2 before the watch
    delivered 1's deletions. Generation 1's block, never bound, must not keep 2 from its
    plan: elsewhere, the operator's next pass would move it back (a restart each time)."""
    state, block = _generation_one(bound=False)
    key = _generation_two(state, block)
    assert state.gangs[key].block == block
    assert list(state.gangs) == [key]


def test_an_earlier_generations_placed_worker_keeps_its_gpus() -> None:
    """A worker of generation 1 the extender still sees bound (its deletion not delivered
    yet) may still hold its GPU: generation 2 goes around it."""
    state, block = _generation_one(bound=True)
    key = _generation_two(state, block)
    assert set(state.gangs[key].block).isdisjoint(block)


def test_a_pod_not_of_the_dljob_drops_no_reservation_of_its_job() -> None:
    """A tenant's pod with the job's label and a later generation, but no owner reference
    to the DLJob, is a gang of its own: the job's reservation stays."""
    state, block = _generation_one(bound=False)
    (reserved,) = state.gangs
    forged = planned(gang("a", 2, generation="9")[0], *block)
    state.filter(pod_info(forged), ["n0"])
    assert reserved in state.gangs
    assert len(state.gangs) == 2


def test_a_gang_planned_on_another_pool_is_placed_in_that_pool_only() -> None:
    """The operator plans every pool of a known type: a gang planned on the H100 node goes
    there (not to the main pool, the A100's), one without a plan to the main pool, and
    one planned on the H100 pool while it is full waits there rather than start on an
    A100, whose clocks and power its plan did not choose."""
    clock = FakeClock()
    state = ClusterState(ttl_s=60.0, clock=clock)
    h100 = "NVIDIA-H100-80GB-HBM3"
    state.replace([node("a0", 8), node("h0", 8, h100), node("h1", 4, h100)], [])
    on_h0 = [("h0", i) for i in range(4, 8)]
    placed = [schedule(state, planned(p, *on_h0)) for p in gang("b", 4)]
    assert placed == ["h0"] * 4
    assert set(state.gangs[GangKey("default", "b", "")].block) == set(on_h0)
    assert [schedule(state, p) for p in gang("c", 2)] == ["a0", "a0"]  # no plan: main pool
    # A block of the 4-GPU H100 pool: its own node, not the 8-GPU pool's.
    placed = [schedule(state, planned(p, ("h1", 0), ("h1", 1))) for p in gang("d", 2)]
    assert placed == ["h1", "h1"]
    # The H100 8-GPU pool has 4 GPUs left: a gang of 8 planned there never goes to a0.
    waiting = gang("e", 8)
    info = pod_info(planned(waiting[0], *(("h0", i) for i in range(8))))
    answer = state.filter(info, sorted(state.nodes))
    assert answer.admitted == []
    assert "not in PowerFlow's GPU pool" in answer.unresolvable["a0"]
    assert set(answer.failed) == {"h0"}  # free again once gang b ends
