"""Operator restarts and lost workers against the emulated API server.

The operator runs in its own thread (``support.operator_harness``); the test
plays the kubelet (pods run, the trainer reports its iterations) and counts
the pod creations and deletions the API server received.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import operator_cases
import pytest
from kmock import method as verb
from powerflow.operator.lifecycle import STUCK_TERMINATION_S
from support.kube_emulator import KubeEmulator
from support.operator_cluster import NODES, cluster, gang_dljob, kubelet, operator

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NS = "ml"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
ITERATIONS = 100


def dljob(name: str) -> dict[str, Any]:
    return gang_dljob(name, ITERATIONS)


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}},
        "status": {"allocatable": {contract.GPU_RESOURCE: "4"}},
    }


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with cluster(kmock, [node(name) for name in NODES]) as client:
        yield client


# The shared wait, with the longer default these operator restarts need.
eventually = functools.partial(operator_cases.eventually, timeout=10.0)


def pod_writes(kmock: KubeEmulator) -> tuple[Counter[str], Counter[str]]:
    """Pod names the API server was asked to create and to delete, with counts."""
    created: Counter[str] = Counter()
    deleted: Counter[str] = Counter()
    for request in list(kmock):
        if request.resource is None or request.resource.plural != "pods" or request.subresource:
            continue
        if request.method == verb.POST and isinstance(request.data, dict):
            created[request.data["metadata"]["name"]] += 1
        elif request.method == verb.DELETE and request.name:
            deleted[request.name] += 1
    return created, deleted


async def phases(api: httpx.AsyncClient) -> Counter[str]:
    items = (await api.get(JOBS)).json()["items"]
    return Counter(str(job.get("status", {}).get("phase")) for job in items)


@pytest.mark.timeout(400)  # 21 operator starts; each waits for kopf and a first pass
async def test_restarts_during_twenty_jobs_create_no_pod_twice(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """20 restarts at seeded random moments while 20 jobs run."""
    rng = random.Random(11)
    jobs = 20
    for i in range(jobs):
        assert (await api.post(JOBS, json=dljob(f"job{i:02d}"))).status_code == 201
    player = asyncio.create_task(kubelet(api, PODS, run_s=0.2))
    try:
        for _ in range(20):
            async with operator(kmock):
                await asyncio.sleep(rng.uniform(0.0, 0.4))
        async with operator(kmock):

            async def all_done() -> bool:
                return (await phases(api))["Succeeded"] == jobs

            await eventually(all_done, timeout=120.0)
    finally:
        player.cancel()
        await asyncio.gather(player, return_exceptions=True)
    created, deleted = pod_writes(kmock)
    twice = {name: n for name, n in created.items() if n > 1}
    summary = f"{sum(created.values())} creations, {sum(deleted.values())} deletions"
    assert not twice, f"{summary}; created twice: {twice}"
    # Each job ran one generation of 4 workers: no restart cost a pod.
    assert len(created) == 4 * jobs, f"{summary}: {sorted(created)}"


async def test_a_restart_adopts_a_complete_gang(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    await api.post(JOBS, json=dljob("job"))

    async def complete() -> bool:
        job = (await api.get(f"{JOBS}/job")).json()
        return job.get("status", {}).get("allocation", {}).get("complete") is True

    async with operator(kmock):
        await eventually(complete)
    before = (await api.get(PODS)).json()["items"]
    async with operator(kmock) as second:
        await operator_cases.poked_pass(api, second, "job", timeout=10.0)
    after = (await api.get(PODS)).json()["items"]
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before]
    assert pod_writes(kmock)[1] == Counter()


async def test_a_worker_lost_while_the_operator_was_down_restarts_the_generation(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    await api.post(JOBS, json=dljob("job"))

    async def complete() -> bool:
        job = (await api.get(f"{JOBS}/job")).json()
        return job.get("status", {}).get("allocation", {}).get("complete") is True

    async with operator(kmock):
        await eventually(complete)
    await api.delete(f"{PODS}/job-g1-w3")
    async with operator(kmock):

        async def second_generation() -> list[str]:
            names = sorted(p["metadata"]["name"] for p in (await api.get(PODS)).json()["items"])
            return names if names == [f"job-g2-w{i}" for i in range(4)] else []

        await eventually(second_generation)
    status = (await api.get(f"{JOBS}/job")).json()["status"]
    assert status["restarts"] == 1
    created, _ = pod_writes(kmock)
    assert created["job-g1-w3"] == 1  # never recreated alone


async def test_a_deleted_worker_restarts_the_generation(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    async with operator(kmock):
        await api.post(JOBS, json=dljob("job"))

        async def complete() -> bool:
            job = (await api.get(f"{JOBS}/job")).json()
            return job.get("status", {}).get("allocation", {}).get("complete") is True

        await eventually(complete)
        await api.delete(f"{PODS}/job-g1-w1")

        async def second_generation() -> bool:
            names = sorted(p["metadata"]["name"] for p in (await api.get(PODS)).json()["items"])
            return names == [f"job-g2-w{i}" for i in range(4)]

        await eventually(second_generation)
    assert (await api.get(f"{JOBS}/job")).json()["status"]["restarts"] == 1
    events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
    assert any("job-g1-w1 (lost)" in e["message"] for e in events if e["reason"] == "WorkerFailed")
    assert pod_writes(kmock)[0]["job-g1-w1"] == 1


async def test_a_worker_stuck_terminating_is_reported_and_waited_for(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """A finalizer keeps the pod terminating, as an unreachable node's kubelet does."""
    async with operator(kmock) as op:
        await api.post(JOBS, json=dljob("job"))

        async def complete() -> bool:
            job = (await api.get(f"{JOBS}/job")).json()
            return job.get("status", {}).get("allocation", {}).get("complete") is True

        await eventually(complete)
        # Scheduled on n1 (an unscheduled pod has no grace period), whose kubelet then
        # stops answering: the finalizer holds the pod terminating.
        binding = {"metadata": {"name": "job-g1-w0"}, "target": {"kind": "Node", "name": "n1"}}
        assert (await api.post(f"{PODS}/job-g1-w0/binding", json=binding)).status_code == 201
        hold = {"metadata": {"finalizers": ["example.com/hold"]}}
        assert (await api.patch(f"{PODS}/job-g1-w0", json=hold, headers=MERGE)).is_success
        failed = {"status": {"phase": "Failed"}}
        assert (await api.patch(f"{PODS}/job-g1-w3/status", json=failed, headers=MERGE)).is_success

        async def only_the_stuck_one() -> bool:
            pods = (await api.get(PODS)).json()["items"]
            return [p["metadata"]["name"] for p in pods] == ["job-g1-w0"]

        await eventually(only_the_stuck_one)

        async def rescaling() -> bool:
            return (await api.get(f"{JOBS}/job")).json()["status"]["phase"] == "Rescaling"

        await eventually(rescaling)
        # The API server ends the grace period (the job's default 60 s) at deletionTimestamp.
        held = (await api.get(f"{PODS}/job-g1-w0")).json()["metadata"]
        assert held["deletionGracePeriodSeconds"] == 60
        controller = op.controller
        assert controller is not None

        async def pass_at(offset_s: float) -> None:
            """Move the operator's clock; wait for a pass that read the moved clock."""
            read_in: list[int] = []

            def clock() -> float:
                read_in.append(controller.passes)  # the pass under way (or next) ends above
                return time.time() + offset_s

            controller.clock = clock
            poke = {"metadata": {"labels": {"poke": str(offset_s)}}}
            assert (await api.patch(f"{JOBS}/job", json=poke, headers=MERGE)).is_success

            async def passed() -> bool:
                return bool(read_in) and controller.passes > read_in[0]

            await eventually(passed)

        # Beyond the stuck timeout but within grace + timeout: the grace period counts.
        await pass_at(STUCK_TERMINATION_S + 30)
        status = (await api.get(f"{JOBS}/job")).json()["status"]
        assert status["phase"] == "Rescaling"
        assert not any(
            c["type"] == "WorkersStuck" and c["status"] == "True"
            for c in status.get("conditions", [])
        )
        # Beyond the grace period and the stuck timeout.
        await pass_at(60 + STUCK_TERMINATION_S + 30)

        async def stuck() -> dict[str, Any]:
            status = (await api.get(f"{JOBS}/job")).json()["status"]
            found = [c for c in status.get("conditions", []) if c["type"] == "WorkersStuck"]
            return found[0] if found and found[0]["status"] == "True" else {}

        condition = await eventually(stuck)
        assert condition["reason"] == "TerminationStuck" and "job-g1-w0" in condition["message"]
        status = (await api.get(f"{JOBS}/job")).json()["status"]
        assert status["phase"] == "Pending"
        events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
        assert any(e["reason"] == "TerminationStuck" and e["type"] == "Warning" for e in events)
        pods = (await api.get(PODS)).json()["items"]
        assert [p["metadata"]["name"] for p in pods] == ["job-g1-w0"]  # no second generation
        # The admin force-deletes it (here: the finalizer goes); the job resumes.
        release = {"metadata": {"finalizers": []}}
        assert (await api.patch(f"{PODS}/job-g1-w0", json=release, headers=MERGE)).is_success

        async def second_generation() -> bool:
            names = sorted(p["metadata"]["name"] for p in (await api.get(PODS)).json()["items"])
            return names == [f"job-g2-w{i}" for i in range(4)]

        await eventually(second_generation)
