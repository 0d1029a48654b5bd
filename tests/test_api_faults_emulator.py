"""The emulator's injected API-server faults answer as kube-apiserver does.

Each test pins one fault of ``support.api_faults`` over real HTTP: 409
``Conflict``, 429 from the max-in-flight / priority-and-fairness filter
(plain text, ``Retry-After``), 500 before or after the write, slow answers,
a watch that ends with a 410 ``ERROR`` event, and etcd compaction (410 on
watches, continue tokens and exact lists from before it); and how rules
select requests (verb, resource, name, namespace, count, seeded probability);
and the fault routes (``/_twin/faults``) through which a test reaches the rules
of the twin's API server, a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from support.api_faults import THROTTLED, Answer, ApiFaults
from support.kube_emulator import KubeEmulator

from powerflow.lab.twin.apiserver import ApiServer, FaultControl
from powerflow.lab.twin.components import apiserver_process, free_port

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

PODS = "/api/v1/namespaces/ns/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def emulator(kmock: KubeEmulator) -> KubeEmulator:
    kmock.load_builtins()
    return kmock


@pytest.fixture
async def api(emulator: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=str(emulator.url)) as client:
        yield client


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def names(api: httpx.AsyncClient) -> list[str]:
    return [p["metadata"]["name"] for p in (await api.get(PODS)).json()["items"]]


async def test_conflict_answers_a_conflict_status_and_writes_nothing(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    created = (await api.post(PODS, json=pod("a"))).json()["metadata"]
    rule = emulator.faults.inject("patch", "pods", Answer(status=409), name="a", times=1)
    label = {"metadata": {"labels": {"x": "1"}}}
    refused = await api.patch(f"{PODS}/a", json=label, headers=MERGE)
    assert refused.status_code == 409
    body = refused.json()
    assert (body["kind"], body["status"], body["reason"], body["code"]) == (
        "Status", "Failure", "Conflict", 409,
    )  # fmt: skip
    assert body["message"] == (
        'Operation cannot be fulfilled on pods "a": the object has been modified; '
        "please apply your changes to the latest version"
    )
    assert body["details"] == {"name": "a", "kind": "pods"}
    stored = (await api.get(f"{PODS}/a")).json()["metadata"]
    assert stored["resourceVersion"] == created["resourceVersion"]
    assert "labels" not in stored
    # times=1: the retry goes through
    assert (await api.patch(f"{PODS}/a", json=label, headers=MERGE)).status_code == 200
    assert rule.hits == 1


async def test_throttling_is_plain_text_with_retry_after_and_does_nothing(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """kube-apiserver's 429 (``maxinflight.go`` ``tooManyRequests``, also API priority and
    fairness): ``Retry-After`` and a plain-text body, no ``Status``."""
    emulator.faults.inject("create", "pods", Answer(status=429, retry_after_s=2), times=1)
    throttled = await api.post(PODS, json=pod("a"))
    assert throttled.status_code == 429
    assert throttled.headers["Retry-After"] == "2"
    assert throttled.headers["Content-Type"].startswith("text/plain")
    assert throttled.text == THROTTLED
    assert await names(api) == []
    assert (await api.post(PODS, json=pod("a"))).status_code == 201


async def test_the_official_client_sees_throttling_as_an_api_exception(
    emulator: KubeEmulator,
) -> None:
    """``kubernetes``' ``ApiException`` carries the status and ``Retry-After`` (a POST is
    not retried by urllib3: it is not idempotent)."""
    emulator.faults.inject("create", "pods", Answer(status=429), times=1)
    config = kubernetes.client.Configuration(host=str(emulator.url).rstrip("/"))

    def create() -> kubernetes.client.ApiException:
        with kubernetes.client.ApiClient(config) as client:
            core = kubernetes.client.CoreV1Api(client)
            try:
                core.create_namespaced_pod("ns", pod("a"), _preload_content=False)
            except kubernetes.client.ApiException as exc:
                return exc
        raise AssertionError("not throttled")

    exc = await asyncio.to_thread(create)
    assert exc.status == 429 and exc.headers["Retry-After"] == "1"


async def test_internal_error_before_the_write_writes_nothing(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    emulator.faults.inject("create", "pods", Answer(status=500), times=1)
    failed = await api.post(PODS, json=pod("a"))
    assert failed.status_code == 500
    body = failed.json()
    assert (body["reason"], body["code"]) == ("InternalError", 500)
    assert body["message"] == "Internal error occurred: etcdserver: request timed out"
    assert body["details"]["causes"] == [{"message": "etcdserver: request timed out"}]
    assert await names(api) == []


async def test_internal_error_after_a_committed_write_leaves_the_write_done(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """etcd committed but the answer timed out: 500, and the object is there (the retry
    meets ``AlreadyExists``)."""
    emulator.faults.inject("create", "pods", Answer(status=500, committed=True), times=1)
    failed = await api.post(PODS, json=pod("a"))
    assert failed.status_code == 500
    assert await names(api) == ["a"]
    again = await api.post(PODS, json=pod("a"))
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")


async def test_committed_binding_binds_and_answers_an_error(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    await api.post(PODS, json=pod("a"))
    emulator.faults.inject("create", "pods/binding", Answer(status=500, committed=True), times=1)
    binding = {"metadata": {"name": "a"}, "target": {"kind": "Node", "name": "n1"}}
    assert (await api.post(f"{PODS}/a/binding", json=binding)).status_code == 500
    assert (await api.get(f"{PODS}/a")).json()["spec"]["nodeName"] == "n1"
    assert (await api.post(f"{PODS}/a/binding", json=binding)).status_code == 409


async def test_slow_answers_come_late_and_then_as_usual(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """A delay alone slows the request down (never faster than asked; no upper bound
    is asserted) and serves it normally; other requests are not held up meanwhile."""
    emulator.faults.inject("list", "pods", Answer(delay_s=1.0), times=1)
    began = time.monotonic()
    slow = asyncio.create_task(api.get(PODS))
    await asyncio.sleep(0.1)
    assert (await api.post(PODS, json=pod("a"))).status_code == 201  # not blocked
    assert not slow.done()
    answer = await slow
    assert time.monotonic() - began >= 1.0
    assert answer.status_code == 200


async def test_delay_then_error(emulator: KubeEmulator, api: httpx.AsyncClient) -> None:
    emulator.faults.inject("get", "pods", Answer(delay_s=0.3, status=503), times=1)
    await api.post(PODS, json=pod("a"))
    began = time.monotonic()
    answer = await api.get(f"{PODS}/a")
    assert time.monotonic() - began >= 0.3
    assert (answer.status_code, answer.json()["reason"]) == (503, "ServiceUnavailable")


async def test_rules_select_by_verb_resource_name_and_namespace(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    faults = emulator.faults
    status_only = faults.inject("patch", "pods/status", Answer(status=500))
    other_ns = faults.inject("*", "*", Answer(status=500), namespace="other")
    only_b = faults.inject("get", "pods", Answer(status=500), name="b*")
    await api.post(PODS, json=pod("a"))
    await api.post(PODS, json=pod("b1"))
    assert (await api.get(f"{PODS}/a")).status_code == 200
    assert (await api.get(f"{PODS}/b1")).status_code == 500
    assert (await api.get(PODS)).status_code == 200  # a list is no get
    label = {"metadata": {"labels": {"x": "1"}}}
    assert (await api.patch(f"{PODS}/a", json=label, headers=MERGE)).status_code == 200
    phase = {"status": {"phase": "Running"}}
    assert (await api.patch(f"{PODS}/a/status", json=phase, headers=MERGE)).status_code == 500
    assert (await api.get("/api/v1/namespaces/other/pods")).status_code == 500
    assert (await api.get("/api/v1/nodes")).status_code == 200
    assert (await api.get("/api")).status_code == 200  # discovery is no resource's
    assert (status_only.hits, other_ns.hits, only_b.hits) == (1, 1, 1)
    # by client: the User-Agent, as the API server's flow schemas can tell them apart
    faults.inject("list", "nodes", Answer(status=500), user_agent="powerflow-operator/*")
    operator = {"User-Agent": "powerflow-operator/1.0 (pod-a)"}
    assert (await api.get("/api/v1/nodes", headers=operator)).status_code == 500
    assert (await api.get("/api/v1/nodes")).status_code == 200
    faults.remove(only_b)
    assert (await api.get(f"{PODS}/b1")).status_code == 200
    faults.clear()
    assert (await api.patch(f"{PODS}/a/status", json=phase, headers=MERGE)).status_code == 200


async def test_probability_draws_are_seeded(emulator: KubeEmulator, api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("a"))

    async def pattern(seed: int) -> list[int]:
        emulator.faults.clear()
        emulator.faults.reseed(seed)
        emulator.faults.inject("get", "pods", Answer(status=500), probability=0.3)
        return [(await api.get(f"{PODS}/a")).status_code for _ in range(60)]

    first, again, other = await pattern(7), await pattern(7), await pattern(8)
    assert first == again
    assert first != other
    # One draw of random.Random(seed) per matching request: a fault below p.
    rng = random.Random(7)
    assert first == [500 if rng.random() < 0.3 else 200 for _ in range(60)]
    assert 5 < first.count(500) < 35


def test_rules_are_checked() -> None:
    faults = ApiFaults()
    with pytest.raises(ValueError, match="unknown verb"):
        faults.inject("post", "pods", Answer(status=500))
    with pytest.raises(ValueError, match="needs a status"):
        faults.inject("get", "pods", Answer())
    with pytest.raises(ValueError, match="writes only"):
        faults.inject("get", "pods", Answer(status=500, committed=True))
    with pytest.raises(ValueError, match="compact"):
        faults.inject("list", "pods", Answer(status=410))
    with pytest.raises(ValueError, match="probability"):
        faults.inject("get", "pods", Answer(status=500), probability=1.5)


async def watch_lines(
    api: httpx.AsyncClient, params: dict[str, str], until: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """The watch's HTTP status and its events, until the server ends it (or ``until``)."""
    events: list[dict[str, Any]] = []
    async with api.stream("GET", PODS, params={"watch": "true", **params}) as resp:
        async for line in resp.aiter_lines():
            if line.strip():
                events.append(json.loads(line))
            if until is not None and len(events) >= until:
                break
        return resp.status_code, events


