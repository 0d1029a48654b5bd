"""The operator against the emulated API server over real HTTP, run in its own thread."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from powerflow.operator.controller import OperatorConfig
from powerflow.operator.jobs import JobRequest
from powerflow.operator.timefmt import parse_time
from support.kube_emulator import KubeEmulator
from support.operator_harness import OperatorThread

from powerflow import contract
from powerflow.policy.snapshot import JobPlan, Plan, Policy, Snapshot
from powerflow.policy.synthetic import SyntheticModel

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NS = "ml"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
BUDGET = f"/api/v1/namespaces/powerflow-system/configmaps/{contract.BUDGET_CONFIGMAP}"
MERGE = {"Content-Type": "application/merge-patch+json"}


class ThresholdPolicy:
    """Test policy: requested GPUs (first come) at 1410 MHz when the limit is
    at least 1 kW, otherwise min GPUs at 1005 MHz. Enough to see the operator
    follow a plan; the real policy is tested in the core."""

    def plan(self, snapshot: Snapshot) -> Plan:
        limit = snapshot.budget.limit_watts
        generous = limit is None or limit >= 1000
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in snapshot.jobs:
            want = job.requested_gpus if generous else job.min_gpus
            n = want if want <= free else 0
            free -= n
            bs = -(-job.global_batch_size // n) if n else 0
            plans.append(JobPlan(job.id, n, 1410 if generous else 1005, bs))
        return Plan(tuple(plans), limit_watts=limit or 1e9, predicted_watts=100.0 * len(plans))


def models(job: JobRequest) -> SyntheticModel:
    return SyntheticModel()


def dljob(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "globalBatchSize": 64,
            "iterations": 1000,
            "gpus": {"requested": 4, "min": 2, "max": 4},
            "restart": {"limit": 1, "backoffSeconds": 0},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "pytorch",
                            "env": [{"name": "A", "value": "1"}],
                        }
                    ]
                }
            },
        },
    }
    body["spec"].update(spec)
    return body


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"},
        },
        "status": {"allocatable": {contract.GPU_RESOURCE: str(gpus)}},
    }


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        for name in ("n1", "n2"):
            assert (await client.post("/api/v1/nodes", json=node(name, 4))).status_code == 201
        cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": {"powerLimitWatts": "5000"}}
        await client.post("/api/v1/namespaces/powerflow-system/configmaps", json=cm)
        yield client


def operator(
    kmock: KubeEmulator, policy: Policy | None = None, window_s: float = 0.3
) -> OperatorThread:
    config = OperatorConfig(debounce_s=0.02, profiling_window_s=window_s)
    return OperatorThread(str(kmock.url), policy or ThresholdPolicy(), models, config)


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout} s: {check.__name__}")
        await asyncio.sleep(0.02)


async def pods_of(api: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    params = {"labelSelector": f"{contract.JOB_LABEL}={job}"}
    items: list[dict[str, Any]] = (await api.get(PODS, params=params)).json()["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


async def status_of(api: httpx.AsyncClient, job: str) -> dict[str, Any]:
    status: dict[str, Any] = (await api.get(f"{JOBS}/{job}")).json().get("status", {})
    return status


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


async def test_dljob_gets_worker_pods_and_status(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    async with operator(kmock):
        created = time.monotonic()
        await api.post(JOBS, json=dljob("resnet"))

        async def four_pods() -> list[dict[str, Any]]:
            pods = await pods_of(api, "resnet")
            return pods if len(pods) == 4 else []

        pods = await eventually(four_pods)
        reaction_s = time.monotonic() - created
        assert reaction_s < 1.0
        assert [p["metadata"]["name"] for p in pods] == [f"resnet-g1-w{i}" for i in range(4)]
        for rank, pod in enumerate(pods):
            env = env_of(pod)
            assert env["A"] == "1"
            assert (env["WORLD_SIZE"], env["RANK"]) == ("4", str(rank))
            assert env["MASTER_ADDR"] == "resnet-g1-w0.resnet.ml.svc"
            assert env["MASTER_PORT"] == "29500"
            assert env["LOCAL_BATCH_SIZE"] == "16"
            assert env["POWERFLOW_FREQUENCY_MHZ"] == "1410"
            meta = pod["metadata"]
            assert meta["labels"][contract.JOB_LABEL] == "resnet"
            assert meta["labels"][contract.WORKER_INDEX_LABEL] == str(rank)
            assert meta["annotations"][contract.WORKERS_ANNOTATION] == "4"
            assert meta["annotations"][contract.FREQUENCY_ANNOTATION] == "1410"
            assert meta["ownerReferences"][0]["kind"] == contract.KIND
            assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits[contract.GPU_RESOURCE] == "1"
        service = (await api.get(f"/api/v1/namespaces/{NS}/services/resnet")).json()
        assert service["spec"]["clusterIP"] == "None"

        async def profiling() -> dict[str, Any]:
            status = await status_of(api, "resnet")
            return status if status.get("phase") == "Profiling" else {}

        # A first run on 4 GPUs profiles them first (see test_profiling_pins_then_runs).
        status = await eventually(profiling)
        assert status["allocation"]["gpus"] == 4
        assert status["allocation"]["frequencyMHz"] == 1410
        assert status["observedGeneration"] == 1
        events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
        assert any(e.get("reason") == "Profiling" for e in events)


async def test_budget_change_reallocates(kmock: KubeEmulator, api: httpx.AsyncClient) -> None:
    async with operator(kmock):
        await api.post(JOBS, json=dljob("gpt"))

        async def gen(g: int, n: int) -> bool:
            pods = await pods_of(api, "gpt")
            return len(pods) == n and all(f"-g{g}-" in p["metadata"]["name"] for p in pods)

        await eventually(lambda: gen(1, 4))
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "500"}}, headers=MERGE)
        await eventually(lambda: gen(2, 2))
        pods = await pods_of(api, "gpt")
        assert {env_of(p)["WORLD_SIZE"] for p in pods} == {"2"}
        assert {env_of(p)["LOCAL_BATCH_SIZE"] for p in pods} == {"32"}
        assert {p["metadata"]["annotations"][contract.FREQUENCY_ANNOTATION] for p in pods} == {
            "1005"
        }

        # An invalid budget keeps the last good one and says so.
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "lots"}}, headers=MERGE)

        async def warned() -> bool:
            events = (await api.get("/api/v1/namespaces/powerflow-system/events")).json()
            return any(e.get("reason") == "InvalidBudget" for e in events["items"])

        await eventually(warned)
        assert await gen(2, 2)


async def test_malformed_dljob_gets_condition_others_served(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    async with operator(kmock):
        bad = dljob("bad", gpus={"requested": 4, "min": 8, "max": 8})
        await api.post(JOBS, json=bad)
        await api.post(JOBS, json=dljob("good"))

        async def four_good() -> bool:
            return len(await pods_of(api, "good")) == 4

        await eventually(four_good)

        async def failed() -> dict[str, Any]:
            status = await status_of(api, "bad")
            return status if status.get("phase") == "Failed" else {}

        status = await eventually(failed)
        (valid,) = [c for c in status["conditions"] if c["type"] == "Valid"]
        assert (valid["status"], valid["reason"]) == ("False", "InvalidGPURange")
        assert await pods_of(api, "bad") == []
        events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
        assert any(e.get("type") == "Warning" and e.get("reason") == "InvalidSpec" for e in events)


async def test_worker_failure_restarts_then_fails(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    async with operator(kmock):
        await api.post(JOBS, json=dljob("flaky"))

        async def gen(g: int) -> bool:
            pods = await pods_of(api, "flaky")
            return len(pods) == 4 and all(f"-g{g}-" in p["metadata"]["name"] for p in pods)

        await eventually(lambda: gen(1))
        failed = {"status": {"phase": "Failed"}}
        await api.patch(f"{PODS}/flaky-g1-w2/status", json=failed, headers=MERGE)
        await eventually(lambda: gen(2))
        assert (await status_of(api, "flaky"))["restarts"] == 1
        await api.patch(f"{PODS}/flaky-g2-w0/status", json=failed, headers=MERGE)

        async def terminal() -> dict[str, Any]:
            status = await status_of(api, "flaky")
            return status if status.get("phase") == "Failed" else {}

        status = await eventually(terminal)
        assert status["restarts"] == 2
        await eventually(lambda: _no_pods(api, "flaky"))


async def _no_pods(api: httpx.AsyncClient, job: str) -> bool:
    return await pods_of(api, job) == []


async def test_completion_by_reported_iterations(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    async with operator(kmock):
        await api.post(JOBS, json=dljob("done", iterations=50))

        async def four() -> bool:
            return len(await pods_of(api, "done")) == 4

        await eventually(four)
        progress = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "50"}}}
        await api.patch(f"{PODS}/done-g1-w0", json=progress, headers=MERGE)

        async def succeeded() -> dict[str, Any]:
            status = await status_of(api, "done")
            return status if status.get("phase") == "Succeeded" else {}

        status = await eventually(succeeded)
        assert status["progress"]["iterations"] == 50
        await eventually(lambda: _no_pods(api, "done"))


async def test_deleting_dljob_removes_its_pods(kmock: KubeEmulator, api: httpx.AsyncClient) -> None:
    async with operator(kmock):
        await api.post(JOBS, json=dljob("gone"))

        async def four() -> bool:
            return len(await pods_of(api, "gone")) == 4

        await eventually(four)
        await api.delete(f"{JOBS}/gone")
        await eventually(lambda: _no_pods(api, "gone"))
        await asyncio.sleep(0.2)  # the operator must not resurrect them
        assert await pods_of(api, "gone") == []


class RecordingPolicy(ThresholdPolicy):
    """ThresholdPolicy that keeps each snapshot's pinned flags (read from the test's loop)."""

    def __init__(self) -> None:
        self.pinned: list[dict[str, bool]] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        self.pinned.append({job.id: job.pinned for job in snapshot.jobs})
        return super().plan(snapshot)


async def _start_workers(api: httpx.AsyncClient, pods: list[dict[str, Any]], node: str) -> None:
    """What the extender (placement at bind) and the kubelet (phase) would write."""
    block = [[node, i] for i in range(len(pods))]
    placement = json.dumps({"node": node, "block": block})
    for pod in pods:
        name = pod["metadata"]["name"]
        meta = {"metadata": {"annotations": {contract.PLACEMENT_ANNOTATION: placement}}}
        assert (await api.patch(f"{PODS}/{name}", json=meta, headers=MERGE)).is_success
        running = {"status": {"phase": "Running"}}
        assert (await api.patch(f"{PODS}/{name}/status", json=running, headers=MERGE)).is_success


async def test_profiling_pins_then_runs(kmock: KubeEmulator, api: httpx.AsyncClient) -> None:
    policy = RecordingPolicy()
    async with operator(kmock, policy, window_s=0.3):
        await api.post(JOBS, json=dljob("prof"))

        async def gen(g: int, n: int) -> list[dict[str, Any]]:
            pods = await pods_of(api, "prof")
            ok = len(pods) == n and all(f"-g{g}-" in p["metadata"]["name"] for p in pods)
            return pods if ok else []

        async def phase(name: str) -> dict[str, Any]:
            status = await status_of(api, "prof")
            return status if status.get("phase") == name else {}

        pods = await eventually(lambda: gen(1, 4))
        status = await eventually(lambda: phase("Profiling"))
        assert "profilingUntil" not in status["allocation"]  # waits for the workers to run
        await _start_workers(api, pods, "n1")

        async def window() -> dict[str, Any]:
            status = await status_of(api, "prof")
            return status if status.get("allocation", {}).get("profilingUntil") else {}

        started = time.time()
        status = await eventually(window)
        until = parse_time(status["allocation"]["profilingUntil"])
        assert until is not None and 0 < until - started <= 0.3 + 0.5
        status = await eventually(lambda: phase("Running"))
        assert time.time() >= until
        assert status["model"]["profiledGpuCounts"] == [4]
        assert "profilingUntil" not in status["allocation"]
        assert any(p.get(f"{NS}/prof") for p in policy.pinned)  # pinned while it profiled
        assert policy.pinned[-1][f"{NS}/prof"] is False
        events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
        assert {"ProfilingStarted", "ProfilingFinished"} <= {e.get("reason") for e in events}

        # A GPU count the job never ran on is profiled again.
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "500"}}, headers=MERGE)
        await eventually(lambda: gen(2, 2))
        status = await eventually(lambda: phase("Profiling"))
        assert status["model"]["profiledGpuCounts"] == [4]
