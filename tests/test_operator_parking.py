"""Nodes the plan powers down (``operator/parking.py``): the annotation and the
``PreferNoSchedule`` taint, as pure functions and against the emulated API server.

The operator runs as a user starts it (``support.operator_harness``) with a test
policy that packs jobs onto whole nodes in name order and powers the rest down.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from kmock import method as verb
from operator_cases import JOBS, MERGE, dljob, eventually, models, poked_pass
from powerflow.operator.actions import Actions
from powerflow.operator.kube import Kube
from powerflow.operator.parking import (
    busy_nodes,
    is_marked,
    mark_patch,
    node_marks,
    powered_down,
)
from support.kube_emulator import KubeEmulator
from support.nodeagent_harness import NodeAgent, RecordingGpus, agent_args
from support.nodeagent_harness import eventually as agent_eventually
from support.operator_harness import Operator, operator_args

from powerflow.core import contract
from powerflow.core.gpus import A100, estimated_spec, unknown_gpu
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.timefmt import parse_time

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NODES = "/api/v1/nodes"
KEY = contract.POWERED_DOWN_ANNOTATION
TAINT = {"key": contract.POWERED_DOWN_TAINT, "effect": "PreferNoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "example.com/spot", "effect": "PreferNoSchedule"}
SINCE = "2026-11-26T10:00:00Z"


class PackPolicy:
    """Each job its requested GPUs on whole nodes, in arrival order and node-name order,
    while nodes last; every node left without a GPU is powered down."""

    def plan(self, snapshot: Snapshot) -> Plan:
        nodes = sorted(snapshot.nodes, key=lambda n: n.name)
        used = 0
        plans = []
        for job in sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.id)):
            need = -(-job.requested_gpus // nodes[0].gpus)
            n = job.requested_gpus if used + need <= len(nodes) else 0
            used += need if n else 0
            plans.append(JobPlan(job.id, n, 1410, -(-job.global_batch_size // n) if n else 0))
        down = tuple(n.name for n in nodes[used:])
        return Plan(tuple(plans), limit_w=1e9, predicted_w=1.0, powered_down_nodes=down)


# -- pure -----------------------------------------------------------------------------------


def body(name: str, taints: list[Any] | None = None, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "7"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "spec": {"taints": taints} if taints is not None else {}}


def marked(name: str, *others: dict[str, Any]) -> dict[str, Any]:
    return body(name, [*others, TAINT], **{KEY: SINCE})


def test_marking_adds_the_annotation_and_the_taint_after_the_others() -> None:
    node = body("n", [GPU_TAINT, SPOT_TAINT], owner="team-a")
    patch = mark_patch(node, True, SINCE)
    assert patch == {
        "metadata": {"resourceVersion": "7", "annotations": {KEY: SINCE}},
        "spec": {"taints": [GPU_TAINT, SPOT_TAINT, TAINT]},
    }


def test_unmarking_removes_only_powerflows_marks() -> None:
    patch = mark_patch(marked("n", GPU_TAINT, SPOT_TAINT), False, SINCE)
    assert patch == {
        "metadata": {"resourceVersion": "7", "annotations": {KEY: None}},
        "spec": {"taints": [GPU_TAINT, SPOT_TAINT]},
    }
    # The last taint gone: null (the API server omits an empty list), not [].
    assert mark_patch(marked("n"), False, SINCE) == {
        "metadata": {"resourceVersion": "7", "annotations": {KEY: None}},
        "spec": {"taints": None},
    }


def test_a_node_already_as_wanted_needs_no_patch() -> None:
    assert mark_patch(marked("n", GPU_TAINT), True, "2030-01-01T00:00:00Z") is None
    assert mark_patch(body("n", [GPU_TAINT]), False, SINCE) is None
    assert mark_patch(body("n"), False, SINCE) is None


def test_half_marks_are_completed_or_cleared() -> None:
    # The annotation alone (someone removed the taint): the taint comes back, the time stays.
    half = body("n", [SPOT_TAINT], **{KEY: SINCE})
    assert mark_patch(half, True, "2030-01-01T00:00:00Z") == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": [SPOT_TAINT, TAINT]},
    }
    # PowerFlow's key with another effect, twice: exactly one PreferNoSchedule entry.
    odd = body("n", [{**TAINT, "effect": "NoSchedule"}, TAINT], **{KEY: SINCE})
    assert not is_marked(odd)
    assert mark_patch(odd, True, SINCE) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": [TAINT]},
    }
    # A taint alone is unmarked too.
    assert mark_patch(body("n", [TAINT]), False, SINCE) == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"taints": None},
    }


PLANNED = (Node("n1", 4, A100), Node("n2", 4, A100), Node("n3", 4, A100))


def test_only_planned_nodes_no_one_else_uses_are_powered_down() -> None:
    plan = Plan((), 1e9, 0.0, powered_down_nodes=("n2", "n3", "gone"))
    bodies = [body("n1"), body("n2"), body("n3")]
    assert powered_down(plan, PLANNED, bodies, busy=()) == {"n2", "n3"}
    assert powered_down(plan, PLANNED, bodies, busy={"n3"}) == {"n2"}
    assert powered_down(plan, PLANNED[:2], bodies, busy=()) == {"n2"}  # n3 left the plan


def test_nodes_of_unknown_gpu_type_are_never_marked_and_lose_their_marks() -> None:
    unknown = tuple(replace(n, gpu=unknown_gpu()) for n in PLANNED)
    plan = Plan((), 1e9, 0.0, powered_down_nodes=("n2", "n3"))
    bodies = [body("n1"), body("n2"), marked("n3")]
    assert powered_down(plan, unknown, bodies, busy=()) == set()
    assert powered_down(None, unknown, bodies, busy=()) == set()
    marks = node_marks(bodies, unknown, plan, busy=(), since=SINCE)
    assert [(m.node, m.powered_down) for m in marks] == [("n3", False)]


def test_without_a_plan_the_last_marks_stand_on_planned_nodes() -> None:
    bodies = [marked("n1"), body("n2"), marked("n3"), marked("other")]
    assert powered_down(None, PLANNED, bodies, busy={"n3"}) == {"n1"}


def test_busy_nodes_are_foreign_gpu_holders_and_bound_workers() -> None:
    def pod(node: str, phase: str, gpus: str = "1", job: str | None = None) -> dict[str, Any]:
        labels = {contract.JOB_LABEL: job} if job else {}
        limits = {contract.GPU_RESOURCE: gpus} if gpus else {}
        return {
            "metadata": {"name": "p", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": phase},
        }

    foreign = [pod("a", "Running"), pod("b", "Succeeded"), pod("c", "Running", gpus="")]
    workers = [pod("d", "Pending", job="j"), pod("e", "Failed", job="j"), pod("", "Pending")]
    assert busy_nodes(workers, foreign) == {"a", "d"}


def test_node_marks_mark_and_unmark_in_one_pass() -> None:
    plan = Plan((), 1e9, 0.0, powered_down_nodes=("n2",))
    bodies = [marked("n1"), body("n2"), marked("n3")]
    marks = node_marks(bodies, PLANNED, plan, busy=(), since=SINCE)
    assert [(m.node, m.powered_down) for m in marks] == [("n1", False), ("n2", True), ("n3", False)]
    # Unmarks go out before the pass's pods are created, marks after everything else.
    actions = Actions(node_marks=marks)
    phases = [
        [args[0].node for verb, args in phase if verb == "node"] for phase in actions.writes()
    ]
    assert phases == [[], ["n1", "n3"], [], [], [], ["n2"]]


# -- against the emulator -------------------------------------------------------------------


def operator(kubeconfig: Path) -> Operator:
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0")
    return Operator(args, PackPolicy(), models)


def job(name: str) -> dict[str, Any]:
    return dljob(name, gpus={"requested": 4, "min": 4, "max": 4})


async def node_of(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    got: dict[str, Any] = (await api.get(f"{NODES}/{name}")).json()
    return got


def is_down(api: httpx.AsyncClient, name: str) -> Callable[[], Any]:
    async def check() -> bool:
        return is_marked(await node_of(api, name))

    check.__name__ = f"{name}_marked"
    return check


def is_up(api: httpx.AsyncClient, name: str) -> Callable[[], Any]:
    async def check() -> bool:
        got = await node_of(api, name)
        annotations = got["metadata"].get("annotations") or {}
        taints = got.get("spec", {}).get("taints") or []
        return KEY not in annotations and all(t.get("key") != TAINT["key"] for t in taints)

    check.__name__ = f"{name}_unmarked"
    return check


def node_patches(kmock: KubeEmulator, name: str | None = None) -> int:
    return sum(
        1
        for r in list(kmock)
        if r.method == verb.PATCH
        and r.resource is not None
        and r.resource.plural == "nodes"
        and (name is None or r.name == name)
    )


async def test_a_node_the_plan_powers_down_is_marked_and_unmarked_when_used_again(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    assert (await api.post(JOBS, json=job("a"))).status_code == 201
    async with operator(kubeconfig) as op:
        await eventually(is_down(api, "n2"))  # a on n1: n2 powered down
        assert not is_marked(await node_of(api, "n1"))
        got = await node_of(api, "n2")
        assert parse_time(got["metadata"]["annotations"][KEY]) is not None
        assert got["spec"]["taints"] == [TAINT]

        assert (await api.post(JOBS, json=job("b"))).status_code == 201
        await eventually(is_up(api, "n2"))  # used again: both marks gone
        assert "taints" not in (await node_of(api, "n2"))["spec"]

        assert (await api.delete(f"{JOBS}/b")).is_success
        await eventually(is_down(api, "n2"))  # no longer used: marked again
        assert not is_marked(await node_of(api, "n1"))
        assert op.error is None


async def test_powerflows_own_plan_powers_down_the_node_it_leaves_empty(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    # The product's policy and models (no test seam): one 4-GPU job on two 4-GPU nodes.
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0")
    assert (await api.post(JOBS, json=job("a"))).status_code == 201

    async def one_marked() -> bool:
        marks = [is_marked(await node_of(api, n)) for n in ("n1", "n2")]
        return sorted(marks) == [False, True]

    async with Operator(args):
        await eventually(one_marked)


async def test_a_node_where_a_foreign_pod_holds_a_gpu_is_never_marked(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    notebook = {
        "metadata": {"name": "notebook"},
        "spec": {
            "nodeName": "n2",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {contract.GPU_RESOURCE: "1"}}}
            ],
        },
    }
    pods = "/api/v1/namespaces/other/pods"
    assert (await api.post(pods, json=notebook)).status_code == 201
    running = {"status": {"phase": "Running"}}
    assert (await api.patch(f"{pods}/notebook/status", json=running, headers=MERGE)).is_success
    assert (await api.post(JOBS, json=job("a"))).status_code == 201
    async with operator(kubeconfig) as op:
        await poked_pass(api, op, "a")
        assert node_patches(kmock) == 0  # n2 left out of the plan, n1 used: nothing marked

        # The notebook ends: n2 is free, and powered down.
        done = {"status": {"phase": "Succeeded"}}
        assert (await api.patch(f"{pods}/notebook/status", json=done, headers=MERGE)).is_success
        await eventually(is_down(api, "n2"))

        # A foreign GPU pod arrives on the marked node: the node leaves the plan, unmarked.
        late = copy.deepcopy(notebook)
        late["metadata"]["name"] = "late"
        assert (await api.post(pods, json=late)).status_code == 201
        assert (await api.patch(f"{pods}/late/status", json=running, headers=MERGE)).is_success
        await eventually(is_up(api, "n2"))


async def test_other_taints_and_annotations_are_kept(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    own = {
        "metadata": {"annotations": {"team": "vision"}},
        "spec": {"taints": [GPU_TAINT, SPOT_TAINT]},
    }
    assert (await api.patch(f"{NODES}/n2", json=own, headers=MERGE)).is_success
    assert (await api.post(JOBS, json=job("a"))).status_code == 201
    async with operator(kubeconfig):
        await eventually(is_down(api, "n2"))
        got = await node_of(api, "n2")
        assert got["spec"]["taints"] == [GPU_TAINT, SPOT_TAINT, TAINT]
        assert got["metadata"]["annotations"]["team"] == "vision"
        assert got["spec"].get("unschedulable") is not True  # never cordoned

        assert (await api.post(JOBS, json=job("b"))).status_code == 201
        await eventually(is_up(api, "n2"))
        got = await node_of(api, "n2")
        assert got["spec"]["taints"] == [GPU_TAINT, SPOT_TAINT]
        assert got["metadata"]["annotations"] == {"team": "vision"}


async def test_a_restarted_operator_writes_no_node_again(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    assert (await api.post(JOBS, json=job("a"))).status_code == 201
    async with operator(kubeconfig):
        await eventually(is_down(api, "n2"))
        await eventually(is_up(api, "n1"))
    since = (await node_of(api, "n2"))["metadata"]["annotations"][KEY]
    before = node_patches(kmock)
    async with operator(kubeconfig) as second:
        await poked_pass(api, second, "a")
    assert node_patches(kmock) == before
    assert (await node_of(api, "n2"))["metadata"]["annotations"][KEY] == since


async def relabel(api: httpx.AsyncClient, product: str) -> None:
    patch = {"metadata": {"labels": {contract.GPU_PRODUCT_LABEL: product}}}
    for name in ("n1", "n2"):
        assert (await api.patch(f"{NODES}/{name}", json=patch, headers=MERGE)).is_success


async def test_a_node_of_unknown_gpu_type_is_never_marked_and_its_gpus_keep_their_defaults(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """The operator leaves a pool of unknown GPU type at its defaults (no clock, no cap),
    so it does not mark its empty nodes powered down either: the agent would park their
    idle GPUs at NVML's lowest clock and minimum power limit. n2's agent runs on
    simulated GPUs of a product the catalogue lacks. Labelled as A100s the pool is
    planned, n2 powered down, marked and parked; relabelled with the unknown product,
    n2's marks go and its GPUs are back at their defaults, and stay so pass after pass."""
    z900 = estimated_spec("NVIDIA Z900", tuple(range(300, 2101, 15)), 500.0)
    gpus = RecordingGpus(gpu=z900)
    lowest, floor = z900.clocks_mhz[0], z900.min_power_limit_w

    def parked() -> bool:
        return all(gpus.locked(i) == lowest and gpus.power_limit_w(i) == floor for i in range(4))

    def defaults() -> bool:
        return all(
            gpus.locked(i) is None and gpus.power_limit_w(i) == z900.max_power_w for i in range(4)
        )

    assert (await api.post(JOBS, json=job("a"))).status_code == 201  # on n1: n2 left empty
    agent = NodeAgent(agent_args(kubeconfig, "--node-name", "n2"), gpus)
    async with operator(kubeconfig) as op, agent:
        await eventually(is_down(api, "n2"))
        await agent_eventually(parked)
        await relabel(api, "NVIDIA-Z900")
        await eventually(is_up(api, "n2"))
        await agent_eventually(defaults)
        writes = len(gpus.calls)
        for _ in range(3):
            await poked_pass(api, op, "a")
        assert is_marked(await node_of(api, "n2")) is False
        assert defaults() and gpus.calls[writes:] == []
        assert op.controller is not None
        assert op.controller.metrics.registry.get_sample_value("powerflow_nodes_unknown_gpu") == 2


