"""The emulator finds a request's reaction as kmock does, without rescanning its log
(``powerflow.lab.twin.reactions``): the same answer for every view kmock offers, over real
HTTP, and the same responses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import kmock
import pytest
from kmock._internal import dsl
from support.kube_emulator import KubeEmulator

from powerflow.lab.twin.reactions import sees

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        yield client


async def test_user_reactions_answer_as_kmock_orders_them(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Criteria, a callable, a slice (the first two only), a priority and an
    or-group: each request gets the reaction kmock's own scan would give it."""
    kmock["get /x"][:2] << b"first two"
    kmock["get /x"] << b"later"
    kmock[lambda request: request.params.get("v") == "1"] << b"callable"
    (kmock["get /a"] | kmock["get /b"]) << b"a or b"
    kmock["/p"] ** 5 << b"high"
    kmock["/p"] << b"low"
    answers = [
        (await api.get(path)).text for path in ["/x", "/x", "/x", "/y?v=1", "/a", "/b", "/p"]
    ]
    assert answers == ["first two", "first two", "later", "callable", "a or b", "a or b", "high"]
    # The API server's own routes still answer beside them.
    assert (await api.get("/api/v1/namespaces/ns/pods")).status_code == 200


async def test_sees_agrees_with_kmocks_scan_for_every_reaction_and_request(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """For every logged request and every reaction (the emulator's fallbacks and views of
    each kind), ``sees`` answers what ``request in view`` answers; the shortcut is taken
    (no scan) for the criteria-and-priority chains."""
    kmock["get /x"][:1] << b"slice"
    kmock["get"]["/x"] << b"chained criteria"
    kmock[lambda request: "q" in request.params] << b"callable"
    (kmock["get /a"] | kmock["post /a"]) << b"group"
    (kmock["/e"] - kmock["get /e"]) << b"exclusion"
    kmock.fallback**3 << 404
    # A callable after a method: kmock keeps them two filters, and the callable sees
    # only POSTs (on a GET, ``data`` is None and it would raise).
    chained = kmock["post"][lambda request: request.data.get("x") == 1]
    assert type(chained) is dsl.Filter and type(chained._source) is dsl.Filter
    chained << b"posted x"
    for path in ["/x", "/x", "/x?q=1", "/a", "/e", "/zzz"]:
        await api.get(path)
    assert (await api.get("/c")).status_code == 404
    assert (await api.post("/c", json={"x": 1})).text == "posted x"
    await api.post("/a", json={})
    await api.post("/e", json={})
    await api.post("/api/v1/namespaces/ns/pods", json={"metadata": {"name": "p"}})
    await api.get("/api/v1/namespaces/ns/pods/p")
    requests = list(kmock)
    reactions = list(kmock._payloads)
    assert len(requests) == 12 and len(reactions) >= 7
    shortcut = 0
    for payload in reactions:
        source = payload._source
        for request in requests:
            assert sees(kmock, source, request) == (request in source), (payload, request)
        shortcut += _chain_is_criteria(kmock, source)
    assert shortcut >= 4  # the fallbacks, the chained criteria, the callables


def _chain_is_criteria(root: kmock.RawHandler, view: dsl.View) -> bool:
    while type(view) in (dsl.Filter, dsl.Priority):
        view = view._source  # type: ignore[attr-defined]
    return view is root
