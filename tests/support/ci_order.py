"""How the suite splits over pytest-xdist's workers (``-n auto --dist loadgroup``, in
``addopts``): the twin's tests run one at a time, on one worker, and first.

A test that starts a twin (``powerflow.lab.twin``: an API server, the operator, the
extender and the node agents, as processes, against a real-time, time-scaled trace)
is load-sensitive: two at once on a 2-core machine starve each other's components.
So they form one unit of work (one worker runs them, in turn), and it comes first:
it is the suite's longest unit, so starting it early lets the other worker(s) run
everything else beside it; started last, it would run alone at the end. Twin tests
mostly wait on real time, so a CPU-bound test beside one costs it little.

The unit is made by the scheduler (``TwinFirstScheduling``), from the test's file:
xdist's own ``loadgroup`` reads ``xdist_group`` marks by appending ``@group`` to each
test id on the workers, which pytest 9.2 does not let it do (its ids are built
from the collection tree: pytest-dev/pytest-xdist#1386, fix in pytest-xdist#1388), so
the marks would be silently ignored and two twins could run at once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

TWIN_GROUP = "twin"


def starts_a_twin(path: str) -> bool:
    """By file: tests/test_twin*.py. A new twin test file named so joins the group by
    itself. ``tests/test_demo.py`` runs a twin too (``powerflow demo``) but stays out:
    it bounds no time and no count that load could move (the view and the summary are
    checked, the agreement only printed), so it runs beside the group as any busy test
    does, and the group, the suite's longest unit, is the shorter for it."""
    name = path.rsplit("/", 1)[-1]
    return name.startswith("test_twin")


def scope_of(nodeid: str) -> str:
    """The unit of work of a test: ``TWIN_GROUP`` for a twin test, else the test itself."""
    return TWIN_GROUP if starts_a_twin(nodeid.split("::", 1)[0]) else nodeid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Twin tests first (stable otherwise): one process runs them first too, and a
    worker's collection order is the order its units are queued in."""
    items.sort(key=lambda item: not starts_a_twin(str(item.path)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the twin's files as one group (``scope_of``); any other
    ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwinFirstScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return TwinFirstScheduling(config, log)


_began = time.monotonic()
_workers_done: dict[str, float] = {}
_twin_workers: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On xdist's controller: which worker runs the twin's unit."""
    node = getattr(report, "node", None)
    if node is not None and starts_a_twin(report.nodeid.split("::", 1)[0]):
        _twin_workers.add(str(node.gateway.id))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """When each xdist worker ran out of work, from the start of the run: whether the
    twin's unit or the rest sets how long the suite takes."""
    _workers_done[str(node.gateway.id)] = time.monotonic() - _began


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _workers_done:
        ends = ", ".join(
            f"{name}{' (twin)' if name in _twin_workers else ''} at {s:.0f} s"
            for name, s in sorted(_workers_done.items())
        )
        terminalreporter.write_line(f"workers done: {ends}")
