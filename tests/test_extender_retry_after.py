"""The extender's reads wait out a ``Retry-After`` as client-go's REST client does
(``extender/kube.py``): a 429 or 5xx that names it is asked again after it, up to
``RETRY_AFTER_TRIES`` times; anything else is the caller's failure at once, and a
write is never sent twice. Against the emulator over HTTP, its faults aimed at the
extender's client."""

from __future__ import annotations

import time

import httpx
import pytest
from powerflow.extender import kube
from powerflow.extender.kube import PODS_PATH, ApiError, Connection, KubeApi, retry_after_s
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.kubeapi import backoff

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
EXT_AGENT = {"user_agent": "powerflow-extender/*"}


@pytest.mark.parametrize(
    ("status", "header", "seconds"),
    [
        (429, "2", 2),
        (503, "1", 1),
        (500, "0", 0),
        (429, "3600", backoff.RETRY_AFTER_MAX_S),  # bounded
        (429, None, None),
        (429, "Wed, 21 Oct 2026 07:28:00 GMT", None),  # a date: not waited for
        (429, "-1", None),
        (404, "2", None),
        (409, "2", None),
    ],
)
def test_which_answers_are_waited_out(status: int, header: str | None, seconds: int | None) -> None:
    headers = {} if header is None else {"Retry-After": header}
    assert retry_after_s(httpx.Response(status, headers=headers)) == seconds


async def test_a_list_throttled_twice_is_answered_after_the_waits(kmock: KubeEmulator) -> None:
    kmock.load_builtins()
    rule = kmock.faults.inject("list", "pods", Answer(status=429), times=2, **EXT_AGENT)
    api = KubeApi(Connection(host=str(kmock.url)))
    try:
        began = time.monotonic()
        items, version = await api.list(PODS_PATH)
        took = time.monotonic() - began
    finally:
        await api.aclose()
    assert items == [] and version
    assert rule.hits == 2
    assert took >= 2.0  # the two Retry-After: 1 waits


async def test_throttling_that_lasts_is_the_callers_failure_after_the_last_try(
    kmock: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "RETRY_AFTER_TRIES", 3)
    kmock.load_builtins()
    rule = kmock.faults.inject("list", "pods", Answer(status=429), **EXT_AGENT)
    api = KubeApi(Connection(host=str(kmock.url)))
    try:
        with pytest.raises(ApiError) as caught:
            await api.list(PODS_PATH)
    finally:
        await api.aclose()
    assert caught.value.status == 429 and rule.hits == 3


async def test_an_error_without_retry_after_and_a_write_are_not_asked_again(
    kmock: KubeEmulator,
) -> None:
    kmock.load_builtins()
    failed = kmock.faults.inject("list", "pods", Answer(status=500), times=1, **EXT_AGENT)
    throttled = kmock.faults.inject("patch", "pods", Answer(status=429), times=1, **EXT_AGENT)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        body = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}
        assert (await client.post("/api/v1/namespaces/ns/pods", json=body)).status_code == 201
    api = KubeApi(Connection(host=str(kmock.url)))
    try:
        with pytest.raises(ApiError) as listed:
            await api.list(PODS_PATH)
        with pytest.raises(ApiError) as patched:
            await api._json(
                "PATCH",
                "/api/v1/namespaces/ns/pods/p",
                json={"metadata": {"labels": {"a": "b"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
    finally:
        await api.aclose()
    assert listed.value.status == 500 and failed.hits == 1
    assert patched.value.status == 429 and throttled.hits == 1
