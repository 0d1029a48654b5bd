"""The operator's pure functions: DLJob -> job, budget, nodes, pods, status, one pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from powerflow.operator.actions import Observed
from powerflow.operator.budget import budget_warnings, parse_budget
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.nodes import cluster_nodes, gpu_of, parse_node
from powerflow.operator.reconcile import reconcile
from powerflow.operator.status import merge_diff, set_condition
from powerflow.operator.workers import WorkerSet, worker_pod
from support.operator_pass import pass_inputs

from powerflow.core import contract
from powerflow.core.errors import ResourceError
from powerflow.core.gpus import A100, UNKNOWN_GPU
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Node
from powerflow.lab.synthetic import SyntheticModel


def body(**spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 100,
            "gpus": {"requested": 4, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    out["spec"].update(spec)
    return out


def test_parse_applies_defaults() -> None:
    job = parse_dljob(body())
    assert (job.min_gpus, job.max_gpus, job.trainer) == (1, 8, "trainer")
    assert (job.master_port, job.grace_s, job.restart_limit) == (29500, 60, 3)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"gpus": {"requested": 4, "min": 8, "max": 8}}, "InvalidGPURange"),
        ({"gpus": {"requested": 3, "min": 3, "max": 3}}, "InvalidGPURange"),
        ({"globalBatchSize": 100}, "BatchNotDivisible"),
        ({"maxLocalBatchSize": 16}, "BatchTooLarge"),
        ({"template": {"spec": {"containers": []}}}, "NoTrainerContainer"),
        ({"trainerContainer": "main"}, "NoTrainerContainer"),
        ({"iterations": "many"}, "InvalidField"),
    ],
)
def test_parse_refuses_with_reason(spec: dict[str, Any], reason: str) -> None:
    with pytest.raises(ResourceError) as exc:
        parse_dljob(body(**spec))
    assert exc.value.reason == reason


def test_parse_refuses_long_names() -> None:
    bad = body()
    bad["metadata"]["name"] = "x" * 60
    with pytest.raises(ResourceError, match="DNS-1035"):
        parse_dljob(bad)


def test_budget() -> None:
    cfg = parse_budget({"eta": "0.5", "pMaxWatts": "300", "schedulingIntervalSeconds": "30"})
    assert (cfg.budget.eta, cfg.budget.p_max_w, cfg.interval_s) == (0.5, 300.0, 30.0)
    assert parse_budget({"powerLimitWatts": "9000"}).budget.limit_w == 9000.0
    for bad in ({}, {"eta": "2"}, {"eta": "x"}, {"powerLimitWatts": "-1"}, {"etta": "0.5"}):
        with pytest.raises(ResourceError):
            parse_budget(bad)


def test_budget_schedule_in_the_configmap() -> None:
    """The plain keys outside the windows; ``at`` is the plain budget in force, which is
    what a pass plans against; a bad window is an InvalidBudget naming it."""
    cfg = parse_budget(
        {
            "eta": "0.7",
            "timezone": "UTC",
            "schedule": '- {start: "08:00", end: "20:00", powerLimitWatts: 300}',
        }
    )
    assert cfg.budget.eta == 0.7 and cfg.schedule is not None
    assert cfg.at(8 * 3600.0).budget.limit_w == 300.0
    assert cfg.at(8 * 3600.0).schedule is None
    assert cfg.at(20 * 3600.0).budget.eta == 0.7
    assert cfg.next_edge_s(9 * 3600.0) == 20 * 3600.0
    assert parse_budget({"eta": "0.7"}).next_edge_s(0.0) is None
    bad = {"eta": "0.7", "schedule": '[{start: "08:00", end: "20:00", eta: 3}]'}
    with pytest.raises(ResourceError, match=r"window 1 \(08:00-20:00\): eta 3") as caught:
        parse_budget(bad)
    assert caught.value.reason == "InvalidBudget"
    zero = parse_budget({"eta": "0.7", "schedule": '[{start: "08:00", end: "20:00", eta: 0}]'})
    assert budget_warnings(zero) == [
        (
            "BudgetStopsAllJobs",
            "schedule window 08:00-20:00: eta is 0: every job is stopped until it is raised",
        )
    ]


def node(name: str, gpus: str, product: str | None = "NVIDIA-A100-SXM4-40GB", **extra: Any) -> Any:
    labels = {contract.GPU_PRODUCT_LABEL: product} if product else {}
    out: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {contract.GPU_RESOURCE: gpus}},
    }
    out.update(extra)
    return out


def test_nodes() -> None:
    assert parse_node(node("a", "8")) == Node("a", 8, A100)
    assert parse_node(node("b", "0")) is None
    assert parse_node(node("c", "8", spec={"unschedulable": True})) is None
    assert gpu_of("Tesla-T4-Unknown").name == gpu_of(None).name == UNKNOWN_GPU
    kept, left = cluster_nodes([node("a", "8"), node("b", "8"), node("c", "4")])
    assert [n.name for n in kept] == ["a", "b"] and left == ("c",)


def test_worker_pod_contract() -> None:
    job = parse_dljob(body())
    pod = worker_pod(job, WorkerSet(3, 4, 64, 1200), 2)
    meta = pod["metadata"]
    assert meta["name"] == "job-g3-w2"
    assert meta["annotations"][contract.GENERATION_ANNOTATION] == "3"
    assert meta["ownerReferences"][0]["uid"] == "u1"
    entries = pod["spec"]["containers"][0]["env"]
    env = {e["name"]: e["value"] for e in entries if "value" in e}
    assert env["MASTER_ADDR"] == "job-g3-w0.job.ml.svc"
    # what the worker library needs (powerflow.worker.env): the pod's identity and
    # the node's IP from the downward API, the agent's port, the grace period
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in entries if "valueFrom" in e
    }
    assert fields == {
        "POWERFLOW_POD_NAME": "metadata.name",
        "POWERFLOW_POD_NAMESPACE": "metadata.namespace",
        "POWERFLOW_POD_UID": "metadata.uid",
        "POWERFLOW_AGENT_HOST": "status.hostIP",
    }
    assert env["POWERFLOW_AGENT_PORT"] == str(contract.AGENT_WORKER_PORT)
    assert env["POWERFLOW_GRACE_SECONDS"] == str(job.grace_s)
    assert contract.MODEL_ANNOTATION not in meta["annotations"]  # no model hint
    hinted = parse_dljob({**body(), "spec": {**body()["spec"], "model": "bert"}})
    hinted_pod = worker_pod(hinted, WorkerSet(3, 4, 64, 1200), 0)
    assert hinted_pod["metadata"]["annotations"][contract.MODEL_ANNOTATION] == "bert"
    assert (env["RANK"], env["WORLD_SIZE"], env["POWERFLOW_FREQUENCY_MHZ"]) == ("2", "4", "1200")
    assert job.template["spec"]["containers"][0].get("env") is None  # template untouched


def test_status_diff_and_conditions() -> None:
    old = {"phase": "Running", "progress": {"iterations": 5, "throughput": 1.0}}
    new = {"phase": "Running", "progress": {"iterations": 6, "throughput": 1.0}}
    assert merge_diff(old, new) == {"progress": {"iterations": 6}}
    assert merge_diff(old, copy.deepcopy(old)) == {}
    # against nothing (a new job's status): everything but the deletions, nested ones kept
    fresh = {"phase": "Pending", "gone": None, "allocation": {"gpus": 2, "stopped": None}}
    want = {"phase": "Pending", "allocation": {"gpus": 2, "stopped": None}}
    assert merge_diff({}, fresh) == merge_diff(None, fresh) == want
    assert merge_diff({"x": 1}, fresh) == want  # the same through the general loop
    first = set_condition(None, "Valid", True, "Ok", "", "t1")
    same = set_condition(first, "Valid", True, "Ok", "", "t2")
    flipped = set_condition(same, "Valid", False, "Bad", "m", "t3")
    assert same[0]["lastTransitionTime"] == "t1" and flipped[0]["lastTransitionTime"] == "t3"


def test_one_pass_with_the_real_policy() -> None:
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    observed = [Observed(body()), Observed(body(**{"gpus": {"requested": 2}}))]
    observed[1].body["metadata"].update(name="two", uid="u2")
    actions = reconcile(
        observed,
        nodes,
        parse_budget({"eta": "0.8"}),
        1000.0,
        PowerFlowPolicy(),
        lambda job: SyntheticModel(),
    )
    assert actions.plan is not None
    pods = [b for b in actions.create if b["kind"] == "Pod"]
    for jp in actions.plan.jobs:
        name = jp.job_id.split("/")[1]
        mine = [p for p in pods if p["metadata"]["labels"][contract.JOB_LABEL] == name]
        assert len(mine) == jp.gpus
        for pod in mine:
            annotations = pod["metadata"]["annotations"]
            assert annotations[contract.FREQUENCY_ANNOTATION] == str(jp.frequency_mhz)
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    # A job on a GPU count it never ran on starts by profiling it.
    assert patches["job"]["phase"] in ("Profiling", "Pending")
    assert actions.allocated_gpus == sum(jp.gpus for jp in actions.plan.jobs) > 0


def _running(phase: str) -> tuple[list[Observed], int]:
    """``body()`` after its first pass was carried out: status written, workers created
    in ``phase``; and its generation."""
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    first = reconcile(
        [Observed(body())], nodes, parse_budget({"eta": "0.8"}), 1000.0, PowerFlowPolicy(),
        lambda job: SyntheticModel(), **pass_inputs(profiling_window_s=0.0),
    )  # fmt: skip
    status: dict[str, Any] = {}
    for _, _, patch in first.status_first + first.status:
        status.update(patch)
    pods = [
        dict(b, status={"phase": phase}) for b in first.create if b["kind"] == "Pod"
    ]  # fmt: skip
    job = dict(body(), status=status)
    return [Observed(job, tuple(pods))], int(status["allocation"]["generation"])


def _after_count(phase: str, count: int, reached_s: float | None, now_s: float) -> Any:
    observed, generation = _running(phase)
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    return reconcile(
        observed, nodes, parse_budget({"eta": "0.8"}), now_s, PowerFlowPolicy(),
        lambda job: SyntheticModel(),
        **pass_inputs(
            profiling_window_s=0.0, agent_progress={"ml/job": (generation, count, reached_s)}
        ),
    )  # fmt: skip


def _phase(actions: Any) -> str | None:
    patches = [p for _, name, p in actions.status_first + actions.status if name == "job"]
    return next((p["phase"] for p in reversed(patches) if "phase" in p), None)


def test_the_agents_count_ends_a_job_after_its_workers_grace_while_they_run() -> None:
    """The count reaches the job's 100 iterations while its workers still run (a final
    save, an evaluation): the job ends the workers' grace period (60 s by default)
    later, not at once; workers that no longer run, or one that exited, end it at once;
    a count short of it never does."""
    early = _after_count("Running", 100, reached_s=2000.0, now_s=2010.0)
    assert _phase(early) != "Succeeded" and not early.delete_pods
    assert early.wake_at_s == 2060.0
    late = _after_count("Running", 100, reached_s=2000.0, now_s=2060.0)
    assert _phase(late) == "Succeeded"
    exited = _after_count("Pending", 100, reached_s=2000.0, now_s=2001.0)
    assert _phase(exited) == "Succeeded"
    observed, generation = _running("Running")  # one rank exited, the others leave
    first, *rest = observed[0].pods
    pods = (dict(first, status={"phase": "Succeeded"}), *rest)
    one_left = reconcile(
        [Observed(observed[0].body, pods)], tuple(Node(f"n{i}", 8, A100) for i in range(2)),
        parse_budget({"eta": "0.8"}), 2001.0, PowerFlowPolicy(), lambda job: SyntheticModel(),
        **pass_inputs(profiling_window_s=0.0, agent_progress={"ml/job": (generation, 100, 2000.0)}),
    )  # fmt: skip
    assert _phase(one_left) == "Succeeded"
    short = _after_count("Running", 99, reached_s=None, now_s=9000.0)
    assert _phase(short) != "Succeeded"
