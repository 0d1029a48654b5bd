"""The allocator / job controller boundary: the allocator's output per job is its
``status.allocation``; the job controller (``job_controller.converge``) brings the
job's pods to it, and reads nothing else.

Pure tests of ``converge`` and ``read_allocation``, then ``reconcile`` passes against
``support.fake_cluster`` checking that the pods carry what the status says and
that a restarted operator, reading status and pods, rewrites no pod.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from powerflow.operator.allocation import JobAllocation, read_allocation, status_fields
from powerflow.operator.budget import parse_budget
from powerflow.operator.job_controller import Profiling, converge
from powerflow.operator.jobs import JobRequest, parse_dljob
from support.fake_cluster import FakeCluster

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.lab.synthetic import SyntheticModel

NODES = tuple(Node(f"n{i}", 4, A100) for i in (1, 2))
BUDGET = parse_budget({"powerLimitWatts": "5000"})
NOW_S = 1000.0
SMALL = replace(
    A100,
    name="A100-low",
    clocks_mhz=tuple(range(210, 1011, 15)),
    default_clock_mhz=1005,
    f0_mhz=900,
)
"""A second GPU type: its sweep has other clocks."""


def dljob(name: str = "a", gpus: int = 4) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1},
        "spec": {
            "globalBatchSize": 64,
            "iterations": 1000,
            "gpus": {"requested": gpus, "min": 1, "max": gpus},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


def request() -> JobRequest:
    return parse_dljob(dljob())  # type: ignore[arg-type]


def allocation(**fields: Any) -> JobAllocation:
    """A new generation's allocation as the status holds it, read back."""
    cap = fields.pop("power_cap_w", 250.0)
    wire = status_fields(JobAllocation(2, 2, 32, 1005, cap, (("n1", 2), ("n1", 3))))
    wire.update(fields)
    return read_allocation(json.loads(json.dumps(wire)))


def annotations(pod: Any) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def running(pods: Any, node: str = "n1") -> list[Any]:
    """The created pods as the API server and kubelet return them: bound, running."""
    out = copy.deepcopy(list(pods))
    for pod in out:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return out


def test_converge_creates_a_generation_from_its_status_alone() -> None:
    alloc = allocation()
    writes = converge(request(), alloc, [], NOW_S)
    pods = [b for b in writes.create if b["kind"] == "Pod"]
    assert [b["kind"] for b in writes.create].count("Service") == 1
    assert [p["metadata"]["name"] for p in pods] == ["a-g2-w0", "a-g2-w1"]
    for pod in pods:
        notes = annotations(pod)
        assert notes[contract.FREQUENCY_ANNOTATION] == "1005"
        assert notes[contract.POWER_LIMIT_ANNOTATION] == "250.0"
        assert notes[contract.GENERATION_ANNOTATION] == "2"
        assert json.loads(notes[contract.PLANNED_BLOCK_ANNOTATION]) == {
            "block": [["n1", 2], ["n1", 3]]
        }
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert (env["POWERFLOW_FREQUENCY_MHZ"], env["LOCAL_BATCH_SIZE"]) == ("1005", "32")
    assert writes.annotate == ()
    # Once they exist, the same status asks for nothing.
    again = converge(request(), alloc, running(pods), NOW_S)
    assert (again.create, again.annotate) == ((), ())


def test_converge_creates_only_the_missing_workers_of_an_unfinished_gang() -> None:
    alloc = allocation()
    pods = [b for b in converge(request(), alloc, [], NOW_S).create if b["kind"] == "Pod"]
    writes = converge(request(), alloc, running(pods[:1]), NOW_S)
    assert [b["metadata"]["name"] for b in writes.create] == ["a", "a-g2-w1"]


