"""Shared pieces of the operator's tests against the emulator: paths, bodies, a test
policy, and polling helpers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from powerflow.operator.jobs import JobRequest

from powerflow.core import contract
from powerflow.core.policy.snapshot import JobPlan, Plan, Snapshot
from powerflow.lab.synthetic import SyntheticModel

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
        limit = snapshot.budget.limit_w
        generous = limit is None or limit >= 1000
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in snapshot.jobs:
            want = job.requested_gpus if generous else job.min_gpus
            n = want if want <= free else 0
            free -= n
            bs = -(-job.global_batch_size // n) if n else 0
            plans.append(JobPlan(job.id, n, 1410 if generous else 1005, bs))
        return Plan(tuple(plans), limit_w=limit or 1e9, predicted_w=100.0 * len(plans))


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


async def seed(client: httpx.AsyncClient) -> None:
    """Two 4-GPU nodes and a 5 kW budget."""
    for name in ("n1", "n2"):
        assert (await client.post("/api/v1/nodes", json=node(name, 4))).status_code == 201
    cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": {"powerLimitWatts": "5000"}}
    await client.post("/api/v1/namespaces/powerflow-system/configmaps", json=cm)


async def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Wait for ``check`` to hold. The bound is generous: it only stops a broken
    test, and a loaded machine (CI's two cores shared with pytest and kopf's
    threads) once took more than 5 s for a pass that normally takes 0.1 s."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout} s: {check.__name__}")
        await asyncio.sleep(0.02)


async def poked_pass(api: httpx.AsyncClient, op: Any, job: str, timeout: float = 5.0) -> None:
    """One more allocation pass of the running operator ``op`` (its ``passes`` count):
    a label change on the DLJob ``job`` is an event; waits for a pass that ends after it."""
    passes = op.passes
    label = {"metadata": {"labels": {"poke": str(time.monotonic())}}}
    assert (await api.patch(f"{JOBS}/{job}", json=label, headers=MERGE)).is_success

    async def passed() -> bool:
        return bool(op.passes > passes)

    await eventually(passed, timeout)


async def pods_of(api: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    params = {"labelSelector": f"{contract.JOB_LABEL}={job}"}
    items: list[dict[str, Any]] = (await api.get(PODS, params=params)).json()["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


async def status_of(api: httpx.AsyncClient, job: str) -> dict[str, Any]:
    status: dict[str, Any] = (await api.get(f"{JOBS}/{job}")).json().get("status", {})
    return status


async def start_workers(api: httpx.AsyncClient, pods: list[dict[str, Any]], node: str) -> None:
    """What the extender (placement at bind) and the kubelet (phase) would write."""
    block = [[node, i] for i in range(len(pods))]
    placement = json.dumps({"node": node, "block": block})
    for pod in pods:
        name = pod["metadata"]["name"]
        meta = {"metadata": {"annotations": {contract.PLACEMENT_ANNOTATION: placement}}}
        assert (await api.patch(f"{PODS}/{name}", json=meta, headers=MERGE)).is_success
        running = {"status": {"phase": "Running"}}
        assert (await api.patch(f"{PODS}/{name}/status", json=running, headers=MERGE)).is_success


def clean_env() -> dict[str, str]:
    """The environment without anything that points at a cluster."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = "/nonexistent"  # no ~/.kube/config either
    return env


def header(request: Any, name: str) -> str | None:
    for key, value in request.headers.items():
        if key.lower() == name.lower():
            return str(value)
    return None


async def start(*argv: str) -> asyncio.subprocess.Process:
    """``powerflow operator ARGV`` in a subprocess; no ingest unless ARGV asks for one
    (port 9443 is shared by every test run on the machine)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "powerflow",
        "operator",
        "--ingest-port",
        "0",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
    )
