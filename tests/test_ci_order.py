"""The suite's split over xdist's workers (``support.ci_order``): every twin test on
one worker, one at a time, first; the others beside it.

The scheduler is xdist's own ``LoadScopeScheduling`` with our scopes, driven here
as xdist's controller drives it (collections in, units out to workers, completions
back), with two stand-in workers: what it hands each worker is what two real
workers would run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.ci_order import (
    TWIN_GROUP,
    pytest_collection_modifyitems,
    pytest_xdist_make_scheduler,
    scope_of,
)


def test_twin_files_are_one_unit_and_the_rest_one_unit_per_test() -> None:
    assert scope_of("tests/test_twin_faults.py::test_x") == TWIN_GROUP
    assert scope_of("tests/test_demo.py::test_y[a-b]") == "tests/test_demo.py::test_y[a-b]"
    assert scope_of("tests/test_cli.py::test_z") == "tests/test_cli.py::test_z"
    assert scope_of("tests/test_twinkle_free.py::t") == TWIN_GROUP  # named so: it joins


@dataclass(eq=False)
class Worker:
    """What the scheduler sees of a worker: its id, the tests sent to it, shutdown."""

    name: str
    sent: list[int] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices
        self.queue += indices

    def send_runtest_all(self) -> None:  # pragma: no cover - only for a single scope
        raise AssertionError("the scheduler sent everything to one worker")

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(dist: str) -> Any:
    option = SimpleNamespace(
        dist=dist, tx=["2*popen"], numprocesses=2, maxprocesses=None, loadscopereorder=True
    )
    return SimpleNamespace(option=option, getvalue=lambda name: getattr(option, name))


def _collected(ids: list[str]) -> list[str]:
    """``ids`` in the order the collection hook leaves them (twin tests first)."""
    items = [SimpleNamespace(path=Path(i.split("::")[0]), nodeid=i) for i in ids]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    return [item.nodeid for item in items]


def test_two_workers_run_every_twin_test_on_one_of_them_first() -> None:
    """xdist's own loadgroup on pytest 9.2 spread marked tests over both workers
    (pytest-dev/pytest-xdist#1386); this scheduler must not."""
    twin = [f"tests/test_twin_{k}.py::test_{j}" for k in "ab" for j in range(3)]
    other = [f"tests/test_{k}.py::test_{j}" for k in ("cli", "policy", "sim") for j in range(4)]
    collection = _collected([*other[:5], *twin[:3], *other[5:], *twin[3:]])
    assert collection[: len(twin)] == sorted(collection[: len(twin)], key=collection.index)
    assert set(collection[: len(twin)]) == set(twin)

    assert pytest_xdist_make_scheduler(_config("load"), None) is None  # xdist's own
    scheduler = pytest_xdist_make_scheduler(_config("loadgroup"), None)
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        scheduler.add_node(w)
    for w in workers:
        scheduler.add_node_collection(w, collection)
    scheduler.schedule()
    while not scheduler.tests_finished:  # each worker finishes one test at a time
        busy = [w for w in workers if w.queue]
        assert busy, "tests left but none sent"
        for w in busy:
            scheduler.mark_test_complete(w, w.queue.pop(0))

    ran = {collection[i]: w.name for w in workers for i in w.sent}
    assert sorted(ran) == sorted(collection)  # each test once
    (twin_worker,) = {ran[t] for t in twin}
    assert {ran[t] for t in other} >= {"gw0", "gw1"} - {twin_worker} != set()
    first = next(w for w in workers if w.name == twin_worker).sent[: len(twin)]
    assert {collection[i] for i in first} == set(twin)  # the twin unit came first there


def test_the_summary_says_when_each_worker_ran_out_and_which_ran_the_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller's hooks as xdist calls them: a report from each worker, then each
    worker going down; the summary line names both and marks the twin's."""
    from support import ci_order

    monkeypatch.setattr(ci_order, "_workers_done", {})
    monkeypatch.setattr(ci_order, "_twin_workers", set())
    clock = iter([100.0, 350.0, 610.0])
    monkeypatch.setattr(ci_order.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(ci_order, "_began", 100.0)

    def node(name: str) -> SimpleNamespace:
        return SimpleNamespace(gateway=SimpleNamespace(id=name))

    ci_order.pytest_runtest_logreport(
        SimpleNamespace(node=node("gw0"), nodeid="tests/test_twin_a.py::t")  # type: ignore[arg-type]
    )
    ci_order.pytest_runtest_logreport(
        SimpleNamespace(node=node("gw1"), nodeid="tests/test_cli.py::t")  # type: ignore[arg-type]
    )
    assert next(clock) == 100.0  # the reports read no clock
    ci_order.pytest_testnodedown(node("gw1"), None)
    ci_order.pytest_testnodedown(node("gw0"), None)
    lines: list[str] = []
    ci_order.pytest_terminal_summary(SimpleNamespace(write_line=lines.append))
    assert lines == ["workers done: gw0 (twin) at 510 s, gw1 at 250 s"]
