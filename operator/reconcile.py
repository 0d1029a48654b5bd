"""One pass of the allocation loop as a pure function: cluster state in, actions out.

``reconcile`` looks at every DLJob with its pods, settles each job's lifecycle
(invalid, failed, backing off, done), builds the core snapshot of the runnable
ones (a job whose old workers still stop among them: it is planned, and started
once they are gone, ``_stopping``), asks the policy for a plan and turns the
plan into pod creations, graceful deletions, annotation updates, status patches
and events.
It holds no state: what it needs to remember lives in DLJob status and pod
names and annotations, so a restarted operator carries on where it stopped
(the optional ``RequestCache`` and progress anchors only save work; the
previous pass's refused writes, ``refused``, are news that the pass records in
status, backoff included). Each job's steps run under a guard: an unexpected
exception for one job is reported on that job and the others proceed.
All scheduling decisions are the policy's.

Profiling (paper §5): a job that starts on a GPU count it has not run on
before is ``Profiling`` for ``profiling_window_s`` once all its workers run
(the node agent slices the window across clocks); meanwhile it is pinned in
the snapshot (when the extender's placement is known), and the window's end
is a scheduling event (``Actions.wake_at_s``) after which it is ``Running``
and the count is in ``status.model.profiledGpuCounts``. While the window
runs, the workers carry the sweep plan for the node agent
(``contract.PROFILE_ANNOTATION``, ``profile_plan``); it is removed when the
window ends (``_profile_plans``).

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
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from powerflow.operator.bodies import (
    Allocation,
    Condition,
    DLJobBody,
    DLJobStatus,
    Meta,
    PodBody,
    ServiceBody,
)
from powerflow.operator.budget import BudgetConfig
from powerflow.operator.jobs import (
    DEFAULT_GRACE_S,
    JobRequest,
    RequestCache,
    object_generation,
    parse_dljob,
    too_large,
)
from powerflow.operator.learning import MeasuredPower
from powerflow.operator.parking import NodeMark
from powerflow.operator.power_order import cap_annotation, lowers
from powerflow.operator.profile_plan import plan_annotation
from powerflow.operator.progress import Running, account
from powerflow.operator.refusals import Refusal, backoff_s
from powerflow.operator.status import merge_diff, set_condition
from powerflow.operator.workers import WorkerSet, pod_name, rendezvous_service, worker_pods

from powerflow.core import contract, untrusted
from powerflow.core.backend import schedule_once
from powerflow.core.errors import PowerFlowError, ResourceError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.buddy import is_aligned_block
from powerflow.core.policy.snapshot import GpuSlot, Job, JobPlan, Node, Plan, Policy, Snapshot
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep
from powerflow.core.timefmt import format_time, format_time_ms, parse_time

log = logging.getLogger(__name__)
ModelFactory = Callable[[JobRequest], PerfModel]
TERMINAL_REASONS = ("Completed", "RestartLimitExceeded")
DEFAULT_PROFILING_WINDOW_S = 240.0
DEFAULT_PROGRESS_INTERVAL_S = 30.0
STUCK_TERMINATION_S = 300.0
"""How long after its grace period a terminating worker counts as stuck (see ``_stuck``)."""
ROOM_WAIT_S = 120.0
"""The longest a new generation waits for workers being deleted to free its planned GPUs
(``_wait_for_room``): twice the default grace period, short next to a training job."""


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


Write = tuple[str, tuple[Any, ...]]
"""One API write: a verb (``status``, ``delete``, ``create``, ``annotate``, ``node``) and its
arguments."""


@dataclass
class Actions:
    """What one pass wants done; ``writes`` gives the order."""

    delete_pods: list[tuple[str, str, int]] = field(default_factory=list)
    create: list[PodBody | ServiceBody] = field(default_factory=list)
    annotate_pods: list[tuple[str, str, dict[str, str | None]]] = field(default_factory=list)
    """Pod annotation merge patches (``None`` removes the annotation) that may raise power."""
    annotate_first: list[tuple[str, str, dict[str, str | None]]] = field(default_factory=list)
    """Pod annotation patches that only lower power (``power_order.lowers``): written with
    the deletions, before anything that raises power."""
    status: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    status_first: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """Status patches of jobs that start, stop or finish a generation: written before any pod."""
    events: list[Event] = field(default_factory=list)
    wake_at_s: float | None = None
    plan: Plan | None = None
    phases: Counter[str] = field(default_factory=Counter)
    allocated_gpus: int = 0
    notes: list[str] = field(default_factory=list)
    anchors: dict[str, float] = field(default_factory=dict)
    """Progress anchors of the jobs whose workers run (see ``progress``)."""
    node_marks: list[NodeMark] = field(default_factory=list)
    """Nodes to mark or unmark as powered down: ``parking.node_marks`` of the pass's plan,
    added by the controller (the node bodies are not ``reconcile``'s input)."""

    def wake(self, at_s: float) -> None:
        self.wake_at_s = at_s if self.wake_at_s is None else min(self.wake_at_s, at_s)

    def writes(self) -> list[list[Write]]:
        """The pass's API writes as phases, each finished before the next begins.

        1. the status of jobs that start, stop or finish a generation: the
           generation and whether it is stopped are recorded before any of its pods is
           created or deleted, so an operator that dies anywhere later finds
           pods its status explains (it neither deletes pods it just made nor
           creates a name twice, nor counts one failure twice);
        2. deletions (old workers stop before new ones start), annotations that only
           lower power (a lower clock, a new or lower power cap, a sweep's end), and
           the powered-down marks of nodes the plan uses again (gone before their
           workers come): power goes down before anything raises it;
        3. creations: Services and pods together (a worker may exist before its
           headless Service; its DNS name resolves once the Service does and
           torchrun's rendezvous retries), each name once;
        4. annotations that may raise power (a higher clock, a higher or removed
           cap, a sweep's plan), then every other status patch;
        5. the powered-down marks of nodes the plan no longer uses (``parking``).

        ``Kube.apply`` carries them out; tests crash between any two of them.
        """
        unique = {(b["metadata"]["namespace"], b["kind"], b["metadata"]["name"]): b
                  for b in self.create}  # fmt: skip
        unmark = [("node", (m,)) for m in self.node_marks if not m.powered_down]
        return [
            [("status", args) for args in self.status_first],
            [("delete", args) for args in self.delete_pods]
            + [("annotate", args) for args in self.annotate_first]
            + unmark,
            [("create", (body,)) for body in unique.values()],
            [("annotate", args) for args in self.annotate_pods],
            [("status", args) for args in self.status],
            [("node", (m,)) for m in self.node_marks if m.powered_down],
        ]


class _View:
    """One DLJob during a pass: what was observed, and the status it should get (``new``)."""

    __slots__ = (
        "agent_done_at", "agent_reported", "alloc", "current", "first", "key", "meta", "name",
        "new", "ns", "obs", "other", "reported", "req", "running", "status", "stopping",
        "terminating",
    )  # fmt: skip

    def __init__(
        self, obs: Observed, agent_progress: Mapping[str, tuple[int, int, float | None]]
    ) -> None:
        self.obs = obs
        meta: Any = obs.body.get("metadata")
        self.meta: Meta = cast(Meta, meta if isinstance(meta, dict) else {})
        self.ns = str(self.meta.get("namespace", "default"))
        self.name = str(self.meta.get("name", ""))
        self.key = f"{self.ns}/{self.name}"
        self.status: DLJobStatus = _clean_status(obs.body.get("status"))
        self.alloc: Allocation = self.status.get("allocation") or {}
        self.new: dict[str, Any] = {}
        self.req: JobRequest | None = None
        self.current: list[PodBody] = []
        self.other: list[PodBody] = []
        self.terminating: list[PodBody] = []
        self.reported: int | None = None
        self.first = False  # starts or stops a generation: its status goes before its pods
        self.stopping = False  # old workers still stop: planned, but nothing carried out
        generation = int(self.alloc.get("generation", 0))
        for pod in obs.pods:
            if pod.get("metadata", {}).get("deletionTimestamp"):
                self.terminating.append(pod)
            elif _generation(pod) == generation:
                self.current.append(pod)
            else:
                self.other.append(pod)
        reported = agent_progress.get(self.key)
        ours = reported is not None and reported[0] == generation
        self.agent_reported = reported[1] if reported and ours else None
        """What the agents reported of the current generation (``reported_progress``)."""
        self.agent_done_at = reported[2] if reported and ours else None
        """When that count reached the job's iterations (None: not yet)."""
        gpus = int(self.alloc.get("gpus", 0))
        # Every worker of the current allocation runs: profiling and progress count.
        self.running = (
            bool(self.current)
            and len(self.current) == gpus
            and all(_pod_phase(p) == "Running" for p in self.current)
        )


def _count(value: Any, default: int = 0) -> int:
    """A non-negative integer written by someone else (status field, annotation).

    ``default`` for anything else: ``int()`` of a float ``1e400`` (inf) raises
    ``OverflowError``, of ``"1e400"`` or 5,000 digits ``ValueError``, of a
    dict ``TypeError``; none of it may stop a pass. Strings of digits count
    (annotations are strings); values past int64 do not.
    """
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if 0 <= value < 1 << 63 else default
    if isinstance(value, float):
        ok = math.isfinite(value) and value.is_integer() and 0 <= value < 2.0**63
        return int(value) if ok else default
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return default


def _clean_status(raw: Any) -> DLJobStatus:
    """The DLJob's status with every field the operator reads of the type it reads.

    Status is ours, but anyone with ``patch`` on ``dljobs/status`` can write
    junk within the schema's types (an integer past int64, a float where
    bounds are not checked), and bodies from older CRDs skip the schema.
    Junk reads as absent, or 0 for counters (the status patch then rewrites
    it where the operator has something to say). Returns ``raw`` itself when it is clean,
    the common case.
    """
    if not isinstance(raw, dict):
        return {}
    status: dict[str, Any] = raw
    fixes: dict[str, Any] = {}
    if "restarts" in status and _count(status["restarts"], -1) < 0:
        fixes["restarts"] = 0
    for key in (
        "phase", "message", "lastFailureTime", "startTime", "lastCreateRefusalTime", "roomWaitSince"
    ):  # fmt: skip
        if key in status and not isinstance(status[key], str):
            fixes[key] = None
    if "createRefusals" in status and _count(status["createRefusals"], -1) < 0:
        fixes["createRefusals"] = 0
    conditions = status.get("conditions")
    if conditions is not None and not (
        isinstance(conditions, list) and all(isinstance(c, dict) for c in conditions)
    ):
        fixes["conditions"] = (
            [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []
        )
    for group, ints in (
        ("allocation", ("gpus", "frequencyMHz", "localBatchSize", "generation")),
        ("progress", ("iterations",)),
    ):
        sub = status.get(group)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            fixes[group] = {}
            continue
        bad: dict[str, Any] = {k: 0 for k in ints if k in sub and _count(sub[k], -1) < 0}
        if group == "allocation":
            nodes = sub.get("nodes")
            if nodes is not None and not (
                isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)
            ):
                bad["nodes"] = []
        if bad:
            fixes[group] = {**sub, **bad}
    energy = status.get("energy")
    if energy is not None:
        if not isinstance(energy, dict):
            fixes["energy"] = {}
        else:
            bad = {
                k: 0
                for k in ("joules", "watts")
                if k in energy and not _finite_non_negative(energy[k])
            }
            if bad:
                fixes["energy"] = {**energy, **bad}
    model = status.get("model")
    if model is not None:
        counts = model.get("profiledGpuCounts") if isinstance(model, dict) else None
        if not isinstance(model, dict):
            fixes["model"] = {}
        elif counts is not None and not (
            isinstance(counts, list) and all(_count(n) > 0 for n in counts)
        ):
            good = [_count(n) for n in counts if _count(n) > 0] if isinstance(counts, list) else []
            fixes["model"] = {**model, "profiledGpuCounts": good}
    if not fixes:
        return cast(DLJobStatus, raw)
    clean = {**status, **fixes}
    return cast(DLJobStatus, {k: v for k, v in clean.items() if v is not None})


def _finite_non_negative(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):  # math.isfinite of an int past float range raises
        return 0 <= value < 1 << 63
    return math.isfinite(value) and value >= 0


def _pod_phase(pod: PodBody) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def _annotation(pod: PodBody, key: str) -> str | None:
    return (pod.get("metadata", {}).get("annotations") or {}).get(key)


def _generation(pod: PodBody) -> int:
    """The pod's allocation generation; -1 when absent or junk (never ours then)."""
    return _count(_annotation(pod, contract.GENERATION_ANNOTATION), -1)


def _reported_iterations(pods: Sequence[PodBody], agents: int | None) -> int | None:
    """The most iterations reported: by the node agents (``agents``), or in a worker's
    progress annotation, which a trainer with the right to patch its pod may write;
    junk there (``1e400``, 5,000 digits) is ignored."""
    best: int | None = agents
    for pod in pods:
        value = _count(_annotation(pod, contract.PROGRESS_ANNOTATION), -1)
        if value >= 0:
            best = value if best is None else max(best, value)
    return best


def _done_by_count(actions: Actions, v: _View, req: JobRequest, now_s: float) -> bool:
    """The agents' count reached the job's iterations: done once a worker has exited
    (the others are leaving too: data-parallel ranks end together, and one waiting on a
    rank that left never ends) or none runs, or else the workers' grace period after
    the count arrived. A trainer saves and evaluates after its last step, which the
    count reports at once; its pods are not deleted under it before that, and a
    trainer hung in its teardown still ends then."""
    if v.agent_reported is None or v.agent_reported < req.iterations:
        return False
    phases = [_pod_phase(p) for p in v.current]
    if "Succeeded" in phases or "Running" not in phases:
        return True
    since = v.agent_done_at if v.agent_done_at is not None else now_s
    if now_s - since >= req.grace_s:
        return True
    actions.wake(since + req.grace_s)
    return False


@functools.lru_cache(maxsize=4096)
def _block(raw: str) -> tuple[GpuSlot, ...]:
    """The GPUs of one placement annotation (empty if malformed).

    Memoised across passes: the annotation never changes once the extender
    bound the pod, and every pod of a gang carries the same one. Read by
    ``powerflow.core.untrusted.parse_block`` (any text, nesting and huge numbers
    included, is a block or an error), and a malformed one is logged here once
    per distinct value: the cache keeps it from repeating every pass.
    """
    try:
        return untrusted.parse_block(raw, "placement annotation")
    except untrusted.UntrustedTextError as exc:
        log.warning("ignoring a malformed placement annotation: %s", exc)
        return ()


def _placement(pods: Sequence[PodBody], sizes: Mapping[str, int]) -> tuple[GpuSlot, ...]:
    """The gang's GPUs from the extender's placement annotation, if complete and sane."""
    slots: set[GpuSlot] = set()
    for pod in pods:
        raw = _annotation(pod, contract.PLACEMENT_ANNOTATION)
        block = _block(raw) if raw else ()
        if not block:
            return ()
        slots.update(block)
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
    warn = phase == "Failed" or reason in ("WorkerFailed", "InvalidSpec", "TerminationStuck")
    changed = v.status.get("phase") != phase
    if changed or (warn and v.status.get("message") != message):
        _event(actions, v, "Warning" if warn else "Normal", reason, message)
    v.new["phase"] = phase
    v.new["message"] = message


def _delete_all(actions: Actions, v: _View, grace_s: int | None) -> None:
    """Delete every live worker; the current generation is stopped (see ``_stop``).

    ``grace_s`` None: each pod's own grace period (``_pod_grace``), for when the
    job's spec gives none (invalid, or the job is over). Never 0: a force delete
    gives no SIGTERM window to checkpoint, and on an unreachable node the process
    keeps running while the next generation starts.
    """
    if v.current:
        _stop(v)
    for pod in v.current + v.other:
        grace = _pod_grace(pod) if grace_s is None else grace_s
        actions.delete_pods.append((v.ns, pod["metadata"]["name"], grace))


def _pod_grace(pod: PodBody) -> int:
    """The pod's ``terminationGracePeriodSeconds`` (set from the job's spec when it was
    created; the API server always fills it), else the DLJob default."""
    grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0:
        return grace
    return DEFAULT_GRACE_S


def _stop(v: _View) -> None:
    """Mark the current generation stopped: none of its pods is created again, a
    failure is not counted again, and its survivors are deleted on every pass
    until they are gone. Written before the deletions (``Actions.writes``)."""
    base = v.new.get("allocation") or v.alloc
    v.new["allocation"] = {**base, "stopped": True}
    v.first = True


def _backoff_s(req: JobRequest, restarts: int) -> float:
    # The exponent is capped: 2 ** (a restart count of 10**18 from a junk status) never ends.
    return float(min(req.max_backoff_s, req.backoff_s * 2 ** min(max(restarts - 1, 0), 40)))


def _lifecycle(
    actions: Actions,
    v: _View,
    now_s: float,
    cluster_gpus: int,
    parse: Callable[[DLJobBody], JobRequest],
    refused: Sequence[Refusal] = (),
) -> bool:
    """Settle everything but the allocation; True when the policy plans the job (its
    plan is carried out unless ``v.stopping``: its old workers still stop).

    ``refused`` are the writes of this job the API server refused in the
    previous pass (see ``refusals``).
    """
    now = format_time(now_s)
    phase = v.status.get("phase")
    conditions = v.status.get("conditions") or []  # never mutated: set_condition copies
    if phase in ("Succeeded", "Failed") and _reason(conditions, "Done") in TERMINAL_REASONS:
        if phase == "Failed":
            _delete_all(actions, v, None)
        else:  # a pass that recorded the success may have died before deleting them
            for pod in v.current + v.other:
                if _pod_phase(pod) not in ("Succeeded", "Failed"):
                    actions.delete_pods.append((v.ns, pod["metadata"]["name"], _pod_grace(pod)))
        return False
    generation = object_generation(v.meta)
    try:
        req = v.req = parse(v.obs.body)
    except ResourceError as exc:
        v.new["conditions"] = set_condition(
            conditions, "Valid", False, exc.reason, str(exc), now, generation
        )
        _set_phase(actions, v, "Failed", "InvalidSpec", f"{exc.reason}: {exc}")
        _delete_all(actions, v, None)
        return False
    conditions = set_condition(conditions, "Valid", True, "SpecValid", "", now, generation)
    v.new["conditions"] = conditions
    restarts = _count(v.status.get("restarts"))
    if phase == "Failed":  # was invalid and got fixed
        _set_phase(actions, v, "Pending", "SpecFixed", "spec is valid again")
    if refused:
        for refusal in refused:
            if refusal.verb != "create":  # nothing to back off from: say so, retry next pass
                failed_verb = f"Failed{refusal.verb.title()}"
                _event(actions, v, "Warning", failed_verb, _refusal_text(refusal))
        created = [r for r in refused if r.verb == "create"]
        if created:
            _refused(actions, v, created, now_s, now)
            return False
    if _refusal_backoff(actions, v, now_s):
        return False
    if (
        v.status.get("createRefusals")
        and v.current
        and len(v.current) == _count(v.alloc.get("gpus"))
    ):  # the gang got created at last
        v.new.update(createRefusals=None, lastCreateRefusalTime=None)
        conditions = set_condition(conditions, "WorkersCreated", True, "Created", "", now)
        v.new["conditions"] = conditions
    if v.alloc.get("stopped") is True and v.current:  # stopped; deleting it did not finish
        _delete_all(actions, v, req.grace_s)
        if _failure_backoff(actions, v, req, restarts, now_s):
            return False  # as once its workers are gone: not planned while it backs off
        return _stopping(v, req, cluster_gpus)
    failed = [p["metadata"]["name"] for p in v.current if _pod_phase(p) == "Failed"]
    failed += _lost(v, req)
    if failed:
        restarts += 1
        v.new.update(restarts=restarts, lastFailureTime=now)
        _delete_all(actions, v, req.grace_s)
        _stop(v)  # also when no worker is left to delete
        names = ", ".join(failed)
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
    annotated = _reported_iterations(v.current, None)
    v.reported = _reported_iterations(v.current, v.agent_reported)
    gpus = _count(v.alloc.get("gpus"))
    all_done = bool(v.current) and len(v.current) == gpus
    all_done = all_done and all(_pod_phase(p) == "Succeeded" for p in v.current)
    if (
        all_done
        or (annotated is not None and annotated >= req.iterations)
        or _done_by_count(actions, v, req, now_s)
    ):
        v.new["conditions"] = set_condition(conditions, "Done", True, "Completed", "", now)
        v.new["completionTime"] = now
        progress = dict(v.status.get("progress") or {})
        progress.update(iterations=req.iterations, summary=f"{req.iterations}/{req.iterations}")
        v.new["progress"] = progress
        v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
        v.new["allocation"] = dict(v.alloc, gpus=0, profilingUntil=None)
        v.first = True  # done before its workers go: they are not lost ones
        for pod in v.current + v.other:
            if _pod_phase(pod) not in ("Succeeded", "Failed"):
                actions.delete_pods.append((v.ns, pod["metadata"]["name"], req.grace_s))
        _set_phase(actions, v, "Succeeded", "Completed", f"{req.iterations} iterations done")
        return False
    if not v.current and _failure_backoff(actions, v, req, restarts, now_s):
        return False
    if v.terminating or v.other:
        for pod in v.other:
            actions.delete_pods.append((v.ns, pod["metadata"]["name"], req.grace_s))
        if _stuck(actions, v, now_s, now):
            return False
        _set_phase(actions, v, "Rescaling", "Rescaling", "waiting for old workers to stop")
        return _stopping(v, req, cluster_gpus)
    _unstuck(v, now)
    reason = too_large(req, cluster_gpus)
    v.new["conditions"] = set_condition(
        v.new["conditions"], "Schedulable", reason is None,
        "TooLargeForCluster" if reason else "Fits", reason or "", now,
    )  # fmt: skip
    if reason is not None:
        _set_phase(actions, v, "Pending", "TooLargeForCluster", reason)
        return False
    return True


def _reason(conditions: Sequence[Condition], type_: str) -> str | None:
    """The reason of the first condition of ``type_`` (None: none)."""
    for c in conditions:
        if c.get("type") == type_:
            return c.get("reason")
    return None


def _failure_backoff(
    actions: Actions, v: _View, req: JobRequest, restarts: int, now_s: float
) -> bool:
    """True while the job waits out the backoff after a worker failure (a wake-up set
    for its end); the job is not planned meanwhile."""
    last_failure = parse_time(v.status.get("lastFailureTime"))
    if last_failure is None or not restarts:
        return False
    ready_s = last_failure + _backoff_s(req, restarts)
    if now_s >= ready_s:
        return False
    actions.wake(ready_s)
    return True


def _stopping(v: _View, req: JobRequest, cluster_gpus: int) -> bool:
    """The job's old workers are still stopping (a rescale, a migration, a restart):
    True (plan it) unless it cannot fit the cluster.

    It starts its next generation as soon as they are gone, so the pass plans it like
    a pending job (its GPU count, placed anew) and carries nothing out for it
    (``reconcile``): no other job is planned onto what it will get. Left out of the
    plan, its demand vanished for a pass or two: the policy gave its GPUs to others,
    which started (or grew) and were preempted again once it came back, each a
    checkpoint-restart for nothing; in the twin, jobs were restarted dozens of times
    a minute (docs/twin.md, "Churn").
    """
    v.stopping = True
    return too_large(req, cluster_gpus) is None


def _refusal_text(refusal: Refusal) -> str:
    return (
        f"{refusal.kind} {refusal.name}: {refusal.verb} refused by the API server "
        f"({refusal.code} {refusal.reason}): {refusal.message}"
    )


def _refused(
    actions: Actions, v: _View, refused: Sequence[Refusal], now_s: float, now: str
) -> None:
    """The API server refused to create some of the job's objects: the gang is all or
    nothing, so delete what was created, back off, and say why on the job."""
    first = refused[0]
    count = _count(v.status.get("createRefusals")) + 1
    wait = backoff_s(count)
    text = _refusal_text(first)
    if len(refused) > 1:
        text += f" (and {len(refused) - 1} more)"
    v.new.update(createRefusals=count, lastCreateRefusalTime=now)
    v.new["conditions"] = set_condition(
        v.new["conditions"], "WorkersCreated", False, first.reason or "Refused", text, now
    )
    if v.alloc:
        v.new["allocation"] = dict(v.alloc, gpus=0, nodes=[], profilingUntil=None)
        _stop(v)  # recorded before the partial gang is deleted (``Actions.writes``)
    if v.status.get("energy"):
        v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
    _delete_all(actions, v, None)  # a partial gang that never ran: still no force delete
    actions.wake(now_s + wait)
    _event(actions, v, "Warning", "FailedCreate", text)
    v.new["phase"] = "Pending"
    v.new["message"] = f"{text}; retry {count} in {wait:.0f} s"


def _refusal_backoff(actions: Actions, v: _View, now_s: float) -> bool:
    """True while the job waits after a refused create (its status says since when)."""
    count = _count(v.status.get("createRefusals"))
    if not count or v.current:
        return False
    last = parse_time(v.status.get("lastCreateRefusalTime"))
    if last is None:
        return False
    if v.status.get("observedGeneration") != object_generation(v.meta):
        return False  # the spec changed since (a fixed template?): try at once
    ready_s = last + backoff_s(count)
    if now_s >= ready_s:
        return False
    actions.wake(ready_s)
    return True


def _lost(v: _View, req: JobRequest) -> list[str]:
    """Workers of a complete, running generation that vanished (deleted, or being deleted).

    torchrun's rendezvous is static (``--nnodes=WORLD_SIZE``): a worker built
    alone into a running gang waits for peers that never rejoin, so a lost
    worker restarts the whole generation, like a failed one. Until the gang
    was complete a missing worker is one not created yet (a pass that died
    half way), and it is created (``_carry_out``).
    """
    if v.alloc.get("complete") is not True or v.alloc.get("stopped") is True:
        return []
    gpus = int(v.alloc.get("gpus", 0))
    generation = int(v.alloc.get("generation", 0))
    have = {p["metadata"]["name"] for p in v.current}
    names = [pod_name(req.name, generation, i) for i in range(gpus)]
    return [f"{name} (lost)" for name in names if name not in have]


def _deadline(pod: PodBody) -> float | None:
    """When a terminating pod counts as stuck (``STUCK_TERMINATION_S`` after its grace).

    The API server sets ``deletionTimestamp`` to the end of the grace period
    (the request time plus ``deletionGracePeriodSeconds``).
    """
    at = parse_time(pod.get("metadata", {}).get("deletionTimestamp"))
    return None if at is None else at + STUCK_TERMINATION_S


def _stuck(actions: Actions, v: _View, now_s: float, now: str) -> bool:
    """Say so when old workers stay terminating past their deadline; True if any does.

    The job then waits (phase Pending, condition ``WorkersStuck``) instead of
    starting a new generation elsewhere: a pod stuck terminating is usually on
    a node that stopped answering, where its process may still run, hold the
    GPU and write the job's checkpoints. Two generations of one job must never
    train at once (the at-most-one guarantee StatefulSets give for the same
    reason), so an admin fences the node: ``kubectl delete pod --force``, or
    the ``node.kubernetes.io/out-of-service`` taint; the job resumes by itself.
    """
    stuck = []
    for pod in v.terminating:
        deadline = _deadline(pod)
        if deadline is None:
            continue
        if now_s >= deadline:
            node = pod.get("spec", {}).get("nodeName") or "no node"
            stuck.append(f"{pod['metadata']['name']} on {node}")
        else:
            actions.wake(deadline)
    if not stuck:
        return False
    message = (
        f"workers stuck terminating: {', '.join(stuck)}; the job waits until they are "
        "gone (force-delete them once their node is fenced)"
    )
    v.new["conditions"] = set_condition(
        v.new["conditions"], "WorkersStuck", True, "TerminationStuck", message, now
    )
    _set_phase(actions, v, "Pending", "TerminationStuck", message)
    return True


def _unstuck(v: _View, now: str) -> None:
    """Clear ``WorkersStuck`` once the stuck workers are gone (only if it was set)."""
    conditions = v.new["conditions"]
    if any(c.get("type") == "WorkersStuck" and c.get("status") == "True" for c in conditions):
        v.new["conditions"] = set_condition(
            conditions, "WorkersStuck", False, "WorkersGone", "", now
        )


def _profiled(v: _View) -> list[int]:
    raw = (v.status.get("model") or {}).get("profiledGpuCounts")
    if not raw:  # a new job's: no set to build and sort
        return []
    return sorted({_count(n) for n in raw} - {0})


def _profiling_until(v: _View) -> float | None:
    return parse_time(v.alloc.get("profilingUntil"))


def _is_profiling(v: _View, now_s: float) -> bool:
    """The current allocation is profiling and its window has not ended."""
    if not v.current or v.status.get("phase") != "Profiling":
        return False
    until = _profiling_until(v)
    return until is None or now_s < until


def _core_job(
    v: _View,
    req: JobRequest,
    now_s: float,
    model: PerfModel,
    sizes: Mapping[str, int],
    measured: MeasuredPower | None = None,
    window_s: float = 0.0,
) -> Job:
    progress = int((v.status.get("progress") or {}).get("iterations", 0))
    running = bool(v.current) and not v.stopping
    frequency = v.alloc.get("frequencyMHz") if running else None
    placement = _placement(v.current, sizes) if running else ()
    # Measured where it runs now (same GPUs per node and local batch), or not at all.
    if measured is not None and placement:
        nodes = Counter(node for node, _ in placement)
        here = (len(placement), max(nodes.values()), int(v.alloc.get("localBatchSize", 0)))
        if here != (measured.n, measured.gpus_per_node, measured.local_batch_size):
            measured = None
    else:
        measured = None
    return Job(
        id=v.key,
        model=model,
        remaining_iterations=float(max(req.iterations - progress, 0)),
        global_batch_size=req.global_batch_size,
        requested_gpus=req.requested_gpus,
        arrival_s=req.created_s,
        elapsed_s=max(now_s - req.created_s, 0.0),
        min_gpus=req.min_gpus,
        max_gpus=req.max_gpus,
        max_local_batch_size=req.max_local_batch_size,
        placement=placement,
        frequency_mhz=None if frequency is None else int(frequency),
        model_name=req.model_name,
        # The policy may only keep GPUs it knows: pinning needs the extender's placement.
        pinned=bool(placement) and _is_profiling(v, now_s),
        measured_power_w=measured.watts if measured is not None else None,
        measured_frequency_mhz=measured.frequency_mhz if measured is not None else None,
        profiled_gpus=frozenset(_profiled(v)) if window_s > 0 else None,
        power_cap_w=_current_cap(v.current) if running else None,
    )


def _current_cap(pods: Sequence[PodBody]) -> float | None:
    """The per-GPU cap the job's workers hold now (their ``power-limit-watts``), for
    the policy to keep it steady (``Job.power_cap_w``): the highest of them (the
    policy keeps a current cap only where it is no higher than the new one, so
    the highest is the safe reading of workers caught mid-update); ``None`` when
    a worker has none or an unreadable one (the agent holds no cap there)."""
    caps = []
    for pod in pods:
        raw = _annotation(pod, contract.POWER_LIMIT_ANNOTATION)
        try:
            cap = float(raw) if raw is not None else math.nan
        except ValueError:
            cap = math.nan
        if not (math.isfinite(cap) and cap > 0):
            return None
        caps.append(cap)
    return max(caps, default=None)


def build_snapshot(
    views: Sequence[_View],
    nodes: tuple[Node, ...],
    budget: BudgetConfig,
    now_s: float,
    models: ModelFactory,
    failed: Callable[[_View, Exception], None] | None = None,
    measured: Mapping[str, MeasuredPower] | None = None,
    window_s: float = 0.0,
    power_ratio: float = 1.0,
) -> Snapshot:
    """The core's snapshot of ``views``; with ``failed``, a job whose conversion
    raises is reported there and left out instead of failing the snapshot.

    ``measured``: each job's latest measured power (``learning.SampleStore.
    measured_power``), passed to the policy where the job still runs as
    measured; ``window_s`` > 0: jobs profile new GPU counts (``Job.profiled_gpus``).
    """
    measured = measured or {}
    sizes = {n.name: n.gpus for n in nodes}
    jobs: list[Job] = []
    held: set[GpuSlot] = set()
    for v in views:
        assert v.req is not None
        try:
            job = _core_job(v, v.req, now_s, models(v.req), sizes, measured.get(v.key), window_s)
        except Exception as exc:
            if failed is None:
                raise
            failed(v, exc)
            continue
        if not held.isdisjoint(job.placement):  # two gangs claim a GPU: trust neither's
            job = replace(job, placement=(), pinned=False)
        elif job.pinned and not is_aligned_block(nodes, job.placement):
            # The policy keeps a pinned job's GPUs only as an aligned block of these
            # nodes, and refuses the whole pass otherwise; the gang's nodes can be
            # unaligned here (the plan's nodes change as other pods come and go).
            job = replace(job, pinned=False)
        held.update(job.placement)
        jobs.append(job)
    return Snapshot(
        nodes=nodes, jobs=tuple(jobs), budget=budget.budget, now_s=now_s, power_ratio=power_ratio
    )


def _start(
    actions: Actions, v: _View, req: JobRequest, jp: JobPlan, now_s: float, window_s: float
) -> None:
    """A new generation of workers; Profiling if the job never ran on this GPU count
    (and profiling is on: ``window_s > 0``)."""
    generation = int(v.alloc.get("generation", 0)) + 1
    cap = cap_annotation(jp.power_cap_w)
    ws = WorkerSet(generation, jp.gpus, jp.local_batch_size, jp.frequency_mhz, cap, jp.placement)
    actions.create.append(rendezvous_service(req))
    actions.create.extend(worker_pods(req, ws))
    v.new["allocation"] = {
        "gpus": jp.gpus,
        "frequencyMHz": jp.frequency_mhz,
        "localBatchSize": jp.local_batch_size,
        "generation": generation,
        "nodes": sorted({node for node, _ in jp.placement}),
        "profilingUntil": None,
        "complete": None,
        "stopped": None,
    }
    v.first = True
    v.new.setdefault("startTime", v.status.get("startTime") or format_time(now_s))
    v.new["roomWaitSince"] = None
    if window_s > 0 and jp.gpus not in _profiled(v):
        _set_phase(
            actions, v, "Profiling", "Profiling",
            f"profiling on {jp.gpus} GPUs (local batch {jp.local_batch_size}) once all "
            "workers run",
        )  # fmt: skip
    else:
        _set_phase(
            actions, v, "Running", "Started",
            f"{jp.gpus} GPUs at {jp.frequency_mhz} MHz, local batch {jp.local_batch_size}",
        )  # fmt: skip


def _profile(actions: Actions, v: _View, now_s: float, window_s: float) -> bool:
    """Advance the profiling of the current allocation; True while it goes on."""
    gpus = int(v.alloc.get("gpus", 0))
    until = _profiling_until(v)
    if until is None:
        if not v.running:
            _set_phase(
                actions, v, "Profiling", "Profiling",
                f"profiling on {gpus} GPUs once all workers run",
            )  # fmt: skip
            return True
        until = now_s + window_s
        v.new["allocation"]["profilingUntil"] = format_time_ms(until)
        _event(actions, v, "Normal", "ProfilingStarted", f"{gpus} GPUs for {window_s:g} s")
    if now_s < until:
        actions.wake(until)
        _set_phase(
            actions, v, "Profiling", "Profiling",
            f"profiling on {gpus} GPUs until {format_time(until)}",
        )  # fmt: skip
        return True
    v.new["model"] = {"profiledGpuCounts": sorted({*_profiled(v), gpus})}
    v.new["allocation"]["profilingUntil"] = None
    _set_phase(actions, v, "Running", "ProfilingFinished", f"profiled on {gpus} GPUs")
    return False


def _carry_out(
    actions: Actions,
    v: _View,
    jp: JobPlan,
    now_s: float,
    window_s: float,
    seen: tuple[GpuSlot, ...] = (),
    claimed: Callable[[], Mapping[GpuSlot, str]] | None = None,
    leaving: Callable[[], Mapping[GpuSlot, float]] | None = None,
) -> bool:
    """Turn the job's plan into actions; True when it holds GPUs after this pass.

    ``seen``: the job's GPUs as the snapshot gave them to the policy (empty when
    unknown); ``claimed``: which job the plan gives each GPU, asked for only
    where a job with workers may move (a cold pass's jobs have none). A plan that puts
    the job on other GPUs of the same count and gives its GPUs to another job
    is a migration (module docstring). ``leaving``: the GPUs that workers being
    deleted still hold, and until when they count (``_leaving``): a new
    generation the plan puts there waits for them (``_wait_for_room``).
    """
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
        base = v.new.get("allocation") or alloc
        v.new["allocation"] = dict(base, gpus=0, nodes=[], profilingUntil=None)
        v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
        v.new["roomWaitSince"] = None
        return False
    if v.current and (jp.gpus, jp.local_batch_size) != shape:
        _delete_all(actions, v, req.grace_s)
        _set_phase(
            actions, v, "Rescaling", "Rescaling",
            f"checkpoint-restart from {shape[0]} to {jp.gpus} GPUs",
        )  # fmt: skip
        return False
    if v.current and _migrates(seen, jp, claimed() if claimed is not None else None):
        _delete_all(actions, v, req.grace_s)
        _set_phase(
            actions, v, "Rescaling", "Migrating",
            f"checkpoint-restart on other GPUs to make room: {_nodes(seen)} -> "
            f"{_nodes(jp.placement)}",
        )  # fmt: skip
        return False
    # A generation recorded (status goes first) but not all created: a pass died
    # between its writes. Its missing workers are created, under the same names.
    unfinished = (
        shape == (jp.gpus, jp.local_batch_size)
        and alloc.get("complete") is not True
        and alloc.get("stopped") is not True
    )
    starts = not v.current and not unfinished
    if starts and leaving is not None and _wait_for_room(actions, v, jp, leaving(), now_s):
        return False
    actions.allocated_gpus += jp.gpus
    if starts:
        _start(actions, v, req, jp, now_s, window_s)
        return True
    generation = int(alloc.get("generation", 0))
    have = {p["metadata"]["name"] for p in v.current}
    missing = [i for i in range(jp.gpus) if pod_name(req.name, generation, i) not in have]
    if missing:  # only an unfinished gang's: a complete one's lost worker restarts it
        cap = cap_annotation(jp.power_cap_w)
        ws = WorkerSet(
            generation, jp.gpus, jp.local_batch_size, jp.frequency_mhz, cap, jp.placement
        )
        actions.create.append(rendezvous_service(req))
        actions.create.extend(worker_pods(req, ws, missing))
    _power_caps(actions, v, jp)
    changed = int(alloc.get("frequencyMHz", 0)) != jp.frequency_mhz
    clock = str(jp.frequency_mhz)
    for pod in v.current:  # also where a pod's value was edited: the plan's clock stands
        if changed or _annotation(pod, contract.FREQUENCY_ANNOTATION) != clock:
            _annotate(actions, v, pod, {contract.FREQUENCY_ANNOTATION: clock})
    if changed:
        _event(
            actions, v, "Normal", "FrequencyChanged",
            f"{alloc.get('frequencyMHz')} -> {jp.frequency_mhz} MHz",
        )  # fmt: skip
    nodes = sorted({str(p.get("spec", {}).get("nodeName")) for p in v.current} - {"None"})
    v.new["allocation"] = dict(alloc, frequencyMHz=jp.frequency_mhz, nodes=nodes)
    if not missing:  # every worker exists: from now on a missing one is lost
        v.new["allocation"]["complete"] = True
    if v.status.get("phase") == "Profiling" and _profile(actions, v, now_s, window_s):
        return True
    if v.new.get("phase") != "Running":
        _set_phase(actions, v, "Running", "Running", f"{jp.gpus} GPUs at {jp.frequency_mhz} MHz")
    return True


def _wait_for_room(
    actions: Actions, v: _View, jp: JobPlan, leaving: Mapping[GpuSlot, float], now_s: float
) -> bool:
    """True (the job waits) while workers being deleted still hold GPUs the plan
    gives this job's new generation.

    The extender takes the plan's block (``contract.PLANNED_BLOCK_ANNOTATION``) only
    when it is free; created at once, the gang would get other GPUs, the next plan
    would find it elsewhere than it placed it and move other jobs again to make
    room. So the job starts once those workers are gone (a pod deletion is an
    event: the next pass comes then), once they count as stuck
    (``STUCK_TERMINATION_S`` past their grace period), or ``ROOM_WAIT_S`` after it
    began to wait (``status.roomWaitSince``), whatever the others do: a delete the
    API server refuses, a grace period of a day. The extender then chooses
    other GPUs.
    """
    if not leaving:  # no worker is being deleted (every job of a cold start)
        return False
    until = [leaving[slot] for slot in jp.placement if slot in leaving and leaving[slot] > now_s]
    since = parse_time(v.status.get("roomWaitSince"))
    since = now_s if since is None else since
    if not until or now_s >= since + ROOM_WAIT_S:
        return False
    v.new["roomWaitSince"] = v.status.get("roomWaitSince") or format_time(now_s)
    v.new["energy"] = dict(v.status.get("energy") or {}, watts=0.0)
    actions.wake(min(*until, since + ROOM_WAIT_S))
    _set_phase(
        actions, v, "Pending", "WaitingForGPUs",
        f"{jp.gpus} GPUs planned on {_nodes(jp.placement)}; waiting for stopping workers "
        "to free them",
    )  # fmt: skip
    return True


def _leaving(views: Sequence[_View], actions: Actions, now_s: float) -> dict[GpuSlot, float]:
    """GPUs held by workers being deleted (terminating, or deleted by this pass), each
    with the time after which its pod counts as stuck and no longer holds it up."""
    out: dict[GpuSlot, float] = {}

    def add(pod: PodBody, until: float) -> None:
        if _pod_phase(pod) in ("Succeeded", "Failed"):  # holds no GPU any more
            return
        raw = _annotation(pod, contract.PLACEMENT_ANNOTATION)
        for slot in _block(raw) if raw else ():
            out[slot] = max(out.get(slot, until), until)

    for v in views:
        for pod in v.terminating:
            add(pod, _deadline(pod) or now_s + STUCK_TERMINATION_S)
    deleted = {(ns, name): grace for ns, name, grace in actions.delete_pods}
    if deleted:
        for v in views:
            for pod in v.current + v.other:
                grace = deleted.get((v.ns, pod["metadata"]["name"]))
                if grace is not None:
                    add(pod, now_s + grace + STUCK_TERMINATION_S)
    return out


def _power_caps(actions: Actions, v: _View, jp: JobPlan) -> None:
    """Each current worker carries the plan's per-GPU power cap
    (``contract.POWER_LIMIT_ANNOTATION``, which the node agent applies), or none;
    written or removed only where it differs, so a restarted operator rewrites nothing."""
    want = cap_annotation(jp.power_cap_w)
    for pod in v.current:
        if _annotation(pod, contract.POWER_LIMIT_ANNOTATION) != want:
            _annotate(actions, v, pod, {contract.POWER_LIMIT_ANNOTATION: want})


def _annotate(actions: Actions, v: _View, pod: PodBody, patch: dict[str, str | None]) -> None:
    """Queue an annotation patch: with the deletions when it only lowers power, else
    after the creations (``Actions.writes``)."""
    old = pod.get("metadata", {}).get("annotations") or {}
    target = actions.annotate_first if lowers(old, patch) else actions.annotate_pods
    target.append((v.ns, pod["metadata"]["name"], patch))


def _migrates(
    seen: tuple[GpuSlot, ...], jp: JobPlan, claimed: Mapping[GpuSlot, str] | None
) -> bool:
    """The plan moves the job (both placements known) and gives its GPUs to another job.

    A move that only packs jobs tighter (no other job needs the GPUs) is not
    worth a checkpoint-restart: the job keeps its GPUs and the others go elsewhere.
    """
    if not seen or not jp.placement or set(seen) == set(jp.placement):
        return False
    owners = claimed or {}
    return any(owners.get(slot, jp.job_id) != jp.job_id for slot in seen)


def _nodes(slots: Sequence[GpuSlot]) -> str:
    return ",".join(sorted({node for node, _ in slots})) or "?"


def _account_all(
    actions: Actions,
    held: Sequence[tuple[_View, JobPlan]],
    models: Mapping[str, PerfModel],
    gpn: int,
    now_s: float,
    anchors: Mapping[str, float],
    interval_s: float = 0.0,
    written: Mapping[str, float] | None = None,
) -> None:
    """Progress and energy of every job holding GPUs (see ``progress``).

    Written at most every ``interval_s`` per job (``written``: when it last
    was), unless the job's status changes anyway or its spec did: an idle
    cluster then rests. A skipped write keeps the job's old anchor, so the
    iterations not written are counted at the next write.
    """
    jobs = []
    for v, jp in held:
        assert v.req is not None
        progress = v.status.get("progress") or {}
        jobs.append(
            Running(  # positional (Running's order): hundreds per pass
                v.key,
                models[v.key],
                jp.gpus,
                jp.local_batch_size,
                jp.frequency_mhz,
                v.req.iterations,
                int(progress.get("iterations", 0)),
                float((v.status.get("energy") or {}).get("joules", 0.0)),
                v.reported,
                v.running,
            )
        )
    accounts = account(jobs, gpn, now_s, anchors)
    written = written or {}
    for (v, _), job, acc in zip(held, jobs, accounts, strict=True):
        if acc is None:
            continue
        last = written.get(v.key)
        spec_seen = v.status.get("observedGeneration") == int(v.meta.get("generation", 1))
        recent = last is not None and now_s - last < interval_s
        if recent and spec_seen and not merge_diff(v.status, v.new):  # no write now
            if acc.anchor_s is not None:
                actions.anchors[v.key] = anchors.get(v.key, acc.anchor_s)
            continue
        total = job.iterations_total
        v.new["progress"] = {
            **(v.status.get("progress") or {}),
            "iterations": acc.iterations,
            "throughput": round(acc.throughput, 6),
            "estimatedCompletion": format_time(acc.eta_s),
            "summary": f"{acc.iterations}/{total}",
        }
        v.new["energy"] = {
            **(v.status.get("energy") or {}),
            "joules": round(acc.joules, 3),
            "watts": round(acc.watts, 3),
        }
        if acc.anchor_s is not None:
            actions.anchors[v.key] = acc.anchor_s


def _account_one(*args: Any) -> bool:
    """``_account_all`` for one job, under the guard (which wants a bool)."""
    _account_all(*args)
    return True


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
    anchors: Mapping[str, float] | None = None,
    *,
    profiling_window_s: float = DEFAULT_PROFILING_WINDOW_S,
    profile_sweep: ClockSweep = PAPER_SWEEP,
    requests: RequestCache | None = None,
    refused: Mapping[str, Sequence[Refusal]] | None = None,
    progress_interval_s: float = 0.0,
    progress_written: Mapping[str, float] | None = None,
    learned: Mapping[str, Mapping[str, Any]] | None = None,
    measured: Mapping[str, MeasuredPower] | None = None,
    power_ratio: float = 1.0,
    agent_progress: Mapping[str, tuple[int, int, float | None]] | None = None,
) -> Actions:
    """Decide everything one pass of the allocation loop does (see module docstring).

    ``anchors`` are the previous pass's ``Actions.anchors``; ``requests``
    memoises DLJob parsing across passes; ``refused`` are the previous pass's
    refused writes by job key (``Kube.apply``'s answer, see ``refusals``).
    A job profiles a GPU count it has not run on for ``profiling_window_s``,
    its workers sweeping ``profile_sweep``'s clocks (``_profile_plans``).
    Progress and energy are written at most every ``progress_interval_s`` per
    job; ``progress_written`` says when each job's were last written (see
    ``_account_all``). ``learned``: the online refit's ``status.model`` fields
    by job key (``_learned_model``). ``measured``: each job's latest measured power
    (``build_snapshot``); ``power_ratio``: the recent measured / planned power of
    the jobs running as planned (``Snapshot.power_ratio``, kept by the controller).
    ``agent_progress``: job key -> (generation, iterations, when they reached the
    job's total) the node agents reported (``reported_progress``); with the workers'
    progress annotations, the most iterations of the current generation count
    (``_View``, ``_done_by_count``).
    Each job's steps run under a ``_Guard``: one job's failure
    never stops the others.
    """
    actions = Actions()
    guard = _Guard(actions, now_s)
    cluster_gpus = sum(n.gpus for n in nodes)
    gpn = max((n.gpus for n in nodes), default=1)
    parse = parse_dljob if requests is None else requests.parse
    refused = refused or {}
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
            runnable,
            nodes,
            budget,
            now_s,
            models,
            guard.fail,
            measured,
            profiling_window_s,
            power_ratio,
        )
        runnable = [v for v in runnable if v.key not in guard.failed]
        try:
            plan = schedule_once(policy, _PassBackend(snapshot))
        except PowerFlowError as exc:
            actions.notes.append(f"policy refused the snapshot: {exc}")
        actions.plan = plan
        if plan is not None:
            by_id = {jp.job_id: jp for jp in plan.jobs}
            jobs = plan.jobs
            claimed = functools.cache(
                lambda: {slot: jp.job_id for jp in jobs for slot in jp.placement}
            )
            held = []
            gpus_of = {n.name: n.gpu for n in nodes}
            # Jobs with workers first, so that a job that starts knows which GPUs this
            # pass frees (``_wait_for_room``); computed once, at the first start: only
            # jobs with workers delete in this loop, and ``_lifecycle`` deleted before it.
            pairs = sorted(
                zip(runnable, snapshot.jobs, strict=True), key=lambda p: not p[0].current
            )
            leaving = functools.cache(lambda: _leaving(views, actions, now_s))
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
                    profiling_window_s,
                    seen,
                    claimed,
                    leaving,
                ) and guard.run(
                    v,
                    _profile_plans,
                    actions,
                    v,
                    gpus_of,
                    nodes[0].gpu,
                    profiling_window_s,
                    profile_sweep,
                    now_s,
                ):
                    held.append((v, jp))
            job_models = {job.id: job.model for job in snapshot.jobs}
            held = [(v, jp) for v, jp in held if v.key not in guard.failed]
            rate = (progress_interval_s, progress_written)
            try:  # batched (one model call per model); on a failure, job by job
                _account_all(actions, held, job_models, gpn, now_s, anchors or {}, *rate)
            except Exception:  # the guard below names the job at fault
                for v, jp in held:
                    one = [(v, jp)]
                    guard.run(
                        v, _account_one, actions, one, job_models, gpn, now_s, anchors or {}, *rate
                    )
    for v in views:
        fields = (learned or {}).get(v.key)
        if fields is not None and v.key not in guard.failed:
            guard.run(v, _learned_model, v, fields)
        if not guard.run(v, _finish, actions, v, v.key not in guard.failed, now_s) and v.new:
            actions.status.append((v.ns, v.name, {"conditions": v.new["conditions"]}))
    return actions


