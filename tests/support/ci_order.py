"""How the suite splits over pytest-xdist's workers (``pytest -n auto --dist loadgroup``;
not the default, see docs/verification.md "CI time"): the twin's tests run one at a
time, and first.

A test that starts a twin (``powerflow.twin``: an API server, the operator, the
extender and the node agents, as processes, against a real-time, time-scaled trace)
is load-sensitive: two at once on a 2-core machine starve each other's components.
So they share one xdist group (one worker runs them, in turn), and they come first:
the group is the suite's longest unit of work, so starting it early lets the other
worker(s) run everything else beside it; started last, it would run alone at the end.
Twin tests mostly wait on real time, so a CPU-bound test beside one costs it little.
"""

from __future__ import annotations

import pytest

TWIN_GROUP = "twin"


def starts_a_twin(item: pytest.Item) -> bool:
    """By file: tests/test_twin*.py and tests/test_demo.py (``powerflow demo`` runs the
    twin). A new twin test file named so joins the group by itself."""
    name = item.path.name
    return name.startswith("test_twin") or name == "test_demo.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every twin test into ``TWIN_GROUP`` and move them first (stable otherwise)."""
    for item in items:
        if starts_a_twin(item):
            item.add_marker(pytest.mark.xdist_group(TWIN_GROUP))
    items.sort(key=lambda item: not starts_a_twin(item))
