"""A small cluster and a plain policy for tests that run the operator to completion.

The operator's restart tests and its API-fault tests drive the same set-up: two 4-GPU
nodes, DLJobs of one fixed 4-GPU gang, a first-come policy whose plan is the same after
any restart or retry (so a repeated plan can never be what moved a job), and synthetic
models (no fitting in the way).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import operator_cases
from powerflow.operator.jobs import JobRequest

from powerflow.core import contract
from powerflow.core.policy.snapshot import JobPlan, Plan, Snapshot
from powerflow.lab.synthetic import SyntheticModel
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args, write_kubeconfig

NODES = ("n1", "n2")
MERGE = {"Content-Type": "application/merge-patch+json"}


class FirstComePolicy:
    """Requested GPUs, first come, while they last (the same plan after any restart)."""

    def plan(self, snapshot: Snapshot) -> Plan:
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.id)):
            n = job.requested_gpus if job.requested_gpus <= free else 0
            free -= n
            plans.append(JobPlan(job.id, n, 1410, -(-job.global_batch_size // n) if n else 0))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=1.0)


def models(job: JobRequest) -> SyntheticModel:
    return SyntheticModel()


def gang_dljob(name: str, iterations: int) -> dict[str, Any]:
    """A DLJob of exactly 4 GPUs (no rescale), restarted at most 3 times, without backoff."""
    return operator_cases.dljob(
        name,
        iterations=iterations,
        gpus={"requested": 4, "min": 4, "max": 4},
        restart={"limit": 3, "backoffSeconds": 0},
        template={"spec": {"containers": [{"name": "trainer", "image": "pytorch"}]}},
    )


@contextlib.asynccontextmanager
async def cluster(
    kmock: KubeEmulator,
    nodes: list[dict[str, Any]],
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """The emulator with the built-in resources, the DLJob resource and ``nodes``; a client
    of it (with ``headers``: a test's own client, told apart from the components')."""
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=headers) as client:
        for body in nodes:
            assert (await client.post("/api/v1/nodes", json=body)).status_code == 201
        yield client


def operator(kmock: KubeEmulator) -> Operator:
    """``powerflow operator`` (kubeconfig at the emulator) with ``FirstComePolicy``, synthetic
    models, a 20 ms debounce and 0.2 s profiling windows, not started yet."""
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0.2")
    return Operator(args, FirstComePolicy(), models)


async def kubelet(api: httpx.AsyncClient, pods: str, run_s: float) -> None:
    """Play the kubelets and the trainers of the pods at ``pods`` (a namespace's pods path)
    until cancelled: pods run; once a gang of 4 ran ``run_s`` in full, its worker 0 reports
    the last iteration (what the trainer writes), which completes the job."""
    since: dict[str, float] = {}
    reported: set[str] = set()
    while True:
        gangs: dict[str, list[dict[str, Any]]] = {}
        for pod in (await api.get(pods)).json()["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if pod.get("status", {}).get("phase") != "Running":
                running = {"status": {"phase": "Running"}}
                await api.patch(f"{pods}/{meta['name']}/status", json=running, headers=MERGE)
            gangs.setdefault(meta["name"].rsplit("-w", 1)[0], []).append(pod)
        now = time.monotonic()
        for gang, members in gangs.items():
            if len(members) < 4:
                continue
            if gang not in reported and now - since.setdefault(gang, now) >= run_s:
                reported.add(gang)
                report = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "100"}}}
                await api.patch(f"{pods}/{gang}-w0", json=report, headers=MERGE)
        await asyncio.sleep(0.05)
