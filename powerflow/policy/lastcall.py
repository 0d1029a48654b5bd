"""Remember a function's answer for the very tuple of nodes it saw last.

Why: the policy checks and numbers the cluster's nodes at every decision, and
the simulator (like the operator between node changes) hands it the same
tuple of frozen ``Node`` objects each time. An identity check answers that in
one comparison, where hashing 64 nodes for ``lru_cache`` would not be free.
Only tuples are remembered: a list could change after the call. Errors are
never remembered (they propagate before anything is stored).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from powerflow.policy.snapshot import Node

T = TypeVar("T")


def same_nodes_as_last_call(
    fn: Callable[[Sequence[Node]], T],
) -> Callable[[Sequence[Node]], T]:
    """``fn`` answering the very tuple of nodes passed last time from memory."""
    last: tuple[Sequence[Node], T] | None = None

    @functools.wraps(fn)
    def remembered(nodes: Sequence[Node]) -> T:
        nonlocal last
        if last is not None and last[0] is nodes:
            return last[1]
        answer = fn(nodes)
        if type(nodes) is tuple:
            last = (nodes, answer)
        return answer

    return remembered
