"""A failed allocation pass is tried again after a back-off, and events do not start one
sooner (``Controller.run``): each pass lists the cluster, and a pass that failed was
tried again at every event, 20 ms apart, or each second without one. Against the
emulator over HTTP, its faults on the pass's DLJob list."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import operator_cases
import pytest
from operator_cases import eventually
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


async def test_a_failing_pass_backs_off_whatever_events_arrive(
    kube: Kube, kmock: KubeEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    rule = kmock.faults.inject("list", contract.PLURAL, Answer(status=500))
    op = controller(kube, Backoff(first_s=0.1, max_s=0.4))
    loop = asyncio.create_task(op.run())
    try:
        op.trigger("start", immediate=True)
        began = time.monotonic()
        while time.monotonic() - began < 1.5:  # an event every 20 ms, as a busy cluster
            op.trigger("a pod changed")
            await asyncio.sleep(0.02)
        # Tries at 0, 0.1, 0.3, 0.7, 1.1, 1.5 s at most (1.5 s of events against 20 ms
        # apart: about 70 passes).
        assert 3 <= rule.hits <= 6
        assert op.retry.failures == rule.hits == op.metrics.pass_failures._value.get()
        assert op.passes == 0

        kmock.faults.remove(rule)  # the API server is back

        async def passed() -> bool:
            return op.passes >= 1

        await eventually(passed, timeout=10)
        assert op.retry.failures == 0
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    failed = [r for r in caplog.records if "allocation pass failed" in r.getMessage()]
    # The first failure logs its traceback; the same error again is one line.
    assert failed[0].levelno == logging.ERROR and failed[0].exc_info is not None
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in failed[1:])
    assert "in a row" in failed[-1].getMessage()


async def test_a_throttled_pass_waits_the_api_servers_retry_after(
    kube: Kube, kmock: KubeEmulator
) -> None:
    # Four 429s: the client waits out three of them (urllib3), then the pass fails with
    # the fourth's Retry-After (2 s), longer than the back-off's 0.05 s.
    rule = kmock.faults.inject("list", contract.PLURAL, Answer(status=429), times=4)
    op = controller(kube, Backoff(first_s=0.05, max_s=0.4))
    loop = asyncio.create_task(op.run())
    try:
        op.trigger("start", immediate=True)

        async def throttled() -> bool:
            return rule.hits == 4

        await eventually(throttled, timeout=20)
        failed_at = time.monotonic()

        async def passed() -> bool:
            return op.passes >= 1

        await eventually(passed, timeout=20)
        assert time.monotonic() - failed_at >= 0.9  # Retry-After: 1 s, not 0.05 s
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_pass_failing_in_one_jobs_write_is_tried_again_without_growing_waits(
    kube: Kube, kmock: KubeEmulator
) -> None:
    """The pass read the cluster and sent every write; one job's status write fails each
    time (a broken webhook, say): the other jobs must not wait 30 s for it."""
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=TESTER) as api:
        assert (await api.post("/api/v1/nodes", json=operator_cases.node("n0", 8))).is_success
        for name in ("a", "b"):
            assert (await api.post(JOBS, json=gang_dljob(name, 100))).status_code == 201
    rule = kmock.faults.inject("patch", f"{contract.PLURAL}/status", Answer(status=500), name="a")
    op = controller(kube, Backoff(first_s=0.1, max_s=0.4))
    loop = asyncio.create_task(op.run())
    try:
        op.trigger("start", immediate=True)

        async def failed_often() -> bool:
            return rule.hits >= 6

        await eventually(failed_often, timeout=20)
        # Each failure waited the first step: growing, six tries would take 1.9 s at least.
        assert op.retry.failures == 1
        assert op.metrics.pass_failures._value.get() >= 6
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
