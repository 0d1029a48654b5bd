"""Pure readers of Pod and Node bodies: the few fields the extender decides on.

Kubernetes bodies arrive as plain dicts (from the scheduler or the API);
every reader here tolerates missing or mistyped fields, because a malformed
object must end in a clear answer, never in an exception deep in a route.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from powerflow.core import untrusted
from powerflow.core.contract import (
    GENERATION_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    PLACEMENT_ANNOTATION,
    PLANNED_BLOCK_ANNOTATION,
    WORKERS_ANNOTATION,
    dljob_controller,
)
from powerflow.core.errors import PlacementError
from powerflow.core.policy.snapshot import GpuSlot
from powerflow.core.taints import pod_tolerations

Body = dict[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class GangKey(NamedTuple):
    """One gang: the workers of one job's allocation (a rescale starts a new gang).

    A named tuple rather than a dataclass: it keys the state's dicts and sets
    (each reservation compares the gangs with their bound workers), and a
    tuple hashes in C.
    """

    namespace: str
    job: str
    generation: str = ""
    owner: str = ""
    """The UID of the DLJob that controls the pods (``dljob_owner``), "" for none: anyone
    who may create pods in a namespace can copy a job's label and generation, and such a
    pod must not take a GPU of that job's block, so it makes a gang of its own."""

    def __str__(self) -> str:
        suffix = f"@{self.generation}" if self.generation else ""
        return f"{self.namespace}/{self.job}{suffix}"


@dataclass(frozen=True)
class PodInfo:
    """What the extender keeps of a pod: enough to count GPUs and rebuild gangs."""

    namespace: str
    name: str
    uid: str
    node: str
    gpus: int
    gang: GangKey | None
    workers: int
    block: tuple[GpuSlot, ...]
    terminal: bool
    tolerations: tuple[dict[str, Any], ...] = ()
    """Kept for PowerFlow's workers only: which tainted nodes their gang may use."""
    planned: tuple[GpuSlot, ...] = ()
    """The operator's plan for the worker's gang (``PLANNED_BLOCK_ANNOTATION``), if any."""
    owner: str = ""
    """The UID of the DLJob that controls the pod (``ownerReferences``), "" if none:
    what tells the operator's workers from a pod that only carries their label."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def bound(self) -> bool:
        return bool(self.node)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _quantity(value: Any) -> int:
    """An extended-resource quantity (whole units; ``"8"``, ``8``, ``"8.0"``); 0 if unreadable.

    Integers are read exactly, however large (``10**400`` is a count no gang
    can have, which placement then says; ``float`` of it would raise).
    """
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str):
        try:
            return max(int(value.strip()), 0)
        except ValueError:
            pass
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return int(number) if math.isfinite(number) and number > 0 else 0


def name_of(body: Any) -> str:
    name = _dict(_dict(body).get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def node_gpus(node: Any) -> int:
    """GPUs the kubelet offers to pods (``allocatable``, else ``capacity``)."""
    status = _dict(_dict(node).get("status"))
    for field in ("allocatable", "capacity"):
        resources = _dict(status.get(field))
        if GPU_RESOURCE in resources:
            gpus = _quantity(resources[GPU_RESOURCE])
            # No node has this many: garbage, which must not become a pool of 2**1328 GPUs.
            return gpus if gpus < MAX_GPU_INDEX else 0
    return 0


def node_product(node: Any) -> str:
    label = _dict(_dict(_dict(node).get("metadata")).get("labels")).get(GPU_PRODUCT_LABEL)
    return label if isinstance(label, str) else ""


def node_unschedulable(node: Any) -> bool:
    return bool(_dict(_dict(node).get("spec")).get("unschedulable"))


def pod_gpus(pod: Any) -> int:
    """GPUs a pod asks for: the sum over its containers (limits win, as for extended resources)."""
    spec = _dict(_dict(pod).get("spec"))
    total = 0
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        resources = _dict(_dict(container).get("resources"))
        limits, requests = _dict(resources.get("limits")), _dict(resources.get("requests"))
        total += _quantity(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE)))
    return total


def job_of(pod: Any) -> str | None:
    """The owning DLJob's name, or ``None`` for a pod that is not PowerFlow's."""
    job = _dict(_dict(_dict(pod).get("metadata")).get("labels")).get(JOB_LABEL)
    return job if isinstance(job, str) and job else None


def gang_of(pod: Any) -> GangKey | None:
    job = job_of(pod)
    if job is None:
        return None
    meta = _dict(_dict(pod).get("metadata"))
    namespace = meta.get("namespace")
    generation = _dict(meta.get("annotations")).get(GENERATION_ANNOTATION, "")
    return GangKey(
        namespace if isinstance(namespace, str) and namespace else "default",
        job,
        generation if isinstance(generation, str) else str(generation),
        dljob_owner(pod),
    )


def workers_of(pod: Any) -> int:
    """The gang size from the operator's annotation; a pod without it is a gang of one."""
    raw = _dict(_dict(_dict(pod).get("metadata")).get("annotations")).get(WORKERS_ANNOTATION)
    if raw is None:
        return 1
    try:
        workers = int(str(raw).strip())
    except ValueError as exc:
        raise PlacementError(f"annotation {WORKERS_ANNOTATION}={raw!r} is not an integer") from exc
    if workers < 1:
        raise PlacementError(f"annotation {WORKERS_ANNOTATION}={raw!r} must be at least 1")
    return workers


