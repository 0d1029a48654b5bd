"""The test emulator behaves as kube-apiserver does where our components depend on it.

Each test pins one documented API-server behaviour, over real HTTP (httpx, and
the official ``kubernetes`` client for the binding call).
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kmock
import kubernetes
import pytest
from support.kube_emulator import KubeEmulator

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

PODS = "/api/v1/namespaces/ns/pods"
JOBS = "/apis/powerflow.io/v1alpha1/namespaces/ns/dljobs"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSONPATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
def emulator(kmock: KubeEmulator) -> KubeEmulator:
    kmock.load_builtins()
    kmock.declare("powerflow.io/v1alpha1/dljobs", "DLJob")
    return kmock


@pytest.fixture
async def api(emulator: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=str(emulator.url)) as client:
        yield client


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_create_sets_server_fields_and_201(api: httpx.AsyncClient) -> None:
    resp = await api.post(PODS, json=pod("a"))
    assert resp.status_code == 201
    meta = resp.json()["metadata"]
    assert meta["namespace"] == "ns"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    again = await api.post(PODS, json=pod("a"))
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"


async def test_generate_name(api: httpx.AsyncClient) -> None:
    body = {"metadata": {"generateName": "ev-"}, "reason": "x"}
    first = (await api.post("/api/v1/namespaces/ns/events", json=body)).json()
    second = (await api.post("/api/v1/namespaces/ns/events", json=body)).json()
    assert first["metadata"]["name"].startswith("ev-")
    assert first["metadata"]["name"] != second["metadata"]["name"]


async def test_versions_increase_and_generation_tracks_spec_only(api: httpx.AsyncClient) -> None:
    job = {"metadata": {"name": "j"}, "spec": {"iterations": 10}}
    v0 = (await api.post(JOBS, json=job)).json()["metadata"]
    label = {"metadata": {"labels": {"x": "1"}}}
    v1 = (await api.patch(f"{JOBS}/j", json=label, headers=MERGE)).json()["metadata"]
    spec = {"spec": {"iterations": 20}}
    v2 = (await api.patch(f"{JOBS}/j", json=spec, headers=MERGE)).json()["metadata"]
    status = {"status": {"phase": "Running"}}
    v3 = (await api.patch(f"{JOBS}/j/status", json=status, headers=MERGE)).json()["metadata"]
    rvs = [int(m["resourceVersion"]) for m in (v0, v1, v2, v3)]
    assert rvs == sorted(set(rvs))
    assert [m["generation"] for m in (v0, v1, v2, v3)] == [1, 1, 2, 2]
    # a no-op patch writes nothing
    v4 = (await api.patch(f"{JOBS}/j", json=spec, headers=MERGE)).json()["metadata"]
    assert v4["resourceVersion"] == v3["resourceVersion"]


async def test_status_subresource_split(api: httpx.AsyncClient) -> None:
    created = await api.post(JOBS, json={"metadata": {"name": "j"}, "status": {"phase": "X"}})
    assert "status" not in created.json()
    both = {"spec": {"iterations": 5}, "status": {"phase": "Running"}}
    main = (await api.patch(f"{JOBS}/j", json=both, headers=MERGE)).json()
    assert main["spec"] == {"iterations": 5} and "status" not in main
    other = {"spec": {"iterations": 9}, "status": {"phase": "Running"}}
    sub = (await api.patch(f"{JOBS}/j/status", json=other, headers=MERGE)).json()
    assert sub["spec"] == {"iterations": 5} and sub["status"] == {"phase": "Running"}


async def test_stale_resource_version_conflicts(api: httpx.AsyncClient) -> None:
    meta = (await api.post(PODS, json=pod("a"))).json()["metadata"]
    await api.patch(f"{PODS}/a", json={"metadata": {"labels": {"x": "1"}}}, headers=MERGE)
    stale = {"metadata": {"resourceVersion": meta["resourceVersion"], "labels": {"x": "2"}}}
    assert (await api.patch(f"{PODS}/a", json=stale, headers=MERGE)).status_code == 409
    put = pod("a") | {"metadata": {"name": "a", "resourceVersion": meta["resourceVersion"]}}
    assert (await api.put(f"{PODS}/a", json=put)).status_code == 409


async def test_json_patch_test_failure_is_422(api: httpx.AsyncClient) -> None:
    meta = (await api.post(PODS, json=pod("a"))).json()["metadata"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "nope"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
    ]
    assert (await api.patch(f"{PODS}/a", json=ops, headers=JSONPATCH)).status_code == 422
    ops[0]["value"] = meta["resourceVersion"]
    ok = await api.patch(f"{PODS}/a", json=ops, headers=JSONPATCH)
    assert ok.status_code == 200 and ok.json()["metadata"]["finalizers"] == ["f"]


async def test_merge_patch_replaces_lists_whole_and_null_deletes(api: httpx.AsyncClient) -> None:
    # RFC 7386, as kube-apiserver applies application/merge-patch+json (a Node's taints
    # have no strategic merge key either: a patch of spec.taints is the whole list).
    a = {"key": "a", "effect": "NoSchedule"}
    b = {"key": "b", "effect": "PreferNoSchedule"}
    node = {"metadata": {"name": "n", "annotations": {"x": "1", "y": "2"}}, "spec": {"taints": [a]}}
    assert (await api.post("/api/v1/nodes", json=node)).status_code == 201
    patch = {"metadata": {"annotations": {"x": None}}, "spec": {"taints": [b, a]}}
    got = (await api.patch("/api/v1/nodes/n", json=patch, headers=MERGE)).json()
    assert got["metadata"]["annotations"] == {"y": "2"} and got["spec"]["taints"] == [b, a]
    got = (
        await api.patch("/api/v1/nodes/n", json={"spec": {"taints": None}}, headers=MERGE)
    ).json()
    assert "taints" not in got["spec"]


async def test_put_replaces(api: httpx.AsyncClient) -> None:
    created = (await api.post(PODS, json=pod("a", x="1"))).json()
    body = pod("a", y="2") | {"metadata": {"name": "a", "labels": {"y": "2"}}}
    replaced = (await api.put(f"{PODS}/a", json=body)).json()
    assert replaced["metadata"]["labels"] == {"y": "2"}
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    assert (await api.put(f"{PODS}/missing", json=pod("missing"))).status_code == 404


async def test_list_selectors_and_version(api: httpx.AsyncClient) -> None:
    for name, role in (("a", "w"), ("b", "w"), ("c", "m")):
        await api.post(PODS, json=pod(name, role=role))
    listed = (await api.get(PODS, params={"labelSelector": "role=w"})).json()
    assert sorted(o["metadata"]["name"] for o in listed["items"]) == ["a", "b"]
    notin = (await api.get(PODS, params={"labelSelector": "role notin (w)"})).json()
    assert [o["metadata"]["name"] for o in notin["items"]] == ["c"]
    field = (await api.get(PODS, params={"fieldSelector": "metadata.name!=a"})).json()
    assert sorted(o["metadata"]["name"] for o in field["items"]) == ["b", "c"]
    last = max(int(o["metadata"]["resourceVersion"]) for o in listed["items"] + notin["items"])
    assert int(listed["metadata"]["resourceVersion"]) >= last


async def test_field_selector_on_unset_field_reads_empty(api: httpx.AsyncClient) -> None:
    """Field sets hold every selectable field, unset ones as "" (pods' ``spec.nodeName``
    before binding): ``spec.nodeName!=`` lists bound pods only, ``=`` unbound ones."""
    await api.post(PODS, json=pod("unbound"))
    bound = pod("bound")
    bound["spec"]["nodeName"] = "n1"
    await api.post(PODS, json=bound)
    selected = (await api.get(PODS, params={"fieldSelector": "spec.nodeName!="})).json()
    assert [o["metadata"]["name"] for o in selected["items"]] == ["bound"]
    unset = (await api.get(PODS, params={"fieldSelector": "spec.nodeName="})).json()
    assert [o["metadata"]["name"] for o in unset["items"]] == ["unbound"]
    phase = (await api.get(PODS, params={"fieldSelector": "status.phase!=Failed"})).json()
    assert len(phase["items"]) == 2


async def test_list_pages_with_limit_and_continue(api: httpx.AsyncClient) -> None:
    """A limited LIST answers in key order with ``metadata.continue`` while items remain,
    and ``remainingItemCount`` when no selector hides the total; the continued pages come
    from the first page's snapshot (same ``resourceVersion``, later writes not in it)."""
    for name in ("e", "b", "d", "a", "c"):
        await api.post(PODS, json=pod(name, role="w"))
    first = (await api.get(PODS, params={"limit": "2"})).json()
    assert [o["metadata"]["name"] for o in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 3
    await api.post(PODS, json=pod("f"))  # after the snapshot: not in its pages
    names, meta = [], first["metadata"]
    while meta.get("continue"):
        page = (await api.get(PODS, params={"limit": "2", "continue": meta["continue"]})).json()
        names += [o["metadata"]["name"] for o in page["items"]]
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        meta = page["metadata"]
    assert names == ["c", "d", "e"]
    assert "remainingItemCount" not in meta
    selected = (await api.get(PODS, params={"limit": "2", "labelSelector": "role=w"})).json()
    assert selected["metadata"]["continue"] and "remainingItemCount" not in selected["metadata"]
    whole = (await api.get(PODS, params={"limit": "10"})).json()
    assert len(whole["items"]) == 6 and "continue" not in whole["metadata"]
    gone = await api.get(PODS, params={"limit": "2", "continue": "not-a-token"})
    assert gone.status_code == 410


LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"


async def test_lease_create_get_and_optimistic_put(api: httpx.AsyncClient) -> None:
    """Leases (coordination.k8s.io/v1) as leader election uses them: create once (409
    AlreadyExists after), get, PUT with the read ``resourceVersion``; a PUT with a
    stale one is 409 Conflict and changes nothing."""
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    created = await api.post(LEASES, json=lease)
    assert created.status_code == 201
    again = await api.post(LEASES, json=lease)
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
    read = (await api.get(f"{LEASES}/l")).json()
    assert read["spec"] == {"holderIdentity": "a"}
    mine = {**read, "spec": {"holderIdentity": "b", "leaseTransitions": 1}}
    assert (await api.put(f"{LEASES}/l", json=mine)).status_code == 200
    stale = {**read, "spec": {"holderIdentity": "c"}}
    conflict = await api.put(f"{LEASES}/l", json=stale)
    assert (conflict.status_code, conflict.json()["reason"]) == (409, "Conflict")
    assert (await api.get(f"{LEASES}/l")).json()["spec"]["holderIdentity"] == "b"


async def _watch(api: httpx.AsyncClient, n: int, **params: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with api.stream("GET", PODS, params={"watch": "true", **params}) as resp:
        async for line in resp.aiter_lines():
            if line.strip():
                events.append(json.loads(line))
            if len(events) >= n:
                break
    return events


async def test_watch_resumes_from_version_without_replay(api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("old"))
    version = (await api.get(PODS)).json()["metadata"]["resourceVersion"]
    await api.post(PODS, json=pod("new"))  # between list and watch: must not be lost
    events = await asyncio.wait_for(_watch(api, 1, resourceVersion=version), 5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "new")]


async def test_watch_without_version_sends_state_then_changes(api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("a"))
    task = asyncio.create_task(_watch(api, 3))
    await asyncio.sleep(0.1)
    await api.patch(f"{PODS}/a", json={"metadata": {"labels": {"x": "1"}}}, headers=MERGE)
    await api.delete(f"{PODS}/a")
    events = await asyncio.wait_for(task, 5)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


async def test_watch_timeout_seconds_ends_stream(api: httpx.AsyncClient) -> None:
    events = await asyncio.wait_for(_watch(api, 1, timeoutSeconds="0.2", resourceVersion="1"), 5)
    assert events == []


async def test_binding_sets_node_once(emulator: KubeEmulator, api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("a"))
    config = kubernetes.client.Configuration(host=str(emulator.url))
    with kubernetes.client.ApiClient(config) as client:
        core = kubernetes.client.CoreV1Api(client)
        body = kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(name="a", annotations={"k": "v"}),
            target=kubernetes.client.V1ObjectReference(kind="Node", name="node-1"),
        )

        def bind() -> Any:
            return core.create_namespaced_pod_binding("a", "ns", body, _preload_content=False)

        resp = await asyncio.to_thread(bind)
        assert resp.status == 201
        assert json.loads(resp.read())["status"] == "Success"
        resp.release_conn()
        with pytest.raises(kubernetes.client.ApiException) as exc:
            await asyncio.to_thread(bind)
        assert exc.value.status == 409
    bound = (await api.get(f"{PODS}/a")).json()
    assert bound["spec"]["nodeName"] == "node-1"
    assert bound["metadata"]["annotations"] == {"k": "v"}
    assert emulator.objects["v1/pods", "ns", "a"] >= {"spec": {"nodeName": "node-1"}}


