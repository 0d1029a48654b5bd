"""One DLJob during a pass (``_View``): its observed body and pods, the status it
should get, and the readers of what tenants and kubelets write on them (counts,
annotations, placements), each bounded and never raising."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

from powerflow.operator.actions import Actions, Event, Observed
from powerflow.operator.allocation import JobAllocation, read_allocation
from powerflow.operator.allocation import count as _count
from powerflow.operator.bodies import (
    Allocation,
    DLJobStatus,
    Meta,
    PodBody,
)
from powerflow.operator.jobs import (
    JobRequest,
)
from powerflow.operator.power_order import lowers
from powerflow.operator.records import filled

from powerflow.core import contract, untrusted
from powerflow.core.policy.snapshot import GpuSlot

log = logging.getLogger(__name__)


class _View:
    """One DLJob during a pass: what was observed, and the status it should get (``new``)."""

    __slots__ = (
        "agent_done_at", "agent_reported", "alloc", "allocation", "current", "first",
        "granted", "key", "meta", "name", "new", "ns", "obs", "other", "reported", "req",
        "running", "status", "stopping", "terminating",
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
        self.allocation: JobAllocation = read_allocation(self.alloc)
        """``alloc`` read once (``allocation``): what the job's pods were made from."""
        self.granted: JobAllocation | None = None
        """What the allocator gives the job in this pass, written into ``new`` as its
        ``status.allocation`` (``carry_out``); the job controller's input."""
        self.new: dict[str, Any] = {}
        self.req: JobRequest | None = None
        self.current: list[PodBody] = []
        self.other: list[PodBody] = []
        self.terminating: list[PodBody] = []
        self.reported: int | None = None
        self.first = False  # starts or stops a generation: its status goes before its pods
        self.stopping = False  # old workers still stop: planned, but nothing carried out
        generation = self.allocation.generation
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
        gpus = self.allocation.gpus
        # Every worker of the current allocation runs: profiling and progress count.
        self.running = (
            bool(self.current)
            and len(self.current) == gpus
            and all(_pod_phase(p) == "Running" for p in self.current)
        )


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
    fields = {"namespace": v.ns, "name": v.name, "uid": uid, "type": type_, "reason": reason,
              "message": message}  # fmt: skip
    actions.events.append(filled(Event, fields))  # ``Event(...)`` (``records``)


def _set_phase(actions: Actions, v: _View, phase: str, reason: str, message: str) -> None:
    """Set phase and message; an event only when the phase or its reason changes."""
    warn = phase == "Failed" or reason in ("WorkerFailed", "InvalidSpec", "TerminationStuck")
    changed = v.status.get("phase") != phase
    if changed or (warn and v.status.get("message") != message):
        _event(actions, v, "Warning" if warn else "Normal", reason, message)
    v.new["phase"] = phase
    v.new["message"] = message


def _annotate(actions: Actions, v: _View, pod: PodBody, patch: dict[str, str | None]) -> None:
    """Queue an annotation patch: with the deletions when it only lowers power, else
    after the creations (``Actions.writes``)."""
    old = pod.get("metadata", {}).get("annotations") or {}
    target = actions.annotate_first if lowers(old, patch) else actions.annotate_pods
    target.append((v.ns, pod["metadata"]["name"], patch))


def _bound_nodes(pods: Sequence[PodBody]) -> list[str]:
    """The nodes the pods were bound to (their ``spec.nodeName``), in the pods' order."""
    return [n for p in pods if isinstance(n := p.get("spec", {}).get("nodeName"), str)]


def _nodes(slots: Sequence[GpuSlot]) -> str:
    return ",".join(sorted({node for node, _ in slots})) or "?"
