"""What the operator watches and how often it acts: an idle cluster costs no passes and no
writes, heartbeats are not scheduling events, the API server does the filtering, and
lists come in pages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import kmock
import kubernetes
import pytest
from operator_cases import (
    BUDGET,
    JOBS,
    MERGE,
    NS,
    PODS,
    ThresholdPolicy,
    dljob,
    eventually,
    models,
    node,
    pods_of,
    start_workers,
    status_of,
)
from powerflow.operator import kube as kube_module
from powerflow.operator.connection import Source, load_configuration
from powerflow.operator.kube import Kube
from powerflow.operator.triggers import Seen, dljob_fingerprint, node_fingerprint, pod_fingerprint
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


def operator(kubeconfig: Path, *options: str) -> Operator:
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0", *options)
    return Operator(args, ThresholdPolicy(), models)


def status_writes(requests: list[Any]) -> int:
    return sum(
        1
        for r in requests
        if r.method == kmock.method.PATCH
        and r.url.path.startswith(JOBS)
        and r.url.path.endswith("/status")
    )


async def _running(api: httpx.AsyncClient, job: str) -> bool:
    return (await status_of(api, job)).get("phase") == "Running"


def test_only_changes_a_pass_decides_on_are_news() -> None:
    seen = Seen()
    job: dict[str, Any] = {"metadata": {"name": "j", "namespace": "ml", "generation": 1}}

    def news(kind: str, body: dict[str, Any], fp: Any, type_: str = "MODIFIED") -> bool:
        return seen.changed(kind, type_, body, fp(body))

    assert news("dljob", job, dljob_fingerprint, "ADDED")
    own = {**job, "status": {"progress": {"iterations": 7}}}
    own["metadata"] = {**job["metadata"], "resourceVersion": "9"}
    assert not news("dljob", own, dljob_fingerprint)  # the operator's own status patch
    assert news(
        "dljob", {**own, "metadata": {**own["metadata"], "generation": 2}}, dljob_fingerprint
    )
    assert news("dljob", own, dljob_fingerprint, "DELETED")

    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ml"}, "status": {}}
    assert news("pod", pod, pod_fingerprint, "ADDED")
    annotated = {**pod, "metadata": {**pod["metadata"], "annotations": {"x": "1"}}}
    assert not news("pod", annotated, pod_fingerprint)
    assert news("pod", {**annotated, "status": {"phase": "Running"}}, pod_fingerprint)

    n: dict[str, Any] = {"metadata": {"name": "n"}, "status": {"conditions": []}}
    ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"}
    assert news("node", {**n, "status": {"conditions": [ready]}}, node_fingerprint, "ADDED")
    beat = {**ready, "lastHeartbeatTime": "t2"}
    assert not news("node", {**n, "status": {"conditions": [beat]}}, node_fingerprint)
    taint = {"key": "k", "effect": "NoSchedule"}
    tainted = {**n, "spec": {"taints": [taint]}, "status": {"conditions": [beat]}}
    assert news("node", tainted, node_fingerprint)


async def test_idle_operator_rests(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """Two running jobs, nothing changing: the operator's own status patches are not
    scheduling events and progress is written at most every --progress-interval, so
    over 3 s there is at most one pass and one status write (before: about 3.5 passes
    and 7 status writes per second, each write waking the next pass)."""
    async with operator(kubeconfig, "--progress-interval", "30") as op:
        for job, node_name in (("a", "n1"), ("b", "n2")):
            await api.post(JOBS, json=dljob(job))
            pods = await eventually(lambda job=job: _four(api, job))
            await start_workers(api, pods, node_name)
        for job in ("a", "b"):
            await eventually(lambda job=job: _running(api, job))
        await settled(op)  # the last events' passes
        passes, writes = op.passes, status_writes(list(kmock))
        await asyncio.sleep(3.0)
        assert op.passes - passes <= 1
        assert status_writes(list(kmock)) - writes <= 1
        # Progress is still written, at the interval: the first write is there.
        assert "iterations" in (await status_of(api, "a")).get("progress", {})


async def test_reporting_all_iterations_is_a_scheduling_event(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A running job's trainer reports progress and then all its iterations, and hangs in
    its teardown (the pod stays Running): the job completes at once, not at the next
    periodic pass (the default interval, 60 s). Progress below the total is no event."""
    assert pod_fingerprint(_reporting(1)) == pod_fingerprint(_reporting(None))
    assert pod_fingerprint(_reporting(49)) == pod_fingerprint(_reporting(1))
    assert pod_fingerprint(_reporting(50)) != pod_fingerprint(_reporting(49))
    async with operator(kubeconfig, "--progress-interval", "30") as op:
        await api.post(JOBS, json=dljob("done", iterations=50))
        pods = await eventually(lambda: _four(api, "done"))
        await start_workers(api, pods, "n1")
        await eventually(lambda: _running(api, "done"))
        await settled(op)
        for iterations in ("10", "50"):
            progress = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: iterations}}}
            await api.patch(f"{PODS}/done-g1-w0", json=progress, headers=MERGE)

        async def succeeded() -> bool:
            return (await status_of(api, "done")).get("phase") == "Succeeded"

        await eventually(succeeded, timeout=10)


