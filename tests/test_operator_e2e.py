"""The operator against the emulated API server over real HTTP, run in its own thread.

Started as ``powerflow operator --kubeconfig FILE`` starts it (``serve``), with a
test policy and synthetic models through ``serve``'s seams."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
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
    pods_of,
    start_workers,
    status_of,
)
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args

from powerflow.core import contract
from powerflow.core.policy.snapshot import Plan, Policy, Snapshot
from powerflow.core.timefmt import parse_time

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


def operator(
    kubeconfig: Path, policy: Policy | None = None, window_s: float = 0.3, *options: str
) -> Operator:
    args = operator_args(
        kubeconfig, "--debounce", "0.02", "--profiling-window", str(window_s), *options
    )
    return Operator(args, policy or ThresholdPolicy(), models)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


async def test_dljob_gets_worker_pods_and_status(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    async with operator(kubeconfig):
        await api.post(JOBS, json=dljob("resnet"))

        async def four_pods() -> list[dict[str, Any]]:
            pods = await pods_of(api, "resnet")
            return pods if len(pods) == 4 else []

        pods = await eventually(four_pods)
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

        async def profiling_event() -> bool:
            # Written in the same pass as the status, after it: a reader may see the
            # status first.
            events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return any(e.get("reason") == "Profiling" for e in events)

        assert await eventually(profiling_event)


async def test_budget_change_reallocates(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    async with operator(kubeconfig):
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
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    async with operator(kubeconfig):
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

        async def warned() -> bool:  # a pass posts its Events after its writes
            events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return any(
                e.get("type") == "Warning" and e.get("reason") == "InvalidSpec" for e in events
            )

        await eventually(warned)


async def _passes_beyond(op: Operator, n: int) -> bool:
    return op.passes > n


async def test_worker_failure_restarts_then_fails(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    async with operator(kubeconfig):
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


async def test_completion_by_reported_iterations(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    """A trainer that reports all its iterations and then hangs in its teardown: the job
    completes at once, not at the next periodic pass (the default interval, 60 s). A
    progress report below the total is not a scheduling event; reaching it is."""
    async with operator(kubeconfig):
        await api.post(JOBS, json=dljob("done", iterations=50))

        async def four() -> bool:
            return len(await pods_of(api, "done")) == 4

        await eventually(four)
        progress = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "50"}}}
        await api.patch(f"{PODS}/done-g1-w0", json=progress, headers=MERGE)

        async def succeeded() -> dict[str, Any]:
            status = await status_of(api, "done")
            return status if status.get("phase") == "Succeeded" else {}

        status = await eventually(succeeded, timeout=10)
        assert status["progress"]["iterations"] == 50
        await eventually(lambda: _no_pods(api, "done"))


async def test_deleting_dljob_removes_its_pods(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    async with operator(kubeconfig):
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


async def test_profiling_pins_then_runs(kubeconfig: Path, api: httpx.AsyncClient) -> None:
    policy = RecordingPolicy()
    async with operator(kubeconfig, policy, window_s=0.3):
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
        before = time.time()
        await start_workers(api, pods, "n1")

        async def window() -> dict[str, Any]:
            status = await status_of(api, "prof")
            return status if status.get("allocation", {}).get("profilingUntil") else {}

        status = await eventually(window)
        seen = time.time()
        until = parse_time(status["allocation"]["profilingUntil"])
        # The window began in a pass between the workers' start and now (no bound on
        # how fast that pass came: the machine may be loaded), and lasts 0.3 s
        # (profilingUntil is kept to the millisecond).
        assert until is not None and before + 0.3 - 0.001 <= until <= seen + 0.3 + 0.001
        status = await eventually(lambda: phase("Running"))
        assert time.time() >= until
        assert status["model"]["profiledGpuCountsByType"] == [{"gpu": "A100", "gpuCounts": [4]}]
        assert "profilingUntil" not in status["allocation"]
        assert any(p.get(f"{NS}/prof") for p in policy.pinned)  # pinned while it profiled
        assert policy.pinned[-1][f"{NS}/prof"] is False

        async def profiling_events() -> bool:  # events go out after the pass's writes
            events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return {"ProfilingStarted", "ProfilingFinished"} <= {e.get("reason") for e in events}

        await eventually(profiling_events)

        # A GPU count the job never ran on is profiled again.
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "500"}}, headers=MERGE)
        await eventually(lambda: gen(2, 2))
        status = await eventually(lambda: phase("Profiling"))
        assert status["model"]["profiledGpuCountsByType"] == [{"gpu": "A100", "gpuCounts": [4]}]


POD_SECURITY = (
    'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": '
    'runAsNonRoot != true (pod or container "trainer" must set securityContext.runAsNonRoot=true)'
)


async def _warnings(api: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
    return [
        e
        for e in events
        if e.get("type") == "Warning" and e.get("involvedObject", {}).get("name") == job
    ]


async def _condition(api: httpx.AsyncClient, job: str, type_: str) -> dict[str, Any]:
    conditions = (await status_of(api, job)).get("conditions") or []
    found: dict[str, Any] = next((c for c in conditions if c["type"] == type_), {})
    return found


async def test_refused_pods_are_reported_on_their_job_which_backs_off(
    kmock: KubeEmulator, kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    rule = kmock.refuse("create", "pods", "bad-*", message=POD_SECURITY.format(name="bad-g1-w0"))
    async with operator(kubeconfig) as op:
        await api.post(JOBS, json=dljob("bad"))
        await api.post(JOBS, json=dljob("good"))

        async def four_good() -> bool:
            return len(await pods_of(api, "good")) == 4

        await eventually(four_good)

        async def refused() -> dict[str, Any]:
            cond = await _condition(api, "bad", "WorkersCreated")
            return cond if cond.get("status") == "False" else {}

        cond = await eventually(refused)
        assert cond["reason"] == "Forbidden"
        assert 'violates PodSecurity "restricted:latest"' in cond["message"]
        status = await status_of(api, "bad")
        assert status["createRefusals"] == 1 and status["phase"] == "Pending"
        warnings = await eventually(lambda: _warnings(api, "bad"))
        assert any(
            e["reason"] == "FailedCreate" and "violates PodSecurity" in e["message"]
            for e in warnings
        )
        assert await pods_of(api, "bad") == []
        good = await status_of(api, "good")
        assert good["phase"] in ("Profiling", "Running") and good["allocation"]["gpus"] == 4

        # Backing off: more passes make no new attempt for the refused job.
        attempts = rule.hits
        assert attempts == 4  # one pass, the four workers of one gang
        for poke in ("1", "2", "3"):
            passes = op.passes
            label = {"metadata": {"labels": {"poke": poke}}}
            assert (await api.patch(f"{JOBS}/good", json=label, headers=MERGE)).is_success
            await eventually(lambda n=passes: _passes_beyond(op, n))
        assert rule.hits == attempts
        assert (await status_of(api, "bad"))["createRefusals"] == 1


async def test_a_service_name_taken_by_someone_else_is_an_error_on_the_job(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    foreign = {
        "metadata": {"name": "taken"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    assert (await api.post(f"/api/v1/namespaces/{NS}/services", json=foreign)).is_success
    async with operator(kubeconfig):
        await api.post(JOBS, json=dljob("taken"))
        await api.post(JOBS, json=dljob("good"))

        async def four_good() -> bool:
            return len(await pods_of(api, "good")) == 4

        await eventually(four_good)

        async def refused() -> dict[str, Any]:
            cond = await _condition(api, "taken", "WorkersCreated")
            return cond if cond.get("status") == "False" else {}

        cond = await eventually(refused)
        assert cond["reason"] == "AlreadyExists"
        assert 'Service "taken" already exists' in cond["message"]
        warnings = await eventually(lambda: _warnings(api, "taken"))
        assert any('Service "taken"' in e["message"] for e in warnings)
        await eventually(lambda: _no_pods(api, "taken"))  # the gang is all or nothing
        service = (await api.get(f"/api/v1/namespaces/{NS}/services/taken")).json()
        assert service["spec"]["selector"] == {"app": "web"}  # left as it was


async def test_gpu_pods_that_are_not_powerflows_occupy_their_gpus(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    """A bound pod of someone else's holding a GPU of n1 takes it within n1, and the plan
    (which needs equal nodes) leaves n1 out while it is held: one 4-GPU job on n2, not two."""
    foreign = {
        "metadata": {"name": "notebook"},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {contract.GPU_RESOURCE: "1"}}}
            ],
        },
    }
    assert (await api.post(PODS, json=foreign)).status_code == 201
    async with operator(kubeconfig):
        await api.post(JOBS, json=dljob("first"))

        async def four_first() -> bool:
            return len(await pods_of(api, "first")) == 4

        await eventually(four_first)
        await api.post(JOBS, json=dljob("second"))

        async def second_seen() -> dict[str, Any]:  # a pass in flight may not have read it
            return await status_of(api, "second")

        status = await eventually(second_seen)
        assert status["phase"] == "Pending" and await pods_of(api, "second") == []
