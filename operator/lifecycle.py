"""Each job's lifecycle in a pass, before any plan: invalid, failed, backing off,
done, stopping, stuck or runnable (``_lifecycle``; ``reconcile``'s module docstring,
"Generations", says what the status records and why)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from powerflow.operator.actions import Actions
from powerflow.operator.allocation import count as _count
from powerflow.operator.bodies import (
    Condition,
    DLJobBody,
    PodBody,
)
from powerflow.operator.job_view import (
    _event,
    _pod_phase,
    _reported_iterations,
    _set_phase,
    _View,
)
from powerflow.operator.jobs import (
    DEFAULT_GRACE_S,
    JobRequest,
    object_generation,
    too_large,
)
from powerflow.operator.refusals import Refusal, backoff_s
from powerflow.operator.status import set_condition
from powerflow.operator.workers import pod_name

from powerflow.core.errors import ResourceError
from powerflow.core.timefmt import format_time, parse_time

TERMINAL_REASONS = ("Completed", "RestartLimitExceeded")
STUCK_TERMINATION_S = 300.0
"""How long after its grace period a terminating worker counts as stuck (see ``_stuck``)."""


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
        v.status.get("createRefusals") and v.current and len(v.current) == v.allocation.gpus
    ):  # the gang got created at last
        v.new.update(createRefusals=None, lastCreateRefusalTime=None)
        conditions = set_condition(conditions, "WorkersCreated", True, "Created", "", now)
        v.new["conditions"] = conditions
    if v.allocation.stopped and v.current:  # stopped; deleting it did not finish
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
    gpus = v.allocation.gpus
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
    if not v.allocation.complete or v.allocation.stopped:
        return []
    gpus, generation = v.allocation.gpus, v.allocation.generation
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
    for c in conditions:  # a loop, not ``any`` over a generator: per job per pass
        if c.get("type") == "WorkersStuck" and c.get("status") == "True":
            v.new["conditions"] = set_condition(
                conditions, "WorkersStuck", False, "WorkersGone", "", now
            )
            return
