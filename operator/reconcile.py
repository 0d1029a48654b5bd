"""One pass of the allocation loop as a pure function: cluster state in, actions out.

``reconcile`` looks at every DLJob with its pods, settles each job's lifecycle
(invalid, failed, backing off, done, terminating), builds the core snapshot of
the runnable ones, asks the policy for a plan and turns the plan into pod
creations, graceful deletions, annotation updates, status patches and events.
It holds no state: what it needs to remember lives in DLJob status and pod
names and annotations, so a restarted operator carries on where it stopped.
All scheduling decisions are the policy's.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from powerflow.operator.bodies import DLJobBody, DLJobStatus, PodBody
from powerflow.operator.budget import BudgetConfig
from powerflow.operator.jobs import JobRequest, parse_dljob, too_large
from powerflow.operator.status import merge_diff, set_condition
from powerflow.operator.timefmt import format_time, parse_time
from powerflow.operator.workers import WorkerSet, rendezvous_service, worker_pods

from powerflow import contract
from powerflow.errors import PowerFlowError, ResourceError
from powerflow.models.protocol import PerfModel
from powerflow.policy.snapshot import GpuSlot, Job, JobPlan, Node, Plan, Policy, Snapshot

ModelFactory = Callable[[JobRequest], PerfModel]
TERMINAL_REASONS = ("Completed", "RestartLimitExceeded")


@dataclass(frozen=True)
class Observed:
    """One DLJob and the pods labelled with its name."""

    body: DLJobBody
    pods: tuple[PodBody, ...] = ()


@dataclass(frozen=True)
class Event:
    namespace: str
    name: str
    uid: str
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Actions:
    """What one pass wants done, in order: deletions, creations, patches, events."""

    delete_pods: list[tuple[str, str, int]] = field(default_factory=list)
    create: list[dict[str, Any]] = field(default_factory=list)
    annotate_pods: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    status: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    wake_at_s: float | None = None
    plan: Plan | None = None
    phases: Counter[str] = field(default_factory=Counter)
    allocated_gpus: int = 0
    notes: list[str] = field(default_factory=list)

    def wake(self, at_s: float) -> None:
        self.wake_at_s = at_s if self.wake_at_s is None else min(self.wake_at_s, at_s)


@dataclass
class _View:
    obs: Observed
    status: DLJobStatus
    new: dict[str, Any]
    req: JobRequest | None = None
    current: list[PodBody] = field(default_factory=list)
    other: list[PodBody] = field(default_factory=list)
    terminating: list[PodBody] = field(default_factory=list)

    @property
    def meta(self) -> Any:
        return self.obs.body.get("metadata", {})

    @property
    def ns(self) -> str:
        return str(self.meta.get("namespace", "default"))

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @property
    def alloc(self) -> dict[str, Any]:
        return dict(self.status.get("allocation") or {})


def _pod_phase(pod: PodBody) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def _annotation(pod: PodBody, key: str) -> str | None:
    return (pod.get("metadata", {}).get("annotations") or {}).get(key)


def _generation(pod: PodBody) -> int:
    try:
        return int(_annotation(pod, contract.GENERATION_ANNOTATION) or -1)
    except ValueError:
        return -1


def _reported_iterations(pods: Sequence[PodBody]) -> int | None:
    best: int | None = None
    for pod in pods:
        try:
            value = int(_annotation(pod, contract.PROGRESS_ANNOTATION) or "")
        except ValueError:
            continue
        best = value if best is None else max(best, value)
    return best


def _placement(pods: Sequence[PodBody], sizes: Mapping[str, int]) -> tuple[GpuSlot, ...]:
    """The gang's GPUs from the extender's placement annotation, if complete and sane."""
    slots: set[GpuSlot] = set()
    for pod in pods:
        raw = _annotation(pod, contract.PLACEMENT_ANNOTATION)
        try:
            block = json.loads(raw)["block"] if raw else None
            slots.update((str(node), int(index)) for node, index in block or [])
        except (ValueError, TypeError, KeyError):
            return ()
    if len(slots) != len(pods) or any(
        node not in sizes or not 0 <= i < sizes[node] for node, i in slots
    ):
        return ()
    return tuple(sorted(slots))


def _event(actions: Actions, v: _View, type_: str, reason: str, message: str) -> None:
    uid = str(v.meta.get("uid", ""))
    actions.events.append(Event(v.ns, v.name, uid, type_, reason, message))


def _set_phase(actions: Actions, v: _View, phase: str, reason: str, message: str) -> None:
    """Set phase and message; an event only when the phase or its reason changes."""
    warn = phase == "Failed" or reason in ("WorkerFailed", "InvalidSpec")
    changed = v.status.get("phase") != phase
    if changed or (warn and v.status.get("message") != message):
        _event(actions, v, "Warning" if warn else "Normal", reason, message)
    v.new["phase"] = phase
    v.new["message"] = message


def _delete_all(actions: Actions, v: _View, grace_s: int) -> None:
    for pod in v.current + v.other:
        actions.delete_pods.append((v.ns, pod["metadata"]["name"], grace_s))


def _backoff_s(req: JobRequest, restarts: int) -> float:
    return float(min(req.max_backoff_s, req.backoff_s * 2 ** max(restarts - 1, 0)))


def _lifecycle(actions: Actions, v: _View, now_s: float, cluster_gpus: int) -> bool:
    """Settle everything but the allocation; True when the job is runnable."""
    now = format_time(now_s)
    phase = v.status.get("phase")
    conditions = list(v.status.get("conditions") or [])
    reasons = {c.get("type"): c.get("reason") for c in conditions}
    if phase in ("Succeeded", "Failed") and reasons.get("Done") in TERMINAL_REASONS:
        if phase == "Failed":
            _delete_all(actions, v, 0)
        return False
    generation = int(v.meta.get("generation", 1))
    try:
        req = v.req = parse_dljob(v.obs.body)
    except ResourceError as exc:
        v.new["conditions"] = set_condition(
            conditions, "Valid", False, exc.reason, str(exc), now, generation
        )
        _set_phase(actions, v, "Failed", "InvalidSpec", f"{exc.reason}: {exc}")
        _delete_all(actions, v, 0)
        return False
    conditions = set_condition(conditions, "Valid", True, "SpecValid", "", now, generation)
    v.new["conditions"] = conditions
    restarts = int(v.status.get("restarts", 0))
    if phase == "Failed":  # was invalid and got fixed
        _set_phase(actions, v, "Pending", "SpecFixed", "spec is valid again")
    failed = [p for p in v.current if _pod_phase(p) == "Failed"]
    if failed:
        restarts += 1
        v.new.update(restarts=restarts, lastFailureTime=now)
        _delete_all(actions, v, req.grace_s)
        names = ", ".join(p["metadata"]["name"] for p in failed)
        if restarts > req.restart_limit:
            v.new["conditions"] = set_condition(
                conditions, "Done", True, "RestartLimitExceeded", names, now
            )
            v.new["completionTime"] = now
            _set_phase(
                actions, v, "Failed", "RestartLimitExceeded",
                f"worker {names} failed; restart limit {req.restart_limit} reached",
            )  # fmt: skip
            return False
        wait = _backoff_s(req, restarts)
        actions.wake(now_s + wait)
        _set_phase(
            actions, v, "Pending", "WorkerFailed",
            f"worker {names} failed; restart {restarts}/{req.restart_limit} in {wait:.0f} s",
        )  # fmt: skip
        return False
    reported = _reported_iterations(v.current)
    gpus = int(v.alloc.get("gpus", 0))
    all_done = bool(v.current) and len(v.current) == gpus
    all_done = all_done and all(_pod_phase(p) == "Succeeded" for p in v.current)
    if all_done or (reported is not None and reported >= req.iterations):
        v.new["conditions"] = set_condition(conditions, "Done", True, "Completed", "", now)
        v.new["completionTime"] = now
        progress = dict(v.status.get("progress") or {})
        progress.update(iterations=req.iterations, summary=f"{req.iterations}/{req.iterations}")
        v.new["progress"] = progress
        v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
        v.new["allocation"] = dict(v.alloc, gpus=0)
        for pod in v.current + v.other:
            if _pod_phase(pod) not in ("Succeeded", "Failed"):
                actions.delete_pods.append((v.ns, pod["metadata"]["name"], req.grace_s))
        _set_phase(actions, v, "Succeeded", "Completed", f"{req.iterations} iterations done")
        return False
    last_failure = parse_time(v.status.get("lastFailureTime"))
    if last_failure is not None and restarts and not v.current:
        ready_s = last_failure + _backoff_s(req, restarts)
        if now_s < ready_s:
            actions.wake(ready_s)
            return False
    if v.terminating or v.other:
        for pod in v.other:
            actions.delete_pods.append((v.ns, pod["metadata"]["name"], req.grace_s))
        _set_phase(actions, v, "Rescaling", "Rescaling", "waiting for old workers to stop")
        return False
    reason = too_large(req, cluster_gpus)
    v.new["conditions"] = set_condition(
        v.new["conditions"], "Schedulable", reason is None,
        "TooLargeForCluster" if reason else "Fits", reason or "", now,
    )  # fmt: skip
    if reason is not None:
        _set_phase(actions, v, "Pending", "TooLargeForCluster", reason)
        return False
    return True


def _core_job(
    v: _View, req: JobRequest, now_s: float, model: PerfModel, sizes: Mapping[str, int]
) -> Job:
    progress = int((v.status.get("progress") or {}).get("iterations", 0))
    running = bool(v.current)
    frequency = v.alloc.get("frequencyMHz") if running else None
    return Job(
        id=f"{req.namespace}/{req.name}",
        model=model,
        remaining_iterations=float(max(req.iterations - progress, 0)),
        global_batch_size=req.global_batch_size,
        requested_gpus=req.requested_gpus,
        arrival_s=req.created_s,
        elapsed_s=max(now_s - req.created_s, 0.0),
        min_gpus=req.min_gpus,
        max_gpus=req.max_gpus,
        max_local_batch_size=req.max_local_batch_size,
        placement=_placement(v.current, sizes) if running else (),
        frequency_mhz=None if frequency is None else int(frequency),
        model_name=req.model_name,
    )


def build_snapshot(
    views: Sequence[_View],
    nodes: tuple[Node, ...],
    budget: BudgetConfig,
    now_s: float,
    models: ModelFactory,
) -> Snapshot:
    sizes = {n.name: n.gpus for n in nodes}
    jobs: list[Job] = []
    held: set[GpuSlot] = set()
    for v in views:
        assert v.req is not None
        job = _core_job(v, v.req, now_s, models(v.req), sizes)
        if held & set(job.placement):  # two gangs claim a GPU: trust neither's placement
            job = Job(**{**job.__dict__, "placement": ()})
        held |= set(job.placement)
        jobs.append(job)
    return Snapshot(nodes=nodes, jobs=tuple(jobs), budget=budget.budget, now_s=now_s)


def _predict(model: PerfModel, n: int, gpn: int, bs: int, f: int) -> tuple[float, float]:
    args = (n, min(n, gpn), bs, f)
    t = float(np.asarray(model.step_time_s(*args)))
    e = float(np.asarray(model.energy_per_iter_j(*args)))
    return t, e


def _carry_out(
    actions: Actions,
    v: _View,
    jp: JobPlan,
    now_s: float,
    last_s: float | None,
    model: PerfModel,
    gpn: int,
) -> None:
    req = v.req
    assert req is not None
    alloc = v.alloc
    shape = (int(alloc.get("gpus", 0)), int(alloc.get("localBatchSize", 0)))
    if jp.gpus == 0:
        if v.current:
            _delete_all(actions, v, req.grace_s)
            _set_phase(actions, v, "Pending", "Preempted", "the policy gave the GPUs to others")
        else:
            _set_phase(actions, v, "Pending", "Waiting", "waiting for GPUs within the budget")
        v.new["allocation"] = dict(alloc, gpus=0, nodes=[])
        v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
        return
    if v.current and (jp.gpus, jp.local_batch_size) != shape:
        _delete_all(actions, v, req.grace_s)
        _set_phase(
            actions, v, "Rescaling", "Rescaling",
            f"checkpoint-restart from {shape[0]} to {jp.gpus} GPUs",
        )  # fmt: skip
        return
    if not v.current:
        generation = int(alloc.get("generation", 0)) + 1
        ws = WorkerSet(generation, jp.gpus, jp.local_batch_size, jp.frequency_mhz)
        actions.create.append(rendezvous_service(req))
        actions.create.extend(worker_pods(req, ws))
        v.new["allocation"] = {
            "gpus": jp.gpus,
            "frequencyMHz": jp.frequency_mhz,
            "localBatchSize": jp.local_batch_size,
            "generation": generation,
            "nodes": sorted({node for node, _ in jp.placement}),
        }
        v.new.setdefault("startTime", v.status.get("startTime") or format_time(now_s))
        _set_phase(
            actions, v, "Running", "Started",
            f"{jp.gpus} GPUs at {jp.frequency_mhz} MHz, local batch {jp.local_batch_size}",
        )  # fmt: skip
    else:
        generation = int(alloc.get("generation", 0))
        ws = WorkerSet(generation, jp.gpus, jp.local_batch_size, jp.frequency_mhz)
        have = {p["metadata"]["name"] for p in v.current}
        missing = [p for p in worker_pods(req, ws) if p["metadata"]["name"] not in have]
        if missing:
            actions.create.append(rendezvous_service(req))
            actions.create.extend(missing)
        if int(alloc.get("frequencyMHz", 0)) != jp.frequency_mhz:
            for pod in v.current:
                annotations = {contract.FREQUENCY_ANNOTATION: str(jp.frequency_mhz)}
                actions.annotate_pods.append((v.ns, pod["metadata"]["name"], annotations))
            _event(
                actions, v, "Normal", "FrequencyChanged",
                f"{alloc.get('frequencyMHz')} -> {jp.frequency_mhz} MHz",
            )  # fmt: skip
        nodes = sorted({str(p.get("spec", {}).get("nodeName")) for p in v.current} - {"None"})
        v.new["allocation"] = dict(alloc, frequencyMHz=jp.frequency_mhz, nodes=nodes)
        _set_phase(actions, v, "Running", "Running", f"{jp.gpus} GPUs at {jp.frequency_mhz} MHz")
    actions.allocated_gpus += jp.gpus
    # Progress and energy: reported iterations when the trainer writes them,
    # otherwise the model's throughput integrated since the last pass.
    t, e = _predict(model, jp.gpus, gpn, jp.local_batch_size, jp.frequency_mhz)
    if not (math.isfinite(t) and math.isfinite(e) and t > 0):
        return
    dt = 0.0 if last_s is None or not v.current else max(now_s - last_s, 0.0)
    progress = dict(v.status.get("progress") or {})
    energy = dict(v.status.get("energy") or {})
    done = float(progress.get("iterations", 0))
    reported = _reported_iterations(v.current)
    done = float(reported) if reported is not None else min(done + dt / t, req.iterations - 1.0)
    iterations = int(max(done, 0))
    progress.update(
        iterations=iterations,
        throughput=round(1.0 / t, 6),
        estimatedCompletion=format_time(now_s + (req.iterations - iterations) * t),
        summary=f"{iterations}/{req.iterations}",
    )
    energy.update(joules=round(float(energy.get("joules", 0.0)) + e / t * dt, 3))
    energy["watts"] = round(e / t, 3)
    v.new["progress"] = progress
    v.new["energy"] = energy


def reconcile(
    observed: Sequence[Observed],
    nodes: tuple[Node, ...],
    budget: BudgetConfig,
    now_s: float,
    policy: Policy,
    models: ModelFactory,
    last_pass_s: Mapping[str, float] | None = None,
) -> Actions:
    """Decide everything one pass of the allocation loop does (see module docstring)."""
    actions = Actions()
    cluster_gpus = sum(n.gpus for n in nodes)
    gpn = max((n.gpus for n in nodes), default=1)
    views: list[_View] = []
    for obs in observed:
        status: DLJobStatus = dict(obs.body.get("status") or {})  # type: ignore[assignment]
        v = _View(obs, status, {})
        generation = int(v.alloc.get("generation", 0))
        for pod in obs.pods:
            if pod.get("metadata", {}).get("deletionTimestamp"):
                v.terminating.append(pod)
            elif _generation(pod) == generation:
                v.current.append(pod)
            else:
                v.other.append(pod)
        views.append(v)
    runnable = [v for v in views if _lifecycle(actions, v, now_s, cluster_gpus)]
    if runnable and not nodes:
        for v in runnable:
            _set_phase(actions, v, "Pending", "NoGPUNodes", "no schedulable GPU nodes")
        runnable = []
    if runnable:
        try:
            snapshot = build_snapshot(runnable, nodes, budget, now_s, models)
            plan = policy.plan(snapshot)
        except PowerFlowError as exc:
            actions.notes.append(f"policy refused the snapshot: {exc}")
            plan = None
        actions.plan = plan
        for v in runnable:
            if plan is None:
                continue
            req = v.req
            assert req is not None
            try:
                jp = plan.job(f"{req.namespace}/{req.name}")
            except KeyError:
                jp = JobPlan(f"{req.namespace}/{req.name}", 0, 0, 0)
            last = (last_pass_s or {}).get(f"{req.namespace}/{req.name}")
            _carry_out(actions, v, jp, now_s, last, models(req), gpn)
    for v in views:
        if not v.new:
            continue
        observed_generation = int(v.meta.get("generation", 1))
        v.new["observedGeneration"] = observed_generation
        patch = merge_diff(dict(v.status), v.new)
        if patch:
            actions.status.append((v.ns, v.name, patch))
        actions.phases[str(v.new.get("phase", v.status.get("phase", "Pending")))] += 1
    return actions