def test_converge_writes_the_status_values_where_the_pods_differ() -> None:
    alloc = allocation()
    pods = running(b for b in converge(request(), alloc, [], NOW_S).create if b["kind"] == "Pod")
    edited = pods[1]["metadata"]["annotations"]
    edited[contract.FREQUENCY_ANNOTATION] = "1410"  # someone edited it: status stands
    edited[contract.PROFILE_ANNOTATION] = "{}"  # a stale sweep
    writes = converge(request(), alloc, pods, NOW_S)
    assert writes.create == ()
    assert [(p["metadata"]["name"], patch) for p, patch in writes.annotate] == [
        ("a-g2-w1", {contract.FREQUENCY_ANNOTATION: "1005"}),
        ("a-g2-w1", {contract.PROFILE_ANNOTATION: None}),
    ]
    # A new clock and no cap in status: every pod follows.
    lower = allocation(frequencyMHz=900, power_cap_w=None)
    writes = converge(request(), lower, pods[:1], NOW_S)
    assert [patch for _, patch in writes.annotate] == [
        {contract.POWER_LIMIT_ANNOTATION: None},
        {contract.FREQUENCY_ANNOTATION: "900"},
    ]


def test_a_stopped_or_empty_allocation_asks_for_no_pod() -> None:
    pods = running(b for b in converge(request(), allocation(), [], NOW_S).create)
    pods = [p for p in pods if p["kind"] == "Pod"]
    for alloc in (allocation(stopped=True), allocation(gpus=0), read_allocation(None)):
        writes = converge(request(), alloc, pods[:1], NOW_S)
        assert (writes.create, writes.annotate) == ((), ())


def test_the_sweep_plan_follows_the_status_window() -> None:
    until = NOW_S + 60
    alloc = allocation(profilingUntil="1970-01-01T00:17:40.000Z")  # NOW_S + 60
    assert alloc.profiling_until_s == until
    profiling = Profiling(240.0, PAPER_SWEEP, {"n2": SMALL}, A100)
    pods = [b for b in converge(request(), alloc, [], NOW_S).create if b["kind"] == "Pod"]
    pods = running(pods[:1], "n1") + running(pods[1:], "n2")
    writes = converge(request(), alloc, pods, NOW_S, profiling)
    plans = {p["metadata"]["name"]: json.loads(str(patch[contract.PROFILE_ANNOTATION]))
             for p, patch in writes.annotate}  # fmt: skip
    assert plans["a-g2-w0"]["clocksMhz"] == list(PAPER_SWEEP.clocks_mhz(A100))
    assert plans["a-g2-w1"]["clocksMhz"] == list(PAPER_SWEEP.clocks_mhz(SMALL))
    assert {p["untilS"] for p in plans.values()} == {until}
    # The window over (the status says so by the clock), the plans go.
    for pod, patch in writes.annotate:
        pod["metadata"]["annotations"].update(patch)
    done = converge(request(), alloc, pods, until, profiling)
    assert [patch for _, patch in done.annotate] == [{contract.PROFILE_ANNOTATION: None}] * 2


def test_read_allocation_reads_junk_as_absent_and_round_trips() -> None:
    junk = {
        "gpus": "four", "frequencyMHz": True, "localBatchSize": -4, "generation": 10**400,
        "powerCapWatts": float("nan"), "block": [["n1", 1]], "profilingUntil": 1e400,
        "complete": "yes", "stopped": 1,
    }  # fmt: skip
    assert read_allocation(junk) == JobAllocation()
    assert read_allocation([1]) == JobAllocation()
    sent = JobAllocation(3, 4, 16, 1200, None, (("n1", 0), ("n2", 1)))
    wire = status_fields(sent)
    assert wire["frequencyMHz"] == 1200 and wire["powerCapWatts"] is None
    assert read_allocation(json.loads(json.dumps(wire))) == sent
    assert read_allocation({**wire, "powerCapWatts": 212.3}).power_cap_w == 212.3


