"""A failed allocation pass is tried again after a back-off, and from the second failure
in a row (or a ``Retry-After``) events do not start one sooner (``Controller.run``):
each pass lists the cluster, and with the 20 ms debounce a failing pass would run
again at every event. Against the emulator over HTTP, its faults on the pass's DLJob
list and status writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import httpx
import operator_cases
import pytest
from operator_cases import eventually
from powerflow.operator import controller as controller_module
from powerflow.operator.controller import (
    Controller,
    OperatorConfig,
    default_policy,
    learned_models,
)
from powerflow.operator.kube import Kube
from powerflow.operator.learning import SampleStore
from prometheus_client import CollectorRegistry
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator
from support.operator_cluster import gang_dljob

from powerflow.core import contract
from powerflow.kubeapi.backoff import Backoff

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/ml/{contract.PLURAL}"
TESTER = {"User-Agent": "test-kubelet"}
"""The test's own client: never matched by the operator's fault rules."""


def controller(kube: Kube, retry: Backoff | None = None) -> Controller:
    store = SampleStore(registry=CollectorRegistry())
    made = Controller(
        kube, OperatorConfig(), default_policy(), learned_models(store), post_events=False
    )
    if retry is not None:
        made.retry = retry
    return made


@contextlib.asynccontextmanager
async def running(op: Controller) -> AsyncIterator[asyncio.Task[None]]:
    """``op``'s allocation loop, woken for a first pass; cancelled after."""
    loop = asyncio.create_task(op.run())
    try:
        op.trigger("start", immediate=True)
        yield loop
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_failing_pass_backs_off_whatever_events_arrive(
    kube: Kube, kmock: KubeEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    rule = kmock.faults.inject("list", contract.PLURAL, Answer(status=500))
    op = controller(kube, Backoff(first_s=0.1, max_s=0.4))
    async with running(op):
        began = time.monotonic()
        while time.monotonic() - began < 1.5:  # an event every 20 ms, as a busy cluster
            op.trigger("a pod changed")
            await asyncio.sleep(0.02)
        hits = rule.hits

        async def counted() -> bool:  # the try in flight at 1.5 s, if any, has ended
            return op.metrics.pass_failures._value.get() >= rule.hits

        await eventually(counted, timeout=10)
    # The second try may follow the first at the next event; then waits of 0.2, 0.4,
    # 0.4... s: 4 to 7 tries in 1.5 s (against one every 20 ms or so).
    assert 4 <= hits <= 7
    assert op.retry.failures == rule.hits == op.metrics.pass_failures._value.get()
    assert op.passes == 0
    failed = [r for r in caplog.records if "allocation pass failed" in r.getMessage()]
    # The first failure logs its traceback; the same again one line at the 2nd and 4th.
    assert failed[0].levelno == logging.ERROR and failed[0].exc_info is not None
    assert [r.getMessage().split(":")[0] for r in failed[1:]] == [
        "allocation pass failed again (2 in a row)",
        "allocation pass failed again (4 in a row)",
    ]
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in failed[1:])


async def test_the_api_server_back_ends_the_back_off(kube: Kube, kmock: KubeEmulator) -> None:
    rule = kmock.faults.inject("list", contract.PLURAL, Answer(status=500), times=3)
    op = controller(kube, Backoff(first_s=0.1, max_s=0.4))
    async with running(op):

        async def passed() -> bool:
            return op.passes >= 1

        await eventually(passed, timeout=10)
        assert rule.hits == 3 and op.retry.failures == 0
        assert op.metrics.last_pass._value.get() > time.time() - 10


async def two_jobs(kmock: KubeEmulator) -> None:
    """A node and DLJobs ``a`` and ``b``: a pass writes each job's status."""
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=TESTER) as api:
        assert (await api.post("/api/v1/nodes", json=operator_cases.node("n0", 8))).is_success
        for name in ("a", "b"):
            assert (await api.post(JOBS, json=gang_dljob(name, 100))).status_code == 201


