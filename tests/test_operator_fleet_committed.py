"""A gang created in one pool of a mixed cluster and not bound yet stays planned in that
pool (pure, one pass: ``reconcile`` with the operator's own policy over both pools).

Its workers carry the node affinity of their planned block's GPU type
(``workers.pool_affinity``), so they can only ever run on that type; until they are
bound the job has no known GPUs, and a plan that read it as waiting could start it in
the other pool. The operator keeps the generation (its shape unchanged, nothing to
migrate) and records the plan's clock: a clock of the other type, which the workers'
node agent would be asked to lock on GPUs of this one, with the budget counted at the
other type's watts. ``Job.committed_gpu`` keeps such a job in its type's pools: the type
of the nodes its workers are bound to, else of their node affinity (never of an
annotation, which a tenant may rewrite).
"""

from __future__ import annotations

from typing import Any

from powerflow.operator.actions import Observed
from powerflow.operator.allocation import CLOCK_FIELD
from powerflow.operator.budget import parse_budget
from powerflow.operator.controller import default_policy, fleet_of
from powerflow.operator.jobs import JobRequest, parse_dljob
from powerflow.operator.pass_snapshot import TypedModels
from powerflow.operator.reconcile import reconcile
from powerflow.operator.workers import WorkerSet, worker_pods
from support.operator_pass import dljob_body, pass_inputs
from support.plan_recorder import Recorder

from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.snapshot import Node, Plan

H100 = GPU_SPECS["H100-SXM"]
NODES = (
    *(Node(f"a{i}", 8, A100) for i in range(2)),
    Node("h0", 8, H100),
)
A100_MODEL = FittedModel(load_prior("resnet50"))
H100_MODEL = FittedModel.on(prior_on(load_prior("resnet50"), H100), H100)
BATCH, GPUS = 256, 4


def body(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return dljob_body(name, status, gpus=GPUS, batch=BATCH)


LABELS = {
    "a0": "NVIDIA-A100-SXM4-40GB",
    "a1": "NVIDIA-A100-SXM4-40GB",
    "h0": "NVIDIA-H100-80GB-HBM3",
}
"""Each node's ``nvidia.com/gpu.product`` label, as the pass is given them with several
pools (``PassSettings.pool_labels``)."""


def unbound_gang(
    name: str, gpu: GpuSpec, block_node: str, bound_node: str, bound: int, pinned: str | None
) -> Observed:
    """A job whose generation 1 the operator created on ``block_node``'s block at ``gpu``'s
    top clock, every worker created (the generation complete), ``bound`` of them bound to
    ``bound_node`` by the extender (no placement annotation on any: the job's GPUs are not
    known), each with a required node affinity on product label ``pinned`` (None: none)."""
    status = {
        "phase": "Running",
        "allocation": {
            "gpus": GPUS,
            "frequencyMHz": gpu.max_clock_mhz,
            "localBatchSize": BATCH // GPUS,
            "generation": 1,
            "complete": True,
        },
        "progress": {"iterations": 0},
    }
    req = parse_dljob(body(name, status))
    block = tuple((block_node, i) for i in range(GPUS))
    ws = WorkerSet(1, GPUS, BATCH // GPUS, gpu.max_clock_mhz, planned=block, pool_product=pinned)
    pods = []
    for i, pod in enumerate(worker_pods(req, ws)):
        spec = {**pod["spec"], "nodeName": bound_node} if i < bound else pod["spec"]
        pods.append({**pod, "spec": spec, "status": {"phase": "Pending"}})
    return Observed(body(name, status), tuple(pods))


def main_model(_req: JobRequest) -> PerfModel:
    return A100_MODEL


def model_on(_req: JobRequest, gpu: GpuSpec) -> PerfModel:
    assert gpu == H100
    return H100_MODEL


def one_pass(observed: Observed) -> tuple[Plan, dict[str, Any]]:
    policy = Recorder(fleet_of(default_policy()))
    actions = reconcile(
        [observed],
        NODES,
        parse_budget({"eta": "1"}),
        1000.0,
        policy,
        TypedModels(main_model, model_on),
        **pass_inputs(profiling_window_s=0.0, pool_labels=LABELS),
    )
    assert policy.plans
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    return policy.plans[-1], patches


def test_a_waiting_job_of_the_same_shape_starts_on_the_a100s() -> None:
    """The premise: the policy ranks the A100 pool first for this job (the H100's
    carried prior is as fast at the same fraction of its top clock, for more watts), so
    read as waiting the job would leave the H100 pool."""
    status = {"phase": "Pending"}
    plan, _ = one_pass(Observed(body("new", status), ()))
    assert {node for node, _ in plan.job("ml/new").placement} <= {"a0", "a1"}


def test_an_unbound_gang_on_the_h100_stays_planned_there_at_an_h100_clock() -> None:
    h100 = LABELS["h0"]
    cases = {
        "none bound, pinned by its affinity": ("h0", "h0", 0, h100),
        "half bound": ("h0", "h0", 2, h100),
        "half bound, no affinity (created with one pool planned)": ("h0", "h0", 2, None),
        "its planned-block annotation rewritten to an A100": ("a1", "h0", 0, h100),
    }
    for case, (block_node, bound_node, bound, pinned) in cases.items():
        gang = unbound_gang("late", H100, block_node, bound_node, bound, pinned)
        plan, patches = one_pass(gang)
        planned = plan.job("ml/late")
        assert planned.gpus == GPUS, case
        assert {node for node, _ in planned.placement} == {"h0"}, case
        # The status keeps the generation's clock unless the plan changed it.
        recorded = (patches.get("late") or {}).get("allocation") or {}
        clock = recorded.get(CLOCK_FIELD, H100.max_clock_mhz)
        assert clock == planned.frequency_mhz and clock in H100.clocks_mhz, case


def test_an_unbound_gang_on_the_a100s_stays_planned_there() -> None:
    """The control: the A100 pool is the job's first choice anyway."""
    gang = unbound_gang("early", A100, "a1", "a1", 0, LABELS["a1"])
    plan, _ = one_pass(gang)
    assert {node for node, _ in plan.job("ml/early").placement} <= {"a0", "a1"}