def _profile_plans(
    actions: Actions,
    v: _View,
    gpus_of: Mapping[str, GpuSpec],
    default_gpu: GpuSpec,
    window_s: float,
    sweep: ClockSweep,
    now_s: float,
) -> bool:
    """Each current worker carries the sweep plan (``sweep``'s clocks over ``window_s``)
    exactly while the job's profiling window runs (``profile_plan``); written or
    removed only where it differs, so a restarted operator rewrites nothing. Always
    True (a ``_Guard`` step)."""
    alloc = v.new.get("allocation") or v.alloc
    until = parse_time(alloc.get("profilingUntil"))
    phase = v.new.get("phase", v.status.get("phase"))
    profiling = phase == "Profiling" and until is not None and now_s < until
    for pod in v.current:
        want = None
        if profiling:
            node = pod.get("spec", {}).get("nodeName")
            gpu = gpus_of.get(node, default_gpu) if isinstance(node, str) else default_gpu
            want = plan_annotation(gpu, window_s, until, sweep)
        if _annotation(pod, contract.PROFILE_ANNOTATION) != want:
            _annotate(actions, v, pod, {contract.PROFILE_ANNOTATION: want})
    return True


def _learned_model(v: _View, fields: Mapping[str, Any]) -> bool:
    """Put the online refit's ``status.model`` fields into the job's new status.

    A new fit (``params`` or ``fits`` differ from status, or bad ``params``
    to remove) is written at once; the sample count and fit error, which
    change with every window, only ride along with a write the job gets
    anyway (progress comes every ``progress_interval_s``), so samples cost
    no status writes of their own. Always True (a ``_Guard`` step).
    """
    current: Mapping[str, Any] = v.status.get("model") or {}
    refit = any(k in fields and current.get(k) != fields[k] for k in ("params", "fits"))
    if refit or merge_diff(v.status, v.new):
        v.new["model"] = {**(v.new.get("model") or {}), **fields}
    return True


def _finish(actions: Actions, v: _View, healthy: bool, now_s: float) -> bool:
    """The job's status patch (what changed) and its phase count."""
    if healthy:
        conditions = v.status.get("conditions") or []
        if any(c.get("type") == "Reconciled" and c.get("status") != "True" for c in conditions):
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