async def test_a_throttled_pass_waits_the_api_servers_retry_after_whatever_events_arrive(
    kube: Kube, kmock: KubeEmulator
) -> None:
    # A PATCH is never sent twice by the client itself: the pass fails at once, with the
    # answer's Retry-After (3 s) far beyond the back-off's 0.05 s.
    await two_jobs(kmock)
    rule = kmock.faults.inject(
        "patch", f"{contract.PLURAL}/status", Answer(status=429, retry_after_s=3), times=1
    )
    op = controller(kube, Backoff(first_s=0.05, max_s=0.4))
    async with running(op):

        async def throttled() -> bool:
            return rule.hits == 1

        await eventually(throttled, timeout=20)
        failed_at = time.monotonic()
        while op.passes == 0 and time.monotonic() - failed_at < 20:
            op.trigger("a pod changed")
            await asyncio.sleep(0.02)
        assert op.passes >= 1
        assert time.monotonic() - failed_at >= 2.9


async def test_a_pass_failing_in_one_jobs_write_is_tried_again_without_growing_waits(
    kube: Kube,
    kmock: KubeEmulator,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass read the cluster and sent every write; one job's status write fails each
    time (a broken webhook, say): the other jobs' new work must not wait 30 s for it."""
    monkeypatch.setattr(controller_module, "WRITES_RETRY_MAX_S", 0.1)
    await two_jobs(kmock)
    rule = kmock.faults.inject("patch", f"{contract.PLURAL}/status", Answer(status=500), name="a")
    op = controller(kube, Backoff(first_s=0.1, max_s=0.4))
    async with running(op):

        async def failed_often() -> bool:
            return op.metrics.pass_failures._value.get() >= 4

        await eventually(failed_often, timeout=20)
    assert rule.hits >= 4
    again = [r.getMessage() for r in caplog.records if "failed again" in r.getMessage()]
    # Growing, the 2nd and 4th would wait 0.2 and 0.4 s.
    assert [m.split("next try in ")[1] for m in again[:2]] == ["0.1 s", "0.1 s"]
    assert "(4 in a row)" in again[1] and "WritesFailed: the first" in again[1]


class Lease:
    """A leader election the test decides: not leading until ``gain``."""

    def __init__(self) -> None:
        self.is_leader = False
        self._gained = asyncio.Event()

    async def wait_leading(self) -> None:
        await self._gained.wait()

    async def wait_lost(self) -> None:
        await asyncio.Event().wait()

    def gain(self) -> None:
        self.is_leader = True
        self._gained.set()


async def test_a_follower_that_takes_the_lease_counts_the_time_without_a_pass_from_then(
    kube: Kube, kmock: KubeEmulator
) -> None:
    kmock.faults.inject("list", contract.PLURAL, Answer(status=500))  # no pass goes through
    op = controller(kube)
    lease = Lease()
    op.leader = lease  # type: ignore[assignment]
    op.metrics.last_pass.set(0.0)  # as a follower that started long ago
    async with running(op):
        await asyncio.sleep(0.2)
        assert op.metrics.last_pass._value.get() == 0.0  # a follower plans nothing
        took = time.time()
        lease.gain()

        async def stamped() -> bool:
            return op.metrics.last_pass._value.get() >= took

        await eventually(stamped, timeout=10)
        assert op.passes == 0


async def test_an_error_in_handling_a_failed_pass_does_not_end_the_loop(
    kube: Kube,
    kmock: KubeEmulator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(exc: BaseException) -> int:
        raise ValueError("a header nobody expected")

    monkeypatch.setattr(controller_module, "asked_wait_s", broken)
    rule = kmock.faults.inject("list", contract.PLURAL, Answer(status=500), times=2)
    op = controller(kube, Backoff(first_s=0.05, max_s=0.2))
    async with running(op) as loop:

        async def passed() -> bool:
            return op.passes >= 1

        await eventually(passed, timeout=10)  # tried again after max_s each time
        assert rule.hits == 2 and not loop.done()
    assert any("and so did handling it" in r.getMessage() for r in caplog.records)
