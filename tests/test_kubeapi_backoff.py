"""The back-off between tries against a failing API server (``powerflow/kubeapi/backoff.py``):
doubling to a ceiling, started over by a success, jittered, and never shorter than the
answer's ``Retry-After``, read from the ``kubernetes`` client's own exception as the
emulator's injected 429 raises it."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import kubernetes
import pytest
from powerflow.operator.kube import WritesFailed
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.kubeapi.backoff import RETRY_AFTER_MAX_S, Backoff, asked_wait_s, retry_after_s


def test_waits_double_up_to_the_ceiling_and_a_success_starts_over() -> None:
    b = Backoff(first_s=1.0, max_s=30.0)
    assert [b.failed() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert b.failures == 7
    b.succeeded()
    assert (b.failures, b.failed()) == (0, 1.0)


def test_many_failures_in_a_row_stay_at_the_ceiling() -> None:
    b = Backoff(first_s=0.5, max_s=4.0)
    waits = [b.failed() for _ in range(2000)]
    assert max(waits) == 4.0 and waits[-1] == 4.0


def test_jitter_spreads_each_wait_over_its_band_reproducibly() -> None:
    def waits(seed: int) -> list[float]:
        b = Backoff(first_s=1.0, max_s=8.0, jitter=0.5, rng=random.Random(seed))
        return [b.failed() for _ in range(6)]

    got = waits(3)
    for wait, base in zip(got, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], strict=True):
        assert base <= wait <= 1.5 * base
    assert got == waits(3) and got != waits(4)
    assert len({w / b for w, b in zip(got, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], strict=True)}) > 1


def test_a_longer_retry_after_is_waited_out_a_shorter_one_is_not() -> None:
    b = Backoff(first_s=1.0, max_s=30.0)
    assert b.failed(asked_s=5) == 5.0
    assert b.failed(asked_s=1) == 2.0  # the second failure's own wait is longer


@pytest.mark.parametrize(
    ("first_s", "max_s", "jitter"), [(0.0, 1.0, 0.0), (2.0, 1.0, 0.0), (1.0, 2.0, -0.1)]
)
def test_nonsense_settings_are_refused(first_s: float, max_s: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="back-off needs"):
        Backoff(first_s=first_s, max_s=max_s, jitter=jitter)


@pytest.mark.parametrize(
    ("status", "header", "seconds"),
    [
        (429, "2", 2),
        (503, " 1 ", 1),
        (429, "3600", RETRY_AFTER_MAX_S),
        (429, None, None),
        (429, "Wed, 21 Oct 2026 07:28:00 GMT", None),
        (429, "1.5", None),
        (429, "\u00b2", None),  # a digit to isdigit, not a number to int
        (429, "9" * 5000, RETRY_AFTER_MAX_S),  # beyond int's 4,300 digits: long
        (429, "1234567890", RETRY_AFTER_MAX_S),
        (404, "2", None),
        (None, "2", None),
    ],
)
def test_which_retry_afters_are_read(
    status: int | None, header: str | None, seconds: int | None
) -> None:
    assert retry_after_s(status, header) == seconds


@pytest.mark.kmock(cls=KubeEmulator)
async def test_the_clients_exception_of_a_throttled_list_carries_the_wait(
    kmock: KubeEmulator,
) -> None:
    kmock.load_builtins()
    # Always: the client (urllib3's Retry) itself waits out three 429s' Retry-After
    # before it raises, the fourth answer's header in its exception.
    kmock.faults.inject("list", "nodes", Answer(status=429, retry_after_s=1))
    kmock.faults.inject("list", "pods", Answer(status=500), times=1)
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url)))
    try:
        core = kubernetes.client.CoreV1Api(client)
        errors: list[Any] = []
        for call in (core.list_node, core.list_pod_for_all_namespaces):
            with pytest.raises(kubernetes.client.ApiException) as caught:
                await asyncio.to_thread(call)  # the emulator serves on this event loop
            errors.append(caught.value)
    finally:
        client.close()
    throttled, failed = errors
    assert asked_wait_s(throttled) == 1
    assert asked_wait_s(failed) is None  # a 500 that names no wait
    assert asked_wait_s(WritesFailed([failed, throttled], [])) == 1  # the operator's
    assert asked_wait_s(ValueError("no answer")) is None
    longer = kubernetes.client.ApiException(status=503, reason="Service Unavailable")
    longer.headers = {"Retry-After": "7"}
    assert asked_wait_s(WritesFailed([throttled, longer], [])) == 7  # the longest asked