async def test_a_watch_ends_with_a_gone_error_event_after_some_events(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """The watch is answered (200); after two events an ``ERROR`` event with the
    ``Expired`` ``Status`` ends it, as the watch cache and etcd compaction end a watch."""
    version = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    for name in ("a", "b", "c"):
        await api.post(PODS, json=pod(name))
    rule = emulator.faults.inject("watch", "pods", Answer(status=410, after_events=2), times=1)
    current = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    status, events = await asyncio.wait_for(watch_lines(api, {"resourceVersion": version}), 10)
    assert status == 200
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "ERROR"]
    error = events[-1]["object"]
    assert (error["kind"], error["status"], error["reason"], error["code"]) == (
        "Status", "Failure", "Expired", 410,
    )  # fmt: skip
    assert error["message"] == f"too old resource version: {version} ({current})"
    assert rule.hits == 1
    # times=1: the next watch streams as usual
    status, events = await asyncio.wait_for(
        watch_lines(api, {"resourceVersion": version}, until=3), 10
    )
    assert [e["object"]["metadata"]["name"] for e in events] == ["a", "b", "c"]


async def test_a_watch_open_when_the_fault_comes_ends_on_its_next_event(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    emulator.faults.inject("watch", "pods", Answer(status=410, after_events=1), times=1)
    version = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    task = asyncio.create_task(watch_lines(api, {"resourceVersion": version}))
    await asyncio.sleep(0.2)
    assert not task.done()
    await api.post(PODS, json=pod("a"))
    await api.post(PODS, json=pod("b"))
    status, events = await asyncio.wait_for(task, 10)
    assert (status, [e["type"] for e in events]) == (200, ["ADDED", "ERROR"])


async def test_a_rule_catches_a_watch_already_open(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    version = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    task = asyncio.create_task(watch_lines(api, {"resourceVersion": version}))
    await api.post(PODS, json=pod("a"))
    await asyncio.sleep(0.2)
    rule = emulator.faults.inject("watch", "pods", Answer(status=410, after_events=1), times=1)
    await api.post(PODS, json=pod("b"))
    await api.post(PODS, json=pod("c"))
    status, events = await asyncio.wait_for(task, 10)
    assert status == 200
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "ERROR"]
    assert [e["object"]["metadata"]["name"] for e in events[:2]] == ["a", "b"]
    assert rule.hits == 1


async def test_compaction_expires_older_watches_lists_and_continue_tokens(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    for name in ("a", "b", "c"):
        await api.post(PODS, json=pod(name))
    old = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    first_page = (await api.get(PODS, params={"limit": "1"})).json()
    await api.post(PODS, json=pod("d"))
    revision = emulator.compact()
    assert revision > int(old)
    # A watch from before: 200, then the Expired ERROR event, and the stream ends.
    status, events = await asyncio.wait_for(watch_lines(api, {"resourceVersion": old}), 10)
    assert status == 200 and [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["message"] == f"too old resource version: {old} ({revision})"
    # A continue token of a list begun before: 410 Expired.
    token = first_page["metadata"]["continue"]
    expired = await api.get(PODS, params={"limit": "1", "continue": token})
    assert (expired.status_code, expired.json()["reason"]) == (410, "Expired")
    # A list at an exact older version: 410 Expired (NotOlderThan is served).
    exact = {"resourceVersion": old, "resourceVersionMatch": "Exact"}
    assert (await api.get(PODS, params=exact)).status_code == 410
    newer = {"resourceVersion": old, "resourceVersionMatch": "NotOlderThan"}
    assert (await api.get(PODS, params=newer)).status_code == 200
    # From the compacted revision on, watches resume without a relist.
    await api.post(PODS, json=pod("e"))
    status, events = await asyncio.wait_for(
        watch_lines(api, {"resourceVersion": str(revision)}, until=1), 10
    )
    assert [e["object"]["metadata"]["name"] for e in events] == ["e"]


async def test_a_watch_ends_when_its_client_goes_away(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """kube-apiserver ends a watch whose connection closed (the request's context is
    cancelled): nothing stays open for a client that left."""

    async def opened() -> bool:
        return emulator.open_watches == 1

    async with (
        httpx.AsyncClient(base_url=str(emulator.url)) as client,
        client.stream("GET", PODS, params={"watch": "true"}) as resp,
    ):
        assert resp.status_code == 200
        await until(opened)
    # the client closed the stream and its connection

    async def closed() -> bool:
        return emulator.open_watches == 0

    await until(closed)


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.02)


# -- the fault routes (``fault_control``): the twin's API server is another process ---------

CONTROL = "/_twin/faults"


async def test_the_fault_routes_are_not_found_unless_enabled(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Off by default: 404 with kube-apiserver's body for an unknown path, no rule
    added, and the cluster's paths served as before."""
    rule = {"verb": "create", "resource": "pods", "status": 500}
    for method, path in (("POST", CONTROL), ("GET", CONTROL), ("POST", "/_twin/compact")):
        answer = await api.request(method, path, json={"rules": [rule]})
        assert answer.status_code == 404
        assert (answer.json()["kind"], answer.json()["reason"]) == ("Status", "NotFound")
    assert emulator.faults.rules == []
    assert (await api.post(PODS, json=pod("a"))).status_code == 201


async def test_rules_posted_to_the_fault_route_are_served_and_counted(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """POST adds rules (201, every rule back); the faults they serve show in GET's
    ``hits``; a rule on every verb and resource never faults the routes themselves;
    DELETE answers the rules with their final hits and removes them."""
    emulator.fault_control = True
    rules = [
        {"verb": "create", "resource": "pods", "status": 409, "times": 1, "user_agent": "x/*"},
        {"verb": "*", "resource": "*", "status": 500, "user_agent": "python-httpx/*"},
    ]
    added = await api.post(CONTROL, json={"rules": rules, "seed": 7})
    assert added.status_code == 201, added.text
    body = added.json()
    assert body["seed"] == 7
    assert [(r["verb"], r["status"], r["hits"]) for r in body["rules"]] == [
        ("create", 409, 0), ("*", 500, 0),
    ]  # fmt: skip
    conflict = await api.post(PODS, json=pod("a"), headers={"User-Agent": "x/1"})
    assert (conflict.status_code, conflict.json()["reason"]) == (409, "Conflict")
    assert (await api.get(PODS)).status_code == 500  # python-httpx: the second rule
    seen = (await api.get(CONTROL)).json()["rules"]  # not faulted by "*"/"*"
    assert [r["hits"] for r in seen] == [1, 1]
    assert emulator.faults.rules[0].hits == 1
    removed = await api.delete(CONTROL)
    assert removed.status_code == 200
    assert [r["hits"] for r in removed.json()["rules"]] == [1, 1]
    assert emulator.faults.rules == []
    assert (await api.post(PODS, json=pod("a"))).status_code == 201


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"rules": [{"verb": "get", "resource": "pods", "delay_s": 1, "bogus": 1}]}, "bogus"),
        ({"rules": [{"verb": "get", "resource": "pods", "delay_s": "1"}]}, "delay_s"),
        ({"rules": [{"verb": "get", "resource": "pods", "delay_s": 1, "times": True}]}, "times"),
        ({"rules": [{"verb": "fly", "resource": "pods", "status": 500}]}, "unknown verb"),
        ({"rules": [{"verb": "get", "resource": "pods"}]}, "needs a status"),
        ({"rules": {"verb": "get"}}, "list of objects"),
        ({"rules": [], "seed": "1"}, "seed"),
        ({"rule": []}, "the body must be"),
        ([], "the body must be"),
    ],
)
async def test_a_bad_rule_is_refused_and_nothing_is_added(
    emulator: KubeEmulator, api: httpx.AsyncClient, body: Any, reason: str
) -> None:
    """400 ``BadRequest`` naming what is wrong (the rule's index), checked as strictly
    as ``inject``'s signature (a string is no number, a bool no count), and no rule
    added: not even the good rule sent before the bad one."""
    emulator.fault_control = True
    good = {"verb": "get", "resource": "pods", "status": 500}
    if isinstance(body, dict) and isinstance(body.get("rules"), list) and body["rules"]:
        body = {**body, "rules": [good, *body["rules"]]}
    answer = await api.post(CONTROL, json=body)
    assert answer.status_code == 400
    assert answer.json()["reason"] == "BadRequest"
    assert reason in answer.json()["message"]
    if isinstance(body, dict) and isinstance(body.get("rules"), list) and body["rules"]:
        assert "rule 1" in answer.json()["message"]
    assert emulator.faults.rules == []
    assert (await api.get(PODS)).status_code == 200


async def test_compaction_through_the_route_expires_older_watches(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    emulator.fault_control = True
    await api.post(PODS, json=pod("a"))
    old = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    await api.post(PODS, json=pod("b"))
    answer = await api.post("/_twin/compact")
    assert answer.status_code == 201
    revision = answer.json()["revision"]
    assert revision > int(old) and emulator.faults.compacted == revision
    _, events = await asyncio.wait_for(watch_lines(api, {"resourceVersion": old}), 10)
    assert [e["type"] for e in events] == ["ERROR"] and events[0]["object"]["code"] == 410


def test_the_api_server_process_opens_its_fault_routes_only_with_the_flag(
    tmp_path: Path,
) -> None:
    """``python -m powerflow.lab.twin.apiserver`` as the twin starts it: with
    ``--fault-control`` a test in another process injects faults through
    ``FaultControl`` and reads how many were served; without it the route is 404."""
    for enabled in (False, True):
        folder = tmp_path / str(enabled)
        folder.mkdir()
        port = free_port()
        server = apiserver_process(folder, port, [], fault_control=enabled).start(60)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                control = FaultControl(client)
                if not enabled:
                    with pytest.raises(ValueError, match="404"):
                        control.inject({"verb": "list", "resource": "pods", "status": 500})
                    assert client.get("/api/v1/pods").status_code == 200
                    continue
                control.inject(
                    {"verb": "list", "resource": "pods", "status": 429, "times": 2}, seed=3
                )
                answers = [client.get("/api/v1/pods") for _ in range(3)]
                assert [a.status_code for a in answers] == [429, 429, 200]
                assert answers[0].headers["Retry-After"] == "1"
                assert [r["hits"] for r in control.rules()] == [2]
                assert control.compact() >= 0
                assert [r["hits"] for r in control.clear()] == [2]
                assert control.rules() == []
        finally:
            server.stop()


def test_a_slow_request_is_answered_while_the_bounded_log_moves_on() -> None:
    """A request still waiting (here a 1 s delay) while dozens of others fill the
    twin's bounded log (``keep_requests``) is answered as it should be, not 500:
    kmock looks for the request itself in the log to find its reaction."""
    with (
        ApiServer(keep_requests=5, fault_control=True) as server,
        httpx.Client(base_url=server.url) as client,
        httpx.Client(base_url=server.url) as others,
        ThreadPoolExecutor(1) as pool,
    ):
        rule = {"verb": "create", "resource": "configmaps", "delay_s": 1.0, "times": 1}
        FaultControl(client).inject(rule)
        body = {"metadata": {"name": "late"}, "data": {"a": "1"}}
        late = pool.submit(client.post, "/api/v1/namespaces/ns/configmaps", json=body)
        while not late.done():
            assert others.get("/api/v1/namespaces/ns/pods").status_code == 200
        answer = late.result()
        assert answer.status_code == 201, answer.text
        assert answer.json()["metadata"]["name"] == "late"
        assert server.emulator is not None
        assert len(server.emulator._requests) <= 11
