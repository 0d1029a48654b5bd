"""Find the kmock reaction for a request without rescanning the request log.

kmock 0.8 (``apps.RawHandler._handle``) decides whether a reaction sees a request
with ``request in reaction._source``: it replays the *whole* request log through the
reaction's filters and looks for the request by identity. That is right for any
view (slices, groups and exclusions depend on the other requests), but it makes
every request cost the length of the log times the number of reactions: a test
emulator that keeps its log for assertions (20 operator restarts and 20 jobs: tens
of thousands of requests) spent about 90 % of its CPU there (py-spy,
docs/verification.md "CI time").

A reaction whose chain is only criteria (``Filter``) and priorities (``Priority``)
up to this handler's root sees a request exactly when every criterion accepts it,
so for such a chain one pass over the chain answers. Any other view in the chain
(slices, ``|``/``&`` groups, exclusions, streams) falls back to kmock's scan, so
the answer never differs from kmock's (``tests/test_kube_emulator_reactions.py``).
"""

from __future__ import annotations

from typing import Any

import aiohttp.web
from kmock._internal import apps, dsl, rendering


def sees(root: dsl.Root, view: dsl.View, request: rendering.Request) -> bool:
    """Whether ``view`` (a reaction's source) sees ``request``, which ``root`` logged.

    The criteria are applied innermost first, as kmock's scan applies them (each
    filter sees only what its source let through): ``kmock["post"][fn]`` never calls
    ``fn`` on a GET."""
    criteria = []
    node: dsl.View = view
    while node is not root:
        kind = type(node)
        if kind is dsl.Filter:
            criteria.append(node.criteria)  # type: ignore[attr-defined]
        elif kind is not dsl.Priority:
            return request in view  # kmock's scan: the view needs the other requests
        node = node._source  # type: ignore[attr-defined]
    return all(criterion(request) for criterion in reversed(criteria))


async def react(root: apps.RawHandler, request: rendering.Request) -> aiohttp.web.StreamResponse:
    """``apps.RawHandler._handle`` with ``sees`` for the membership test: the payloads in
    the same priority order, the same handling of mismatch, depletion and
    non-actionable reactions, the same error when none answers."""
    payloads: list[Any] = root._payloads
    priorities = [payload.priorities for payload in payloads]
    width = max((len(priority) for priority in priorities), default=0)
    keys = [tuple(-p for p in priority) + (0,) * (width - len(priority)) for priority in priorities]
    order = sorted(range(len(payloads)), key=lambda index: keys[index])
    # A snapshot, as kmock's: a reaction replaced while one answers (``r << x`` swaps it
    # in place in the list) is not tried in the same round.
    for payload in [payloads[index] for index in order]:
        if payload._disabled.is_set() or not sees(root, payload._source, request):
            continue
        try:
            response: aiohttp.web.StreamResponse = await payload(request)
            return response
        except rendering.ReactionMismatchError:  # either mismatch or depletion
            payload._disabled.set()
        except NotImplementedError:  # matched, but non-actionable (nothing to respond with)
            pass
    raise NotImplementedError(
        "Undefined server behaviour: no reaction matching the request is defined. "
        "Consider adding a catch-all fallback reaction: `kmock.fallback << 404`."
    )
