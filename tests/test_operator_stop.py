"""The operator stops when told to, whatever arrives in the same moment.

On SIGTERM kopf runs the cleanup handler, which cancels the allocation loop and
then the Lease's election. On Python 3.11, ``asyncio.wait_for`` returns its
awaitable's result instead of raising when the cancel lands in the tick that
awaitable finishes; the loop, waiting for a trigger with ``wait_for``, then went
on as if nothing had happened, the election was never cancelled, and the
operator never stopped (CI: "the operator did not stop within 30 s", its
elector still retrying). The kubelet would have killed it after its grace
period, with the Lease unreleased, so a standby would wait out the Lease.
"""

from __future__ import annotations

import asyncio

import pytest
from powerflow.operator.controller import (
    Controller,
    OperatorConfig,
    default_policy,
    learned_models,
)
from powerflow.operator.kube import Kube
from powerflow.operator.learning import SampleStore
from prometheus_client import CollectorRegistry
from support.kube_emulator import KubeEmulator

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


async def test_the_allocation_loop_stops_when_cancelled_as_a_trigger_wakes_it(
    kube: Kube,
) -> None:
    store = SampleStore(registry=CollectorRegistry())
    controller = Controller(
        kube, OperatorConfig(), default_policy(), learned_models(store), post_events=False
    )
    loop = asyncio.create_task(controller.run())
    for _ in range(3):  # a few rounds: each a trigger and a cancel in the same tick
        await asyncio.sleep(0.2)  # the loop waits for a trigger
        assert not loop.done()
        controller.trigger("an event", immediate=True)
        await asyncio.sleep(0)  # the wait for the trigger ends in this tick...
        loop.cancel()  # ...and the stop lands in it
        done, _ = await asyncio.wait({loop}, timeout=5)
        if not done:
            loop.cancel()
            await asyncio.wait({loop}, timeout=5)
            pytest.fail("the allocation loop went on after it was cancelled")
        assert loop.cancelled()
        loop = asyncio.create_task(controller.run())
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