@pytest.fixture
async def kube(kmock: KubeEmulator) -> Any:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url)))
    yield Kube(client, None)
    client.close()


async def test_a_node_changed_meanwhile_is_read_again_and_nothing_is_lost(
    kmock: KubeEmulator, api: httpx.AsyncClient, kube: Kube
) -> None:
    seen = await node_of(api, "n2")
    plan = Plan((), 1e9, 0.0, powered_down_nodes=("n2",))
    (mark,) = node_marks([seen], (Node("n2", 4, A100),), plan, busy=(), since=SINCE)
    # Another controller taints the node after the pass read it.
    late = {"spec": {"taints": [SPOT_TAINT]}}
    assert (await api.patch(f"{NODES}/n2", json=late, headers=MERGE)).is_success
    before = node_patches(kmock, "n2")
    await asyncio.to_thread(kube._mark_node, mark)
    got = await node_of(api, "n2")
    assert got["spec"]["taints"] == [SPOT_TAINT, TAINT]
    assert got["metadata"]["annotations"][KEY] == SINCE
    assert node_patches(kmock, "n2") == before + 2  # refused (409), then recomputed


async def test_a_refused_node_patch_is_logged_once_and_stops_nothing(
    kmock: KubeEmulator,
    api: httpx.AsyncClient,
    kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kmock.refuse("patch", "nodes")  # no RBAC patch on nodes
    assert (await api.post(JOBS, json=job("a"))).status_code == 201
    caplog.set_level(logging.WARNING, logger="powerflow.operator.kube")
    async with operator(kubeconfig) as op:

        async def created() -> bool:
            params = {"labelSelector": f"{contract.JOB_LABEL}=a"}
            got = (await api.get("/api/v1/namespaces/ml/pods", params=params)).json()
            return len(got["items"]) == 4

        await eventually(created)  # the pass went on
        await poked_pass(api, op, "a")
    assert not is_marked(await node_of(api, "n2"))
    refusals = [r for r in caplog.records if "as powered down" in r.getMessage()]
    assert len(refusals) == 1 and "n2" in refusals[0].getMessage()
    assert "403" in refusals[0].getMessage()
