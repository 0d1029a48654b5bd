"""A plan carried out for one job, the allocator's last step: the job's allocation
written into its status (a new generation, the clock and power cap of the running
one, the profiling window begun or ended), a migration or a rescale; then the job
controller's writes that bring the job's pods to that allocation (``_converge``,
``job_controller``). ``reconcile``'s module docstring, "Migrations", says why a move
is a checkpoint-restart."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from powerflow.operator.actions import Actions
from powerflow.operator.allocation import (
    CAP_FIELD,
    CLOCK_FIELD,
    JobAllocation,
    cap_w,
    profiling_until_field,
    status_fields,
)
from powerflow.operator.bodies import (
    PodBody,
)
from powerflow.operator.job_controller import Profiling, converge
from powerflow.operator.job_view import (
    _annotate,
    _annotation,
    _block,
    _bound_nodes,
    _event,
    _nodes,
    _pod_phase,
    _set_phase,
    _View,
)
from powerflow.operator.lifecycle import STUCK_TERMINATION_S, _deadline, _delete_all
from powerflow.operator.profiled import (
    BY_TYPE,
    NodeTypes,
    ProfileWindow,
    profiled_on,
    with_profiled,
)
from powerflow.operator.workers import pod_name

from powerflow.core import contract
from powerflow.core.policy.snapshot import GpuSlot, JobPlan
from powerflow.core.timefmt import format_time, parse_time

_new_tuple = tuple.__new__
"""A named tuple from a tuple of every field in order, as its generated ``__new__``
builds it, without that Python frame (a ``JobAllocation`` per job per pass)."""

ROOM_WAIT_S = 120.0
"""The longest a new generation waits for workers being deleted to free its planned GPUs
(``_wait_for_room``): twice the default grace period, short next to a training job."""


def _start(
    actions: Actions, v: _View, jp: JobPlan, now_s: float, window_s: float, types: NodeTypes
) -> None:
    """A new generation: its allocation recorded (the job controller creates its
    workers from it, ``_converge``); Profiling if the job never ran on this GPU count
    on the GPU type of the plan's nodes (and profiling is on: ``window_s > 0``)."""
    granted = _new_tuple(  # ``JobAllocation(...)`` without its ``__new__``'s frame
        JobAllocation,
        (
            v.allocation.generation + 1,
            jp.gpus,
            jp.local_batch_size,
            jp.frequency_mhz,
            cap_w(jp.power_cap_w),
            tuple(sorted(jp.placement)),
            None,  # profiling_until_s
            False,  # complete
            False,  # stopped
        ),
    )
    v.granted = granted
    fields = status_fields(granted)  # a new dict: the bookkeeping goes on at its end
    fields["nodes"] = sorted({node for node, _ in jp.placement})
    fields["profilingUntil"] = None
    fields["complete"] = None
    fields["stopped"] = None
    v.new["allocation"] = fields
    v.first = True
    v.new.setdefault("startTime", v.status.get("startTime") or format_time(now_s))
    v.new["roomWaitSince"] = None
    gpu = types.of_slots(jp.placement)
    if window_s > 0 and jp.gpus not in profiled_on(v.status.get("model"), gpu):
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


def _profile(actions: Actions, v: _View, now_s: float, window_s: float, types: NodeTypes) -> bool:
    """Advance the profiling of the current allocation; True while it goes on. Its end
    records the count as profiled on the GPU type of the workers' nodes (``profiled``)."""
    gpus = v.allocation.gpus
    until = v.allocation.profiling_until_s
    if until is None:
        if not v.running:
            _set_phase(
                actions, v, "Profiling", "Profiling",
                f"profiling on {gpus} GPUs once all workers run",
            )  # fmt: skip
            return True
        written = profiling_until_field(now_s + window_s)
        v.new["allocation"]["profilingUntil"] = written
        until = parse_time(written) or now_s + window_s  # as the status will read
        v.granted = (v.granted or v.allocation)._replace(profiling_until_s=until)
        _event(actions, v, "Normal", "ProfilingStarted", f"{gpus} GPUs for {window_s:g} s")
    if now_s < until:
        actions.wake(until)
        _set_phase(
            actions, v, "Profiling", "Profiling",
            f"profiling on {gpus} GPUs until {format_time(until)}",
        )  # fmt: skip
        return True
    gpu = types.of([*_bound_nodes(v.current), *(node for node, _ in v.allocation.block)])
    v.new["model"] = {BY_TYPE: with_profiled(v.status.get("model"), gpu, gpus)}
    v.new["allocation"]["profilingUntil"] = None
    v.granted = (v.granted or v.allocation)._replace(profiling_until_s=None)
    _set_phase(actions, v, "Running", "ProfilingFinished", f"profiled on {gpus} GPUs")
    return False


