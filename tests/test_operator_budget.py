"""The budget in force against the emulated API server: restarts, warnings, deletion."""

from __future__ import annotations

import datetime as dt
import functools
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import operator_cases
import pytest
from powerflow.operator.budget import IN_FORCE_CONFIGMAP, SOURCE_VERSION_ANNOTATION
from powerflow.operator.jobs import JobRequest
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args, write_kubeconfig

from powerflow.core import contract
from powerflow.core.policy.snapshot import JobPlan, Plan, Snapshot
from powerflow.lab.synthetic import SyntheticModel

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NS = "ml"
SYSTEM = "powerflow-system"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
CMS = f"/api/v1/namespaces/{SYSTEM}/configmaps"
BUDGET = f"{CMS}/{contract.BUDGET_CONFIGMAP}"
MERGE = {"Content-Type": "application/merge-patch+json"}


class ThresholdPolicy:
    """Requested GPUs under a limit of at least 1 kW or none, else min GPUs; the plan's
    limit is the budget's (1e9 without one), as the metric shows."""

    def plan(self, snapshot: Snapshot) -> Plan:
        limit = snapshot.budget.limit_w
        generous = limit is None or limit >= 1000
        plans = []
        for job in snapshot.jobs:
            n = job.requested_gpus if generous else job.min_gpus
            plans.append(JobPlan(job.id, n, 1410, job.global_batch_size // n))
        return Plan(tuple(plans), limit_w=1e9 if limit is None else limit, predicted_w=1.0)


def models(job: JobRequest) -> SyntheticModel:
    return SyntheticModel()


def dljob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "globalBatchSize": 64,
            "iterations": 1000,
            "gpus": {"requested": 4, "min": 2, "max": 4},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "pytorch"}]}},
        },
    }


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "labels": {contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"},
            },
            "status": {"allocatable": {contract.GPU_RESOURCE: "4"}},
        }
        assert (await client.post("/api/v1/nodes", json=node)).status_code == 201
        yield client


def operator(kmock: KubeEmulator) -> Operator:
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0")
    return Operator(args, ThresholdPolicy(), models)


# The shared wait, with the longer default these operator restarts need.
eventually = functools.partial(operator_cases.eventually, timeout=10.0)


async def set_budget(api: httpx.AsyncClient, data: dict[str, str]) -> None:
    current = await api.get(BUDGET)
    if current.status_code == 404:
        cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": data}
        assert (await api.post(CMS, json=cm)).status_code == 201
    else:  # replace the data whole, as kubectl apply of a new manifest does
        body = current.json()
        body["data"] = data
        assert (await api.put(BUDGET, json=body)).is_success


async def gpus_of(api: httpx.AsyncClient, job: str) -> set[str]:
    """The running generation's pod names."""
    items = (await api.get(PODS)).json()["items"]
    return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}


async def events(api: httpx.AsyncClient, reason: str) -> list[dict[str, Any]]:
    items = (await api.get(f"/api/v1/namespaces/{SYSTEM}/events")).json()["items"]
    return [e for e in items if e.get("reason") == reason]


async def settled_pass(api: httpx.AsyncClient, op: Operator) -> None:
    """Wait for the startup pass to end, then for one more pass ended after a poke (a
    label change on the job is an event). Counting from before the startup pass ended
    raced: a pass counted once it ends, so ``passes`` read before or after it differs."""

    async def started() -> bool:
        return op.controller is not None and op.controller.passes >= 1

    await eventually(started)
    assert op.controller is not None
    passes = op.controller.passes
    poke = {"metadata": {"labels": {"poke": str(time.monotonic())}}}
    assert (await api.patch(f"{JOBS}/job", json=poke, headers=MERGE)).is_success

    async def passed() -> bool:
        return op.controller is not None and op.controller.passes > passes

    await eventually(passed)


def budget_metric(op: Operator) -> float | None:
    assert op.controller is not None
    registry = op.controller.metrics.registry
    return registry.get_sample_value("powerflow_power_budget_watts")