async def test_binding_unknown_pod_is_404(api: httpx.AsyncClient) -> None:
    body = {"metadata": {"name": "x"}, "target": {"kind": "Node", "name": "n"}}
    assert (await api.post(f"{PODS}/x/binding", json=body)).status_code == 404


async def test_finalizers_delay_deletion(api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("a") | {"metadata": {"name": "a", "finalizers": ["f"]}})
    marked = (await api.delete(f"{PODS}/a")).json()
    assert marked["metadata"]["deletionTimestamp"]
    assert (await api.get(f"{PODS}/a")).status_code == 200
    await api.patch(f"{PODS}/a", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert (await api.get(f"{PODS}/a")).status_code == 404


async def test_delete_preconditions(api: httpx.AsyncClient) -> None:
    await api.post(PODS, json=pod("a"))
    body = {"preconditions": {"uid": "someone-else"}}
    resp = await api.request("DELETE", f"{PODS}/a", json=body)
    assert resp.status_code == 409
    assert (await api.delete(f"{PODS}/missing")).status_code == 404


async def test_garbage_collection_of_owned_objects(api: httpx.AsyncClient) -> None:
    owner = (await api.post(JOBS, json={"metadata": {"name": "j"}})).json()
    ref = {"apiVersion": "powerflow.io/v1alpha1", "kind": "DLJob", "name": "j"}
    ref["uid"] = owner["metadata"]["uid"]
    owned = pod("w") | {"metadata": {"name": "w", "ownerReferences": [ref]}}
    await api.post(PODS, json=owned)
    await api.post(PODS, json=pod("free"))
    await api.delete(f"{JOBS}/j")
    names = [o["metadata"]["name"] for o in (await api.get(PODS)).json()["items"]]
    assert names == ["free"]


async def test_a_dependent_goes_once_none_of_its_owners_exists(api: httpx.AsyncClient) -> None:
    """The garbage collector deletes a dependent whose owners are all gone, also one
    created after its owner was deleted (a controller acting on a stale view); one
    live owner keeps it; a namespaced owner in another namespace counts as absent."""
    gone = (await api.post(JOBS, json={"metadata": {"name": "gone"}})).json()
    kept = (await api.post(JOBS, json={"metadata": {"name": "kept"}})).json()
    other_ns = "/apis/powerflow.io/v1alpha1/namespaces/elsewhere/dljobs"
    elsewhere = (await api.post(other_ns, json={"metadata": {"name": "x"}})).json()

    def owned(name: str, *owners: dict[str, Any]) -> dict[str, Any]:
        refs = [
            {
                "apiVersion": "powerflow.io/v1alpha1",
                "kind": "DLJob",
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
            }
            for o in owners
        ]
        return pod(name) | {"metadata": {"name": name, "ownerReferences": refs}}

    async def names() -> list[str]:
        return sorted(o["metadata"]["name"] for o in (await api.get(PODS)).json()["items"])

    assert (await api.post(PODS, json=owned("both", gone, kept))).status_code == 201
    assert (await api.delete(f"{JOBS}/gone")).status_code == 200
    assert await names() == ["both"]  # kept still owns it
    assert (await api.post(PODS, json=owned("late", gone))).status_code == 201
    assert (await api.post(PODS, json=owned("astray", elsewhere))).status_code == 201
    assert await names() == ["both"]
    assert (await api.delete(f"{JOBS}/kept")).status_code == 200
    assert await names() == []


async def test_seeded_objects_get_versions(emulator: KubeEmulator, api: httpx.AsyncClient) -> None:
    emulator.objects["v1/pods", "ns", "seeded"] = pod("seeded")
    fetched = (await api.get(f"{PODS}/seeded")).json()
    assert int(fetched["metadata"]["resourceVersion"]) > 0


def test_importable_as_support_package() -> None:
    import support

    assert support.KubeEmulator is KubeEmulator
    assert issubclass(KubeEmulator, kmock.KubernetesEmulator)


POD_SECURITY = (
    'pods "bad-1" is forbidden: violates PodSecurity "restricted:latest": '
    'allowPrivilegeEscalation != false (container "c" must set '
    "securityContext.allowPrivilegeEscalation=false)"
)


async def test_refused_create_answers_an_admission_status(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """kube-apiserver's answer to an admission denial (PodSecurity, ResourceQuota):
    403 with a ``Status`` body naming the object, and nothing stored."""
    rule = emulator.refuse("create", "pods", "bad-*", message=POD_SECURITY)
    resp = await api.post(PODS, json=pod("bad-1"))
    assert resp.status_code == 403
    body = resp.json()
    assert {k: body[k] for k in ("apiVersion", "kind", "status", "code", "reason", "message")} == {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "message": POD_SECURITY,
    }
    assert body["details"] == {"name": "bad-1", "kind": "pods"}
    assert (await api.get(f"{PODS}/bad-1")).status_code == 404
    assert (await api.post(PODS, json=pod("good-1"))).status_code == 201  # others pass
    assert rule.hits == 1


async def test_refusals_by_verb_namespace_and_count(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    emulator.refuse("create", "pods", namespace="other")
    assert (await api.post(PODS, json=pod("a"))).status_code == 201
    invalid = emulator.refuse("patch", "pods", "a", status=422, reason="Invalid", times=1)
    patch = {"metadata": {"labels": {"x": "1"}}}
    refused = await api.patch(f"{PODS}/a", json=patch, headers=MERGE)
    assert (refused.status_code, refused.json()["reason"]) == (422, "Invalid")
    assert refused.json()["message"] == 'pods "a" is invalid: Invalid'
    assert "x" not in (await api.get(f"{PODS}/a")).json()["metadata"].get("labels", {})
    assert (await api.patch(f"{PODS}/a", json=patch, headers=MERGE)).status_code == 200
    assert invalid.hits == 1  # times=1: the second patch went through
    emulator.refuse("delete", "pods", "a")
    assert (await api.delete(f"{PODS}/a")).status_code == 403
    status = {"status": {"phase": "Running"}}
    emulator.refuse("patch", "dljobs/status", "j", status=422, reason="Invalid")
    await api.post(JOBS, json={"metadata": {"name": "j"}})
    assert (await api.patch(f"{JOBS}/j/status", json=status, headers=MERGE)).status_code == 422
    assert (await api.patch(f"{JOBS}/j", json=patch, headers=MERGE)).status_code == 200


async def test_deleting_a_pod_sets_the_end_of_its_grace_period(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """kube-apiserver's graceful deletion (``rest.BeforeDelete`` with
    ``podStrategy.CheckGracefulDelete``): ``deletionTimestamp`` is the request time
    plus the grace period, which ``deletionGracePeriodSeconds`` states: the delete
    options' ``gracePeriodSeconds`` (body, or the query the ``kubernetes`` client
    sends), else the pod's ``spec.terminationGracePeriodSeconds``; 0 for a pod not
    scheduled or already finished, and for objects that are not pods. A finalizer
    keeps each here (as an unreachable node's kubelet keeps a pod)."""

    def held(name: str, node: str | None = "n1") -> dict[str, Any]:
        body = pod(name) | {"metadata": {"name": name, "finalizers": ["f"]}}
        body["spec"] = body["spec"] | {"terminationGracePeriodSeconds": 90}
        if node:
            body["spec"]["nodeName"] = node
        return body

    for name in ("own", "query", "body", "finished"):
        assert (await api.post(PODS, json=held(name))).status_code == 201
    assert (await api.post(PODS, json=held("unscheduled", None))).status_code == 201
    done = {"status": {"phase": "Succeeded"}}
    assert (await api.patch(f"{PODS}/finished/status", json=done, headers=MERGE)).is_success
    job = {"metadata": {"name": "j", "finalizers": ["f"]}}
    assert (await api.post(JOBS, json=job)).status_code == 201
    before = datetime.datetime.now(tz=datetime.UTC).replace(microsecond=0)
    await api.delete(f"{PODS}/own")
    await api.delete(f"{PODS}/query", params={"gracePeriodSeconds": "5"})
    await api.request("DELETE", f"{PODS}/body", json={"gracePeriodSeconds": 7})
    await api.delete(f"{PODS}/unscheduled")
    await api.delete(f"{PODS}/finished")
    await api.delete(f"{JOBS}/j")
    after = datetime.datetime.now(tz=datetime.UTC)
    expected = {"own": 90, "query": 5, "body": 7, "unscheduled": 0, "finished": 0}
    marked = [(await api.get(f"{PODS}/{name}")).json() for name in expected]
    marked.append((await api.get(f"{JOBS}/j")).json())
    for obj, grace in zip(marked, [*expected.values(), 0], strict=True):
        meta = obj["metadata"]
        assert meta["deletionGracePeriodSeconds"] == grace, meta["name"]
        at = datetime.datetime.fromisoformat(meta["deletionTimestamp"])
        assert before + datetime.timedelta(seconds=grace) <= at, meta["name"]
        assert at <= after + datetime.timedelta(seconds=grace), meta["name"]


async def test_with_kubelets_a_bound_pod_stays_until_a_delete_with_grace_0(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """kube-apiserver keeps a pod on a node through its grace period: a graceful delete
    only marks it, updates (its kubelet's status) keep it, another graceful delete
    changes nothing; the kubelet's delete with ``gracePeriodSeconds=0`` (or a force
    delete) removes it. A pod not scheduled, or finished, goes at once (grace 0).
    Without ``kubelets`` (tests with no kubelet) a bound pod goes at once too."""
    on_node = pod("run") | {"spec": {"containers": [], "nodeName": "n1"}}
    assert (await api.post(PODS, json=on_node)).status_code == 201
    assert (await api.delete(f"{PODS}/run")).status_code == 200
    assert (await api.get(f"{PODS}/run")).status_code == 404  # no kubelets: at once

    emulator.kubelets = True
    for name in ("run", "finished"):
        assert (await api.post(PODS, json=on_node | {"metadata": {"name": name}})).is_success
    assert (await api.post(PODS, json=pod("unscheduled"))).status_code == 201
    done = {"status": {"phase": "Succeeded"}}
    assert (await api.patch(f"{PODS}/finished/status", json=done, headers=MERGE)).is_success
    for name in ("run", "finished", "unscheduled"):
        assert (await api.delete(f"{PODS}/{name}")).status_code == 200
    assert (await api.get(f"{PODS}/finished")).status_code == 404
    assert (await api.get(f"{PODS}/unscheduled")).status_code == 404
    marked = (await api.get(f"{PODS}/run")).json()["metadata"]
    assert marked["deletionTimestamp"] and marked["deletionGracePeriodSeconds"] == 30
    stopped = {"status": {"phase": "Failed"}}
    assert (await api.patch(f"{PODS}/run/status", json=stopped, headers=MERGE)).is_success
    assert (await api.delete(f"{PODS}/run")).status_code == 200  # terminal now: grace 0
    assert (await api.get(f"{PODS}/run")).status_code == 404

    assert (await api.post(PODS, json=on_node | {"metadata": {"name": "run"}})).is_success
    await api.delete(f"{PODS}/run", params={"gracePeriodSeconds": "5"})
    await api.delete(f"{PODS}/run")  # graceful again: still there
    assert (await api.get(f"{PODS}/run")).status_code == 200
    final = {"gracePeriodSeconds": 0, "preconditions": {"uid": marked["uid"]}}
    assert (await api.request("DELETE", f"{PODS}/run", json=final)).status_code == 409
    await api.request("DELETE", f"{PODS}/run", json={"gracePeriodSeconds": 0})
    assert (await api.get(f"{PODS}/run")).status_code == 404


async def test_default_toleration_seconds_admission(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """The ``DefaultTolerationSeconds`` admission plugin (kube-apiserver's
    ``--default-not-ready-toleration-seconds``, ``--default-unreachable-toleration-seconds``):
    a pod gets a ``NoExecute`` toleration of ``node.kubernetes.io/not-ready`` and of
    ``node.kubernetes.io/unreachable`` for that long, unless it tolerates the taint
    already (its key, or no key, with ``NoExecute`` or no effect); off by default."""
    plain = (await api.post(PODS, json=pod("before"))).json()
    assert "tolerations" not in plain["spec"]
    emulator.not_ready_toleration_s = 300
    emulator.unreachable_toleration_s = 200
    got = (await api.post(PODS, json=pod("plain"))).json()["spec"]["tolerations"]
    assert got == [
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 200,
        },
    ]
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    body = pod("own")
    body["spec"]["tolerations"] = [own | {"tolerationSeconds": 10}]
    got = (await api.post(PODS, json=body)).json()["spec"]["tolerations"]
    keys = [t["key"] for t in got]
    assert keys == ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]
    assert got[0]["tolerationSeconds"] == 10
    body = pod("all")
    body["spec"]["tolerations"] = [{"operator": "Exists"}]
    got = (await api.post(PODS, json=body)).json()["spec"]["tolerations"]
    assert got == [{"operator": "Exists"}]


# -- TokenReview: pkg/registry/authentication/tokenreview/storage.go and the API reference
# (https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-review-v1/)

REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
AGENT = "system:serviceaccount:powerflow-system:powerflow-nodeagent"


def review(token: str, *audiences: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


async def test_token_review_authenticates_a_registered_token(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """201 with the review: authenticated, the user (username, uid, groups, extra as
    lists of strings) and ``status.audiences``, the requested audiences the token has.
    A review is not stored (no GET/LIST of tokenreviews exists)."""
    extra = {"authentication.kubernetes.io/node-name": ["gpu-1"]}
    user = emulator.register_token(
        "t1", AGENT, groups=("system:serviceaccounts",), extra=extra, audiences=("ingest", "x")
    )
    resp = await api.post(REVIEWS, json=review("t1", "ingest", "other"))
    assert resp.status_code == 201
    body = resp.json()
    assert body["kind"] == "TokenReview" and body["spec"]["token"] == "t1"
    assert body["status"] == {
        "authenticated": True,
        "user": {
            "username": AGENT,
            "uid": user.uid,
            "groups": ["system:serviceaccounts"],
            "extra": extra,
        },
        "audiences": ["ingest"],
    }
    assert all(key[0].plural != "tokenreviews" for key in emulator.objects)


async def test_token_review_refuses_unknown_tokens_and_foreign_audiences(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Still 201: ``authenticated`` false (omitted: ``omitempty``) with an ``error``, no
    user, for a token the server does not know and for a token whose audiences do not
    meet ``spec.audiences`` (without them, the API server's own audiences)."""
    emulator.register_token("t1", AGENT, audiences=("ingest",))
    for body in (review("nope", "ingest"), review("t1", "other"), review("t1")):
        resp = await api.post(REVIEWS, json=body)
        assert resp.status_code == 201
        status = resp.json()["status"]
        assert status.get("authenticated", False) is False
        assert status["error"] and not status["user"]
        assert "audiences" not in status


async def test_token_review_without_audiences_is_for_the_api_server(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """No ``spec.audiences``: the API server's audiences, returned in the status."""
    emulator.register_token("t2", "alice")
    status = (await api.post(REVIEWS, json=review("t2"))).json()["status"]
    assert status["authenticated"] is True and status["user"]["username"] == "alice"
    assert status["audiences"] == ["https://kubernetes.default.svc.cluster.local"]


async def test_token_review_needs_a_token(emulator: KubeEmulator, api: httpx.AsyncClient) -> None:
    """``storage.go``: an empty token is a 400 BadRequest Status."""
    resp = await api.post(REVIEWS, json=review(""))
    assert resp.status_code == 400
    assert resp.json()["reason"] == "BadRequest"
    assert resp.json()["message"] == "token is required for TokenReview in authentication"


async def test_token_review_can_be_forbidden(
    emulator: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Without RBAC for ``create`` on ``tokenreviews``: 403 Forbidden (``refuse``)."""
    emulator.register_token("t1", AGENT)
    emulator.refuse("create", "tokenreviews")
    resp = await api.post(REVIEWS, json=review("t1"))
    assert resp.status_code == 403 and resp.json()["reason"] == "Forbidden"


async def test_discovery_and_version_as_client_go_reads_them(api: httpx.AsyncClient) -> None:
    """The core group's ``APIResourceList`` has ``groupVersion: v1`` (client-go maps
    resources by it: with kmock's ``/v1`` kubectl and helm find no ConfigMap), and
    ``/version`` names a release the chart accepts (``kubeVersion: >=1.27``)."""
    core = (await api.get("/api/v1")).json()
    assert core["groupVersion"] == "v1"
    assert {"pods", "configmaps", "services"} <= {r["name"] for r in core["resources"]}
    group = (await api.get("/apis/powerflow.io/v1alpha1")).json()
    assert group["groupVersion"] == "powerflow.io/v1alpha1"
    version = (await api.get("/version")).json()
    assert (int(version["major"]), int(version["minor"])) >= (1, 27)
    assert version["gitVersion"].startswith(f"v{version['major']}.{version['minor']}.")


async def test_a_new_crd_is_established_and_its_resource_served(api: httpx.AsyncClient) -> None:
    """As the apiextensions controllers do a moment after the create: ``NamesAccepted``
    and ``Established`` (what ``helm install`` waits for), the names accepted, and the
    resource served (and discovered) at its served version."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {}},
                {"name": "v0", "served": False, "storage": False, "schema": {}},
            ],
        },
    }
    created = await api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert created.status_code == 201, created.text
    status = created.json()["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "NamesAccepted": "True",
        "Established": "True",
    }
    assert status["acceptedNames"]["kind"] == "Widget" and status["storedVersions"] == ["v1"]
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    made = await api.post("/apis/example.com/v1/namespaces/ns/widgets", json=widget)
    assert made.status_code == 201, made.text
    listing = (await api.get("/apis/example.com/v1")).json()
    assert [r["name"] for r in listing["resources"] if "/" not in r["name"]] == ["widgets"]


async def test_objects_come_back_with_their_type_whatever_the_create_sent(
    api: httpx.AsyncClient,
) -> None:
    """The server sets ``apiVersion`` and ``kind`` (client-go's decoders refuse an object
    without them, helm's ``lookup`` among them)."""
    bare = {"metadata": {"name": "c"}, "data": {"a": "1"}}
    created = (await api.post("/api/v1/namespaces/ns/configmaps", json=bare)).json()
    fetched = (await api.get("/api/v1/namespaces/ns/configmaps/c")).json()
    for body in (created, fetched):
        assert (body["apiVersion"], body["kind"]) == ("v1", "ConfigMap")
    job = (await api.post(JOBS, json={"metadata": {"name": "j"}, "spec": {}})).json()
    assert (job["apiVersion"], job["kind"]) == ("powerflow.io/v1alpha1", "DLJob")
