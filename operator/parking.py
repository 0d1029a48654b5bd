"""Marking the nodes the plan powers down: pure functions from a pass's view to node patches.

The policy lists in ``Plan.powered_down_nodes`` the nodes it gives no GPU
(their idle power counts zero in its prediction). The operator marks each
such node with the annotation ``contract.POWERED_DOWN_ANNOTATION`` (value:
when it was marked, RFC 3339) and the taint ``contract.POWERED_DOWN_TAINT``
with effect ``PreferNoSchedule``; the node agent parks the GPUs of a marked
node that no container holds (lowest clock, minimum power limit), and the
taint steers other pods elsewhere so that an empty node stays empty (and a
cluster-autoscaler can remove it: README, "Nodes the plan powers down").
Both go as soon as the plan uses the node again or the node leaves the plan
(cordoned, NotReady, another pool, a foreign GPU pod arrived).

What is never done: marking a node of a GPU type PowerFlow does not know
(``gpus.tunes`` false: the pool is planned for GPU counts only and its GPUs are
left at their defaults, ``nodes``; parking would lock their clocks and power
limits all the same), marking a node where a pod that is not PowerFlow's
holds a GPU (``nodes.cluster_nodes`` already leaves such nodes out of the
plan; the check is repeated here against the same pods so that a mark can
never follow from a stale plan), marking a node where a PowerFlow worker is
still bound (the extender, not the plan, chose its GPUs, so the plan's
placement can differ from where the workers are; the node is marked once they
are gone), cordoning, draining or deleting anything. Other taints and
annotations are kept: the patch rewrites ``spec.taints`` as a whole (a
JSON merge patch replaces lists, and ``taints`` has no strategic merge key),
so it carries the ``resourceVersion`` it was computed from and the API
server refuses it (409) when the node changed meanwhile; ``Kube`` then
re-reads the node and computes the patch again (``mark_patch``).

Without a plan in a pass (no runnable DLJob, or the policy refused the
snapshot) the marks the last plan left stay as they are, except on nodes
that left the plan. Every decision is read back from the node itself, so a
restarted operator writes nothing for nodes already marked as it would
mark them (the annotation keeps its first time).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.operator.bodies import NodeBody, PodBody
from powerflow.operator.nodes import TERMINAL_PHASES, foreign_gpus

from powerflow.core import contract
from powerflow.core.gpus import tunes
from powerflow.core.policy.snapshot import Node, Plan

EFFECT = "PreferNoSchedule"


@dataclass(frozen=True)
class NodeMark:
    """One node to mark (``powered_down``) or unmark, and the patch that does it.

    ``since``: the annotation's value if the node is marked (RFC 3339), kept
    so that a patch recomputed after a conflict says the same.
    """

    node: str
    powered_down: bool
    since: str
    patch: dict[str, Any]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _name(body: Any) -> str:
    name = _dict(_dict(body).get("metadata")).get("name")
    return name if isinstance(name, str) else ""


def _taints(body: Any) -> list[Any]:
    taints = _dict(_dict(body).get("spec")).get("taints")
    return taints if isinstance(taints, list) else []


def _ours(taint: Any) -> bool:
    return isinstance(taint, dict) and taint.get("key") == contract.POWERED_DOWN_TAINT


def is_marked(body: Any) -> bool:
    """Marked as PowerFlow marks: the annotation and the taint with effect ``PreferNoSchedule``."""
    annotations = _dict(_dict(_dict(body).get("metadata")).get("annotations"))
    ours = [t for t in _taints(body) if _ours(t)]
    return (
        contract.POWERED_DOWN_ANNOTATION in annotations
        and len(ours) == 1
        and ours[0].get("effect") == EFFECT
    )


def has_any_mark(body: Any) -> bool:
    """The annotation or a taint with PowerFlow's key, whatever its effect."""
    annotations = _dict(_dict(_dict(body).get("metadata")).get("annotations"))
    return contract.POWERED_DOWN_ANNOTATION in annotations or any(_ours(t) for t in _taints(body))


def mark_patch(body: Any, powered_down: bool, since: str) -> dict[str, Any] | None:
    """The JSON merge patch that gives the node the wanted marks; None when it has them.

    Marking adds the annotation (unless present: its time stays) and sets
    PowerFlow's taint to exactly one ``PreferNoSchedule`` entry; unmarking
    removes the annotation and every taint with PowerFlow's key. Other taints
    keep their order and content; the patch carries the node's
    ``resourceVersion`` (optimistic concurrency, see the module docstring).
    """
    if (is_marked(body) if powered_down else not has_any_mark(body)) is True:
        return None
    meta = _dict(_dict(body).get("metadata"))
    annotations = _dict(meta.get("annotations"))
    others = [t for t in _taints(body) if not _ours(t)]
    patch_meta: dict[str, Any] = {}
    version = meta.get("resourceVersion")
    if isinstance(version, str) and version:
        patch_meta["resourceVersion"] = version
    if powered_down:
        taints: list[Any] = [*others, {"key": contract.POWERED_DOWN_TAINT, "effect": EFFECT}]
        if contract.POWERED_DOWN_ANNOTATION not in annotations:
            patch_meta["annotations"] = {contract.POWERED_DOWN_ANNOTATION: since}
    else:
        taints = others
        if contract.POWERED_DOWN_ANNOTATION in annotations:
            patch_meta["annotations"] = {contract.POWERED_DOWN_ANNOTATION: None}
    patch: dict[str, Any] = {"metadata": patch_meta}
    if taints != _taints(body):
        # null, not [], once nothing is left: the API server omits an empty list.
        patch["spec"] = {"taints": taints or None}
    return patch


def busy_nodes(workers: Iterable[PodBody], foreign_gpu_pods: Iterable[Any]) -> frozenset[str]:
    """Nodes that must not be marked: a foreign pod holds a GPU there, or a PowerFlow
    worker (of ``workers``) is bound there and not finished (terminating ones included)."""
    busy = set(foreign_gpus(foreign_gpu_pods))
    for pod in workers:
        node = _dict(_dict(pod).get("spec")).get("nodeName")
        phase = _dict(_dict(pod).get("status")).get("phase")
        if isinstance(node, str) and node and phase not in TERMINAL_PHASES:
            busy.add(node)
    return frozenset(busy)


def powered_down(
    plan: Plan | None,
    planned: Sequence[Node],
    bodies: Iterable[NodeBody],
    busy: Collection[str],
) -> frozenset[str]:
    """The nodes to be marked after this pass (see the module docstring): never one of a
    GPU type PowerFlow does not tune (``gpus.tunes``)."""
    names = {n.name for n in planned if tunes(n.gpu)}
    if plan is not None:
        wanted = set(plan.powered_down_nodes)
    else:  # no plan this pass: the last plan's marks stand
        wanted = {_name(b) for b in bodies if is_marked(b)}
    return frozenset(n for n in wanted & names if n not in busy)


def node_marks(
    bodies: Iterable[NodeBody],
    planned: Sequence[Node],
    plan: Plan | None,
    busy: Collection[str],
    since: str,
) -> list[NodeMark]:
    """The node patches of one pass: a mark for each node to be marked that is not yet,
    an unmark for each node carrying any PowerFlow mark that is not to be marked.
    ``since``: the pass's time, RFC 3339 (the annotation of a node marked now)."""
    nodes = list(bodies)
    down = powered_down(plan, planned, nodes, busy)
    out = []
    for body in sorted(nodes, key=_name):
        name = _name(body)
        if not name:
            continue
        patch = mark_patch(body, name in down, since)
        if patch is not None:
            out.append(NodeMark(name, name in down, since, patch))
    return out
