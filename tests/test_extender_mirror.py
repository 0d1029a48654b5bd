"""The extender's mirror relists the cluster (every node, DLJob and pod) with a back-off
(``extender/mirror.py``): a watch that fails at once, 410s in a row and a server that
ends every watch at once cost a relist or a watch now and then, not a loop as fast as
the round trip. Against the emulator over HTTP, its faults aimed at the extender."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from powerflow.extender import kube as kube_module
from powerflow.extender.kube import Connection, KubeApi
from powerflow.extender.mirror import Mirror
from powerflow.extender.state import ClusterState
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.core.contract import GROUP, KIND, PLURAL, VERSION

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
EXT_AGENT = {"user_agent": "powerflow-extender/*"}


@contextlib.asynccontextmanager
async def mirroring(kmock: KubeEmulator, **options: Any) -> AsyncIterator[Mirror]:
    kmock.load_builtins()
    kmock.declare(f"{GROUP}/{VERSION}/{PLURAL}", KIND)
    api = KubeApi(Connection(host=str(kmock.url)))
    mirror = Mirror(api, ClusterState(), **options)
    task = asyncio.create_task(mirror.run())
    try:
        yield mirror
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.aclose()


def requests(kmock: KubeEmulator, path: str, watch: bool) -> int:
    return sum(
        1
        for r in kmock
        if r.method == "GET"
        and str(r.url.path) == path
        and (r.params.get("watch") == "true") == watch
    )


async def test_a_watch_that_fails_at_once_relists_after_a_growing_wait(
    kmock: KubeEmulator,
) -> None:
    kmock.faults.inject("watch", "pods", Answer(status=500), **EXT_AGENT)
    async with mirroring(kmock) as mirror:
        await asyncio.sleep(3.0)
    lists = requests(kmock, "/api/v1/pods", watch=False)
    # Relists at 0, 0.5-0.75, 1.5-2.25 (then 3.5-5.25) s: at most 3 in 3 s, where a
    # back-off started over by each good LIST relisted every 0.5 s (7).
    assert 2 <= lists <= 3 and mirror.relists == lists
    assert not mirror.state.synced and "500" in mirror.state.unsynced_reason


async def test_410s_in_a_row_relist_after_a_growing_wait(kmock: KubeEmulator) -> None:
    """The first 410 relists at once (compaction happens), the next ones wait: a watch
    cache that answers every watch with 410 gets a relist now and then, not a loop."""
    kmock.faults.inject("watch", "pods", Answer(status=410, after_events=0), **EXT_AGENT)
    async with mirroring(kmock) as mirror:
        await asyncio.sleep(3.0)
    lists = requests(kmock, "/api/v1/pods", watch=False)
    assert 2 <= lists <= 4, lists  # 0, at once, then 1-1.5 and 2-3 s later
    assert mirror.backoff.failures >= 2


async def test_a_server_that_ends_every_watch_at_once_gets_one_a_second(
    kmock: KubeEmulator,
) -> None:
    async with mirroring(kmock, watch_timeout_s=0) as mirror:  # each watch ends at once
        await asyncio.sleep(2.5)
        assert mirror.state.synced
    for path in ("/api/v1/pods", "/api/v1/nodes", f"/apis/{GROUP}/{VERSION}/{PLURAL}"):
        assert 2 <= requests(kmock, path, watch=True) <= 3, path  # at 0, 1 and 2 s
    assert mirror.relists == 1


async def test_a_throttled_watch_relists_after_the_retry_after(kmock: KubeEmulator) -> None:
    kmock.faults.inject("watch", "pods", Answer(status=429, retry_after_s=2), times=1, **EXT_AGENT)
    async with mirroring(kmock) as mirror:
        await asyncio.sleep(1.5)
        assert requests(kmock, "/api/v1/pods", watch=False) == 1  # not after 0.5-0.75 s
        for _ in range(100):
            if mirror.state.synced and mirror.relists == 2:
                break
            await asyncio.sleep(0.05)
    assert mirror.relists == 2 and mirror.state.synced


async def synced(mirror: Mirror) -> None:
    for _ in range(200):
        if mirror.state.synced:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never synced: {mirror.state.unsynced_reason}")


POD = {"spec": {"containers": [{"name": "c", "image": "x"}]}}


async def test_a_watch_that_brought_events_then_410_relists_at_once_whatever_the_back_off(
    kmock: KubeEmulator,
) -> None:
    async with mirroring(kmock) as mirror, httpx.AsyncClient(base_url=str(kmock.url)) as api:
        await synced(mirror)
        mirror.backoff.failures = 4  # as after failures: the next one would wait 8-12 s
        kmock.faults.inject("watch", "pods", Answer(status=410, after_events=1), **EXT_AGENT)
        pods = "/api/v1/namespaces/default/pods"
        for name in ("p", "q"):  # p reaches the mirror; q's event meets the 410
            assert (await api.post(pods, json={**POD, "metadata": {"name": name}})).is_success
        for _ in range(40):
            if mirror.relists == 2:
                break
            await asyncio.sleep(0.05)
        assert mirror.relists == 2  # within 2 s: the watch had worked, the back-off started over


async def test_a_busy_clusters_other_watches_do_not_reset_the_back_off(
    kmock: KubeEmulator,
) -> None:
    """The nodes watch brings events all the time (a busy cluster); the pods watch ends in
    410 at once each time: its relists still back off."""
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        node = {"metadata": {"name": "n0", "labels": {"x": "0"}}}
        assert (await api.post("/api/v1/nodes", json=node)).is_success
        kmock.faults.inject("watch", "pods", Answer(status=410, after_events=0), **EXT_AGENT)
        async with mirroring(kmock) as mirror:
            began = asyncio.get_running_loop().time()
            i = 0
            while asyncio.get_running_loop().time() - began < 3.0:
                i += 1
                patch = {"metadata": {"labels": {"x": str(i)}}}
                headers = {"Content-Type": "application/merge-patch+json"}
                await api.patch("/api/v1/nodes/n0", json=patch, headers=headers)
                await asyncio.sleep(0.02)
    lists = requests(kmock, "/api/v1/pods", watch=False)
    # 0, at once, then 1-1.5 and 2-3 s later: 4 at most (one relist a round trip without).
    assert 2 <= lists <= 4, lists
    assert mirror.backoff.failures >= 2


async def test_lists_that_fail_after_a_good_run_wait_longer_each_time(
    kmock: KubeEmulator,
) -> None:
    """The 410 that ends a run whose pods watch brought an event relists at once; the
    LISTs that fail after it wait 1-1.5 s, then 2-3 s (the relist at once took the first
    step), where a back-off started over at each of them would try every 0.5 s."""
    async with mirroring(kmock) as mirror, httpx.AsyncClient(base_url=str(kmock.url)) as api:
        await synced(mirror)
        pods = "/api/v1/namespaces/default/pods"
        assert (await api.post(pods, json={**POD, "metadata": {"name": "p"}})).is_success
        for _ in range(100):  # the watch brought it
            if mirror._brought.get("/api/v1/pods"):
                break
            await asyncio.sleep(0.05)
        kmock.faults.inject("list", "pods", Answer(status=500), **EXT_AGENT)
        kmock.faults.inject("watch", "pods", Answer(status=410), **EXT_AGENT)
        before = requests(kmock, "/api/v1/pods", watch=False)
        assert (await api.post(pods, json={**POD, "metadata": {"name": "q"}})).is_success
        await asyncio.sleep(2.5)
        # At once, then 1-1.5 s later (the next at 3 s at the earliest): 2 failed LISTs.
        assert requests(kmock, "/api/v1/pods", watch=False) - before == 2
        assert mirror.backoff.failures >= 2 and not mirror.state.synced


async def test_lists_come_page_by_page(
    kmock: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One answer with every pod of a large cluster may not start within the client's
    10 s: the mirror lists page by page, as the operator does."""
    monkeypatch.setattr(kube_module, "LIST_PAGE", 2)
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for i in range(5):
            pod = {"metadata": {"name": f"p{i}"}, "spec": {"containers": [{"name": "c"}]}}
            assert (await api.post("/api/v1/namespaces/default/pods", json=pod)).is_success
    async with mirroring(kmock) as mirror:
        for _ in range(100):
            if mirror.state.synced:
                break
            await asyncio.sleep(0.05)
        assert mirror.state.synced
    pages = [
        r for r in kmock if str(r.url.path) == "/api/v1/pods" and r.params.get("watch") != "true"
    ]
    assert len(pages) == 3 and all(r.params.get("limit") == "2" for r in pages)
    assert [bool(r.params.get("continue")) for r in pages] == [False, True, True]