class ClockPolicy:
    """Every job on 4 GPUs at ``frequency_mhz``, capped at ``cap_w``."""

    def __init__(self) -> None:
        self.frequency_mhz = 1410
        self.cap_w: float | None = None

    def plan(self, snapshot: Snapshot) -> Plan:
        plans, free = [], [(n.name, i) for n in snapshot.nodes for i in range(n.gpus)]
        for job in snapshot.jobs:
            block, free = tuple(free[:4]), free[4:]
            plans.append(JobPlan(job.id, 4, self.frequency_mhz, 16, block, power_cap_w=self.cap_w))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=1.0)


def settle(cluster: FakeCluster, policy: ClockPolicy) -> None:
    for _ in range(8):
        before = copy.deepcopy((cluster.jobs, cluster.pods))
        one_pass(cluster, policy)
        cluster.settle()
        if (cluster.jobs, cluster.pods) == before:
            return
    raise AssertionError("the cluster did not settle")


def one_pass(cluster: FakeCluster, policy: ClockPolicy, limit: int | None = None) -> Any:
    actions, _ = cluster.one_pass(
        limit, budget=BUDGET, policy=policy, models=lambda job: SyntheticModel()
    )
    return actions


def assert_pods_follow_status(cluster: FakeCluster) -> None:
    """Every job's live pods carry its status allocation, and converge asks for nothing."""
    for name, job in cluster.jobs.items():
        alloc = read_allocation(job["status"]["allocation"])
        pods = [
            p for p in cluster.pods.values()
            if p["metadata"]["labels"][contract.JOB_LABEL] == name
            and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        assert len(pods) == alloc.gpus > 0
        for pod in pods:
            notes = annotations(pod)
            assert notes[contract.FREQUENCY_ANNOTATION] == str(alloc.frequency_mhz)
            assert notes.get(contract.POWER_LIMIT_ANNOTATION) == (
                None if alloc.power_cap_w is None else f"{alloc.power_cap_w:.1f}"
            )
        req = parse_dljob(job)
        writes = converge(req, alloc, pods, cluster.now_s)
        assert (writes.create, writes.annotate) == ((), ()), name


def test_the_pods_carry_the_clock_and_cap_their_status_holds() -> None:
    cluster, policy = FakeCluster(NODES), ClockPolicy()
    cluster.submit(dljob("a"))
    cluster.submit(dljob("b"))
    settle(cluster, policy)
    assert cluster.jobs["a"]["status"]["allocation"]["block"] == [
        {"node": "n1", "gpu": i} for i in range(4)
    ]
    assert_pods_follow_status(cluster)
    policy.frequency_mhz, policy.cap_w = 1005, 212.37
    settle(cluster, policy)
    assert cluster.jobs["a"]["status"]["allocation"]["frequencyMHz"] == 1005
    assert cluster.jobs["a"]["status"]["allocation"]["powerCapWatts"] == 212.3
    assert_pods_follow_status(cluster)
    assert max(cluster.created.values()) == 1  # a clock or a cap is no restart


def test_a_pass_that_died_after_the_pods_took_the_new_clock_rewrites_no_pod() -> None:
    cluster, policy = FakeCluster(NODES), ClockPolicy()
    cluster.submit(dljob("a"))
    settle(cluster, policy)
    policy.frequency_mhz = 1005  # a lower clock: the pods' patches go before the status
    actions = one_pass(cluster, policy, limit=0)
    flat = [verb for phase in actions.writes() for verb, _ in phase]
    assert flat == ["annotate"] * 4 + ["status"]
    cluster.apply(actions, limit=4)  # the operator dies before its status write
    assert cluster.jobs["a"]["status"]["allocation"]["frequencyMHz"] == 1410
    # The restarted operator records the clock; the pods already carry it.
    again = one_pass(cluster, policy)
    verbs = [verb for phase in again.writes() for verb, _ in phase]
    assert verbs == ["status"]
    assert cluster.jobs["a"]["status"]["allocation"]["frequencyMHz"] == 1005
    assert_pods_follow_status(cluster)
