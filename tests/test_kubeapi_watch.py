"""The shared LIST+WATCH thread (``powerflow/kubeapi/watch.py``) against the emulator over
real HTTP: the LIST (paginated) then the events of the selection, a resumed watch that
replays nothing, a relist after ``410 Gone``, the back-off after other failures, and
``stop``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kubernetes
import pytest
from operator_cases import eventually
from support import kube_emulator
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.kubeapi import watch as watch_module
from powerflow.kubeapi.backoff import Backoff
from powerflow.kubeapi.watch import ListWatch

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
PODS = "/api/v1/namespaces/ml/pods"
SELECTED = {"label_selector": "app=a"}


def pod(name: str, app: str = "a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


class Seen:
    """What the watch handed to the event loop, in order."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.loop = asyncio.get_running_loop()
        self.wrong_thread = 0

    def _check_thread(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.wrong_thread += running is not self.loop

    def on_list(self, items: list[dict[str, Any]]) -> None:
        self._check_thread()
        self.lists.append(sorted(i["metadata"]["name"] for i in items))

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._check_thread()
        self.events.append((kind, obj["metadata"]["name"]))

    async def lists_made(self, count: int, timeout: float = 10.0) -> None:
        async def made() -> bool:
            return len(self.lists) >= count

        await eventually(made, timeout)

    async def event_seen(self, kind: str, name: str, timeout: float = 10.0) -> None:
        async def seen() -> bool:
            return (kind, name) in self.events

        await eventually(seen, timeout)


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        yield client


@pytest.fixture
def core(kmock: KubeEmulator) -> Any:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url)))
    yield kubernetes.client.CoreV1Api(client)
    client.close()


@contextlib.asynccontextmanager
async def watching(
    core: Any, seen: Seen, timeout_s: int = 300, backoff: Backoff | None = None
) -> AsyncIterator[ListWatch[dict[str, Any]]]:
    """A started watch of the ``app=a`` pods, once its first LIST arrived; stopped after."""
    w: ListWatch[dict[str, Any]] = ListWatch(
        "test",
        core.list_pod_for_all_namespaces,
        seen.on_list,
        seen.on_event,
        selection=SELECTED,
        timeout_s=timeout_s,
        backoff=backoff,
    )
    w.start()
    try:
        await seen.lists_made(1)
        yield w
    finally:
        w.stop()


def watch_requests(kmock: KubeEmulator) -> list[Any]:
    return [
        r
        for r in kmock
        if r.method == "GET"
        and str(r.url.path) == "/api/v1/pods"
        and r.params.get("watch") == "true"
    ]


