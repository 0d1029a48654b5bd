"""One pass of the allocation loop as a pure function: cluster state in, actions out.

``reconcile`` looks at every DLJob with its pods (``job_view``), settles each
job's lifecycle (invalid, failed, backing off, done: ``lifecycle``), builds the
core snapshot of the runnable ones (a job whose old workers still stop among
them: it is planned, and started once they are gone, ``_stopping``;
``pass_snapshot``), asks the policy for a plan and writes each job's allocation into its
status (``carry_out``); the job controller brings each job's pods to that
allocation (``job_controller.converge``: creations and annotation updates), and
graceful deletions, status patches and events follow (``pass_progress``; what a
pass wants done is an ``Actions``).
This module holds the order of those steps and the guard around each job's.
It holds no state: what it needs to remember lives in DLJob status and pod
names and annotations, so a restarted operator carries on where it stopped
(the optional ``RequestCache`` and progress anchors only save work; the
previous pass's refused writes, ``refused``, are news that the pass records in
status, backoff included). Each job's steps run under a guard: an unexpected
exception for one job is reported on that job and the others proceed.
All scheduling decisions are the policy's.

Profiling (paper §5): a job that starts on a GPU count it has not run on
before on the GPU type of the plan's nodes is ``Profiling`` for
``profiling_window_s`` once all its workers run (the node agent slices the
window across clocks); meanwhile it is pinned in the snapshot (when the
extender's placement is known), and the window's end is a scheduling event
(``Actions.wake_at_s``) after which it is ``Running`` and the count is in
``status.model.profiledGpuCountsByType`` under that type (``profiled``). While
the window runs, the workers carry the sweep plan for the node agent
(``contract.PROFILE_ANNOTATION``, ``profile_plan``); it is removed when the
window ends (``job_controller.converge``).

Learning. The caller passes what the online refit knows (``learned``: the
``status.model`` fields per job, from ``learning.SampleStore``); reconcile
writes them in the job's status patch when the fit changed, and otherwise
only along with a write the job gets anyway, so a stream of samples costs no
extra writes (``_learned_model``).

Generations. Every allocation is a generation of workers (pod names carry
it). Its record in ``status.allocation`` is written before any of its pods
is created or deleted (``Actions.writes``), and says whether the gang was
ever complete and whether the operator stopped it; so a pass that dies
between two writes is finished by the next one without churn: workers of an
unfinished generation are created under the same names, a stopped
generation's survivors are deleted again, no failure is counted twice. Once
the gang was complete, a lost worker (failed, evicted, deleted) restarts the
generation, counted against ``restart.limit``: torchrun's rendezvous is
static, so a worker recreated alone would wait for peers that never rejoin.
A worker stuck terminating past its grace period plus
``STUCK_TERMINATION_S`` is reported (condition ``WorkersStuck``) and the job
waits for it (``_stuck`` says why it does not start elsewhere).

Migrations. The extender, not the operator, binds a gang's GPUs: the
plan's block, which every worker carries (``contract.PLANNED_BLOCK_ANNOTATION``),
when it is free, else the free aligned block that fits best; so the policy's
placement is carried out through what the operator creates and deletes and
that hint, and a new generation waits a little for workers being deleted to
free its planned GPUs (``_wait_for_room``). When the plan gives
a running job the same GPU count on other GPUs (a ``Plan.migrations``
entry, for PowerFlow's placement: to make room for a gang that would not fit
otherwise), the job is checkpoint-restarted like a rescale (not counted
against ``restart.limit``) and the extender places its new gang in the room
left. The alternative, planning with every running job pinned to its GPUs,
is not possible without losing rescaling: ``Job.pinned`` also freezes the
GPU count, so no budget change could shrink a running job, and a new gang
that only fits after a move would wait for ever. Placement moves a job only
when the space is needed (``powerflow.core.policy.placement``), so a migration
costs one checkpoint-restart of one job where the other choice leaves a gang
pending. A job that is profiling is pinned and never moved; a job whose GPUs
are unknown (no placement annotation yet) is never moved either, nor a job
whose GPUs the plan gives to no other job (a move only to pack jobs tighter
is not worth a checkpoint-restart).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import BudgetConfig
from powerflow.operator.carry_out import _carry_out, _converge, _leaving
from powerflow.operator.job_controller import Profiling
from powerflow.operator.job_view import _event, _set_phase, _View
from powerflow.operator.jobs import (
    object_generation,
    parse_dljob,
)
from powerflow.operator.learning import OTHER_TYPES
from powerflow.operator.lifecycle import _lifecycle
from powerflow.operator.pass_inputs import DEFAULT_SETTINGS, NO_MEMORY, PassMemory, PassSettings
from powerflow.operator.pass_progress import _account_all, _account_one
from powerflow.operator.pass_snapshot import (
    ModelFactory,
    build_snapshot,
    pool_nodes,
)
from powerflow.operator.profiled import ProfileWindow, node_types
from powerflow.operator.status import merge_diff, set_condition

from powerflow.core.backend import schedule_once
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import GpuSpec, tunes
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.fleet import model_on
from powerflow.core.policy.snapshot import Job, JobPlan, Node, Plan, Policy, Snapshot
from powerflow.core.timefmt import format_time

log = logging.getLogger(__name__)


@dataclass
class _PassBackend:
    """The operator's side of the core's ``Backend`` seam for one pass.

    The snapshot is built from what the pass observed; the plan is carried out
    by the caller through ``Actions``, so ``apply`` only records it. Going
    through ``schedule_once`` keeps the one place where any policy is called
    shared with the simulator.
    """

    observed_snapshot: Snapshot
    applied: Plan | None = None

    def snapshot(self) -> Snapshot:
        return self.observed_snapshot

    def apply(self, plan: Plan) -> None:
        self.applied = plan


class _Guard:
    """Contain each job's failures to that job (``reconcile``'s per-job steps).

    An exception from one job's step (a bug, or a body the validation missed)
    undoes what that step added to ``Actions`` and becomes a ``Reconciled``
    condition (reason ``InternalError``, the exception's one-line text) and a
    Warning event on that job; the job sits out the pass and the others go on.
    """

    def __init__(self, actions: Actions, now_s: float) -> None:
        self.actions = actions
        self.now_s = now_s
        self.failed: set[str] = set()

    def run(self, v: _View, step: Callable[..., bool], *args: Any) -> bool:
        a = self.actions
        marks = (
            len(a.delete_pods), len(a.create), len(a.annotate_pods), len(a.events),
            a.allocated_gpus,
        )  # fmt: skip
        try:
            return step(*args)
        except Exception as exc:
            del a.delete_pods[marks[0] :], a.create[marks[1] :], a.annotate_pods[marks[2] :]
            del a.events[marks[3] :]
            a.allocated_gpus = marks[4]
            self.fail(v, exc)
            return False

    def fail(self, v: _View, exc: Exception) -> None:
        self.failed.add(v.key)
        self.actions.anchors.pop(v.key, None)
        try:
            text = str(exc)
        except Exception:  # a str() that raises must not escape either
            text = ""
        lines = text.strip().splitlines()
        message = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
        conditions = v.status.get("conditions") or []
        before: Mapping[str, Any] = next(
            (c for c in conditions if c.get("type") == "Reconciled"), {}
        )
        # What the step decided is dropped: the status gets only this condition.
        v.new = {}
        v.new["conditions"] = set_condition(
            conditions, "Reconciled", False, "InternalError", message, format_time(self.now_s)
        )
        if (before.get("reason"), before.get("message")) != ("InternalError", message):
            # Once per distinct error (the condition remembers it), with the traceback.
            _event(self.actions, v, "Warning", "InternalError", message)
            log.error("%s: internal error, job skipped this pass", v.key, exc_info=exc)


def reconcile(
    observed: Sequence[Observed],
    nodes: tuple[Node, ...],
    budget: BudgetConfig,
    now_s: float,
    policy: Policy,
    models: ModelFactory,
    memory: PassMemory = NO_MEMORY,
    settings: PassSettings = DEFAULT_SETTINGS,
) -> Actions:
    """Decide everything one pass of the allocation loop does (see module docstring),
    from what was observed, the ``memory`` the controller keeps between passes and its
    ``settings``. Each job's steps run under a ``_Guard``: one job's failure never
    stops the others.

    ``nodes`` of several pools (``nodes.fleet_nodes``, planned by ``FleetPolicy``):
    ``models`` as ``TypedModels`` gives each job's model on each type but the first
    node's (``build_snapshot``), ``settings.pool_labels`` each node's GPU product label,
    which new workers are pinned to (``job_controller.converge``); a job larger than
    every pool is too large (a gang runs within one pool).
    """
    pools = settings.pool_labels
    anchors, requests, refused_of = memory.anchors, memory.requests, memory.refused
    progress_written, learned = memory.progress_written, memory.learned
    agent_progress = memory.agent_progress
    progress_interval_s = settings.progress_interval_s
    # A pool of a type PowerFlow does not know is planned for GPU counts only: no
    # clock, cap or profiling sweep reaches its GPUs (``nodes``' module docstring).
    pool_gpus: dict[tuple[str, int], int] = {}
    types: dict[str, GpuSpec] = {}
    for n in nodes:
        key = (n.gpu.name, n.gpus)
        pool_gpus[key] = pool_gpus.get(key, 0) + n.gpus
        types.setdefault(n.gpu.name, n.gpu)
    tuned = all(tunes(gpu) for gpu in types.values())
    if not tuned:
        settings = replace(settings, profiling_window_s=0.0)
    profiling_window_s, profile_sweep = settings.profiling_window_s, settings.profile_sweep
    actions = Actions()
    guard = _Guard(actions, now_s)
    cluster_gpus = max(pool_gpus.values(), default=0)  # a gang runs within one pool
    parse = parse_dljob if requests is None else requests.parse
    refused = refused_of or {}
    views = [_View(obs, agent_progress or {}) for obs in observed]
    runnable = [
        v
        for v in views
        if guard.run(v, _lifecycle, actions, v, now_s, cluster_gpus, parse, refused.get(v.key, ()))
    ]
    if requests is not None:
        requests.retain_seen()
    if runnable and not nodes:
        for v in runnable:
            _set_phase(actions, v, "Pending", "NoGPUNodes", "no schedulable GPU nodes")
        runnable = []
    if runnable:
        plan: Plan | None = None
        snapshot = build_snapshot(
            runnable, nodes, budget, now_s, models, memory, settings, guard.fail
        )
        runnable = [v for v in runnable if v.key not in guard.failed]
        try:
            plan = schedule_once(policy, _PassBackend(snapshot))
        except PowerFlowError as exc:
            actions.notes.append(f"policy refused the snapshot: {exc}")
        if plan is not None and not tuned:
            plan = replace(plan, jobs=tuple(replace(jp, power_cap_w=None) for jp in plan.jobs))
        actions.plan = plan
        if plan is not None:
            by_id = {jp.job_id: jp for jp in plan.jobs}
            jobs = plan.jobs
            claimed = functools.cache(
                lambda: {slot: jp.job_id for jp in jobs for slot in jp.placement}
            )
            held = []
            gpus_of = {n.name: n.gpu for n in nodes}
            sweep = Profiling(profiling_window_s, profile_sweep, gpus_of, nodes[0].gpu)
            kinds = node_types(nodes)
            # Jobs with workers first, so that a job that starts knows which GPUs this
            # pass frees (``_wait_for_room``); computed once, at the first start: only
            # jobs with workers delete in this loop, and ``_lifecycle`` deleted before it.
            zipped = list(zip(runnable, snapshot.jobs, strict=True))
            pairs = [p for p in zipped if p[0].current] + [p for p in zipped if not p[0].current]
            leaving = functools.cache(lambda: _leaving(views, actions, now_s))
            window = ProfileWindow(profiling_window_s, kinds)
            for v, job in pairs:
                jp = by_id.get(v.key) or JobPlan(v.key, 0, 0, 0)
                if v.stopping:  # planned, so its GPUs go to no other job; it starts later
                    continue
                seen = () if job.pinned else job.placement
                if guard.run(
                    v,
                    _carry_out,
                    actions,
                    v,
                    jp,
                    now_s,
                    window,
                    seen,
                    claimed,
                    leaving,
                ) and guard.run(v, _converge, actions, v, now_s, sweep, tuned, pools):
                    held.append((v, jp))
            held = [(v, jp) for v, jp in held if v.key not in guard.failed]
            rate = (progress_interval_s, progress_written)
            for gpn, in_pool, job_models in _by_pool(held, snapshot.jobs, nodes, len(pool_gpus)):
                try:  # batched (one model call per model); on a failure, job by job
                    _account_all(actions, in_pool, job_models, gpn, now_s, anchors or {}, *rate)
                except Exception:  # the guard below names the job at fault
                    for v, jp in in_pool:
                        one = [(v, jp)]
                        guard.run(
                            v,
                            _account_one,
                            actions,
                            one,
                            job_models,
                            gpn,
                            now_s,
                            anchors or {},
                            *rate,
                        )
    for v in views:
        fields = (learned or {}).get(v.key)
        if fields is not None and v.key not in guard.failed:
            guard.run(v, _learned_model, v, fields)
        if not guard.run(v, _finish, actions, v, v.key not in guard.failed, now_s) and v.new:
            actions.status.append((v.ns, v.name, {"conditions": v.new["conditions"]}))
    return actions


def _by_pool(
    held: Sequence[tuple[_View, JobPlan]],
    jobs: Sequence[Job],
    nodes: Sequence[Node],
    pool_count: int,
) -> list[tuple[int, Sequence[tuple[_View, JobPlan]], dict[str, PerfModel]]]:
    """The jobs holding GPUs by the pool their plan puts them in, each pool's GPUs per node
    and each job's model on the pool's type (``fleet.model_on``): progress and energy are
    predicted with its own pool's node size and type. One pool (``pool_count``): all of
    them, with their snapshot models (a job planned without placement counts in the
    first node's pool)."""
    if pool_count <= 1:
        gpn = max((n.gpus for n in nodes), default=1)
        return [(gpn, held, {job.id: job.model for job in jobs})]
    pool_of = pool_nodes(nodes)
    first = pool_of[nodes[0].name]
    groups: dict[str, tuple[tuple[Node, ...], list[tuple[_View, JobPlan]]]] = {}
    for v, jp in held:
        pool = pool_of.get(jp.placement[0][0], first) if jp.placement else first
        groups.setdefault(pool[0].name, (pool, []))[1].append((v, jp))
    by_id = {job.id: job for job in jobs}
    return [
        (pool[0].gpus, in_pool, {v.key: model_on(by_id[v.key], pool[0].gpu) for v, _ in in_pool})
        for pool, in_pool in groups.values()
    ]


_FIT_FIELDS = ("params", "fits", OTHER_TYPES)


def _learned_model(v: _View, fields: Mapping[str, Any]) -> bool:
    """Put the online refit's ``status.model`` fields into the job's new status.

    A new fit (``params``, ``fits`` or the fits on other types, ``otherGpuTypes``,
    differ from status, or bad ones to remove) is written at once; the sample
    count and fit error, which change with every window, only ride along with a
    write the job gets anyway (progress comes every ``progress_interval_s``), so
    samples cost no status writes of their own. Always True (a ``_Guard`` step).
    """
    current: Mapping[str, Any] = v.status.get("model") or {}
    refit = any(k in fields and current.get(k) != fields[k] for k in _FIT_FIELDS)
    if refit or merge_diff(v.status, v.new):
        v.new["model"] = {**(v.new.get("model") or {}), **fields}
    return True


def _finish(actions: Actions, v: _View, healthy: bool, now_s: float) -> bool:
    """The job's status patch (what changed) and its phase count."""
    if healthy:
        conditions = v.status.get("conditions") or []
        if conditions and any(  # a new job has none: no generator for it
            c.get("type") == "Reconciled" and c.get("status") != "True" for c in conditions
        ):
            now = format_time(now_s)
            v.new["conditions"] = set_condition(
                v.new.get("conditions", conditions), "Reconciled", True, "Reconciled", "", now
            )
    if not v.new:
        return True
    v.new["observedGeneration"] = object_generation(v.meta)
    patch = merge_diff(v.status, v.new)
    if patch:
        (actions.status_first if v.first else actions.status).append((v.ns, v.name, patch))
    actions.phases[str(v.new.get("phase", v.status.get("phase", "Pending")))] += 1
    return True
