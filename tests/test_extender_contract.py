"""Every route answers kube-scheduler's extender/v1 bodies as kube-scheduler expects.

Bodies are built as kube-scheduler serialises them (``extender_bodies``): Go
field names for the extender structs, full Pod and NodeList objects inside,
in both ``nodeCacheCapable`` modes. The cache is filled directly (no API
server here); binding against an API server is in ``test_extender_bind.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from extender_bodies import args, binding_args, go_json, node, pod
from powerflow.extender import create_app
from powerflow.extender.wire import MAX_EXTENDER_PRIORITY

from powerflow import __version__

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
JSON = {"Content-Type": "application/json"}
NODES = [node(f"gpu-{i}") for i in range(4)]


def worker(i: int = 0, workers: int = 4) -> dict[str, Any]:
    return pod(f"train-{i}", job="train", workers=workers, index=i, namespace="ml")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(connect=False)
    app.state.extender.state.replace(NODES, [])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://extender"
    ) as c:
        yield c


@pytest.fixture
async def offline() -> AsyncIterator[httpx.AsyncClient]:
    """An app whose kubeconfig does not exist: started, but never synced."""
    app = create_app(kubeconfig="/nonexistent/kubeconfig")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://extender"
    ) as c:
        yield c


async def post(c: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    response = await c.post(path, content=go_json(body), headers=JSON)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response


@pytest.mark.parametrize("cache_capable", [True, False], ids=["NodeNames", "Nodes"])
async def test_filter_passes_every_node_for_pods_that_are_not_powerflows(
    client: httpx.AsyncClient, cache_capable: bool
) -> None:
    plain = pod("web-0", gpus=0)
    result = (await post(client, "/filter", args(plain, NODES, cache_capable=cache_capable))).json()
    assert set(result) == FILTER_KEYS
    assert result["Error"] == "" and result["FailedNodes"] is None
    if cache_capable:
        assert result["NodeNames"] == [n["metadata"]["name"] for n in NODES]
        assert result["Nodes"] is None
    else:
        assert result["NodeNames"] is None
        assert result["Nodes"]["items"] == NODES  # the objects come back untouched


@pytest.mark.parametrize("cache_capable", [True, False], ids=["NodeNames", "Nodes"])
async def test_filter_admits_only_the_gangs_block(
    client: httpx.AsyncClient, cache_capable: bool
) -> None:
    result = (
        await post(client, "/filter", args(worker(), NODES, cache_capable=cache_capable))
    ).json()
    assert set(result) == FILTER_KEYS and result["Error"] == ""
    if cache_capable:
        admitted = result["NodeNames"]
    else:
        admitted = [n["metadata"]["name"] for n in result["Nodes"]["items"]]
        assert result["Nodes"]["items"][0] in NODES
    assert len(admitted) == 1
    names = {n["metadata"]["name"] for n in NODES}
    # Outside the gang's block no eviction makes room: FailedAndUnresolvableNodes.
    assert result["FailedNodes"] is None
    assert set(result["FailedAndUnresolvableNodes"]) == names - set(admitted)
    assert all("ml/train" in why for why in result["FailedAndUnresolvableNodes"].values())
    # The next worker of the same gang is sent to the same block.
    again = (await post(client, "/filter", args(worker(1), NODES, cache_capable=True))).json()
    assert again["NodeNames"] == admitted


@pytest.mark.parametrize("cache_capable", [True, False], ids=["NodeNames", "Nodes"])
async def test_prioritize_scores_the_block_and_is_neutral_for_others(
    client: httpx.AsyncClient, cache_capable: bool
) -> None:
    body = args(worker(), NODES, cache_capable=cache_capable)
    admitted = (await post(client, "/filter", body)).json()["FailedAndUnresolvableNodes"]
    scores = (await post(client, "/prioritize", body)).json()
    assert [set(s) for s in scores] == [{"Host", "Score"}] * len(NODES)
    assert [s["Host"] for s in scores] == [n["metadata"]["name"] for n in NODES]
    assert all(0 <= s["Score"] <= MAX_EXTENDER_PRIORITY for s in scores)
    by_host = {s["Host"]: s["Score"] for s in scores}
    block = [h for h in by_host if h not in admitted]
    assert len(block) == 1
    assert by_host[block[0]] > max(v for h, v in by_host.items() if h != block[0])
    plain = args(pod("web-0", gpus=0), NODES, cache_capable=cache_capable)
    neutral = (await post(client, "/prioritize", plain)).json()
    assert len({s["Score"] for s in neutral}) == 1


async def test_keys_are_matched_case_insensitively_as_go_does(client: httpx.AsyncClient) -> None:
    names = [n["metadata"]["name"] for n in NODES]
    for key_pod, key_names in (("pod", "nodenames"), ("POD", "NODENAMES"), ("pOd", "nodeNames")):
        body = {key_pod: worker(), key_names: names, "SomethingNew": 1}
        result = (await post(client, "/filter", body)).json()
        assert result["Error"] == "" and len(result["NodeNames"]) == 1
    bind = (await post(client, "/bind", {"podname": "p", "node": "gpu-0"})).json()
    assert set(bind) == {"Error"} and "no Kubernetes API" in bind["Error"]


async def test_null_fields_decode_like_go_nil(client: httpx.AsyncClient) -> None:
    result = (await post(client, "/filter", {"Pod": None, "Nodes": None, "NodeNames": None})).json()
    assert "no Pod" in result["Error"]


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b"null", b'"text"', b'{"Pod": 3}', b'{"NodeNames": "gpu-0"}'],
    ids=["empty", "truncated", "list", "null", "string", "pod-int", "names-str"],
)
async def test_undecodable_requests_get_200_with_error(
    client: httpx.AsyncClient, body: bytes
) -> None:
    for path in ("/filter", "/prioritize", "/bind"):
        response = await client.post(path, content=body, headers=JSON)
        assert response.status_code == 200, (path, response.text)
        if path == "/prioritize":
            assert response.json() == []
            assert response.headers["x-powerflow-error"]
        elif body != b'{"Pod": 3}' or path == "/filter":
            assert response.json()["Error"], (path, body)


async def test_malformed_gang_size_is_an_error_not_a_guess(client: httpx.AsyncClient) -> None:
    bad = worker()
    bad["metadata"]["annotations"]["powerflow.io/workers"] = "four"
    result = (await post(client, "/filter", args(bad, NODES, cache_capable=True))).json()
    assert "not an integer" in result["Error"]


async def test_offline_app_still_serves_plain_pods_and_says_why_for_powerflow_pods(
    offline: httpx.AsyncClient,
) -> None:
    assert (await offline.get("/healthz")).status_code == 200
    ready = await offline.get("/readyz")
    assert ready.status_code == 503
    assert "no Kubernetes configuration" in ready.json()["reason"]
    plain = (
        await post(offline, "/filter", args(pod("web", gpus=0), NODES, cache_capable=True))
    ).json()
    assert plain["Error"] == "" and len(plain["NodeNames"]) == len(NODES)
    gang = (await post(offline, "/filter", args(worker(), NODES, cache_capable=True))).json()
    assert "cannot place" in gang["Error"] and "/nonexistent/kubeconfig" in gang["Error"]
    bind = (await post(offline, "/bind", binding_args(worker(), "gpu-0"))).json()
    assert "no Kubernetes API configured" in bind["Error"]


async def test_health_version_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/readyz")).json()["ready"] is True
    assert (await client.get("/version")).json() == {
        "name": "powerflow-extender",
        "version": __version__,
    }
    await post(client, "/filter", args(worker(), NODES, cache_capable=True))
    await post(client, "/prioritize", args(worker(), NODES, cache_capable=True))
    await client.post("/filter", content=b"{", headers=JSON)
    text = (await client.get("/metrics")).text
    assert 'powerflow_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert 'powerflow_extender_request_duration_seconds_count{verb="prioritize"} 1.0' in text
    assert 'powerflow_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert 'powerflow_extender_requests_total{outcome="error",verb="filter"} 1.0' in text
    assert 'powerflow_extender_cache_objects{kind="nodes"} 4.0' in text
    assert 'powerflow_extender_cache_objects{kind="gangs"} 1.0' in text
