"""A cluster of two GPU types through ``powerflow operator`` against the emulated API
server: every pool of a known type is planned (``nodes.fleet_nodes``, ``FleetPolicy``)
under one budget, each job's workers are pinned to its pool's GPU product and carry a
clock of that type, and windows measured on a node of the second type refit the job's
model on that type (``SampleStore.model_on``). Started as a user starts it (``serve``
with a kubeconfig), with the product's policy and models."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from operator_cases import JOBS, NS, dljob, eventually, pods_of, start_workers, status_of
from powerflow.operator.controller import default_policy, fleet_of
from powerflow.operator.learning import SampleStore, params_status
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.policy.fleet import FleetPolicy
from powerflow.core.policy.snapshot import Plan, Snapshot
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.core.telemetry import WindowSample
from powerflow.lab import groundtruth as gt

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

H100 = GPU_SPECS["H100-SXM"]
LABELS = {"a1": "NVIDIA-A100-SXM4-40GB", "h1": "NVIDIA-H100-80GB-HBM3"}
TYPES = {"a1": A100, "h1": H100}
MODEL = "resnet50"
ETA = 0.6


class Recording(FleetPolicy):
    """The product's policy over every pool (``FleetPolicy`` of ``default_policy``, what
    the operator plans with), recording each snapshot and plan of the whole cluster."""

    def __init__(self) -> None:
        super().__init__(default_policy)
        self.snapshots: list[Snapshot] = []
        self.plans: list[Plan] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        plan = super().plan(snapshot)
        self.snapshots.append(snapshot)
        self.plans.append(plan)
        return plan


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {contract.GPU_PRODUCT_LABEL: LABELS[name]}},
        "status": {"allocatable": {contract.GPU_RESOURCE: "8"}},
    }


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """One 8-GPU A100 node, one 8-GPU H100 node, a budget of eta 0.6, passes every 0.2 s."""
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        for name in LABELS:
            assert (await client.post("/api/v1/nodes", json=node(name))).status_code == 201
        data = {"eta": str(ETA), "schedulingIntervalSeconds": "0.2"}
        cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": data}
        await client.post("/api/v1/namespaces/powerflow-system/configmaps", json=cm)
        yield client


def gang(name: str) -> dict[str, Any]:
    """A job of exactly 8 GPUs: one whole node of either type."""
    return dljob(name, model=MODEL, gpus={"requested": 8, "min": 8, "max": 8})


def planned_nodes(pods: list[dict[str, Any]]) -> set[str]:
    nodes = set()
    for pod in pods:
        raw = pod["metadata"]["annotations"][contract.PLANNED_BLOCK_ANNOTATION]
        nodes.update(n for n, _ in json.loads(raw)["block"])
    return nodes


def pinned_product(pod: dict[str, Any]) -> list[str]:
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    values: list[str] = []
    for term in required["nodeSelectorTerms"]:
        for expression in term["matchExpressions"]:
            assert expression["key"] == contract.GPU_PRODUCT_LABEL
            assert expression["operator"] == "In"
            values += expression["values"]
    return values


def windows(job: str, count: int, gpu: GpuSpec) -> list[WindowSample]:
    """``count`` windows of ``job`` on one whole node of type ``gpu`` at the profile's
    clocks on that type in turn (its ground truth, 3 % noise, seed 0)."""
    truth = gt.ground_truth(MODEL, gpu)
    rng = np.random.default_rng(0)
    clocks = PAPER_SWEEP.clocks_mhz(gpu)
    out = []
    for i in range(count):
        f = clocks[i % len(clocks)]
        s = gt.measure(truth, 8, 8, 8, f, rng=rng, noise=0.03)
        out.append(
            WindowSample(
                namespace=NS,
                job=job,
                generation=1,
                n=8,
                gpus_per_node=8,
                local_batch_size=8,
                frequency_mhz=f,
                gpus_measured=8,
                iterations=10,
                step_time_s=float(s.step_time_s[0]),
                energy_j=float(s.energy_j[0]),
                end_s=1.0,
            )
        )
    return out


async def two_gangs(api: httpx.AsyncClient) -> dict[str, list[dict[str, Any]]]:
    """Two 8-GPU jobs submitted, and their pods once both gangs are whole."""
    for name in ("j1", "j2"):
        assert (await api.post(JOBS, json=gang(name))).status_code == 201

    async def both() -> dict[str, list[dict[str, Any]]]:
        gangs = {name: await pods_of(api, name) for name in ("j1", "j2")}
        return gangs if all(len(p) == 8 for p in gangs.values()) else {}

    return await eventually(both)


async def training_on_h1(api: httpx.AsyncClient) -> str:
    """``two_gangs``, then the workers of the one planned on the H100 node started; its
    name."""
    gangs = await two_gangs(api)
    (job,) = [name for name, pods in gangs.items() if planned_nodes(pods) == {"h1"}]
    await start_workers(api, gangs[job], "h1")
    return job


async def test_both_pools_are_planned_under_one_budget_each_gang_pinned_to_its_type(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    recording = Recording()
    args = operator_args(kubeconfig, "--profiling-window", "0")
    async with Operator(args, recording) as op:
        gangs = await two_gangs(api)
        on = {name: planned_nodes(pods) for name, pods in gangs.items()}
        assert sorted(on.values(), key=sorted) == [{"a1"}, {"h1"}]  # one whole node each
        for pods in gangs.values():
            (where,) = planned_nodes(pods)
            for pod in pods:
                assert pinned_product(pod) == [LABELS[where]]
                clock = int(pod["metadata"]["annotations"][contract.FREQUENCY_ANNOTATION])
                assert clock in TYPES[where].clocks_mhz
        # The H100's clocks above the A100's top: a gang on it may run there, one on the
        # A100 never does.
        (h100_gang,) = [name for name, nodes in on.items() if nodes == {"h1"}]
        snapshot, plan = recording.snapshots[-1], recording.plans[-1]
        assert {n.name: n.gpu for n in snapshot.nodes} == TYPES
        limit = ETA * 8 * (A100.p_max_w + H100.p_max_w)
        assert plan.limit_w == pytest.approx(limit)
        assert plan.predicted_w <= limit + 1e-6
        controller = op.controller
        assert controller is not None

        async def budget_shown() -> bool:
            # Set once the pass's writes are done: the pods can be read before.
            shown: float = controller.metrics.budget_watts._value.get()
            return shown == pytest.approx(limit)

        await eventually(budget_shown)
        # Each job's model on the second type is its prior carried over to it.
        for job in snapshot.jobs:
            models = dict(job.models_by_gpu)
            assert set(models) == {"A100", "H100-SXM"}
            h100 = models["H100-SXM"]
            assert isinstance(h100, FittedModel)
            assert h100.params == prior_on(load_prior(MODEL), H100)
        assert {jp.job_id for jp in plan.jobs if jp.gpus} == {f"{NS}/j1", f"{NS}/j2"}
        assert h100_gang in ("j1", "j2")


async def test_windows_from_a_node_of_the_second_type_refit_that_types_model(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    """The job on the H100 node (the other job fills the A100 node) sends windows from
    it: its H100 model is refitted on them, its model on the main pool's A100 stays its
    prior, and its measured power is the H100 windows'."""
    recording = Recording()
    args = operator_args(kubeconfig, "--profiling-window", "0")
    async with Operator(args, recording) as op:
        job = await training_on_h1(api)
        assert op.controller is not None and op.controller.learning is not None
        store: SampleStore = op.controller.learning
        store.add("h1", windows(job, 21, H100), 1.0)
        key = f"{NS}/{job}"

        def models_of(snapshot: Snapshot) -> dict[str, Any]:
            (found,) = [j for j in snapshot.jobs if j.id == key]
            return dict(found.models_by_gpu)

        carried = prior_on(load_prior(MODEL), H100)

        async def refitted() -> bool:
            snapshots = recording.snapshots
            return bool(snapshots) and models_of(snapshots[-1])["H100-SXM"].params != carried

        await eventually(refitted)
        snapshot = recording.snapshots[-1]
        models = models_of(snapshot)
        fitted = models["H100-SXM"]
        assert fitted.params.gpu == "H100-SXM" and fitted.gpu == H100
        assert models["A100"].params == load_prior(MODEL)  # nothing learnt on the A100
        (found,) = [j for j in snapshot.jobs if j.id == key]
        assert found.placement and {n for n, _ in found.placement} == {"h1"}
        assert found.measured_power_w is not None
        # The measured power is the H100 windows' (the latest configuration's).
        measured = store.measured_power()[key]
        clocks = PAPER_SWEEP.clocks_mhz(H100)
        assert measured.frequency_mhz == clocks[20 % len(clocks)]  # the last window's


