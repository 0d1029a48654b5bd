"""The Profiling phase and progress accounting of one pass (pure, no cluster)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.reconcile import reconcile
from powerflow.operator.workers import WorkerSet, worker_pods
from support.operator_pass import pass_inputs

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Policy, Snapshot
from powerflow.core.timefmt import format_time_ms, parse_time
from powerflow.lab.synthetic import SyntheticModel

NODES = (Node("n0", 8, A100), Node("n1", 8, A100))
BUDGET = parse_budget({"eta": "1"})
MODEL = SyntheticModel()
WINDOW = 0.3


class KeepPolicy:
    """Requested GPUs for each job (its own GPUs when pinned), at 1410 MHz; records
    each snapshot so that tests see what the policy was told."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        self.snapshots.append(snapshot)
        plans = []
        for job in snapshot.jobs:
            n = len(job.placement) if job.pinned else job.requested_gpus
            slots = job.placement or tuple(("n0", i) for i in range(n))
            plans.append(JobPlan(job.id, n, 1410, job.global_batch_size // n, slots))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=0.0)


def body(status: dict[str, Any] | None = None, gpus: int = 4) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 10_000,
            "gpus": {"requested": gpus, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    if status is not None:
        out["status"] = status
    return out


def running_pods(
    generation: int = 1, gpus: int = 4, phase: str = "Running", first: int = 0
) -> tuple[dict[str, Any], ...]:
    """The job's workers as the extender (placement) and the kubelet (phase) leave them."""
    req = parse_dljob(body(gpus=gpus))
    block = [["n0", i] for i in range(first, first + gpus)]
    placement = json.dumps({"node": "n0", "block": block})
    pods = []
    for pod in worker_pods(req, WorkerSet(generation, gpus, 256 // gpus, 1410)):
        annotations = {**pod["metadata"]["annotations"], contract.PLACEMENT_ANNOTATION: placement}
        meta = {**pod["metadata"], "annotations": annotations}
        spec = {**pod["spec"], "nodeName": "n0"}
        pods.append({**pod, "metadata": meta, "spec": spec, "status": {"phase": phase}})
    return tuple(pods)


def allocation(**extra: Any) -> dict[str, Any]:
    return {"gpus": 4, "frequencyMHz": 1410, "localBatchSize": 64, "generation": 1, **extra}


def one_pass(
    obs: Observed, now_s: float, policy: Policy | None = None, **kw: Any
) -> tuple[Actions, dict[str, Any]]:
    kw.setdefault("profiling_window_s", WINDOW)
    actions = reconcile(
        [obs], NODES, BUDGET, now_s, policy or KeepPolicy(), lambda j: MODEL, **pass_inputs(**kw)
    )
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    return actions, patches.get("job", {})


def test_a_new_gpu_count_profiles_first() -> None:
    actions, patch = one_pass(Observed(body()), 100.0)
    assert patch["phase"] == "Profiling"
    assert len([b for b in actions.create if b["kind"] == "Pod"]) == 4
    assert [e.reason for e in actions.events] == ["Profiling"]


def test_a_profiled_gpu_count_runs_at_once() -> None:
    status = {"model": {"profiledGpuCounts": [2, 4], "samples": 7}}
    _, patch = one_pass(Observed(body(status)), 100.0)
    assert patch["phase"] == "Running"
    assert "model" not in patch  # samples and fitError are not the operator's to touch


def test_a_zero_window_turns_profiling_off() -> None:
    _, patch = one_pass(Observed(body()), 100.0, profiling_window_s=0.0)
    assert patch["phase"] == "Running"


def test_window_starts_when_all_workers_run_and_pins_the_job() -> None:
    status = {"phase": "Profiling", "allocation": allocation()}
    pending = Observed(body(status), running_pods(phase="Pending"))
    policy = KeepPolicy()
    actions, patch = one_pass(pending, 100.0, policy)
    assert "profilingUntil" not in patch.get("allocation", {}) and actions.wake_at_s is None
    assert policy.snapshots[-1].jobs[0].pinned  # placement known: the GPUs are kept

    actions, patch = one_pass(Observed(body(status), running_pods()), 100.0, policy)
    until = parse_time(patch["allocation"]["profilingUntil"])
    assert until is not None and abs(until - (100.0 + WINDOW)) < 1e-3
    assert actions.wake_at_s == until  # the window's end is a scheduling event
    assert policy.snapshots[-1].jobs[0].pinned
    assert "ProfilingStarted" in [e.reason for e in actions.events]
    assert not actions.create and not actions.delete_pods


def test_window_end_records_the_count_and_unpins() -> None:
    until = 100.0 + WINDOW
    status = {
        "phase": "Profiling",
        "allocation": allocation(profilingUntil=format_time_ms(until)),
        "model": {"profiledGpuCounts": [1], "samples": 3},
    }
    obs = Observed(body(status), running_pods())
    policy = KeepPolicy()
    actions, patch = one_pass(obs, until - 0.1, policy)
    assert patch.get("phase", "Profiling") == "Profiling" and actions.wake_at_s == until
    assert policy.snapshots[-1].jobs[0].pinned

    actions, patch = one_pass(obs, until, policy)
    assert patch["phase"] == "Running"
    # Under the workers' type; the list without a type (read as every type's) stays.
    assert patch["model"] == {"profiledGpuCountsByType": [{"gpu": "A100", "gpuCounts": [4]}]}
    assert patch["allocation"]["profilingUntil"] is None  # merge patch: delete the field
    assert not policy.snapshots[-1].jobs[0].pinned  # the policy may now move the job
    assert [e.reason for e in actions.events] == ["ProfilingFinished"]


def test_without_placement_a_profiling_job_is_not_pinned() -> None:
    """The policy can only keep GPUs it knows (the snapshot would be invalid)."""
    status = {"phase": "Profiling", "allocation": allocation()}
    pods = tuple({**p, "metadata": {**p["metadata"], "annotations": {}}} for p in running_pods())
    for pod in pods:
        pod["metadata"]["annotations"][contract.GENERATION_ANNOTATION] = "1"
    policy = KeepPolicy()
    one_pass(Observed(body(status), pods), 100.0, policy)
    assert not policy.snapshots[-1].jobs[0].pinned


def test_a_profiling_job_on_gpus_that_are_no_aligned_block_does_not_stop_the_plan() -> None:
    """The policy keeps a pinned job's GPUs only as an aligned block of the plan's nodes
    and refuses the whole pass otherwise ("policy refused the snapshot": no plan for any
    job). A gang can sit unaligned there: the extender takes a plan's whole nodes in any
    order, and the plan's nodes change as other pods come and go."""
    status = {"phase": "Profiling", "allocation": allocation()}
    obs = Observed(body(status), running_pods(first=2))  # n0's GPUs 2-5
    policy = KeepPolicy()
    one_pass(obs, 100.0, policy)
    assert not policy.snapshots[-1].jobs[0].pinned
    paper = PowerFlowPolicy()
    actions, _ = one_pass(obs, 100.0, paper)
    assert not any("refused" in note for note in actions.notes), actions.notes
    assert actions.plan is not None and actions.plan.jobs[0].gpus > 0


def test_progress_counts_whole_iterations_and_keeps_the_rest() -> None:
    """Many short passes add up to what one long pass counts (no rounding loss)."""
    status = {
        "phase": "Running",
        "allocation": allocation(),
        "model": {"profiledGpuCounts": [4]},
        "progress": {"iterations": 0},
        "energy": {"joules": 0.0},
    }
    t = float(MODEL.step_time_s(4, 4, 64, 1410))
    e = float(MODEL.energy_per_iter_j(4, 4, 64, 1410))
    pods = running_pods()
    anchors: dict[str, float] = {}
    now = 1000.0
    actions, _ = one_pass(Observed(body(status), pods), now, anchors=anchors)
    anchors = actions.anchors
    assert anchors == {"ml/job": now}
    for _ in range(40):  # passes every 0.4 step times: each alone makes no whole iteration
        now += 0.4 * t
        actions, patch = one_pass(Observed(body(status), pods), now, anchors=anchors)
        anchors = actions.anchors
        if "progress" in patch:
            status = {
                **status,
                "progress": {**status["progress"], **patch["progress"]},
                "energy": {**status["energy"], **patch["energy"]},
            }
    assert status["progress"]["iterations"] == 16  # floor(40 * 0.4)
    assert abs(status["energy"]["joules"] - 16 * e) < 1e-2
    assert abs(status["energy"]["watts"] - e / t) < 1e-2


def test_pending_workers_neither_progress_nor_draw_power() -> None:
    status = {"phase": "Running", "allocation": allocation(), "progress": {"iterations": 5}}
    pods = running_pods(phase="Pending")
    actions, patch = one_pass(Observed(body(status), pods), 1000.0, anchors={"ml/job": 0.0})
    assert patch["energy"]["watts"] == 0.0
    assert "iterations" not in patch.get("progress", {})  # still 5
    assert actions.anchors == {}


def merged(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch applied (RFC 7386), as the API server does with status patches."""
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_progress_writes_are_rate_limited_without_losing_iterations() -> None:
    """With ``progress_interval_s``, a job whose status does not otherwise change gets
    progress written at most once per interval; the passes in between keep the anchor,
    so the next write counts every whole iteration since the last one."""
    status: dict[str, Any] = {
        "phase": "Running",
        "observedGeneration": 1,
        "allocation": allocation(),
        "model": {"profiledGpuCounts": [4]},
        "progress": {"iterations": 0},
        "energy": {"joules": 0.0},
    }
    t = float(MODEL.step_time_s(4, 4, 64, 1410))
    interval = 5 * t
    pods = running_pods()
    anchors: dict[str, float] = {}
    written: dict[str, float] = {}
    start = now = 1000.0
    write_times = []
    for _ in range(41):  # passes every 0.4 step times
        actions, patch = one_pass(
            Observed(body(status), pods),
            now,
            anchors=anchors,
            progress_interval_s=interval,
            progress_written=written,
        )
        anchors = actions.anchors
        if "progress" in patch:
            written["ml/job"] = now
            write_times.append(now)
        status = merged(status, patch)
        now += 0.4 * t
    gaps = [b - a for a, b in itertools.pairwise(write_times)]
    assert len(write_times) == 4 and all(g >= interval - 1e-9 for g in gaps)
    last = write_times[-1]
    assert status["progress"]["iterations"] == int((last - start) / t + 1e-9)