def _carry_out(
    actions: Actions,
    v: _View,
    jp: JobPlan,
    now_s: float,
    profile: ProfileWindow,
    seen: tuple[GpuSlot, ...] = (),
    claimed: Callable[[], Mapping[GpuSlot, str]] | None = None,
    leaving: Callable[[], Mapping[GpuSlot, float]] | None = None,
) -> bool:
    """Turn the job's plan into actions; True when it holds GPUs after this pass.

    ``profile``: the profiling window and the planned nodes' GPU types, which a
    profiled count is recorded for (``profiled``).
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
    shape = (v.allocation.gpus, v.allocation.local_batch_size)
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
        and not v.allocation.complete
        and not v.allocation.stopped
    )
    starts = not v.current and not unfinished
    if starts and leaving is not None and _wait_for_room(actions, v, jp, leaving(), now_s):
        return False
    actions.allocated_gpus += jp.gpus
    if starts:
        _start(actions, v, jp, now_s, profile.seconds, profile.types)
        return True
    # The plan's clock and cap for the running generation, recorded in its status; the
    # job controller brings the workers to them (``_converge``).
    before = v.allocation.frequency_mhz
    if before != jp.frequency_mhz:
        _event(
            actions, v, "Normal", "FrequencyChanged",
            f"{alloc.get(CLOCK_FIELD)} -> {jp.frequency_mhz} MHz",
        )  # fmt: skip
    nodes = sorted({str(p.get("spec", {}).get("nodeName")) for p in v.current} - {"None"})
    cap = cap_w(jp.power_cap_w)
    v.new["allocation"] = dict(alloc, nodes=nodes)
    v.new["allocation"][CLOCK_FIELD] = jp.frequency_mhz
    v.new["allocation"][CAP_FIELD] = cap
    complete = v.allocation.complete
    if not complete:
        generation = v.allocation.generation
        have = {p["metadata"]["name"] for p in v.current}
        complete = all(pod_name(req.name, generation, i) in have for i in range(jp.gpus))
        if complete:  # every worker exists: from now on a missing one is lost
            v.new["allocation"]["complete"] = True
    a = v.allocation  # built whole: ``_replace`` costs twice as much, on every pass
    v.granted = _new_tuple(  # ``JobAllocation(...)`` without its ``__new__``'s frame
        JobAllocation,
        (
            a.generation, a.gpus, a.local_batch_size, jp.frequency_mhz, cap, a.block,
            a.profiling_until_s, complete, a.stopped,
        ),
    )  # fmt: skip
    profiling = v.status.get("phase") == "Profiling"
    if profiling and _profile(actions, v, now_s, profile.seconds, profile.types):
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


def _converge(
    actions: Actions,
    v: _View,
    now_s: float,
    profiling: Profiling | None,
    tuned: bool = True,
    pools: Mapping[str, str] | None = None,
) -> bool:
    """The job controller's writes for the job (``job_controller.converge``), from the
    allocation the allocator gave it in this pass (``v.granted``, what its status
    gets), into ``actions``: the creations, and each
    annotation patch with the deletions when it only lowers power, else after the
    creations (``_annotate``). ``tuned``: False on a pool of unknown GPU type (no clock
    written); ``pools``: each node's pool label (``job_controller.converge``). Always
    True (a ``_Guard`` step)."""
    assert v.req is not None and v.granted is not None
    writes = converge(v.req, v.granted, v.current, now_s, profiling, tuned=tuned, pools=pools)
    actions.create.extend(writes.create)
    for pod, patch in writes.annotate:
        _annotate(actions, v, pod, patch)
    return True
