"""The components ride through API-server faults with nothing lost (issue 16).

Each component is started as a user starts it (its command's ``serve`` or the
command itself, with a kubeconfig pointing at the emulator) while the
emulator injects faults into its requests only (``support.api_faults``, rules
matched by the component's ``User-Agent``; the test's own requests, playing
the kubelet and the user, are never faulted): 409 conflicts, 429 throttling
with ``Retry-After``, 500s before and after a committed write, watches that
end with a 410 ``ERROR`` event (and etcd compaction), and answers seconds
late. Draws are seeded.

Nothing lost means, for the operator: every DLJob reaches ``Succeeded``,
no job was restarted (no fault cost a generation), and each worker slot's pod
was created once (one uid per pod name, over the emulator's whole history);
for the node agent: every pod's clocks are applied and reset as without
faults; for the extender: a bind whose API call fails answers an ``Error``
and books nothing, and no GPU is ever booked twice.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import operator_cases
import pytest
from powerflow.operator.jobs import JobRequest
from support.api_faults import Fault
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args, write_kubeconfig

from powerflow import contract
from powerflow.policy.snapshot import JobPlan, Plan, Snapshot
from powerflow.policy.synthetic import SyntheticModel

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NS = "ml"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
TESTER = {"User-Agent": "test-kubelet"}
"""The test's own client: never matched by the components' fault rules."""
OPERATOR_AGENTS = ("powerflow-operator/*", "kopf/*")
"""The operator's two clients: its allocation loop's and kopf's watches."""
ITERATIONS = 100
JOBS_N = 4

eventually = functools.partial(operator_cases.eventually, timeout=90.0)


class FirstComePolicy:
    """Requested GPUs, first come, while they last (the same plan after any retry)."""

    def plan(self, snapshot: Snapshot) -> Plan:
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.id)):
            n = job.requested_gpus if job.requested_gpus <= free else 0
            free -= n
            plans.append(JobPlan(job.id, n, 1410, -(-job.global_batch_size // n) if n else 0))
        return Plan(tuple(plans), limit_watts=1e9, predicted_watts=1.0)


def models(job: JobRequest) -> SyntheticModel:
    return SyntheticModel()


def dljob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "globalBatchSize": 64,
            "iterations": ITERATIONS,
            "gpus": {"requested": 4, "min": 4, "max": 4},
            "restart": {"limit": 3, "backoffSeconds": 0},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "pytorch"}]}},
        },
    }


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=TESTER) as client:
        for name in ("n1", "n2"):
            body = operator_cases.node(name, 4)
            assert (await client.post("/api/v1/nodes", json=body)).status_code == 201
        yield client


def operator(kmock: KubeEmulator) -> Operator:
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0.2")
    return Operator(args, FirstComePolicy(), models)


async def kubelet(api: httpx.AsyncClient, run_s: float) -> None:
    """Pods run; once a gang ran ``run_s`` in full, its worker 0 reports the last
    iteration (what the trainer writes), which completes the job."""
    since: dict[str, float] = {}
    reported: set[str] = set()
    while True:
        gangs: dict[str, list[dict[str, Any]]] = {}
        for pod in (await api.get(PODS)).json()["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if pod.get("status", {}).get("phase") != "Running":
                running = {"status": {"phase": "Running"}}
                await api.patch(f"{PODS}/{meta['name']}/status", json=running, headers=MERGE)
            gangs.setdefault(meta["name"].rsplit("-w", 1)[0], []).append(pod)
        now = time.monotonic()
        for gang, members in gangs.items():
            if len(members) < 4:
                continue
            if gang not in reported and now - since.setdefault(gang, now) >= run_s:
                reported.add(gang)
                report = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "100"}}}
                await api.patch(f"{PODS}/{gang}-w0", json=report, headers=MERGE)
        await asyncio.sleep(0.05)


