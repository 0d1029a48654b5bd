"""No input makes a verb answer anything but 200 with its own shape (a 500 strands every pod).

Hypothesis sends arbitrary JSON, and bodies shaped like the scheduler's with
every field PowerFlow reads replaced by junk, to an app whose cache holds a
cluster with gangs in it, so the placement paths run too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from extender_bodies import node, pod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from powerflow.extender import create_app
from powerflow.extender.wire import MAX_EXTENDER_PRIORITY

from powerflow.core.contract import (
    GENERATION_ANNOTATION,
    GPU_RESOURCE,
    JOB_LABEL,
    WORKERS_ANNOTATION,
)

VERBS = ("/filter", "/prioritize", "/bind")
NODE_NAMES = [f"gpu-{i}" for i in range(4)]

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
junk = json_values | st.sampled_from(
    ["4", "0", "-1", "1e309", "8", " 2 ", "NaN", "Infinity", str(10**400), 10**400, "\ud800"]
)
"""Values that broke readers before: overflowing numbers, numeric strings, lone surrogates."""


class Client:
    """One app and one loop for all examples (hypothesis examples cannot be async)."""

    def __init__(self) -> None:
        app = create_app(connect=False)
        bound = [
            pod(f"old-{i}", job="old", workers=4, index=i, node_name="gpu-0") for i in range(4)
        ]
        self.state = app.state.extender.state
        self.state.replace([node(n) for n in NODE_NAMES], bound)
        self.loop = asyncio.new_event_loop()
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://extender"
        )

    def post(self, path: str, content: bytes) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        return self.loop.run_until_complete(self.http.post(path, content=content, headers=headers))

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    c = Client()
    yield c
    c.close()


def check(path: str, response: httpx.Response, candidates: list[str] | None = None) -> None:
    assert response.status_code == 200, response.text
    # Every failure is one the extender meant, never a bug caught by the safety net.
    assert "internal error" not in response.headers.get("x-powerflow-error", "")
    body = response.json()
    if path == "/prioritize":
        assert isinstance(body, list)
        for entry in body:
            assert set(entry) == {"Host", "Score"}
            assert 0 <= entry["Score"] <= MAX_EXTENDER_PRIORITY
        return
    assert isinstance(body, dict) and isinstance(body["Error"], str)
    assert not body["Error"].startswith("internal error"), body["Error"]
    if path == "/filter" and not body["Error"] and candidates is not None:
        assert set(body["NodeNames"] or []) <= set(candidates)


fuzz = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@fuzz
@given(path=st.sampled_from(VERBS), body=json_values)
def test_arbitrary_json_never_gives_a_500(client: Client, path: str, body: Any) -> None:
    check(path, client.post(path, json.dumps(body).encode()))


@fuzz
@given(path=st.sampled_from(VERBS), raw=st.binary(max_size=64))
def test_arbitrary_bytes_never_give_a_500(client: Client, path: str, raw: bytes) -> None:
    check(path, client.post(path, raw))


@st.composite
def scheduler_like(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    body = pod("p", job="j", workers=4)
    meta = body["metadata"]
    if draw(st.booleans()):
        meta["labels"][JOB_LABEL] = draw(junk)
    if draw(st.booleans()):
        meta["annotations"][WORKERS_ANNOTATION] = draw(junk)
    if draw(st.booleans()):
        meta["annotations"][GENERATION_ANNOTATION] = draw(junk)
    for key in ("name", "namespace", "labels", "annotations"):
        if draw(st.integers(0, 5)) == 0:
            meta[key] = draw(junk)
    container = body["spec"]["containers"][0]
    if draw(st.booleans()):
        container["resources"]["limits"][GPU_RESOURCE] = draw(junk)
    if draw(st.integers(0, 5)) == 0:
        container["resources"] = draw(junk)
    if draw(st.integers(0, 5)) == 0:
        body["spec"]["containers"] = draw(junk)
    if draw(st.integers(0, 5)) == 0:
        body["spec"]["nodeName"] = draw(junk)
    if draw(st.integers(0, 3)) == 0:
        body["status"]["phase"] = draw(junk)
    if draw(st.integers(0, 3)) == 0:
        body["spec"]["tolerations"] = draw(junk | st.lists(junk, max_size=3))
    names = draw(
        st.lists(st.sampled_from([*NODE_NAMES, "elsewhere"]) | st.text(max_size=6), max_size=6)
    )
    return body, names


@fuzz
@given(case=scheduler_like(), cache_capable=st.booleans(), path=st.sampled_from(VERBS[:2]))
def test_scheduler_shaped_junk_never_gives_a_500(
    client: Client, case: tuple[dict[str, Any], list[str]], cache_capable: bool, path: str
) -> None:
    body, names = case
    if cache_capable:
        payload: dict[str, Any] = {"Pod": body, "NodeNames": names}
    else:
        items = [node(n) if n in NODE_NAMES else {"metadata": {"name": n}} for n in names]
        payload = {"Pod": body, "Nodes": {"metadata": {}, "items": items}}
    check(path, client.post(path, json.dumps(payload).encode()), names)


@fuzz
@given(
    name=st.text(max_size=20),
    namespace=st.text(max_size=20),
    uid=json_values,
    target=st.text(max_size=20),
)
def test_binding_args_junk_never_gives_a_500(
    client: Client, name: str, namespace: str, uid: Any, target: str
) -> None:
    payload = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": target}
    check("/bind", client.post("/bind", json.dumps(payload).encode()))


@st.composite
def junk_node(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A node of the cache with the fields placement reads replaced by junk."""
    body = node(name, draw(st.sampled_from([0, 1, 4, 7, 8])))
    if draw(st.booleans()):
        body["spec"]["unschedulable"] = draw(junk)
    if draw(st.booleans()):
        body["spec"]["taints"] = draw(
            junk | st.lists(st.fixed_dictionaries({"key": junk, "effect": junk}), max_size=2)
        )
    if draw(st.booleans()):
        body["status"]["conditions"] = draw(junk | st.lists(junk, max_size=2))
    if draw(st.booleans()):
        body["status"]["allocatable"][GPU_RESOURCE] = draw(junk)
    if draw(st.integers(0, 3)) == 0:
        body["metadata"]["labels"] = draw(junk)
    return body


@fuzz
@given(
    nodes=st.tuples(*(junk_node(n) for n in NODE_NAMES)),
    case=scheduler_like(),
    path=st.sampled_from(VERBS[:2]),
)
def test_junk_nodes_in_the_cache_never_give_a_500(
    client: Client,
    nodes: tuple[dict[str, Any], ...],
    case: tuple[dict[str, Any], list[str]],
    path: str,
) -> None:
    body, names = case
    bound = [pod(f"old-{i}", job="old", workers=4, index=i, node_name="gpu-0") for i in range(4)]
    try:
        client.state.replace(list(nodes), bound)
        payload = {"Pod": body, "NodeNames": names}
        check(path, client.post(path, json.dumps(payload).encode()), names)
    finally:
        client.state.replace([node(n) for n in NODE_NAMES], bound)
