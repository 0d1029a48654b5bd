"""Progress and energy of jobs in a cluster of two pools, one pass (pure, no cluster):
each job is accounted with its own pool's GPUs per node and its model on that pool's
GPU type (``reconcile._by_pool``, ``pass_progress``, ``progress``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from powerflow.operator.actions import Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import JobRequest, parse_dljob
from powerflow.operator.pass_snapshot import TypedModels
from powerflow.operator.reconcile import reconcile
from powerflow.operator.workers import WorkerSet, worker_pods
from support.operator_pass import dljob_body, pass_inputs

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot

H100 = GPU_SPECS["H100-SXM"]
# The main pool: three 8-GPU A100 nodes; beside it two 4-GPU H100 nodes.
NODES = (
    *(Node(f"a{i}", 8, A100) for i in range(3)),
    Node("h0", 4, H100),
    Node("h1", 4, H100),
)
A100_MODEL = FittedModel(load_prior("resnet50"))
H100_MODEL = FittedModel.on(prior_on(load_prior("resnet50"), H100), H100)
CLOCK = {"A100": 1410, "H100-SXM": 1980}
BATCH = 256


def body(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return dljob_body(name, status, gpus=8, batch=BATCH)


def gang(name: str, nodes: tuple[str, ...], per_node: int, gpu: GpuSpec) -> Observed:
    """A running 8-GPU job whose workers the extender bound ``per_node`` to each of
    ``nodes``, at ``gpu``'s planned clock, its status as the operator left it."""
    status = {
        "phase": "Running",
        "allocation": {
            "gpus": 8,
            "frequencyMHz": CLOCK[gpu.name],
            "localBatchSize": BATCH // 8,
            "generation": 1,
            "complete": True,
        },
        "progress": {"iterations": 0},
        "energy": {"joules": 0.0},
    }
    req = parse_dljob(body(name, status))
    pods = []
    for i, pod in enumerate(worker_pods(req, WorkerSet(1, 8, BATCH // 8, CLOCK[gpu.name]))):
        node = nodes[i // per_node]
        block = [[node, j] for j in range(per_node)]
        placement = json.dumps({"node": node, "block": block})
        annotations = {**pod["metadata"]["annotations"], contract.PLACEMENT_ANNOTATION: placement}
        pods.append(
            {
                **pod,
                "metadata": {**pod["metadata"], "annotations": annotations},
                "spec": {**pod["spec"], "nodeName": node},
                "status": {"phase": "Running"},
            }
        )
    return Observed(body(name, status), tuple(pods))


class Keep:
    """Every job keeps its GPUs, at its type's clock."""

    def plan(self, snapshot: Snapshot) -> Plan:
        types = {n.name: n.gpu.name for n in snapshot.nodes}
        jobs = []
        for job in snapshot.jobs:
            clock = CLOCK[types[job.placement[0][0]]]
            jobs.append(JobPlan(job.id, 8, clock, BATCH // 8, job.placement))
        return Plan(tuple(jobs), limit_w=1e9, predicted_w=0.0)


def main_model(_req: JobRequest) -> PerfModel:
    return A100_MODEL


def model_on(_req: JobRequest, gpu: GpuSpec) -> PerfModel:
    assert gpu == H100
    return H100_MODEL


def test_each_pool_accounts_its_jobs_with_its_node_size_and_its_types_model() -> None:
    """A job on the two 4-GPU H100 nodes is accounted with the H100 model at 4 GPUs per
    node and the H100's clock; a job on one 8-GPU A100 node with the A100 model at 8 per
    node. 30 s after the anchors, each job's iterations are the whole step times its own
    model fits in them, and its watts its energy per iteration over its step time."""
    observed = [
        gang("on-h100", ("h0", "h1"), 4, H100),
        gang("on-a100", ("a0",), 8, A100),
    ]
    now = 1000.0
    anchors = {"ml/on-h100": now - 30.0, "ml/on-a100": now - 30.0}
    actions = reconcile(
        observed,
        NODES,
        parse_budget({"eta": "1"}),
        now,
        Keep(),
        TypedModels(main_model, model_on),
        **pass_inputs(anchors=anchors, profiling_window_s=0.0),
    )
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    expected = {
        "on-h100": (H100_MODEL, 4, CLOCK["H100-SXM"]),
        "on-a100": (A100_MODEL, 8, CLOCK["A100"]),
    }
    for name, (model, per_node, clock) in expected.items():
        t = float(model.step_time_s(8, per_node, BATCH // 8, clock))
        e = float(model.energy_per_iter_j(8, per_node, BATCH // 8, clock))
        patch = patches[name]
        assert patch["progress"]["iterations"] == int(30.0 // t), name
        assert patch["progress"]["throughput"] == pytest.approx(1 / t, rel=1e-5), name
        assert patch["energy"]["watts"] == pytest.approx(e / t, abs=1e-3), name
        assert patch["energy"]["joules"] == pytest.approx(int(30.0 // t) * e, abs=1e-3), name

    # The H100 job's figures are neither the A100 model's (the same step time at the
    # A100's top clock, by the prior's carry-over, but not the same energy) nor those
    # of 8 GPUs per node.
    def figures(model: PerfModel, per_node: int, clock: int) -> tuple[float, float]:
        t = float(model.step_time_s(8, per_node, BATCH // 8, clock))
        return t, float(model.energy_per_iter_j(8, per_node, BATCH // 8, clock))

    h100 = figures(H100_MODEL, 4, 1980)
    for other in (figures(A100_MODEL, 4, 1410), figures(H100_MODEL, 8, 1980)):
        assert max(abs(o / h - 1) for o, h in zip(other, h100, strict=True)) > 0.03
