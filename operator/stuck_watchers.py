"""Watch streams that kopf cancels but that go on watching.

kopf (1.45.2) ends a watch stream's ``streaming_block`` by
cancelling its pause waiter and awaiting it under ``contextlib.suppress(CancelledError)``.
A cancellation of the watcher itself that lands on that await is swallowed there: the
watcher opens its next stream as if nothing happened, and kopf's shutdown, which
cancels each task once and then waits, waits for it forever (nolar/kopf#1168, open).
The window is short, but a stream that ends often (410s from an API server that
compacts, a flaky network) meets it: the operator then ignores SIGTERM until the
kubelet kills it after the grace period, and its Lease is left for a successor to
wait out.

``recancel_stuck_watchers`` runs beside kopf and cancels such a watcher again: a
task named as kopf names its watchers, still running ``STUCK_S`` after a cancellation
was asked of it. The new cancellation lands on the stream's read, as nearly every
one does, and ends it. Only kopf's watchers are touched: another task may take its
time over a cancellation (the Lease's release).
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

WATCHER_PREFIX = "watcher for "
"""How kopf names a resource's watcher task (``watcher for pods.v1@None``)."""
STUCK_S = 2.0
"""A watcher still running this long after its cancellation was asked is cancelled
again: a kopf watcher that took the cancellation ends within a loop turn or two."""
EVERY_S = 0.5


async def recancel_stuck_watchers(*, stuck_s: float = STUCK_S, every_s: float = EVERY_S) -> None:
    """Forever (until cancelled): cancel again each kopf watcher that has been
    cancelling for ``stuck_s`` without ending."""
    loop = asyncio.get_running_loop()
    since: dict[asyncio.Task[object], float] = {}
    while True:
        await asyncio.sleep(every_s)
        now = loop.time()
        stuck = {
            task
            for task in asyncio.all_tasks(loop)
            if task.get_name().startswith(WATCHER_PREFIX) and task.cancelling() and not task.done()
        }
        since = {task: since.get(task, now) for task in stuck}
        for task, first in since.items():
            if now - first >= stuck_s:
                log.warning(
                    "%s did not end %.1f s after its cancellation (kopf swallowed it): "
                    "cancelled again",
                    task.get_name(),
                    now - first,
                )
                task.cancel()
                since[task] = now
