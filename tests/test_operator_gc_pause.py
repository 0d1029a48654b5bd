"""``gc_pause.paused``: the collector is off inside, back as it was after, and a pass
decides the same with it as without it."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from powerflow.operator import gc_pause
from powerflow.operator.actions import Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import JobRequest, RequestCache
from powerflow.operator.pass_inputs import PassMemory
from powerflow.operator.reconcile import reconcile

from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Node
from powerflow.lab.synthetic import SyntheticModel, synthetic_zoo


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_inside_on_after_with_the_young_generation_empty() -> None:
    with gc_pause.paused():
        assert not gc.isenabled()
        junk = [[] for _ in range(5000)]
        assert gc.get_count()[0] >= 5000  # nothing collected them
    assert gc.isenabled()
    assert gc.get_count()[0] < 100
    del junk


def test_what_the_block_built_goes_to_the_oldest_generation_unwalked() -> None:
    with gc_pause.paused():
        kept = [[] for _ in range(1000)]
    young = {id(o) for generation in (0, 1) for o in gc.get_objects(generation)}
    assert not any(id(x) in young for x in kept)
    assert any(o is kept for o in gc.get_objects(2))
    assert gc.get_freeze_count() == 0  # promoted, not left frozen


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_a_cycle_made_inside_is_still_collected() -> None:
    with gc_pause.paused():
        node = _Node()
        gone = weakref.ref(node)
        del node
    assert gone() is not None  # a cycle: only the collector frees it
    gc.collect()
    assert gone() is None


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    with gc_pause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_back_on_after_an_exception() -> None:
    with pytest.raises(ValueError), gc_pause.paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_nested_and_threads_resume_when_the_last_leaves() -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_pause.paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with gc_pause.paused():
        with gc_pause.paused():
            pass
        assert not gc.isenabled()  # the inner block left, the outer one has not
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    thread.join(10)
    assert gc.isenabled()


def dljob(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"j{i}", "namespace": "ml", "uid": f"u{i}", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 1000 + 10 * i,
            "gpus": {"requested": 1 << (i % 3), "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


def test_a_pass_decides_the_same_with_the_collector_held_off() -> None:
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(8))
    zoo = synthetic_zoo(4, seed=0)
    observed = [Observed(dljob(i)) for i in range(48)]  # type: ignore[arg-type]
    budget = parse_budget({"eta": "0.7"})

    def model(job: JobRequest) -> SyntheticModel:
        return zoo[int(job.name[1:]) % len(zoo)]

    def run() -> Any:
        actions = reconcile(
            observed,
            nodes,
            budget,
            1e6,
            PowerFlowPolicy(),
            model,
            PassMemory(requests=RequestCache()),
        )
        return (actions.create, actions.status, actions.status_first, actions.events,
                actions.plan, actions.anchors, actions.wake_at_s)  # fmt: skip

    plain = run()
    with gc_pause.paused():
        paused = run()
    assert paused == plain
    assert any(b["kind"] == "Pod" for b in plain[0])
