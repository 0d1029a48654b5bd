"""``records.filled`` gives each of its callers the object the dataclass's own
``__init__`` gives: every field set, equal, the same ``vars``, the same hash, frozen.
The pass's callers are checked on what they built in a real pass (the core's ``Job``
in the policy's snapshot, the events) and in ``job_controller`` (the ``WorkerSet``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from powerflow.operator import job_controller
from powerflow.operator.actions import Observed
from powerflow.operator.allocation import JobAllocation
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import JobRequest, parse_dljob
from powerflow.operator.pass_inputs import PassMemory
from powerflow.operator.reconcile import reconcile
from powerflow.operator.records import filled
from powerflow.operator.workers import WorkerSet

from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Node, Plan, Snapshot
from powerflow.lab.synthetic import SyntheticModel, synthetic_zoo


def same_as_init(obj: Any) -> None:
    cls = type(obj)
    assert set(vars(obj)) == {f.name for f in dataclasses.fields(cls)}
    plain = cls(**vars(obj))
    assert obj == plain
    assert vars(obj) == vars(plain)
    assert hash(obj) == hash(plain)
    assert repr(obj) == repr(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.name = "other"


def body(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"j{i}", "namespace": "ml", "uid": f"u{i}", "generation": 1},
        "spec": {
            "globalBatchSize": 64,
            "iterations": 100 + i,
            "gpus": {"requested": 1 << (i % 3), "min": 1, "max": 4},
            "model": "bert" if i % 2 else None,
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


class Recording(PowerFlowPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[Snapshot] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        self.snapshots.append(snapshot)
        return super().plan(snapshot)


def test_the_jobs_and_events_of_a_pass() -> None:
    zoo = synthetic_zoo(3, seed=0)

    def model(job: JobRequest) -> SyntheticModel:
        return zoo[int(job.name[1:]) % len(zoo)]

    policy = Recording()
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    observed = [Observed(body(i)) for i in range(12)]  # type: ignore[arg-type]
    actions = reconcile(observed, nodes, parse_budget({"eta": "0.7"}), 1e6, policy, model,
                        PassMemory())  # fmt: skip
    (snapshot,) = policy.snapshots
    assert len(snapshot.jobs) == 12 and actions.events
    for job in snapshot.jobs:
        same_as_init(job)
    for event in actions.events:
        same_as_init(event)


def test_the_worker_set_of_a_new_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[WorkerSet] = []
    build = job_controller.worker_pods

    def record(job: JobRequest, ws: WorkerSet, indices: Any = None) -> Any:
        seen.append(ws)
        return build(job, ws, indices)

    monkeypatch.setattr(job_controller, "worker_pods", record)
    job = parse_dljob(body(2))  # type: ignore[arg-type]
    block = (("n0", 0), ("n0", 1), ("n0", 2), ("n0", 3))
    for pools, tuned in ((None, True), ({"n0": "NVIDIA-A100"}, False)):
        allocation = JobAllocation(3, 4, 16, 1410, 250.5, block)
        job_controller.converge(job, allocation, (), 1e6, tuned=tuned, pools=pools)
    assert [ws.pool_product for ws in seen] == [None, "NVIDIA-A100"]
    assert [ws.frequency_mhz for ws in seen] == [1410, None]
    for ws in seen:
        same_as_init(ws)


def test_filled_is_the_init() -> None:
    fields = {f.name: i for i, f in enumerate(dataclasses.fields(WorkerSet))}
    assert vars(filled(WorkerSet, dict(fields))) == vars(WorkerSet(**fields))
