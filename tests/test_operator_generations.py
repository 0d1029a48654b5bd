"""Generations of workers, pure: crashes between writes, lost and stuck workers, migrations.

Each test runs ``reconcile`` passes against ``support.fake_cluster`` (the API
server's effects, the extender's block choice and the kubelet, in memory).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from powerflow.extender.objects import parse_block
from powerflow.operator.budget import BudgetConfig, parse_budget
from powerflow.operator.carry_out import ROOM_WAIT_S
from powerflow.operator.lifecycle import STUCK_TERMINATION_S
from support.fake_cluster import FakeCluster

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.timefmt import format_time, parse_time
from powerflow.lab.synthetic import SyntheticModel

NODES = tuple(Node(f"n{i}", 4, A100) for i in (1, 2))
GENEROUS = parse_budget({"powerLimitWatts": "5000"})
TIGHT = parse_budget({"powerLimitWatts": "500"})


class ThresholdPolicy:
    """Requested GPUs (first come) when the limit is at least 1 kW, else min GPUs."""

    def plan(self, snapshot: Snapshot) -> Plan:
        limit = snapshot.budget.limit_w
        generous = limit is None or limit >= 1000
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in snapshot.jobs:
            want = job.requested_gpus if generous else job.min_gpus
            n = want if want <= free else 0
            free -= n
            plans.append(JobPlan(job.id, n, 1410 if generous else 1005, -(-64 // n) if n else 0))
        return Plan(tuple(plans), limit_w=limit or 1e9, predicted_w=1.0)


def dljob(name: str, uid: str, requested: int = 4, low: int = 2, high: int = 4) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "generation": 1},
        "spec": {
            "globalBatchSize": 64,
            "iterations": 1000,
            "gpus": {"requested": requested, "min": low, "max": high},
            "restart": {"limit": 3, "backoffSeconds": 0},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


def one_pass(
    cluster: FakeCluster, budget: BudgetConfig, limit: int | None = None, policy: Any = None
) -> int:
    _, n = cluster.one_pass(
        limit,
        budget=budget,
        policy=policy or ThresholdPolicy(),
        models=lambda job: SyntheticModel(),
    )
    return n


def settle(cluster: FakeCluster, budget: BudgetConfig, policy: Any = None) -> None:
    """Passes, with the kubelet and extender acting between them, until nothing changes."""
    for _ in range(12):
        before = copy.deepcopy((cluster.jobs, cluster.pods))
        one_pass(cluster, budget, policy=policy)
        cluster.settle()
        if (cluster.jobs, cluster.pods) == before:
            return
    raise AssertionError("the cluster did not settle")


# The scenario: each step is an outside event; the operator then passes until settled.
def _submit(c: FakeCluster) -> BudgetConfig:
    c.submit(dljob("a", "ua"))
    c.submit(dljob("b", "ub"))
    return GENEROUS


def _tighten(c: FakeCluster) -> BudgetConfig:
    return TIGHT  # both jobs rescale from 4 to 2 GPUs


def _fail_a(c: FakeCluster) -> BudgetConfig:
    c.pods["a-g2-w1"]["status"] = {"phase": "Failed", "reason": "Evicted"}
    return TIGHT


def _lose_b(c: FakeCluster) -> BudgetConfig:
    del c.pods["b-g2-w0"]  # deleted by someone: it simply vanishes
    return TIGHT


def _complete_a(c: FakeCluster) -> BudgetConfig:
    c.pods["a-g3-w0"]["metadata"]["annotations"]["powerflow.io/iterations"] = "1000"
    return TIGHT


SCENARIO = (_submit, _tighten, _fail_a, _lose_b, _complete_a)


def _run(crash: tuple[int, int] | None) -> tuple[FakeCluster, list[int]]:
    """The scenario; ``crash=(k, n)``: pass ``k`` (counted from 0) dies after ``n`` writes."""
    cluster = FakeCluster(NODES)
    writes: list[int] = []
    budget = GENEROUS
    for step in SCENARIO:
        budget = step(cluster)
        for _ in range(12):
            before = copy.deepcopy((cluster.jobs, cluster.pods))
            k = len(writes)
            limit = crash[1] if crash is not None and crash[0] == k else None
            writes.append(one_pass(cluster, budget, limit))
            cluster.settle()
            if limit is None and (cluster.jobs, cluster.pods) == before:
                break
    return cluster, writes


def test_the_scenario_restarts_rescales_and_counts() -> None:
    cluster, _ = _run(None)
    assert sorted(cluster.pods) == ["b-g3-w0", "b-g3-w1"]
    assert cluster.jobs["a"]["status"]["phase"] == "Succeeded"
    assert cluster.jobs["a"]["status"]["restarts"] == 1  # evicted worker
    assert cluster.jobs["b"]["status"]["restarts"] == 1  # lost worker
    assert max(cluster.created.values()) == 1


def test_a_crash_between_any_two_writes_causes_no_churn() -> None:
    reference, writes = _run(None)
    cases = [(k, n) for k, total in enumerate(writes) for n in range(total)]
    assert len(cases) > 40
    for crash in cases:
        cluster, _ = _run(crash)
        twice = {name: n for name, n in cluster.created.items() if n > 1}
        assert not twice, f"crash {crash}: created twice {twice}"
        assert set(cluster.created) == set(reference.created), f"crash {crash}"
        assert set(cluster.deleted) == set(reference.deleted), f"crash {crash}"
        assert sorted(cluster.pods) == sorted(reference.pods), f"crash {crash}"
        for name, job in reference.jobs.items():
            status = cluster.jobs[name]["status"]
            assert status.get("restarts") == job["status"].get("restarts"), f"crash {crash}"
            assert status["allocation"] == job["status"]["allocation"], f"crash {crash}"


def test_a_generation_is_recorded_before_its_pods() -> None:
    cluster = FakeCluster(NODES)
    cluster.submit(dljob("a", "ua"))
    actions, _ = cluster.one_pass(
        0, budget=GENEROUS, policy=ThresholdPolicy(), models=lambda j: SyntheticModel()
    )
    phases = actions.writes()
    verbs = [[verb for verb, _ in phase] for phase in phases]
    assert verbs[0] == ["status"] and phases[0][0][1][2]["allocation"]["generation"] == 1
    assert "create" in verbs[2]


def test_a_lost_worker_restarts_the_generation() -> None:
    cluster = FakeCluster(NODES)
    cluster.submit(dljob("a", "ua"))
    settle(cluster, GENEROUS)
    assert cluster.jobs["a"]["status"]["allocation"]["complete"] is True
    del cluster.pods["a-g1-w2"]
    one_pass(cluster, GENEROUS)
    status = cluster.jobs["a"]["status"]
    assert status["restarts"] == 1 and status["phase"] == "Pending"
    assert "a-g1-w2 (lost)" in status["message"]
    assert cluster.created["a-g1-w2"] == 1  # not recreated alone
    assert all(p["metadata"].get("deletionTimestamp") for p in cluster.pods.values())
    settle(cluster, GENEROUS)
    assert sorted(cluster.pods) == [f"a-g2-w{i}" for i in range(4)]


def test_lost_workers_count_against_the_restart_limit() -> None:
    cluster = FakeCluster(NODES)
    body = dljob("a", "ua")
    body["spec"]["restart"]["limit"] = 1
    cluster.submit(body)
    settle(cluster, GENEROUS)
    for generation in (1, 2):
        del cluster.pods[f"a-g{generation}-w0"]
        settle(cluster, GENEROUS)
    status = cluster.jobs["a"]["status"]
    assert (status["phase"], status["restarts"]) == ("Failed", 2)
    assert cluster.pods == {}


def test_an_unfinished_gang_gets_its_missing_workers() -> None:
    """A pass that died after creating some workers: the rest come, the same generation."""
    cluster = FakeCluster(NODES)
    cluster.submit(dljob("a", "ua"))
    one_pass(cluster, GENEROUS, limit=4)  # status, Service, two of four pods
    assert sorted(cluster.pods) == ["a-g1-w0", "a-g1-w1"]
    settle(cluster, GENEROUS)
    assert sorted(cluster.pods) == [f"a-g1-w{i}" for i in range(4)]
    assert cluster.jobs["a"]["status"].get("restarts") is None


def test_a_worker_stuck_terminating_is_reported_and_the_job_waits() -> None:
    cluster = FakeCluster(NODES)
    cluster.submit(dljob("a", "ua"))
    settle(cluster, GENEROUS)
    node = cluster.pods["a-g1-w0"]["spec"]["nodeName"]
    cluster.stuck_nodes.add(node)
    cluster.pods["a-g1-w3"]["status"] = {"phase": "Failed"}
    one_pass(cluster, GENEROUS)
    cluster.settle()  # the workers on the unreachable node stay terminating
    actions, _ = cluster.one_pass(
        budget=GENEROUS, policy=ThresholdPolicy(), models=lambda j: SyntheticModel()
    )
    assert cluster.jobs["a"]["status"]["phase"] == "Rescaling"
    deadline = parse_time(cluster.pods["a-g1-w0"]["metadata"]["deletionTimestamp"])
    assert deadline is not None and actions.wake_at_s == deadline + STUCK_TERMINATION_S
    cluster.now_s = deadline + STUCK_TERMINATION_S
    actions, _ = cluster.one_pass(
        budget=GENEROUS, policy=ThresholdPolicy(), models=lambda j: SyntheticModel()
    )
    status = cluster.jobs["a"]["status"]
    (stuck,) = [c for c in status["conditions"] if c["type"] == "WorkersStuck"]
    assert (stuck["status"], stuck["reason"]) == ("True", "TerminationStuck")
    assert f"a-g1-w0 on {node}" in stuck["message"]
    assert status["phase"] == "Pending"
    assert [(e.type, e.reason) for e in actions.events] == [("Warning", "TerminationStuck")]
    assert not any(name.startswith("a-g2") for name in cluster.pods)  # never twice at once
    # The admin force-deletes them: the job goes on and the condition clears.
    cluster.stuck_nodes.clear()
    settle(cluster, GENEROUS)
    status = cluster.jobs["a"]["status"]
    (stuck,) = [c for c in status["conditions"] if c["type"] == "WorkersStuck"]
    assert stuck["status"] == "False"
    assert sorted(cluster.pods) == [f"a-g2-w{i}" for i in range(4)]


@pytest.mark.parametrize("policy", [PowerFlowPolicy])
def test_a_migration_makes_room_for_a_gang(policy: Any) -> None:
    """a and c (2 GPUs each) sit on different nodes; b needs a whole node.

    The policy moves a next to c; without carrying the move out, b's gang
    finds no block and waits for ever.
    """
    cluster = FakeCluster(NODES)
    plan = policy()
    budget = parse_budget({"eta": "1"})
    cluster.submit(dljob("a", "ua", 2, 2, 2))
    settle(cluster, budget, plan)
    cluster.submit(dljob("c", "uc", 2, 2, 2))
    settle(cluster, budget, plan)
    # Put c on the other node, as an extender with another view might have.
    nodes = {p["spec"]["nodeName"] for n, p in cluster.pods.items() if n.startswith("a-")}
    assert nodes == {"n1"}
    for name, pod in cluster.pods.items():
        if name.startswith("c-"):
            pod["spec"]["nodeName"] = "n2"
            index = int(name[-1])
            block = '{"node": "n2", "block": [["n2", 0], ["n2", 1]]}'
            pod["metadata"]["annotations"]["powerflow.io/placement"] = block
            assert index in (0, 1)
    cluster.submit(dljob("b", "ub", 4, 4, 4))
    settle(cluster, budget, plan)
    assert cluster.pending_gangs() == []
    running = {n for n, p in cluster.pods.items() if p["status"]["phase"] == "Running"}
    assert {n.split("-")[0] for n in running} == {"a", "b", "c"}
    moved = [n for n in cluster.jobs if cluster.jobs[n]["status"].get("restarts")]
    assert moved == []  # a move is not a failure
    # Stable: further passes move nothing.
    deleted = sum(cluster.deleted.values())
    settle(cluster, budget, plan)
    assert sum(cluster.deleted.values()) == deleted


class MovePolicy:
    """Runs a on 2 GPUs of n2 (and b, when it exists, on n1's first two GPUs); with
    ``placed=False`` it says nothing of where (the extender chooses)."""

    def __init__(self, placed: bool = True) -> None:
        self.placed = placed

    def plan(self, snapshot: Snapshot) -> Plan:
        where = {"ml/a": (("n2", 0), ("n2", 1)), "ml/b": (("n1", 0), ("n1", 1))}
        plans = tuple(
            JobPlan(j.id, 2, 1410, 32, where[j.id] if self.placed else ()) for j in snapshot.jobs
        )
        return Plan(plans, limit_w=1e9, predicted_w=1.0)


def test_a_move_only_to_pack_jobs_is_not_carried_out() -> None:
    cluster = FakeCluster(NODES)
    cluster.submit(dljob("a", "ua", 2, 2, 2))
    settle(cluster, GENEROUS, MovePolicy(placed=False))  # the extender puts a on n1
    assert {p["spec"]["nodeName"] for p in cluster.pods.values()} == {"n1"}
    settle(cluster, GENEROUS, MovePolicy())
    assert sum(cluster.deleted.values()) == 0  # n1's GPUs are nobody else's
    cluster.submit(dljob("b", "ub", 2, 2, 2))
    actions, _ = cluster.one_pass(
        budget=GENEROUS, policy=MovePolicy(), models=lambda j: SyntheticModel()
    )
    assert sorted(name for _, name, _ in actions.delete_pods) == ["a-g1-w0", "a-g1-w1"]
    assert cluster.jobs["a"]["status"]["phase"] == "Rescaling"
    assert [e.reason for e in actions.events if e.name == "a"] == ["Migrating"]


def test_a_spec_edited_invalid_stops_a_running_gang_gracefully() -> None:
    """An invalid spec fails the job, but its workers get their SIGTERM window to
    checkpoint (a grace of 0 is a force delete: on an unreachable node the process
    keeps running while a fixed spec starts the next generation)."""
    cluster = FakeCluster(NODES)
    job = dljob("a", "ua")
    job["spec"]["terminationGracePeriodSeconds"] = 90  # the pods get it
    cluster.submit(job)
    settle(cluster, GENEROUS)
    running = sorted(cluster.pods)
    assert len(running) == 4
    cluster.jobs["a"]["spec"]["gpus"] = {"requested": 4, "min": 8, "max": 4}
    cluster.jobs["a"]["metadata"]["generation"] = 2
    actions, _ = cluster.one_pass(
        budget=GENEROUS, policy=ThresholdPolicy(), models=lambda job: SyntheticModel()
    )
    assert cluster.jobs["a"]["status"]["phase"] == "Failed"
    assert sorted(actions.delete_pods) == [("ml", name, 90) for name in running]


class WantsPolicy:
    """First come (snapshot order), each job its ``wants`` GPUs if they are free, else none."""

    def __init__(self, wants: dict[str, int]) -> None:
        self.wants = wants

    def plan(self, snapshot: Snapshot) -> Plan:
        free = sum(n.gpus for n in snapshot.nodes)
        plans = []
        for job in snapshot.jobs:
            want = self.wants[job.id]
            n = want if want <= free else 0
            free -= n
            plans.append(JobPlan(job.id, n, 1410, -(-64 // n) if n else 0))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=1.0)


def test_a_job_whose_old_workers_stop_keeps_its_gpus_in_the_plan() -> None:
    """a rescales from 4 to 2 GPUs; until its old workers are gone, the plan still counts
    a's demand. Left out of the snapshot, a's GPUs looked free, the pending c was started
    on them and preempted again once a came back: a checkpoint-restart for nothing,
    which the twin showed as jobs restarted dozens of times a minute (docs/twin.md)."""
    cluster = FakeCluster(NODES)
    policy = WantsPolicy({"ml/a": 4, "ml/b": 4, "ml/c": 4})
    cluster.submit(dljob("a", "ua"))
    cluster.submit(dljob("b", "ub"))
    settle(cluster, GENEROUS, policy)
    cluster.submit(dljob("c", "uc"))
    settle(cluster, GENEROUS, policy)
    assert not any(name.startswith("c-") for name in cluster.pods)  # no room
    a_node = cluster.pods["a-g1-w0"]["spec"]["nodeName"]
    cluster.stuck_nodes.add(a_node)  # a's old workers take their time to stop
    policy.wants["ml/a"] = 2
    for _ in range(3):
        one_pass(cluster, GENEROUS, policy=policy)
        cluster.settle()
    assert cluster.jobs["a"]["status"]["phase"] == "Rescaling"
    cluster.stuck_nodes.clear()
    settle(cluster, GENEROUS, policy)
    assert sorted(cluster.pods) == [f"a-g2-w{i}" for i in range(2)] + [
        f"b-g1-w{i}" for i in range(4)
    ]
    assert not any(name.startswith("c-") for name in cluster.created)  # never started
    assert cluster.jobs["c"]["status"]["phase"] == "Pending"


class WherePolicy:
    """Each job its GPUs where ``where`` says (a job not in it gets none)."""

    def __init__(self, where: dict[str, tuple[tuple[str, int], ...]]) -> None:
        self.where = where

    def plan(self, snapshot: Snapshot) -> Plan:
        plans = []
        for job in snapshot.jobs:
            slots = self.where.get(job.id, ())
            n = len(slots)
            plans.append(JobPlan(job.id, n, 1410, -(-64 // n) if n else 0, slots))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=1.0)


def _slots(node: str, *indices: int) -> tuple[tuple[str, int], ...]:
    return tuple((node, i) for i in indices)


def _blocks(cluster: FakeCluster, job: str) -> set[tuple[str, int]]:
    return {
        slot
        for name, pod in cluster.pods.items()
        if name.startswith(f"{job}-")
        for slot in parse_block(pod["metadata"]["annotations"][contract.PLACEMENT_ANNOTATION])
    }


def test_a_gang_waits_for_the_gpus_its_plan_frees_and_lands_where_planned() -> None:
    """The plan moves a from n1 to n2 to give b all of n1. Created at once, b's gang
    found n1 still held by a's stopping workers and got n2, where a was planned: the
    next plan found both elsewhere than it put them and moved them again. Now every
    worker carries the plan's block, and b starts once a's old workers are gone."""
    cluster = FakeCluster(NODES)
    policy = WherePolicy({"ml/a": _slots("n1", 0, 1)})
    cluster.submit(dljob("a", "ua", 2, 2, 2))
    settle(cluster, GENEROUS, policy)
    planned = json.loads(
        cluster.pods["a-g1-w0"]["metadata"]["annotations"][contract.PLANNED_BLOCK_ANNOTATION]
    )
    assert planned == {"block": [["n1", 0], ["n1", 1]]}
    cluster.submit(dljob("b", "ub", 4, 4, 4))
    policy.where.update({"ml/a": _slots("n2", 0, 1), "ml/b": _slots("n1", 0, 1, 2, 3)})
    actions, _ = cluster.one_pass(budget=GENEROUS, policy=policy, models=lambda j: SyntheticModel())
    assert sorted(name for _, name, _ in actions.delete_pods) == ["a-g1-w0", "a-g1-w1"]
    assert not any(name.startswith("b-") for name in cluster.pods)  # n1 is not free yet
    status = cluster.jobs["b"]["status"]
    assert status["phase"] == "Pending" and "waiting for stopping workers" in status["message"]
    settle(cluster, GENEROUS, policy)
    assert _blocks(cluster, "a") == set(_slots("n2", 0, 1))
    assert _blocks(cluster, "b") == set(_slots("n1", 0, 1, 2, 3))
    assert sum(cluster.deleted.values()) == 2  # a's old workers, once each
    assert cluster.jobs["b"]["status"]["phase"] == "Running"


@pytest.mark.parametrize("how", ["stuck", "refused"])
def test_a_gang_waits_for_the_planned_gpus_at_most_room_wait_s(how: str) -> None:
    """Workers that do not go (their node stopped answering, or the API server refuses
    their deletion, so every pass deletes them again) hold the planned GPUs up for
    ``ROOM_WAIT_S`` at most; then the gang starts and the extender chooses others."""
    cluster = FakeCluster(NODES)
    policy = WherePolicy({"ml/a": _slots("n1", 0, 1)})
    cluster.submit(dljob("a", "ua", 2, 2, 2))
    settle(cluster, GENEROUS, policy)
    if how == "stuck":
        cluster.stuck_nodes.add("n1")
    else:
        write = cluster.write
        cluster.write = lambda verb, args: None if verb == "delete" else write(verb, args)  # type: ignore[method-assign]
    cluster.submit(dljob("b", "ub", 2, 2, 2))
    policy.where.update({"ml/a": (), "ml/b": _slots("n1", 0, 1)})
    began = cluster.now_s
    for _ in range(3):
        actions, _ = cluster.one_pass(
            budget=GENEROUS, policy=policy, models=lambda j: SyntheticModel()
        )
        cluster.settle()
        assert not any(name.startswith("b-") for name in cluster.pods)
        assert actions.wake_at_s == began + ROOM_WAIT_S
        assert cluster.jobs["b"]["status"]["roomWaitSince"] == format_time(began)
        cluster.now_s += 30.0
    cluster.now_s = began + ROOM_WAIT_S
    settle(cluster, GENEROUS, policy)
    got = _blocks(cluster, "b")  # other GPUs: n1's first two are still held
    assert len(got) == 2 and got.isdisjoint(_slots("n1", 0, 1))
    assert "roomWaitSince" not in cluster.jobs["b"]["status"]


def test_a_job_stopped_after_a_failure_backs_off_even_before_its_deletes_show() -> None:
    """A worker failed; the pass recorded it and died before deleting the workers. The
    next pass deletes them again and, as once they are gone, leaves the job out of
    the plan until its backoff ends."""
    cluster = FakeCluster(NODES)
    body = dljob("a", "ua")
    body["spec"]["restart"]["backoffSeconds"] = 30
    policy = Recording(WantsPolicy({"ml/a": 4}))
    cluster.submit(body)
    settle(cluster, GENEROUS, policy)
    cluster.pods["a-g1-w1"]["status"] = {"phase": "Failed"}
    one_pass(cluster, GENEROUS, limit=1, policy=policy)  # a's status only
    status = cluster.jobs["a"]["status"]
    assert (status["restarts"], status["allocation"]["stopped"]) == (1, True)
    actions, _ = cluster.one_pass(budget=GENEROUS, policy=policy, models=lambda j: SyntheticModel())
    assert sorted(name for _, name, _ in actions.delete_pods) == [f"a-g1-w{i}" for i in range(4)]
    assert actions.plan is None  # no job to plan: a backs off
    failed_at = parse_time(status["lastFailureTime"])
    assert failed_at is not None and actions.wake_at_s is not None
    assert actions.wake_at_s > cluster.now_s and actions.wake_at_s <= failed_at + 60


class Recording:
    """A policy that keeps the snapshots it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, []  # type: list[Snapshot]

    def plan(self, snapshot: Snapshot) -> Plan:
        self.seen.append(snapshot)
        return self.inner.plan(snapshot)  # type: ignore[no-any-return]


def test_a_job_stopped_by_a_pass_that_died_before_deleting_stays_planned() -> None:
    """A pass recorded a's rescale (its generation stopped) and died before deleting its
    workers: the next pass deletes them again and plans a as a pending job (no
    placement, no clock: its workers are on their way out), not leaving its GPUs to c."""
    cluster = FakeCluster(NODES)
    policy = Recording(WantsPolicy({"ml/a": 4, "ml/b": 4, "ml/c": 4}))
    cluster.submit(dljob("a", "ua"))
    cluster.submit(dljob("b", "ub"))
    settle(cluster, GENEROUS, policy)
    cluster.submit(dljob("c", "uc"))
    settle(cluster, GENEROUS, policy)
    policy.inner.wants["ml/a"] = 2
    one_pass(cluster, GENEROUS, limit=1, policy=policy)  # a's status only
    assert cluster.jobs["a"]["status"]["allocation"]["stopped"] is True
    assert not any(p["metadata"].get("deletionTimestamp") for p in cluster.pods.values())
    actions, _ = cluster.one_pass(budget=GENEROUS, policy=policy, models=lambda j: SyntheticModel())
    assert sorted(name for _, name, _ in actions.delete_pods) == [f"a-g1-w{i}" for i in range(4)]
    (a,) = [job for job in policy.seen[-1].jobs if job.id == "ml/a"]
    assert (a.placement, a.frequency_mhz, a.pinned) == ((), None, False)
    settle(cluster, GENEROUS, policy)
    assert not any(name.startswith("c-") for name in cluster.created)
    assert sorted(cluster.pods) == [f"a-g2-w{i}" for i in range(2)] + [
        f"b-g1-w{i}" for i in range(4)
    ]
