"""A kopf watcher whose cancellation kopf swallows is cancelled again
(``operator/stuck_watchers.py``).

The swallowing is kopf's own ``streaming_block`` (nolar/kopf#1168), driven here as
its watcher drives it: a stream that ends (a 410), then the next one. A cancellation
that lands while the block's cleanup awaits its pause waiter is lost, and the
watcher goes on; in the operator that made a stop wait forever (seen under the API
faults test's ending watches).
"""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet
from kopf._cogs.clients.watching import streaming_block
from kopf._cogs.structs.references import Resource
from powerflow.operator.stuck_watchers import WATCHER_PREFIX, recancel_stuck_watchers

PODS = Resource(group="", version="v1", plural="pods")


async def ending_streams(stream_ended: asyncio.Event, streams: list[int]) -> None:
    """A kopf watcher's loop: each stream is read until it ends, then the next one."""
    paused = ToggleSet(any)
    while True:
        async with streaming_block(resource=PODS, namespace=None, operator_paused=paused):
            streams.append(1)
            await stream_ended.wait()  # the stream, read until its 410
            stream_ended.clear()


async def cancel_in_the_blocks_cleanup(
    task: asyncio.Task[None], stream_ended: asyncio.Event
) -> None:
    """End the stream, let the watcher reach the block's cleanup, and cancel it there."""
    await asyncio.sleep(0.05)
    stream_ended.set()
    await asyncio.sleep(0)  # the watcher leaves its stream: it now awaits its pause waiter
    task.cancel()


async def test_kopfs_block_swallows_a_cancellation_that_lands_in_its_cleanup() -> None:
    """Without the re-cancel, the watcher outlives its cancellation: what the fix is for."""
    stream_ended, streams = asyncio.Event(), []
    task = asyncio.create_task(ending_streams(stream_ended, streams), name=f"{WATCHER_PREFIX}pods")
    await cancel_in_the_blocks_cleanup(task, stream_ended)
    await asyncio.sleep(0.5)
    assert not task.done() and task.cancelling() == 1 and len(streams) == 2
    task.cancel()  # now it waits on its stream: this one ends it
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


async def test_a_watcher_that_outlived_its_cancellation_is_cancelled_again() -> None:
    stream_ended, streams = asyncio.Event(), []
    task = asyncio.create_task(ending_streams(stream_ended, streams), name=f"{WATCHER_PREFIX}pods")
    recancel = asyncio.create_task(recancel_stuck_watchers(stuck_s=0.2, every_s=0.05))
    try:
        await cancel_in_the_blocks_cleanup(task, stream_ended)
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
        assert task.cancelled()
    finally:
        recancel.cancel()


async def test_other_tasks_and_watchers_not_cancelled_are_left_alone() -> None:
    """A task that takes its time over a cancellation (a Lease's release) and a watcher
    at work are not cancelled by it."""
    released = asyncio.Event()

    async def releasing() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.6)  # the release, which must not be cut short
            released.set()
            raise

    slow = asyncio.create_task(releasing(), name="powerflow-lease")
    watcher = asyncio.create_task(asyncio.sleep(60), name=f"{WATCHER_PREFIX}nodes")
    recancel = asyncio.create_task(recancel_stuck_watchers(stuck_s=0.2, every_s=0.05))
    try:
        await asyncio.sleep(0.05)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        assert released.is_set()
        assert not watcher.done()
    finally:
        watcher.cancel()
        recancel.cancel()