def test_the_operator_plans_its_policy_over_every_pool_itself_on_the_first() -> None:
    """``fleet_of``: the policy given (the scheduler's) plans the first pool, so a cluster
    of one pool is planned exactly as by that policy; each other pool gets a replica with
    its own memo; a ``FleetPolicy`` is used as it is."""
    policy = default_policy()
    fleet = fleet_of(policy)
    assert isinstance(fleet, FleetPolicy)
    first, second = fleet._policy(("A100", 8)), fleet._policy(("H100-SXM", 8))
    assert first is policy and second == policy and second is not policy
    assert second.memo is not policy.memo  # type: ignore[attr-defined]
    recording = Recording()
    assert fleet_of(recording) is recording


async def test_a_restarted_operator_plans_with_the_fit_on_each_type_from_status(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    """The H100 fit of the job on the H100 node goes to its ``status.model.otherGpuTypes``
    (the A100 pool is the main one: ``params`` holds its A100 knowledge); a restarted
    operator plans with it from its first pass, writes no pod and leaves the job's model
    status as it was (no refit, no churn)."""
    recording = Recording()
    args = operator_args(kubeconfig, "--profiling-window", "0")
    async with Operator(args, recording) as op:
        job = await training_on_h1(api)
        assert op.controller is not None and op.controller.learning is not None
        op.controller.learning.add("h1", windows(job, 21, H100), 1.0)

        async def written() -> dict[str, Any]:
            model: dict[str, Any] = (await status_of(api, job)).get("model", {})
            return model if model.get("otherGpuTypes") else {}

        model = await eventually(written)
        (entry,) = model["otherGpuTypes"]
        assert entry["gpu"] == "H100-SXM" and entry["fits"] == 1
        assert "params" not in model  # nothing learnt on the A100
        fitted = entry["params"]
        # The pass after the fit may still write the workers (their clocks on the new
        # model): the pods as this operator leaves them, unchanged over two more passes.
        pods = await versions(api, job)
        for _ in range(20):
            seen = op.passes

            async def two_more(seen: int = seen) -> bool:
                return op.passes >= seen + 2

            await eventually(two_more)
            now = await versions(api, job)
            if now == pods:
                break
            pods = now

    restarted = Recording()
    async with Operator(args, restarted) as again:

        async def passes() -> bool:
            return again.passes >= 3

        await eventually(passes)
        key = f"{NS}/{job}"
        (first,) = [j for j in restarted.snapshots[0].jobs if j.id == key]
        h100 = dict(first.models_by_gpu)["H100-SXM"]
        assert isinstance(h100, FittedModel) and params_status(h100.params) == fitted
        assert (await status_of(api, job))["model"] == model
        now = await versions(api, job)
        assert now == pods


async def versions(api: httpx.AsyncClient, job: str) -> dict[str, str]:
    """Each worker pod's ``resourceVersion``: a pod written since has another."""
    return {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in await pods_of(api, job)
    }
