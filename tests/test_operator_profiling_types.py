"""Profiled GPU counts per GPU type (``operator.profiled``), in one pass of a cluster of an
A100 node and an H100 node (pure, no cluster): a count profiled on one type profiles
again on another, the window's end records it under the type the workers run on, and
the counts without a type count on every type."""

from __future__ import annotations

import json
from typing import Any

import pytest
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.profiled import (
    BY_TYPE,
    MAX_COUNTS,
    MAX_TYPES,
    by_type,
    profiled_everywhere,
    profiled_on,
    with_profiled,
)
from powerflow.operator.reconcile import reconcile
from powerflow.operator.workers import WorkerSet, worker_pods
from support.operator_pass import pass_inputs

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.timefmt import format_time_ms
from powerflow.lab.synthetic import SyntheticModel

H100 = GPU_SPECS["H100-SXM"]
NODES = (Node("a0", 8, A100), Node("h0", 8, H100))
CLOCK = {"a0": 1410, "h0": 1980}
WINDOW = 0.3


class PutOn:
    """Each job on ``node``'s first GPUs (its own GPUs while it holds some), at that
    node's type's clock; records the snapshots."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.snapshots: list[Snapshot] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        self.snapshots.append(snapshot)
        plans = []
        for job in snapshot.jobs:
            n = job.requested_gpus
            slots = job.placement or tuple((self.node, i) for i in range(n))
            clock = CLOCK[slots[0][0]]
            plans.append(JobPlan(job.id, n, clock, job.global_batch_size // n, slots))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=0.0)


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 10_000,
            "gpus": {"requested": 4, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    if status is not None:
        out["status"] = status
    return out


def pods_on(node: str) -> tuple[dict[str, Any], ...]:
    """The job's 4 running workers, bound by the extender to ``node``'s first GPUs."""
    req = parse_dljob(body())
    placement = json.dumps({"node": node, "block": [[node, i] for i in range(4)]})
    pods = []
    for pod in worker_pods(req, WorkerSet(1, 4, 64, CLOCK[node])):
        annotations = {**pod["metadata"]["annotations"], contract.PLACEMENT_ANNOTATION: placement}
        meta = {**pod["metadata"], "annotations": annotations}
        spec = {**pod["spec"], "nodeName": node}
        pods.append({**pod, "metadata": meta, "spec": spec, "status": {"phase": "Running"}})
    return tuple(pods)


def one_pass(obs: Observed, now_s: float, policy: PutOn) -> tuple[Actions, dict[str, Any]]:
    actions = reconcile(
        [obs],
        NODES,
        parse_budget({"eta": "1"}),
        now_s,
        policy,
        lambda _req: SyntheticModel(),
        **pass_inputs(profiling_window_s=WINDOW),
    )
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    return actions, patches.get("job", {})


def typed(**counts: list[int]) -> list[dict[str, Any]]:
    names = {"A100": "A100", "H100": "H100-SXM"}
    return [{"gpu": names[k], "gpuCounts": v} for k, v in counts.items()]


def test_a_count_profiled_on_one_type_profiles_again_on_another() -> None:
    status = {"model": {BY_TYPE: typed(A100=[4])}}
    _, patch = one_pass(Observed(body(status)), 100.0, PutOn("a0"))
    assert patch["phase"] == "Running"
    _, patch = one_pass(Observed(body(status)), 100.0, PutOn("h0"))
    assert patch["phase"] == "Profiling"


def test_counts_without_a_type_count_on_every_type() -> None:
    """``profiledGpuCounts``, the list without a type, is read as profiled everywhere."""
    status = {"model": {"profiledGpuCounts": [4]}}
    for node in ("a0", "h0"):
        _, patch = one_pass(Observed(body(status)), 100.0, PutOn(node))
        assert patch["phase"] == "Running", node


def test_the_windows_end_records_the_count_under_the_workers_type() -> None:
    """The other types' counts and the untyped list stay as they are."""
    until = 100.0 + WINDOW
    status = {
        "phase": "Profiling",
        "allocation": {
            "gpus": 4,
            "frequencyMHz": 1980,
            "localBatchSize": 64,
            "generation": 1,
            "complete": True,
            "profilingUntil": format_time_ms(until),
        },
        "model": {"profiledGpuCounts": [1], BY_TYPE: typed(A100=[4])},
    }
    actions, patch = one_pass(Observed(body(status), pods_on("h0")), until, PutOn("h0"))
    assert patch["phase"] == "Running"
    assert patch["model"] == {BY_TYPE: typed(A100=[4], H100=[4])}
    assert [e.reason for e in actions.events] == ["ProfilingFinished"]


