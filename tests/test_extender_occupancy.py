"""The state's occupancy, kept up to date as gangs come and go, equals the plain scan.

``ClusterState.occupied`` (what a new gang's reservation is chosen around)
starts from the union of every live block, which ``Reservations`` keeps as
gangs are set, deleted and shrunk. Random runs of scheduling, binding,
deleting, expiring, forgetting and relisting check it against rebuilding it
slot by slot from every gang's current block.
"""

from __future__ import annotations

from typing import Any

import pytest
from extender_bodies import dljob, node, pod
from hypothesis import given, settings
from hypothesis import strategies as st
from powerflow.extender.objects import placement_annotation, pod_info
from powerflow.extender.placing import occupied_indices
from powerflow.extender.state import ClusterState

from powerflow.core.contract import PLACEMENT_ANNOTATION

NODES = [node(f"n{i}", 8) for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slot_by_slot(state: ClusterState) -> dict[str, set[int]]:
    """The occupancy as first written: every slot of every block, then the GPUs outside.

    In the main pool's geometry: its nodes have ``per_node`` GPUs; other pods' GPUs beyond
    the node's spare ones, and PowerFlow workers of gangs no longer reserved, are taken on
    the lowest free indices, as is every block index past ``per_node``.
    """
    slots: dict[str, set[int]] = {}
    for gang in state.gangs.values():
        for name, index in gang.block:
            slots.setdefault(name, set()).add(index)
    view = state.pool_view()
    if view.pool is None:
        return slots
    cap = view.pool.per_node
    extra: dict[str, int] = {}
    for name in view.members:
        entry = state.nodes[name]
        foreign = sum(
            i.gpus for i in state.pods.values() if i.bound and i.gang is None and i.node == name
        )
        extra[name] = min(cap, max(0, foreign - (entry.gpus - cap)))
    for info in state.pods.values():
        if info.bound and info.gang is not None and info.gang not in state.gangs:
            extra[info.node] = extra.get(info.node, 0) + info.gpus
    for name, count in extra.items():
        if name not in view.members:
            continue
        held = slots.get(name, set())
        count += len({i for i in held if i >= cap})
        if count or any(i >= cap for i in held):
            slots[name] = occupied_indices(cap, {i for i in held if i < cap}, count)
    return slots


steps = st.lists(
    st.one_of(
        st.tuples(st.just("gang"), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 2])),
        st.tuples(st.just("foreign"), st.integers(0, 5), st.integers(1, 4)),
        st.tuples(st.just("delete"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("expire"), st.just(0), st.just(0)),
        st.tuples(st.just("relist"), st.just(0), st.just(0)),
        st.tuples(st.just("forget"), st.integers(0, 1000), st.integers(0, 2)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(steps=steps, bind_fraction=st.floats(0.0, 1.0))
def test_cached_occupancy_equals_the_slot_by_slot_scan(
    steps: list[tuple[str, int, int]], bind_fraction: float
) -> None:
    clock = Clock()
    state = ClusterState(ttl_s=30.0, clock=clock)
    state.replace(NODES, [])
    bodies: dict[tuple[str, str], dict[str, Any]] = {}
    for n, (kind, a, b) in enumerate(steps):
        clock.now += 10.0
        if kind == "gang":
            workers = max(1, a // b)
            for i in range(workers):
                body = pod(f"g{n}-{i}", job=f"g{n}", workers=workers, gpus=b, index=i)
                info = pod_info(body)
                answer = state.filter(info, sorted(state.nodes))
                if not answer.admitted or i >= workers * bind_fraction:
                    break  # the rest of the gang never shows up: its reservation expires
                state.begin_bind(info, answer.admitted[0])
                state.end_bind(info, answer.admitted[0])
                body["spec"]["nodeName"] = answer.admitted[0]
                bodies[info.key] = body
        elif kind == "foreign":
            body = pod(f"f{n}", gpus=b, node_name=f"n{a}")
            state.upsert_pod(body)
            bodies[pod_info(body).key] = body
        elif kind == "delete" and bodies:
            key = sorted(bodies)[a % len(bodies)]
            state.delete_pod(bodies.pop(key))
        elif kind == "expire":
            clock.now += 60.0
            state.expire()
        elif kind == "relist":
            state.replace(NODES, list(bodies.values()))
        elif kind == "forget" and state.gangs:
            key = sorted(state.gangs)[a % len(state.gangs)]
            if b == 0:
                del state.gangs[key]
            elif b == 1:
                state.gangs.pop(key)
            else:
                state.gangs.clear()
        assert state.occupied() == slot_by_slot(state)


def test_a_shrunk_reservation_frees_its_slots() -> None:
    """Expiry replaces a gang's block: the cached grouping must follow it."""
    clock = Clock()
    state = ClusterState(ttl_s=30.0, clock=clock)
    state.replace(NODES, [])
    first = pod_info(pod("w-0", job="w", workers=4, gpus=2, index=0))
    where = state.filter(first, sorted(state.nodes)).admitted[0]
    assert len(state.occupied()[where]) == 8
    state.begin_bind(first, where)
    state.end_bind(first, where)
    clock.now += 60.0
    state.expire()
    assert len(state.occupied()[where]) == 2


def test_changes_that_would_bypass_the_union_are_refused() -> None:
    state = ClusterState()
    state.replace(NODES, [])
    info = pod_info(pod("w-0", job="w", workers=2, gpus=2))
    state.filter(info, sorted(state.nodes))
    gang = state.gangs[info.gang]  # type: ignore[index]
    for change in (
        lambda: state.gangs.update({gang.key: gang}),
        lambda: state.gangs.setdefault(gang.key, gang),
        lambda: state.gangs.popitem(),
    ):
        with pytest.raises(TypeError, match="Reservations change only"):
            change()
    assert state.occupied() == slot_by_slot(state) != {}
    assert state.gangs.pop(gang.key) is gang and state.gangs.pop(gang.key, None) is None
    assert state.occupied() == {}


def bound(body: dict[str, Any], where: str, block: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """``body`` bound to ``where`` with ``block`` as its placement annotation."""
    meta = body["metadata"]
    notes = {**meta["annotations"], PLACEMENT_ANNOTATION: placement_annotation(where, block)}
    return {
        **body,
        "metadata": {**meta, "annotations": notes},
        "spec": {**body["spec"], "nodeName": where},
    }


def newcomer_block(state: ClusterState, name: str) -> set[tuple[str, int]]:
    """The block a new 4-GPU gang ``name`` is given (its reservation dropped again)."""
    info = pod_info(pod(f"{name}-0", job=name, workers=4, index=0))
    assert state.filter(info, sorted(state.nodes)).admitted
    assert info.gang is not None
    return set(state.gangs.pop(info.gang).block)


def test_a_worker_bound_outside_its_gangs_reservation_keeps_its_block_taken() -> None:
    """An extender restarted while its bind was in flight: it lists the gang's workers
    unbound and reserves the gang a block; the earlier bind then lands, on another
    block of the same node. Both blocks are held by the gang's workers, and a new
    gang gets neither (it was handed the landed one: two gangs on one GPU), after a
    relist too."""
    state = ClusterState()
    job = dljob("k", gpus=4)
    bodies = [pod(f"k-{i}", job="k", workers=4, index=i, owner=job) for i in range(4)]
    state.replace(NODES, bodies, [job])
    second = pod_info(bodies[1])
    where = state.filter(second, sorted(state.nodes)).admitted[0]
    state.begin_bind(second, where)
    state.end_bind(second, where)
    assert second.gang is not None
    reserved = state.gangs[second.gang].block
    landed = tuple((where, i) for i in range(8) if (where, i) not in reserved)[:4]
    first = bound(bodies[0], where, landed)
    both = {i for _, i in reserved + landed}
    for relist in (False, True):
        if relist:
            state.replace(NODES, [first, *bodies[1:]], [job])
        else:
            state.upsert_pod(first)
        assert state.occupied()[where] >= both
        given = newcomer_block(state, f"l{relist:d}")
        assert not given & set(reserved + landed), (relist, given)


def test_a_restart_after_the_stray_bind_landed_keeps_both_blocks_taken() -> None:
    """A fresh extender lists a gang whose workers sit on two blocks of one node (one
    worker bound by a bind that landed late): it adopts the gang on one block, and the
    other stays taken too."""
    job = dljob("k", gpus=4)
    bodies = [pod(f"k-{i}", job="k", workers=4, index=i, owner=job) for i in range(4)]
    low, high = tuple(("n0", i) for i in range(4)), tuple(("n0", i) for i in range(4, 8))
    listed = [bound(bodies[0], "n0", high), *(bound(b, "n0", low) for b in bodies[1:])]
    for order in (listed, listed[::-1]):
        state = ClusterState()
        state.replace(NODES, order, [job])
        assert len(state.gangs) == 1  # adopted, on one of the two blocks
        assert state.occupied()["n0"] == set(range(8))
        assert not newcomer_block(state, "l") & set(low + high)


def test_a_stray_worker_of_an_expired_gang_keeps_its_gpus() -> None:
    """A gang reserved on one node whose only bound worker landed on another: expiry
    finds no bound worker in the reservation and drops it; the worker's GPUs, named by
    its placement, stay taken exactly (not one GPU on the lowest free index)."""
    clock = Clock()
    state = ClusterState(ttl_s=30.0, clock=clock)
    job = dljob("k", gpus=4)
    bodies = [pod(f"k-{i}", job="k", workers=4, index=i, owner=job) for i in range(4)]
    state.replace(NODES, bodies, [job])
    second = pod_info(bodies[1])
    state.filter(second, sorted(state.nodes))
    assert second.gang is not None
    reserved = state.gangs[second.gang].block
    elsewhere = next(
        n["metadata"]["name"] for n in NODES if n["metadata"]["name"] != reserved[0][0]
    )
    landed = tuple((elsewhere, i) for i in range(4, 8))
    state.upsert_pod(bound(bodies[0], elsewhere, landed))
    clock.now += 60.0
    assert state.expire() == [second.gang] and second.gang not in state.gangs
    assert state.occupied()[elsewhere] >= {4, 5, 6, 7}
    taken = set(landed)
    for name in ("l", "m"):  # two more gangs: neither on the stray's GPUs
        info = pod_info(pod(f"{name}-0", job=name, workers=4, index=0))
        assert state.filter(info, sorted(state.nodes)).admitted
        assert info.gang is not None
        block = set(state.gangs[info.gang].block)
        assert not block & taken, block
        taken |= block


def test_a_shrunk_reservation_is_no_stray() -> None:
    """Expiry shrank a gang's block to its bound worker's GPU; a relist then reads that
    worker's placement, the whole first block: the GPUs expiry freed stay free."""
    clock = Clock()
    state = ClusterState(ttl_s=30.0, clock=clock)
    bodies = [pod(f"k-{i}", job="k", workers=4, gpus=1, index=i) for i in range(4)]
    state.replace(NODES, bodies)
    first = pod_info(bodies[0])
    where = state.filter(first, sorted(state.nodes)).admitted[0]
    assert first.gang is not None
    block = state.gangs[first.gang].block
    state.begin_bind(first, where)
    state.end_bind(first, where)
    clock.now += 60.0
    state.expire()
    kept = state.gangs[first.gang].block
    assert len(kept) == 1
    state.replace(NODES, [bound(bodies[0], where, block), *bodies[1:]])
    assert state.occupied()[where] == {i for _, i in kept}


def test_a_placement_a_tenant_wrote_takes_no_gpus_of_its_naming() -> None:
    """A pod with the job label and a placement naming a whole node, but no DLJob's
    worker (no owner, no generation): counted as the one GPU it requests, on the
    lowest free index, as before; not as the eight its placement names."""
    state = ClusterState()
    state.replace(NODES, [])
    forged = bound(
        pod("x-0", job="x", workers=1, index=0), "n0", tuple(("n0", i) for i in range(8))
    )
    state.upsert_pod(forged)
    assert len(state.occupied().get("n0", ())) == 1
    wide = bound(
        pod("y-0", job="y", workers=1, index=0), "n1", tuple(("n1", i) for i in range(200))
    )
    state.upsert_pod(wide)
    assert len(state.occupied().get("n1", ())) == 1