async def test_lists_every_page_then_hands_over_the_selections_events(
    kmock: KubeEmulator, api: httpx.AsyncClient, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module, "LIST_PAGE", 2)  # three pages for five pods
    for name in ("p1", "p2", "p3", "p4", "p5"):
        assert (await api.post(PODS, json=pod(name))).status_code == 201
    assert (await api.post(PODS, json=pod("other", app="b"))).status_code == 201
    listed_at = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    seen = Seen()
    async with watching(core, seen) as w:
        assert seen.lists == [["p1", "p2", "p3", "p4", "p5"]]
        pages = [r for r in kmock if str(r.url.path) == "/api/v1/pods" and "watch" not in r.params]
        assert len(pages) == 3 and all(r.params.get("limit") == "2" for r in pages)

        assert (await api.post(PODS, json=pod("p6"))).status_code == 201
        assert (await api.post(PODS, json=pod("ignored", app="b"))).status_code == 201
        patch = {"metadata": {"annotations": {"x": "1"}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        assert (await api.patch(f"{PODS}/p6", json=patch, headers=headers)).is_success
        assert (await api.delete(f"{PODS}/p1")).is_success
        await seen.event_seen("DELETED", "p1")
        await asyncio.sleep(0.2)  # nothing else trails in
        assert seen.events == [("ADDED", "p6"), ("MODIFIED", "p6"), ("DELETED", "p1")]
        assert (w.lists, seen.wrong_thread) == (1, 0)
        # The watch started from the LIST's resourceVersion, with bookmarks asked for.
        (first,) = watch_requests(kmock)
        assert first.params["resourceVersion"] == listed_at
        assert first.params["allowWatchBookmarks"] == "true"


async def test_a_watch_the_server_ends_resumes_from_the_last_version_without_replay(
    kmock: KubeEmulator, api: httpx.AsyncClient, core: Any
) -> None:
    assert (await api.post(PODS, json=pod("p1"))).status_code == 201
    seen = Seen()
    async with watching(core, seen, timeout_s=1) as w:
        created = await api.post(PODS, json=pod("p2"))
        version = created.json()["metadata"]["resourceVersion"]

        async def resumed_after_p2() -> bool:
            return any(r.params.get("resourceVersion") == version for r in watch_requests(kmock))

        # The server ends each watch after a second; the next one starts from p2's version.
        await eventually(resumed_after_p2, timeout=10)
        assert (await api.post(PODS, json=pod("p3"))).status_code == 201
        await seen.event_seen("ADDED", "p3")
        await asyncio.sleep(0.2)
        assert seen.events == [("ADDED", "p2"), ("ADDED", "p3")]  # p1, p2 not replayed
        assert w.lists == 1 and seen.lists == [["p1"]]


@pytest.fixture
def short_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """A history of three events: writes a watch does not select push its version out of
    it, so its next resume is answered 410 Gone (an ERROR event, as kube-apiserver does)."""
    monkeypatch.setattr(kube_emulator, "_HISTORY", 3)


async def test_a_version_older_than_the_history_relists(
    short_history: None, api: httpx.AsyncClient, core: Any
) -> None:
    assert (await api.post(PODS, json=pod("p1"))).status_code == 201
    seen = Seen()
    async with watching(core, seen, timeout_s=1) as w:
        for i in range(5):
            assert (await api.post(PODS, json=pod(f"b{i}", app="b"))).status_code == 201
        await seen.lists_made(2)
        assert seen.lists[1] == ["p1"] and w.lists == len(seen.lists)

        # Watching goes on from the new LIST's version.
        assert (await api.post(PODS, json=pod("p2"))).status_code == 201
        await seen.event_seen("ADDED", "p2")
        assert seen.events == [("ADDED", "p2")] and seen.wrong_thread == 0


async def test_stop_ends_an_open_watch_and_hands_over_nothing_more(
    kmock: KubeEmulator, api: httpx.AsyncClient, core: Any
) -> None:
    seen = Seen()
    async with watching(core, seen) as w:  # the server would hold its watch open for 300 s

        async def requested() -> bool:
            return bool(watch_requests(kmock))

        await eventually(requested)
        await asyncio.sleep(0.2)  # the watch's stream is open

    async def ended() -> bool:
        return not w.running()

    await eventually(ended)
    assert (await api.post(PODS, json=pod("late"))).status_code == 201
    await asyncio.sleep(0.2)
    assert seen.events == []
    assert len(watch_requests(kmock)) == 1


async def test_the_thread_ends_when_its_event_loop_has_closed(
    api: httpx.AsyncClient, core: Any
) -> None:
    """A component that ended without ``stop`` leaves no thread polling the API server."""
    lists: list[int] = []
    made: list[ListWatch[dict[str, Any]]] = []

    async def component() -> None:
        w: ListWatch[dict[str, Any]] = ListWatch(
            "orphan",
            core.list_pod_for_all_namespaces,
            lambda items: lists.append(len(items)),
            lambda kind, obj: None,
            timeout_s=1,
        )
        made.append(w)
        w.start()
        while not lists:
            await asyncio.sleep(0.02)

    # The component's own event loop, in a thread: this loop keeps serving the emulator.
    await asyncio.wait_for(asyncio.to_thread(asyncio.run, component()), 10)
    (w,) = made

    async def ended() -> bool:
        return not w.running()

    await eventually(ended, timeout=10)
    assert lists == [0]


async def test_a_failing_list_is_tried_again_after_a_wait_that_doubles(
    kmock: KubeEmulator, api: httpx.AsyncClient, core: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Not each second: a thousand agents must not keep an overloaded API server down."""
    rule = kmock.faults.inject("list", "pods", Answer(status=500), times=4)
    seen = Seen()
    began = time.monotonic()
    async with watching(core, seen, backoff=Backoff(first_s=0.1, max_s=0.4)) as w:
        took = time.monotonic() - began  # to the first LIST that went through
        assert w.backoff.failures == 0  # the LIST went through: the next failure waits 0.1 s
    assert rule.hits == 4 and w.lists == 1
    waits = [r.getMessage().split("trying again in ")[1] for r in caplog.records
             if "trying again" in r.getMessage()]  # fmt: skip
    assert waits == ["0.1 s", "0.2 s", "0.4 s", "0.4 s"]  # doubling to the ceiling
    assert took >= 3.0  # and at most one LIST a second, as ever


def test_the_default_back_off_starts_at_a_second_and_spreads_the_agents(core: Any) -> None:
    waits = []
    for _ in range(20):
        w: ListWatch[dict[str, Any]] = ListWatch(
            "test", core.list_pod_for_all_namespaces, lambda items: None, lambda k, o: None
        )
        waits.append([w.backoff.failed() for _ in range(7)])
    assert all(1.0 <= first <= 1.5 for first, *_ in waits)
    assert all(30.0 <= last <= 45.0 for *_, last in waits)
    assert len({first for first, *_ in waits}) == 20  # not all back together


async def test_a_failure_after_a_long_good_try_waits_the_first_wait_again(core: Any) -> None:
    """A stream cut after hours of events is a first failure, not the nth in a row."""
    w: ListWatch[dict[str, Any]] = ListWatch(
        "test",
        core.list_pod_for_all_namespaces,
        lambda items: None,
        lambda k, o: None,
        backoff=Backoff(first_s=0.01, max_s=0.04),
    )
    for _ in range(5):
        w._failed(time.monotonic(), "stream cut", None)
    assert w.backoff.failures == 5
    w._failed(time.monotonic() - 1.0, "stream cut", None)  # it had run 1 s > 0.04 s
    assert w.backoff.failures == 1
    asked = time.monotonic()
    w._failed(time.monotonic(), "throttled", 1)
    assert time.monotonic() - asked >= 1.0  # a Retry-After longer than the wait is waited out


async def test_relists_after_410s_in_a_row_back_off(
    kmock: KubeEmulator, api: httpx.AsyncClient, core: Any
) -> None:
    """A server whose every watch ends in 410 Gone (a watch cache that keeps failing)
    is relisted after 1, 2, 4... s (each up to half longer), not each second: every
    node's agent relists, and a relist may go to etcd."""
    rule = kmock.faults.inject("watch", "pods", Answer(status=410, after_events=0))
    seen = Seen()
    w: ListWatch[dict[str, Any]] = ListWatch(
        "test", core.list_pod_for_all_namespaces, seen.on_list, seen.on_event, selection=SELECTED
    )
    w.start()
    try:
        await seen.lists_made(1)
        await asyncio.sleep(6.0)
    finally:
        w.stop()
    # Lists at 0, 1-1.5, 3-4.5 (then 7-10.5) s: three in 6 s, where one a second would
    # be seven.
    assert 2 <= w.lists <= 4 and rule.hits >= 2
    assert w.relists.failures >= 2