def pod_incarnations(kmock: KubeEmulator) -> dict[str, set[str]]:
    """Each pod name the API server ever stored, with the uids it had (one per creation)."""
    uids: dict[str, set[str]] = {}
    for key in list(kmock.objects):
        resource, namespace, name = key
        if getattr(resource, "plural", None) != "pods" or getattr(resource, "group", None):
            continue
        for version in kmock.objects[key].history:  # None marks a deletion
            uid = (version or {}).get("metadata", {}).get("uid")
            if uid:
                uids.setdefault(name, set()).add(uid)
    return uids


def for_operator(kmock: KubeEmulator, verb: str, resource: str, **fault: Any) -> list[Fault]:
    """The same rule for both of the operator's clients."""
    return [
        kmock.faults.inject(verb, resource, user_agent=agent, **fault)
        for agent in OPERATOR_AGENTS
    ]


def conflicts(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(kmock, "patch", f"{contract.PLURAL}/status", status=409, probability=0.3),
        *for_operator(kmock, "create", "pods", status=409, probability=0.2),
        *for_operator(kmock, "patch", "pods", status=409, probability=0.3),
    ]


def throttling(kmock: KubeEmulator) -> list[Fault]:
    return for_operator(kmock, "*", "*", status=429, probability=0.15, retry_after_s=1)


def internal_errors(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(kmock, "create", "pods", status=500, committed=True, probability=0.2),
        *for_operator(kmock, "create", "pods", status=500, probability=0.1),
        *for_operator(kmock, "delete", "pods", status=500, committed=True, probability=0.3),
        *for_operator(kmock, "patch", f"{contract.PLURAL}/status", status=500, probability=0.15),
        *for_operator(kmock, "list", "*", status=500, probability=0.1),
    ]


def gone_watches(kmock: KubeEmulator) -> list[Fault]:
    return for_operator(kmock, "watch", "*", status=410, after_events=2, probability=0.5)


def slow(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(kmock, "list", "*", delay_s=2.0, probability=0.1),
        *for_operator(kmock, "create", "pods", delay_s=1.5, probability=0.1),
        *for_operator(kmock, "patch", "*", delay_s=1.5, probability=0.1),
    ]


def everything(kmock: KubeEmulator) -> list[Fault]:
    return [
        *conflicts(kmock),
        *throttling(kmock),
        *internal_errors(kmock),
        *gone_watches(kmock),
        *slow(kmock),
    ]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "faults",
    [conflicts, throttling, internal_errors, gone_watches, slow, everything],
    ids=lambda f: f.__name__,
)
async def test_the_operator_loses_nothing_under_api_faults(
    kmock: KubeEmulator, api: httpx.AsyncClient, faults: Any
) -> None:
    kmock.faults.reseed(16)
    rules: list[Fault] = faults(kmock)
    for i in range(JOBS_N):
        assert (await api.post(JOBS, json=dljob(f"job{i}"))).status_code == 201
    player = asyncio.create_task(kubelet(api, run_s=0.3))
    try:
        async with operator(kmock):

            async def all_done() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = (await api.get(JOBS)).json()["items"]
                phases = [j.get("status", {}).get("phase") for j in items]
                return items if phases.count("Succeeded") == JOBS_N else []

            jobs = await eventually(all_done)
    finally:
        player.cancel()
        await asyncio.gather(player, return_exceptions=True)
    assert sum(rule.hits for rule in rules) > 0, "no fault was injected"
    restarted = {j["metadata"]["name"]: j["status"].get("restarts") for j in jobs}
    assert not any(restarted.values()), f"generations lost to faults: {restarted}"
    incarnations = pod_incarnations(kmock)
    twice = {name: len(uids) for name, uids in incarnations.items() if len(uids) > 1}
    assert not twice, f"pods created more than once: {twice}"
    expected = {f"job{i}-g1-w{w}" for i in range(JOBS_N) for w in range(4)}
    assert set(incarnations) == expected
    hits: Counter[str] = Counter()
    for r in rules:
        hits[f"{r.verb} {r.resource} {r.status or r.delay_s}"] += r.hits
    print(f"faults injected: {dict(hits)}")