def placement_annotation(node: str, block: tuple[GpuSlot, ...]) -> str:
    """The ``powerflow.io/placement`` value: the pod's node and its gang's whole block."""
    return json.dumps({"node": node, "block": [[n, i] for n, i in block]}, separators=(",", ":"))


def parse_block(raw: Any) -> tuple[GpuSlot, ...]:
    """The block recorded on a bound pod; empty when absent or unreadable (GPUs then count).

    ``powerflow.core.untrusted.parse_block`` reads it: the same reader as the operator's
    and the node agent's, refusing what ``placement_annotation`` never writes."""
    if not isinstance(raw, str):
        return ()
    try:
        return untrusted.parse_block(raw, "placement annotation")
    except untrusted.UntrustedTextError:
        return ()


MAX_GPU_INDEX = untrusted.MAX_GPU_INDEX


def pod_info(pod: Any) -> PodInfo:
    """Read a pod body; PowerFlow-specific fields stay empty for other pods."""
    body = _dict(pod)
    meta, spec = _dict(body.get("metadata")), _dict(body.get("spec"))
    gang = gang_of(body)
    node = spec.get("nodeName")
    phase = _dict(body.get("status")).get("phase")
    try:
        workers = workers_of(body) if gang else 1
    except PlacementError:
        workers = 1
    annotations = _dict(meta.get("annotations"))
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=node if isinstance(node, str) else "",
        gpus=pod_gpus(body),
        gang=gang,
        workers=workers,
        block=parse_block(annotations.get(PLACEMENT_ANNOTATION)) if gang else (),
        terminal=isinstance(phase, str) and phase in TERMINAL_PHASES,
        tolerations=pod_tolerations(body) if gang else (),
        planned=parse_block(annotations.get(PLANNED_BLOCK_ANNOTATION)) if gang else (),
        owner=dljob_owner(body) if gang else "",
    )


def dljob_owner(pod: Any) -> str:
    """The UID of the pod's controller when that is a DLJob
    (``contract.dljob_controller``), else "": a UID here names a DLJob that exists or
    did a moment ago."""
    ref = dljob_controller(_dict(_dict(pod).get("metadata")))
    uid = None if ref is None else ref.get("uid")
    return uid if isinstance(uid, str) else ""


def describe(body: Any) -> str:
    """``Kind namespace/name`` of a body for a log line, whatever its shape."""
    obj = _dict(body)
    meta = _dict(obj.get("metadata"))
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    name = meta.get("name") if isinstance(meta.get("name"), str) else "?"
    namespace = meta.get("namespace")
    return f"{kind} {namespace}/{name}" if isinstance(namespace, str) else f"{kind} {name}"
