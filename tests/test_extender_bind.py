"""Bind, the cluster mirror and restarts, against the emulated API server over real HTTP.

The extender runs as in production: its mirror lists and watches the
emulator (``support.kube_emulator``), ``/bind`` posts the pod's ``binding``
subresource, and a second app started on the same cluster rebuilds the gang
reservations from the bound pods' placement annotations. Everything is
async on pytest's loop: the extender's httpx client never blocks it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import kmock as kmock_module
import pytest
from extender_bodies import args, binding_args, go_json, node, pod
from fastapi import FastAPI
from powerflow.extender import create_app, mirror
from powerflow.extender.kube import Connection, KubeApi
from powerflow.extender.objects import pod_info
from powerflow.extender.state import ClusterState
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.core.contract import (
    API_VERSION,
    GENERATION_ANNOTATION,
    GROUP,
    KIND,
    PLACEMENT_ANNOTATION,
    PLURAL,
    VERSION,
)

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
NODE_NAMES = [f"gpu-{i}" for i in range(4)]


@pytest.fixture
async def cluster(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """The emulator with four 8-GPU nodes and the DLJob resource; yields a plain client."""
    kmock.load_builtins()
    kmock.declare(f"{GROUP}/{VERSION}/{PLURAL}", KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for name in NODE_NAMES:
            body = node(name)
            status = body.pop("status")
            assert (await api.post("/api/v1/nodes", json=body)).status_code == 201
            patched = await api.patch(
                f"/api/v1/nodes/{name}/status", json={"status": status}, headers=MERGE
            )
            assert patched.status_code == 200
        yield api


async def create_pod(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    ns = body["metadata"]["namespace"]
    fresh = json.loads(json.dumps(body))
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        fresh["metadata"].pop(key)
    response = await api.post(f"/api/v1/namespaces/{ns}/pods", json=fresh)
    assert response.status_code == 201
    created: dict[str, Any] = response.json()
    return created


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


class Ext(httpx.AsyncClient):
    """A client of one extender app, with a look at its state."""

    @property
    def state(self) -> ClusterState:
        transport = self._transport
        assert isinstance(transport, httpx.ASGITransport)
        state: ClusterState = transport.app.state.extender.state  # type: ignore[attr-defined]
        return state


@pytest.fixture
async def start(kmock: KubeEmulator) -> AsyncIterator[Callable[..., Any]]:
    """Start extender apps on the emulator (mirror running); all are stopped at the end."""
    apps: list[FastAPI] = []

    async def _start(host: str | None = None, **kw: Any) -> Ext:
        app = create_app(KubeApi(Connection(host or str(kmock.url).rstrip("/"))), **kw)
        apps.append(app)
        await app.state.extender.start()
        return Ext(transport=httpx.ASGITransport(app=app), base_url="http://ext")

    yield _start
    for app in apps:
        await app.state.extender.stop()


async def ready(client: httpx.AsyncClient) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while (await client.get("/readyz")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def schedule(ext: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Filter, prioritize and bind one pod the way kube-scheduler does; returns node and answer."""
    nodes = [node(n) for n in NODE_NAMES]
    filtered = (
        await ext.post(
            "/filter", content=go_json(args(body, nodes, cache_capable=True)), headers=JSON
        )
    ).json()
    assert filtered["Error"] == "", filtered
    admitted = filtered["NodeNames"]
    scored = (
        await ext.post(
            "/prioritize", content=go_json({"Pod": body, "NodeNames": admitted}), headers=JSON
        )
    ).json()
    best = max(scored, key=lambda s: s["Score"])["Host"]
    bound = await ext.post("/bind", content=go_json(binding_args(body, best)), headers=JSON)
    assert bound.status_code == 200
    return best, bound.json()