def test_the_policy_sees_the_counts_of_the_type_a_job_holds_and_of_every_type_while_it_waits() -> (
    None
):
    """``Job.profiled_gpus``: a job on the H100 node, the H100's counts (and the untyped
    ones); a waiting job, the counts profiled on both types, since the plan may start it
    on either."""
    model = {"profiledGpuCounts": [8], BY_TYPE: typed(A100=[4, 2], H100=[2])}
    waiting = PutOn("a0")
    one_pass(Observed(body({"model": model})), 100.0, waiting)
    assert waiting.snapshots[-1].jobs[0].profiled_gpus == {2, 8}
    running = {
        "phase": "Running",
        "allocation": {"gpus": 4, "frequencyMHz": 1980, "localBatchSize": 64, "generation": 1},
        "model": model,
    }
    holding = PutOn("h0")
    one_pass(Observed(body(running), pods_on("h0")), 100.0, holding)
    assert holding.snapshots[-1].jobs[0].profiled_gpus == {2, 8}
    one_pass(Observed(body(running), pods_on("a0")), 100.0, holding)
    assert holding.snapshots[-1].jobs[0].profiled_gpus == {2, 4, 8}


@pytest.mark.parametrize(
    "raw",
    [
        "H100-SXM",
        [None, 3, {"gpu": 7, "gpuCounts": [4]}, {"gpu": "", "gpuCounts": [4]}],
        [{"gpu": "x" * 64, "gpuCounts": [4]}, {"gpu": "H100-SXM", "gpuCounts": "4"}],
    ],
    ids=["not-a-list", "bad-entries", "long-name-and-bad-counts"],
)
def test_a_malformed_list_is_no_counts_and_is_rewritten_clean(raw: Any) -> None:
    model = {BY_TYPE: raw}
    assert by_type(model) == {}
    assert profiled_on(model, "H100-SXM") == frozenset()
    assert with_profiled(model, "A100", 4) == typed(A100=[4])


def test_what_status_may_hold_is_bounded_on_reading_and_on_writing() -> None:
    """At most ``MAX_TYPES`` entries and ``MAX_COUNTS`` counts each are read, junk counts
    skipped, the first entry of a type named twice taken; a write that would pass the
    bounds (the CRD's ``maxItems``) leaves the count out."""
    many = [{"gpu": f"T{i:02}", "gpuCounts": [1]} for i in range(MAX_TYPES + 4)]
    assert len(by_type({BY_TYPE: many})) == MAX_TYPES
    assert len(with_profiled({BY_TYPE: many}, "A100", 4)) == MAX_TYPES
    assert {"gpu": "A100", "gpuCounts": [4]} not in with_profiled({BY_TYPE: many}, "A100", 4)
    counts = list(range(1, 2 * MAX_COUNTS))
    model = {BY_TYPE: [{"gpu": "A100", "gpuCounts": [0, -1, "x", 1e400, *counts]}]}
    assert by_type(model)["A100"] == counts[: MAX_COUNTS - 4]
    twice = {BY_TYPE: [*typed(A100=[4]), *typed(A100=[2])]}
    assert profiled_on(twice, "A100") == {4}
    assert profiled_everywhere(twice, ["A100", "H100-SXM"]) == frozenset()
    full = {BY_TYPE: [{"gpu": "A100", "gpuCounts": list(range(1, MAX_COUNTS + 1))}]}
    assert with_profiled(full, "A100", 1000)[0]["gpuCounts"] == list(range(1, MAX_COUNTS + 1))