def _reporting(iterations: int | None) -> dict[str, Any]:
    """A worker pod whose trainer runs 50 iterations and reported ``iterations``."""
    annotations = {} if iterations is None else {contract.PROGRESS_ANNOTATION: str(iterations)}
    env = [{"name": "POWERFLOW_ITERATIONS", "value": "50"}]
    return {
        "metadata": {"name": "w0", "namespace": NS, "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "env": env}]},
        "status": {"phase": "Running"},
    }


async def test_scheduling_interval_makes_periodic_passes(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """``schedulingIntervalSeconds`` wakes the loop with nothing else happening."""
    interval = {"data": {"schedulingIntervalSeconds": "0.3"}}
    assert (await api.patch(BUDGET, json=interval, headers=MERGE)).is_success
    async with operator(kubeconfig) as op:
        passes = op.passes

        async def three_more() -> bool:
            return op.passes - passes >= 3

        await eventually(three_more, timeout=10)


async def test_node_heartbeat_is_not_a_scheduling_event(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A kubelet's status heartbeat (condition times only) makes no pass; a change of
    allocatable GPUs, a cordon or Ready going False does."""
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert (await api.patch("/api/v1/nodes/n1/status", json=ready, headers=MERGE)).is_success
    async with operator(kubeconfig) as op:
        passes = await settled(op)
        for beat in range(5):
            ready = {
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": f"2026-01-01T00:00:0{beat}Z",
            }
            body = {"status": {"conditions": [ready]}}
            assert (await api.patch("/api/v1/nodes/n1/status", json=body, headers=MERGE)).is_success
        await asyncio.sleep(0.5)
        assert op.passes == passes
        for change in (
            {"status": {"allocatable": {contract.GPU_RESOURCE: "2"}}},
            {"spec": {"unschedulable": True}},
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        ):
            path = "/api/v1/nodes/n2" + ("/status" if "status" in change else "")
            before = op.passes
            assert (await api.patch(path, json=change, headers=MERGE)).is_success
            await eventually(lambda before=before: _passes_beyond(op, before))


async def test_watches_are_filtered_by_the_api_server(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """kopf lists and watches pods with the ``powerflow.io/job`` label selector and the
    ConfigMaps with a field selector on the budget's name and namespace, in pages; other
    pods and ConfigMaps never reach the operator."""
    async with operator(kubeconfig) as op:
        passes = await settled(op)
        other = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}
        assert (await api.post(PODS, json=other)).status_code == 201
        cm = {"metadata": {"name": "unrelated"}, "data": {"x": "1"}}
        assert (await api.post(f"/api/v1/namespaces/{NS}/configmaps", json=cm)).status_code == 201
        await asyncio.sleep(0.5)
        assert op.passes == passes
    by_resource: dict[str, list[Any]] = {"pods": [], "configmaps": []}
    for r in kmock:
        agent = next((v for k, v in r.headers.items() if k.lower() == "user-agent"), "")
        if agent.startswith("kopf/") and r.method == kmock.method.GET:
            plural = r.url.path.rstrip("/").rsplit("/", 1)[-1]
            if plural in by_resource:
                by_resource[plural].append(r)
    assert by_resource["pods"] and by_resource["configmaps"]
    for r in by_resource["pods"]:
        assert r.params.get("labelSelector") == contract.JOB_LABEL
    fields = f"metadata.name={contract.BUDGET_CONFIGMAP},metadata.namespace=powerflow-system"
    for r in by_resource["configmaps"]:
        assert r.params.get("fieldSelector") == fields
    lists = [r for rs in by_resource.values() for r in rs if r.params.get("watch") != "true"]
    assert lists and all(r.params.get("limit") for r in lists)


def gpu_pod(name: str, node_name: str | None, gpus: str = "1", **labels: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if gpus:
        container["resources"] = {"limits": {contract.GPU_RESOURCE: gpus}}
    spec: dict[str, Any] = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


async def test_read_pages_lists_and_finds_foreign_gpu_pods(
    kmock: KubeEmulator,
    api: httpx.AsyncClient,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Kube.read`` follows ``continue`` tokens to the end of every list, and reports
    the bound, non-terminal pods that request GPUs and are not PowerFlow's."""
    monkeypatch.setattr(kube_module, "LIST_PAGE", 2)
    for i in range(3, 8):
        assert (await api.post("/api/v1/nodes", json=node(f"n{i}", 4))).status_code == 201
    for i in range(5):
        assert (await api.post(JOBS, json=dljob(f"j{i}"))).status_code == 201
    cases = {
        "foreign": gpu_pod("foreign", "n1"),
        "foreign-2": gpu_pod("foreign-2", "n3", gpus="2"),
        "unbound": gpu_pod("unbound", None),
        "cpu-only": gpu_pod("cpu-only", "n1", gpus=""),
        "done": gpu_pod("done", "n2"),
        "ours": gpu_pod("ours", "n2", **{contract.JOB_LABEL: "j0"}),
        # The label alone, no DLJob as controller: someone else's GPUs (a squatter).
        "squatter": gpu_pod("squatter", "n4", **{contract.JOB_LABEL: "j0"}),
        "squatter-cpu": gpu_pod("squatter-cpu", "n4", gpus="", **{contract.JOB_LABEL: "j0"}),
    }
    j0 = (await api.get(f"{JOBS}/j0")).json()["metadata"]
    owner = {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "controller": True}
    cases["ours"]["metadata"]["ownerReferences"] = [{**owner, "name": "j0", "uid": j0["uid"]}]
    for body in cases.values():
        assert (await api.post(PODS, json=body)).status_code == 201
    succeeded = {"status": {"phase": "Succeeded"}}
    assert (await api.patch(f"{PODS}/done/status", json=succeeded, headers=MERGE)).is_success
    client = kubernetes.client.ApiClient(load_configuration(Source(str(kubeconfig))))
    try:
        state = await Kube(client, None).read("powerflow-system", contract.BUDGET_CONFIGMAP)
    finally:
        client.close()
    assert len(state.nodes) == 7
    assert len(state.jobs) == 5
    (j0,) = [o for o in state.jobs if o.body["metadata"]["name"] == "j0"]
    assert [p["metadata"]["name"] for p in j0.pods] == ["ours"]
    foreign = sorted(p["metadata"]["name"] for p in state.foreign_gpu_pods)
    assert foreign == ["foreign", "foreign-2", "squatter"]
    continued = [r for r in kmock if r.params.get("continue")]
    assert continued and all(r.params.get("limit") == "2" for r in continued)


async def settled(op: Operator) -> int:
    """The pass count once no pass came for 0.4 s (the startup lists' events are done)."""
    while True:
        passes = op.passes
        await asyncio.sleep(0.4)
        if op.passes == passes:
            return passes


async def _four(api: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    pods = await pods_of(api, job)
    return pods if len(pods) == 4 else []


async def _passes_beyond(op: Operator, n: int) -> bool:
    return op.passes > n


def _foreign_lists(requests: list[Any]) -> int:
    """Pod LISTs (not watches) of the foreign pods' selector, from the request log."""
    return sum(
        1
        for r in requests
        if r.method == kmock.method.GET
        and r.url.path == "/api/v1/pods"
        and r.params.get("labelSelector") == f"!{contract.JOB_LABEL}"
        and r.params.get("watch") not in ("true", "1")
    )


async def test_passes_read_foreign_gpu_pods_from_a_watch_fed_cache(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """Passes list no pods beyond the cache's LIST (not every bound non-PowerFlow
    pod of the cluster, each pass); a foreign GPU pod leaving is a
    scheduling event whose pass plans with its GPUs free again, and one arriving makes a
    pass too."""
    assert (await api.post(PODS, json=gpu_pod("notebook", "n1"))).status_code == 201
    async with operator(kubeconfig) as op:
        for job in ("first", "second"):
            await api.post(JOBS, json=dljob(job))
        await eventually(lambda: _four(api, "first"))
        await start_workers(api, await pods_of(api, "first"), "n2")
        await eventually(lambda: _running(api, "first"))
        await settled(op)
        assert await pods_of(api, "second") == []  # n1 has 2 usable GPUs: no room
        lists = _foreign_lists(list(kmock))
        assert lists >= 1

        # N passes (the interval wakes the loop): no foreign LIST among them.
        interval = {"data": {"schedulingIntervalSeconds": "0.2"}}
        assert (await api.patch(BUDGET, json=interval, headers=MERGE)).is_success
        passes = op.passes

        async def five_more() -> bool:
            return op.passes - passes >= 5

        await eventually(five_more, timeout=10)
        assert _foreign_lists(list(kmock)) == lists
        interval = {"data": {"schedulingIntervalSeconds": "60"}}
        assert (await api.patch(BUDGET, json=interval, headers=MERGE)).is_success
        await settled(op)

        # The notebook leaves: a pass at once (not in 60 s) gives "second" n1.
        assert (await api.delete(f"{PODS}/notebook")).is_success
        await eventually(lambda: _four(api, "second"), timeout=10)
        await start_workers(api, await pods_of(api, "second"), "n1")
        await eventually(lambda: _running(api, "second"))
        passes = await settled(op)

        # A foreign GPU pod arriving is news too (its GPUs are taken from now on).
        assert (await api.post(PODS, json=gpu_pod("late", "n2"))).status_code == 201

        async def one_more() -> bool:
            return op.passes > passes

        await eventually(one_more, timeout=10)
        assert _foreign_lists(list(kmock)) == lists