def worker(
    i: int, workers: int = 4, job: str = "train", owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A worker pod of DLJob ``job``; ``owner``: that DLJob as the API server stored it
    (the pod then names it as its controller and carries its current generation)."""
    body = pod(f"{job}-{i}", job=job, workers=workers, index=i, namespace="ml")
    if owner is not None:
        meta = owner["metadata"]
        ref = {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"]}
        body["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
        generation = owner["status"]["allocation"]["generation"]
        body["metadata"]["annotations"][GENERATION_ANNOTATION] = str(generation)
    return body


async def create_dljob(api: httpx.AsyncClient, name: str, generation: int) -> dict[str, Any]:
    """A DLJob in namespace ``ml`` whose status says allocation ``generation``."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/ml/{PLURAL}"
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": {}}
    assert (await api.post(path, json=body)).status_code == 201
    status = {"status": {"allocation": {"generation": generation}}}
    patched = await api.patch(f"{path}/{name}/status", json=status, headers=MERGE)
    assert patched.status_code == 200, patched.text
    stored: dict[str, Any] = patched.json()
    return stored


async def test_bind_sets_node_and_records_the_placement(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    body = await create_pod(cluster, worker(0))
    chosen, answer = await schedule(ext, body)
    assert answer == {"Error": ""}
    stored = (await cluster.get("/api/v1/namespaces/ml/pods/train-0")).json()
    assert stored["spec"]["nodeName"] == chosen
    placement = json.loads(stored["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert placement["node"] == chosen
    assert len(placement["block"]) == 4
    assert {n for n, _ in placement["block"]} == {chosen}


async def test_second_bind_to_another_node_fails_cleanly_and_same_node_succeeds(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    body = await create_pod(cluster, pod("web-0", gpus=0))  # not PowerFlow's: still bound
    first = await ext.post("/bind", content=go_json(binding_args(body, "gpu-1")), headers=JSON)
    assert first.json() == {"Error": ""}
    other = await ext.post("/bind", content=go_json(binding_args(body, "gpu-2")), headers=JSON)
    assert other.status_code == 200
    assert "already bound to gpu-1" in other.json()["Error"]
    same = await ext.post("/bind", content=go_json(binding_args(body, "gpu-1")), headers=JSON)
    assert same.json() == {"Error": ""}
    stored = (await cluster.get("/api/v1/namespaces/default/pods/web-0")).json()
    assert stored["spec"]["nodeName"] == "gpu-1"
    assert PLACEMENT_ANNOTATION not in (stored["metadata"].get("annotations") or {})


async def test_rebind_of_a_gang_worker_bound_behind_the_cache_is_checked_with_the_api(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    body = await create_pod(cluster, worker(0))
    chosen, _ = await schedule(ext, body)
    other = next(n for n in NODE_NAMES if n != chosen)
    answer = await ext.post("/bind", content=go_json(binding_args(body, other)), headers=JSON)
    assert f"already bound to {chosen}" in answer.json()["Error"]


async def test_bind_of_a_missing_pod_is_a_clear_error(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    missing = {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-0"}
    answer = (await ext.post("/bind", content=go_json(missing), headers=JSON)).json()
    assert "404" in answer["Error"] and "ghost" in answer["Error"]


async def test_a_whole_gang_over_http_and_a_restart_rebuilds_it(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    job = await create_dljob(cluster, "train", generation=1)
    bodies = [await create_pod(cluster, worker(i, workers=16, owner=job)) for i in range(16)]
    placed = [(await schedule(ext, b))[0] for b in bodies[:12]]
    assert sorted({placed.count(n) for n in set(placed)}) == [4, 8]
    block = next(iter(ext.state.gangs.values())).block

    # A new extender (the old one crashed) rebuilds the gang from the bound pods.
    fresh = await start()
    await ready(fresh)
    state = fresh.state
    assert [g.block for g in state.gangs.values()] == [block]
    rest = [(await schedule(fresh, b))[0] for b in bodies[12:]]
    counts = {n: (placed + rest).count(n) for n in set(placed + rest)}
    assert sorted(counts.values()) == [8, 8]
    # And another gang of 8 now gets the two remaining nodes' worth without overlap.
    other = await create_pod(cluster, worker(0, workers=8, job="other"))
    node_name, _ = await schedule(fresh, other)
    assert node_name not in counts


async def test_a_restart_adopts_no_gang_from_pods_no_dljob_owns(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    """Pods that carry the job label and a placement annotation but are not a DLJob's
    workers of its current generation (a tenant's pod, or an old generation) reserve
    nothing after a restart; a DLJob whose status catches up is adopted then."""
    job = await create_dljob(cluster, "train", generation=1)
    ext = await start()
    await ready(ext)
    bodies = [await create_pod(cluster, worker(i, workers=8, owner=job)) for i in range(4)]
    placed = [(await schedule(ext, b))[0] for b in bodies]
    squatter = pod("squat", job="train", workers=1, namespace="ml", gpus=0, generation="1")
    squatter["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps(
        {"node": "gpu-3", "block": [[n, i] for n in NODE_NAMES for i in range(8)]}
    )
    squatter["spec"]["nodeName"] = "gpu-3"
    squatter["metadata"]["namespace"] = "tenant"
    await create_pod(cluster, squatter)
    # The DLJob moved on (a rescale the extender missed while it was down): its old
    # generation's pods are not adopted either.
    path = f"/apis/{GROUP}/{VERSION}/namespaces/ml/{PLURAL}/train/status"
    moved = {"status": {"allocation": {"generation": 2}}}
    assert (await cluster.patch(path, json=moved, headers=MERGE)).status_code == 200

    fresh = await start()
    await ready(fresh)
    assert fresh.state.gangs == {}
    assert fresh.state.filter(pod_info(worker(0, workers=16, job="big")), NODE_NAMES[:]).admitted
    back = {"status": {"allocation": {"generation": 1}}}
    assert (await cluster.patch(path, json=back, headers=MERGE)).status_code == 200
    train = ("ml", "train", "1")
    await wait_for(lambda: any(key[:3] == train for key in fresh.state.gangs))
    (gang,) = [g for key, g in fresh.state.gangs.items() if key[:3] == train]
    assert gang.key.owner  # the DLJob's workers: owned
    assert {n for n, _ in gang.block} == set(placed) and len(gang.block) == 8


async def test_mirror_follows_the_watch(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    state = ext.state
    busy = await create_pod(cluster, pod("someone-else", gpus=8))
    del busy
    binding = {"metadata": {"name": "someone-else"}, "target": {"kind": "Node", "name": "gpu-0"}}
    await cluster.post("/api/v1/namespaces/default/pods/someone-else/binding", json=binding)
    await wait_for(
        lambda: (
            state.pods.get(("default", "someone-else")) is not None
            and state.pods[("default", "someone-else")].node == "gpu-0"
        )
    )
    await cluster.delete("/api/v1/nodes/gpu-3")
    await wait_for(lambda: "gpu-3" not in state.nodes)
    await cluster.delete("/api/v1/namespaces/default/pods/someone-else")
    await wait_for(lambda: ("default", "someone-else") not in state.pods)


async def test_unreachable_api_is_a_clear_error(start: Callable[..., Any]) -> None:
    ext = await start(host="http://127.0.0.1:9")
    await wait_for(lambda: "unreachable" in ext.state.unsynced_reason)
    ready_answer = await ext.get("/readyz")
    assert ready_answer.status_code == 503 and "unreachable" in ready_answer.json()["reason"]
    gang = (
        await ext.post(
            "/filter",
            content=go_json(args(worker(0), [node("gpu-0")], cache_capable=True)),
            headers=JSON,
        )
    ).json()
    assert "unreachable" in gang["Error"]
    plain = (
        await ext.post("/bind", content=go_json(binding_args(pod("web"), "gpu-0")), headers=JSON)
    ).json()
    assert "unreachable" in plain["Error"]


@pytest.mark.parametrize("index", ["1e400", "Infinity", "-1e400"])
async def test_a_poisoned_pod_is_skipped_and_other_gangs_are_placed(
    cluster: httpx.AsyncClient, start: Callable[..., Any], index: str
) -> None:
    """A placement annotation whose index overflows is skipped, not a failed listing
    (which would make the mirror relist forever and keep /readyz at 503)."""
    poisoned = pod("poisoned-0", job="poisoned", workers=1, namespace="ml")
    placement = f'{{"node":"gpu-0","block":[["gpu-0",{index}]]}}'
    poisoned["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement
    await create_pod(cluster, poisoned)
    binding = {"metadata": {"name": "poisoned-0"}, "target": {"kind": "Node", "name": "gpu-0"}}
    assert (
        await cluster.post("/api/v1/namespaces/ml/pods/poisoned-0/binding", json=binding)
    ).status_code == 201
    ext = await start()
    await ready(ext)
    # Another one arriving through the watch is skipped too.
    late = pod("poisoned-1", job="late", workers=1, namespace="ml", node_name="gpu-1")
    late["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement.replace("gpu-0", "gpu-1")
    await create_pod(cluster, late)
    await wait_for(lambda: ("ml", "poisoned-1") in ext.state.pods)
    bodies = [await create_pod(cluster, worker(i, workers=8)) for i in range(8)]
    placed = {(await schedule(ext, b))[0] for b in bodies}
    assert len(placed) == 1 and (await ext.get("/readyz")).status_code == 200


async def test_bind_refuses_a_pod_uid_that_is_not_the_pods(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    body = await create_pod(cluster, worker(0))
    await wait_for(lambda: ("ml", "train-0") in ext.state.pods)
    request = binding_args(body, "gpu-0") | {"PodUID": "6f1d2c3b-0000-4e5f-8a9b-0c1d2e3f4a5b"}
    answer = await ext.post("/bind", content=go_json(request), headers=JSON)
    assert answer.status_code == 200
    assert (
        "uid 6f1d2c3b-0000" in answer.json()["Error"]
        and "nothing was bound" in (answer.json()["Error"])
    )
    stored = (await cluster.get("/api/v1/namespaces/ml/pods/train-0")).json()
    assert not stored["spec"].get("nodeName")
    assert not ext.state.gangs or all(not g.assumed for g in ext.state.gangs.values())


async def test_bind_of_a_pod_re_created_behind_the_cache_asks_the_api(
    cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    ext = await start()
    await ready(ext)
    old = await create_pod(cluster, pod("web-0", gpus=2, namespace="ml"))
    await cluster.delete("/api/v1/namespaces/ml/pods/web-0")
    new = await create_pod(cluster, pod("web-0", gpus=2, namespace="ml"))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    uid = new["metadata"]["uid"]
    await wait_for(lambda: getattr(ext.state.pods.get(("ml", "web-0")), "uid", "") == uid)
    ext.state.upsert_pod(old)  # the watch lags behind: the cache still has the old pod
    answer = await ext.post("/bind", content=go_json(binding_args(new, "gpu-2")), headers=JSON)
    assert answer.json() == {"Error": ""}
    stored = (await cluster.get("/api/v1/namespaces/ml/pods/web-0")).json()
    assert stored["spec"]["nodeName"] == "gpu-2"


def gen_worker(i: int, generation: str) -> dict[str, Any]:
    """A worker of the 32-GPU gang ``ml/bert@<generation>``: four pods of 8 GPUs."""
    return pod(
        f"bert-{generation}-{i}", job="bert", workers=4, gpus=8, index=i,
        namespace="ml", generation=generation,
    )  # fmt: skip


async def filter_and_bind(ext: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Filter, then bind to the first admitted node; the bind's answer (or the filter's)."""
    nodes = [node(n) for n in NODE_NAMES]
    content = go_json(args(body, nodes, cache_capable=True))
    filtered = (await ext.post("/filter", content=content, headers=JSON)).json()
    if filtered["Error"] or not filtered["NodeNames"]:
        return {"Error": filtered["Error"] or str(filtered["FailedNodes"]), "filter": True}
    host = filtered["NodeNames"][0]
    bound = await ext.post("/bind", content=go_json(binding_args(body, host)), headers=JSON)
    answer: dict[str, Any] = bound.json()
    return answer


async def test_a_gang_whose_binds_all_failed_and_whose_pods_went_away_frees_its_block(
    kmock: KubeEmulator, cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    """The twin's stall: every bind of a generation failed (500s, a 404 for a pod deleted
    meanwhile), the operator rescaled (deleted the pods, created the next generation), and
    the old generation's block, never bound, was kept for ever; the new gang found no block.
    """
    ext = await start()
    await ready(ext)
    old = [await create_pod(cluster, gen_worker(i, "22")) for i in range(4)]
    fault = kmock.faults.inject("create", "pods/binding", Answer(status=500), times=3)
    for body in old[:3]:
        assert "500" in (await filter_and_bind(ext, body))["Error"]
    assert fault.hits == 3
    # The last worker is deleted (the rescale) while its bind is in flight: 404.
    fault = kmock.faults.inject("create", "pods/binding", Answer(delay_s=1.0), times=1)
    binding = asyncio.create_task(filter_and_bind(ext, old[3]))
    await wait_for(lambda: fault.hits == 1)
    for body in old:
        path = f"/api/v1/namespaces/ml/pods/{body['metadata']['name']}"
        assert (await cluster.delete(path)).status_code == 200
    assert "404" in (await binding)["Error"]
    await wait_for(lambda: not ext.state.pods)
    new = [await create_pod(cluster, gen_worker(i, "23")) for i in range(4)]
    answers = [await filter_and_bind(ext, body) for body in new]
    assert answers == [{"Error": ""}] * 4, answers
    assert [str(key) for key in ext.state.gangs] == ["ml/bert@23"]
    assert not ext.state._in_flight


async def test_binds_answered_500_after_commit_leave_no_gpus_taken_once_the_pods_go(
    kmock: KubeEmulator, cluster: httpx.AsyncClient, start: Callable[..., Any]
) -> None:
    """A real API server can commit a binding and answer 500 (an etcd timeout): the
    extender forgets the attempt, then counts the pod from the watch; when the pods are
    deleted (a rescale) every GPU is free again for the next generation."""
    ext = await start()
    await ready(ext)
    old = [await create_pod(cluster, gen_worker(i, "7")) for i in range(4)]
    fault = kmock.faults.inject(
        "create", "pods/binding", Answer(status=500, committed=True), times=4
    )
    for body in old:
        assert "500" in (await filter_and_bind(ext, body))["Error"]
    assert fault.hits == 4
    await wait_for(lambda: all(p.bound for p in ext.state.pods.values()))
    assert not ext.state._in_flight
    for body in old:
        path = f"/api/v1/namespaces/ml/pods/{body['metadata']['name']}"
        assert (await cluster.delete(path)).status_code == 200
    await wait_for(lambda: not ext.state.pods)
    assert ext.state.gangs == {}
    new = [await create_pod(cluster, gen_worker(i, "8")) for i in range(4)]
    assert [await filter_and_bind(ext, body) for body in new] == [{"Error": ""}] * 4


async def test_a_worker_someone_else_bound_to_its_node_is_bound_without_a_pod_write(
    cluster: httpx.AsyncClient, start: Callable[..., Any], kmock: KubeEmulator
) -> None:
    """A gang worker bound behind the extender's cache (another binder, a retried call)
    to the very node the scheduler asks for: the binding answers 409, the pod is where
    the scheduler wants it, and that is all: no PATCH of the placement onto it, which the
    chart grants the extender no role for (a 403 on a real cluster, and an error
    answer); its gang's other workers carry the block."""
    ext = await start()
    await ready(ext)
    body = await create_pod(cluster, worker(0))
    wire = go_json(args(body, [node(n) for n in NODE_NAMES], cache_capable=True))
    admitted = (await ext.post("/filter", content=wire, headers=JSON)).json()["NodeNames"]
    extender = ext._transport.app.state.extender  # type: ignore[attr-defined]
    extender._task.cancel()  # the mirror stops: the cache will not see the bind below
    binding = {"metadata": {"name": "train-0"}, "target": {"kind": "Node", "name": admitted[0]}}
    bound = await cluster.post("/api/v1/namespaces/ml/pods/train-0/binding", json=binding)
    assert bound.status_code == 201
    before = len([r for r in kmock if r.method == kmock_module.method.PATCH])
    answer = await ext.post("/bind", content=go_json(binding_args(body, admitted[0])), headers=JSON)
    assert answer.json() == {"Error": ""}
    assert len([r for r in kmock if r.method == kmock_module.method.PATCH]) == before


async def test_a_dljob_resource_installed_after_the_extender_started_is_mirrored_soon(
    kmock: KubeEmulator, start: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started before the CRD (``crds.install=false``, the CRD applied later): the
    extender mirrors DLJobs once the resource exists, within the poll, not at the next
    relist, and stays ready meanwhile."""
    monkeypatch.setattr(mirror, "CRD_POLL_S", 0.05)
    kmock.load_builtins()  # no DLJob resource yet
    ext = await start()
    await ready(ext)
    assert ext.state.dljobs == {}
    kmock.declare(f"{GROUP}/{VERSION}/{PLURAL}", KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        await create_dljob(api, "train", generation=1)
    await wait_for(lambda: ("ml", "train") in ext.state.dljobs)
    assert (await ext.get("/readyz")).status_code == 200