async def test_a_restart_during_an_invalid_budget_keeps_the_cap(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    await set_budget(api, {"powerLimitWatts": "300"})
    await api.post(JOBS, json=dljob("job"))
    two = {f"job-g1-w{i}" for i in range(2)}
    async with operator(kmock) as op:

        async def capped() -> bool:
            return await gpus_of(api, "job") == two

        await eventually(capped)
        assert budget_metric(op) == 300.0
    await set_budget(api, {"powerLimitWatts": "lots"})
    async with operator(kmock) as op:
        await settled_pass(api, op)
        assert budget_metric(op) == 300.0
        assert await gpus_of(api, "job") == two  # not rescaled to the whole cluster
        (invalid,) = await events(api, "InvalidBudget")
        assert "keeping powerLimitWatts 300 W" in invalid["message"]
        # A valid budget again takes over and is recorded.
        await set_budget(api, {"powerLimitWatts": "5000"})

        async def generous() -> bool:
            return await gpus_of(api, "job") == {f"job-g2-w{i}" for i in range(4)}

        await eventually(generous)
    recorded = (await api.get(f"{CMS}/{IN_FORCE_CONFIGMAP}")).json()
    assert recorded["data"] == {"powerLimitWatts": "5000"}
    version = (await api.get(BUDGET)).json()["metadata"]["resourceVersion"]
    assert recorded["metadata"]["annotations"][SOURCE_VERSION_ANNOTATION] == version


@pytest.mark.parametrize(
    ("data", "reason", "words"),
    [
        ({"eta": "0"}, "BudgetStopsAllJobs", "eta is 0: every job is stopped"),
        ({"powerLimitWatts": "0"}, "BudgetStopsAllJobs", "powerLimitWatts is 0"),
        (
            {"eta": "0.5", "powerLimitWatts": "300"},
            "BudgetKeysConflict",
            "powerLimitWatts (300 W) is in force, eta (0.5) is ignored",
        ),
    ],
)
async def test_surprising_budgets_get_a_warning(
    kmock: KubeEmulator, api: httpx.AsyncClient, data: dict[str, str], reason: str, words: str
) -> None:
    await set_budget(api, data)
    async with operator(kmock):

        async def warned() -> list[dict[str, Any]]:
            return await events(api, reason)

        (event,) = await eventually(warned)
    assert event["type"] == "Warning" and words in event["message"]
    assert event["involvedObject"]["name"] == contract.BUDGET_CONFIGMAP


async def test_a_deleted_budget_means_the_default(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    await set_budget(api, {"powerLimitWatts": "300"})
    await api.post(JOBS, json=dljob("job"))
    async with operator(kmock) as op:

        async def capped() -> bool:
            return await gpus_of(api, "job") == {f"job-g1-w{i}" for i in range(2)}

        await eventually(capped)
        assert (await api.delete(BUDGET)).is_success

        async def uncapped() -> bool:
            return await gpus_of(api, "job") == {f"job-g2-w{i}" for i in range(4)}

        await eventually(uncapped)
        assert budget_metric(op) == 1e9

        async def said() -> list[dict[str, Any]]:
            found = await events(api, "BudgetInForce")
            return [e for e in found if "the default" in e["message"]]

        (event,) = await eventually(said)
        assert event["involvedObject"]["name"] == IN_FORCE_CONFIGMAP
    recorded = (await api.get(f"{CMS}/{IN_FORCE_CONFIGMAP}")).json()
    assert recorded.get("data") in (None, {})


async def test_an_unrecorded_budget_in_force_is_kept_over_an_older_record(
    kmock: KubeEmulator, api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The record is read only at start: a valid budget that could not be recorded
    (no RBAC for it, a 5xx) stays in force when the ConfigMap then turns invalid,
    rather than the older record taking over. Its warnings are still posted, and the
    failed write is logged once, not on every pass."""
    await set_budget(api, {"powerLimitWatts": "300"})
    await api.post(JOBS, json=dljob("job"))
    async with operator(kmock):

        async def recorded() -> bool:
            saved = await api.get(f"{CMS}/{IN_FORCE_CONFIGMAP}")
            return saved.status_code == 200 and saved.json()["data"] == {"powerLimitWatts": "300"}

        await eventually(recorded)
    for verb in ("create", "update", "patch"):
        kmock.refuse(verb, "configmaps", IN_FORCE_CONFIGMAP, namespace=SYSTEM)
    await set_budget(api, {"powerLimitWatts": "5000", "eta": "0.5"})
    four = {f"job-g2-w{i}" for i in range(4)}
    async with operator(kmock) as op:

        async def generous() -> bool:
            return await gpus_of(api, "job") == four

        await eventually(generous)

        async def warned() -> list[dict[str, Any]]:
            return await events(api, "BudgetKeysConflict")

        await eventually(warned)
        await set_budget(api, {"powerLimitWatts": "lots"})
        await settled_pass(api, op)
        await settled_pass(api, op)
        assert budget_metric(op) == 5000.0
        assert await gpus_of(api, "job") == four  # not rescaled to the recorded 300 W
        (invalid,) = await events(api, "InvalidBudget")
        assert "keeping powerLimitWatts 5000 W" in invalid["message"]
    saved = (await api.get(f"{CMS}/{IN_FORCE_CONFIGMAP}")).json()
    assert saved["data"] == {"powerLimitWatts": "300"}  # the writes were refused
    refusals = [
        r for r in caplog.records if f"could not write ConfigMap {IN_FORCE_CONFIGMAP}" in r.message
    ]
    assert len(refusals) == 1, [r.message for r in refusals]


def clock_text(t_s: float) -> str:
    """``t_s`` as a schedule time ``HH:MM:SS`` (UTC)."""
    return dt.datetime.fromtimestamp(t_s, dt.UTC).strftime("%H:%M:%S")


def label_time(t_s: float) -> str:
    """``t_s`` as the Event names a window's edge (docs/operator.md): ``HH:MM``, with
    ``:SS`` only when not 0 (this test once failed, 1 run in 60, on a start at :00)."""
    text = clock_text(t_s)
    return text.removesuffix(":00")


def schedule_from(start_s: float, watts: str, default: str = "4000") -> dict[str, str]:
    """A budget of ``default`` W with a one-hour window of ``watts`` W from ``start_s``;
    an hour-long interval, so that only the window's edge can cause a pass."""
    window = f"start: '{clock_text(start_s)}', end: '{clock_text(start_s + 3600)}'"
    return {
        "powerLimitWatts": default,
        "schedulingIntervalSeconds": "3600",
        "schedule": f"- {{{window}, powerLimitWatts: {watts}}}",
    }


async def test_the_operator_switches_the_budget_at_a_window_edge(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """A window that starts a few seconds after the ConfigMap is written: the pass the
    change causes plans against the default (4000 W: the job keeps 4 GPUs), and with no
    event and an hour-long interval the operator runs a pass at the edge, plans
    against the window's 300 W (2 GPUs) and says so in an Event. The edge is some
    seconds ahead; on a machine too slow to see the default first, the test starts
    again with the edge further out (it never judges how fast anything was)."""
    await set_budget(api, {"powerLimitWatts": "5000", "schedulingIntervalSeconds": "3600"})
    await api.post(JOBS, json=dljob("job"))
    async with operator(kmock) as op:

        async def at(watts: float, gpus: int) -> None:
            async def there() -> bool:
                return budget_metric(op) == watts and len(await gpus_of(api, "job")) == gpus

            await eventually(there)

        await at(5000.0, 4)
        for margin in (3.0, 6.0, 12.0, 24.0):
            start = float(int(time.time() + margin))
            await set_budget(api, schedule_from(start, "300"))

            async def changed() -> float | None:
                watts = budget_metric(op)
                return watts if watts != 5000.0 else None

            if await eventually(changed) == 4000.0:
                break
            # the edge passed before the change's pass: back to 4 GPUs, further out
            await set_budget(api, {"powerLimitWatts": "5000", "schedulingIntervalSeconds": "3600"})
            await at(5000.0, 4)
        else:
            raise AssertionError("never saw the default before the edge")
        assert len(await gpus_of(api, "job")) == 4

        async def windowed() -> bool:
            return budget_metric(op) == 300.0 and len(await gpus_of(api, "job")) == 2

        await eventually(windowed, timeout=margin + 10.0)
        label = f"{label_time(start)}-{label_time(start + 3600)}"

        async def said() -> list[dict[str, Any]]:
            found = await events(api, "BudgetWindow")
            return [e for e in found if f"window {label} (UTC)" in e["message"]]

        (event,) = await eventually(said)
        assert event["involvedObject"]["name"] == contract.BUDGET_CONFIGMAP
        assert "powerLimitWatts 300 W in force" in event["message"]


async def gpus_of_at_least(api: httpx.AsyncClient, n: int) -> bool:
    return len(await gpus_of(api, "job")) >= n


async def test_a_restart_during_an_invalid_budget_keeps_the_recorded_schedule(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """The record holds the schedule, not the budget it had in force: an operator
    restarted while the ConfigMap is invalid plans against the window in force now."""
    now = time.time()
    data = schedule_from(now - 1800, "300", default="5000")
    await set_budget(api, data)
    await api.post(JOBS, json=dljob("job"))
    async with operator(kmock) as op:
        await eventually(lambda: gpus_of_at_least(api, 2))
        assert budget_metric(op) == 300.0
    recorded = (await api.get(f"{CMS}/{IN_FORCE_CONFIGMAP}")).json()
    assert recorded["data"] == data
    await set_budget(api, {**data, "schedule": "- {start: '08:00', end: 20:00, eta: 1}"})
    async with operator(kmock) as op:
        await settled_pass(api, op)
        assert budget_metric(op) == 300.0
        assert len(await gpus_of(api, "job")) == 2
        (invalid,) = await events(api, "InvalidBudget")
        assert "end: 1200 is a number" in invalid["message"]
        assert "keeping powerLimitWatts 5000 W, every 3600 s; windows " in invalid["message"]
