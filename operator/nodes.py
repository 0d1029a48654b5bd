"""Node objects -> the core's ``Node``s: the GPU inventory the policy plans on.

GPUs come from ``status.allocatable["nvidia.com/gpu"]``. The GPU type, first
found first: what the node's agent discovered through NVML
(``powerflow.core.gpu_facts``, kept by ``discovered.DiscoveredGpus``); else the
catalogue type of the ``nvidia.com/gpu.product`` label (set by NVIDIA's GPU
feature discovery, e.g. ``NVIDIA-H100-80GB-HBM3``:
``powerflow.core.gpus.gpu_for_product``); else ``gpus.unknown_gpu``, a
placeholder planned for GPU counts only: PowerFlow writes no clock, cap or
profiling sweep for its jobs (``reconcile``), so their GPUs stay at their
defaults, and the budget counts each of its GPUs at the catalogue's largest
board limit. No type is ever guessed from another: clocks of one type are
never written to another.

Left out: nodes that are cordoned, not Ready, without GPUs, or with a
``NoSchedule``/``NoExecute`` taint that none of ``tolerations`` matches. The
workers' real tolerations come from each DLJob's pod template, which the
inventory cannot know per job, so a tainted node is planned on only when the
admin's ``tolerations`` (``powerflow operator --tolerate``, one set for all
jobs; the scheduler extender's ``--tolerate`` must say the same) tolerate
every hard taint on it. The default, ``powerflow.core.taints.GPU_TOLERATIONS``,
tolerates only the ``nvidia.com/gpu`` taint of managed GPU node pools, which
the API server's ``ExtendedResourceToleration`` admission gives every pod
requesting GPUs.

Nodes are pooled by the core's rule (``powerflow.core.policy.pools``), from their
allocatable GPUs, so the pools do not change as other pods come and go. The
operator plans the main pool and every other pool of a known type, each as its
type, under one budget (``fleet_nodes``, ``FleetPolicy``), and reports the nodes of
the pools it leaves out. GPUs held by bound, running pods that are not
PowerFlow's (no ``powerflow.io/job`` label) are taken within their node: the plan
needs equal nodes, so a node whose pool GPUs others hold is left out of the plan
until they go (``pools.plan_nodes``). The scheduler extender applies the same rule
to the same inputs, so it places each gang in the pool planned for it here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from powerflow.operator.bodies import NodeBody

from powerflow.core import contract
from powerflow.core.gpu_facts import merged_spec
from powerflow.core.gpus import GpuSpec, gpu_for_product, planned_gpu, tunes
from powerflow.core.policy.pools import NodeShape, Pool, plan_nodes, pools
from powerflow.core.policy.snapshot import Node
from powerflow.core.taints import (
    GPU_TOLERATIONS,
    hard_taints,
    node_cordoned,
    node_ready,
    untolerated,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
NO_DISCOVERY: Mapping[str, GpuSpec] = {}


gpu_of = planned_gpu
"""The node's type: discovered, else the label's catalogue type, else unknown."""


def known_gpu(product: str | None, discovered: GpuSpec | None = None) -> GpuSpec | None:
    """``gpu_of``'s type where it is one (discovered or catalogue); None: unknown."""
    return discovered if discovered is not None else gpu_for_product(product)


MAX_GPUS = 1 << 16
"""More GPUs than any node or pod has: such a quantity is garbage and reads as 0."""


def _count(raw: Any) -> int:
    """A whole extended-resource quantity (``"8"``, ``8``); 0 when unreadable or absurd."""
    if isinstance(raw, bool):
        return 0
    try:
        value = int(str(raw).strip())
    except ValueError:
        return 0
    return value if 0 < value < MAX_GPUS else 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _product(body: Any) -> str:
    label = _dict(_dict(_dict(body).get("metadata")).get("labels")).get(contract.GPU_PRODUCT_LABEL)
    return label if isinstance(label, str) else ""


def _shape(body: Any, tolerations: Iterable[Any]) -> NodeShape | None:
    """The node as pooling sees it, or None when PowerFlow may not plan on it at all."""
    if node_cordoned(body) or not node_ready(body) or untolerated(hard_taints(body), tolerations):
        return None
    name = _dict(_dict(body).get("metadata")).get("name")
    allocatable = _dict(_dict(_dict(body).get("status")).get("allocatable"))
    gpus = _count(allocatable.get(contract.GPU_RESOURCE, 0))
    if not isinstance(name, str) or not name or gpus < 1:
        return None
    return NodeShape(name, _product(body), gpus)


def parse_node(body: NodeBody, tolerations: Iterable[Any] = ()) -> Node | None:
    """One node's allocatable GPUs, or ``None`` when it offers none to schedule on."""
    shape = _shape(body, tolerations)
    if shape is None:
        return None
    return Node(name=shape.name, gpus=shape.allocatable, gpu=gpu_of(shape.product))


def unknown_gpu_nodes(
    bodies: Iterable[NodeBody], discovered: Mapping[str, GpuSpec] = NO_DISCOVERY
) -> list[str]:
    """The nodes with GPUs whose type neither their agent nor the catalogue knows."""
    out = []
    for body in bodies:
        name = _dict(_dict(body).get("metadata")).get("name")
        allocatable = _dict(_dict(_dict(body).get("status")).get("allocatable"))
        if not isinstance(name, str) or _count(allocatable.get(contract.GPU_RESOURCE, 0)) < 1:
            continue
        if known_gpu(_product(body), discovered.get(name)) is None:
            out.append(name)
    return sorted(out)


def pool_gpu(product: str, names: Iterable[str], discovered: Mapping[str, GpuSpec]) -> GpuSpec:
    """The type a pool of nodes with one product label is planned as.

    A label of a catalogue type: that type, with the facts its nodes' agents
    reported for it (reports naming another type are ignored; ``gpu_facts.node_spec``
    keeps each within the type's ranges). A label the catalogue lacks: what the
    agents discovered once every node of the pool has reported one type, else
    unknown (``gpu_of``): one agent, honest or not, never speaks for nodes that said
    nothing. Several reports of one type are merged to what all of them allow
    (``gpu_facts.merged_spec``), so honest boards that differ a little still plan together."""
    names = list(names)
    label = gpu_for_product(product)
    reports = [discovered[name] for name in names if name in discovered]
    if label is not None:
        same = [r for r in reports if r.name == label.name]
        return merged_spec(same) if same else label
    if not reports or len(reports) < len(names) or len({r.name for r in reports}) != 1:
        return gpu_of(product)
    return merged_spec(reports)


def pod_gpus(pod: Any) -> int:
    """GPUs a pod holds: its containers' sum, or its largest init container's if more.

    Limits win over requests, as for every extended resource.
    """
    spec = _dict(_dict(pod).get("spec"))

    def gpus(container: Any) -> int:
        resources = _dict(_dict(container).get("resources"))
        limits, requests = _dict(resources.get("limits")), _dict(resources.get("requests"))
        return _count(limits.get(contract.GPU_RESOURCE, requests.get(contract.GPU_RESOURCE, 0)))

    def each(field: str) -> list[int]:
        items = spec.get(field)
        return [gpus(c) for c in items] if isinstance(items, list) else []

    return max(sum(each("containers")), max(each("initContainers"), default=0))


def foreign_gpus(pods: Iterable[Any]) -> dict[str, int]:
    """GPUs held on each node by bound, non-terminal pods that are not PowerFlow's."""
    held: dict[str, int] = {}
    for pod in pods:
        meta, spec = _dict(_dict(pod).get("metadata")), _dict(_dict(pod).get("spec"))
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node or contract.JOB_LABEL in _dict(meta.get("labels")):
            continue
        if _dict(_dict(pod).get("status")).get("phase") in TERMINAL_PHASES:
            continue
        gpus = pod_gpus(pod)
        if gpus:
            held[node] = held.get(node, 0) + gpus
    return held


def _pooled(
    bodies: Iterable[NodeBody], foreign_gpu_pods: Iterable[Any], tolerations: Iterable[Any]
) -> tuple[list[NodeShape], tuple[Pool, ...]]:
    """The nodes PowerFlow may plan on, as pooling sees them, and their pools (main first)."""
    allowed = list(tolerations)
    held = foreign_gpus(foreign_gpu_pods)
    shapes = []
    for body in bodies:
        shape = _shape(body, allowed)
        if shape is not None:
            shapes.append(
                NodeShape(shape.name, shape.product, shape.allocatable, held.get(shape.name, 0))
            )
    return shapes, pools(shapes)


def cluster_nodes(
    bodies: Iterable[NodeBody],
    foreign_gpu_pods: Iterable[Any] = (),
    tolerations: Iterable[Any] = GPU_TOLERATIONS,
    discovered: Mapping[str, GpuSpec] = NO_DISCOVERY,
) -> tuple[tuple[Node, ...], tuple[str, ...]]:
    """The main pool's nodes the plan may use (sorted by name) and the names left out.

    ``foreign_gpu_pods``: pods that may hold GPUs (any pods: the bound,
    non-terminal ones requesting ``nvidia.com/gpu`` without the
    ``powerflow.io/job`` label count). ``tolerations``: the node taints
    PowerFlow's pools accept (see the module doc). The names left out are the
    nodes of the other pools (another product, or another capacity); the
    main pool's nodes held in part by others are in neither. ``discovered``: each
    node's type as its agent reported it (``pool_gpu``). What a one-pool view
    needs (``powerflow budget``'s what-if); the operator plans ``fleet_nodes``.
    """
    shapes, found = _pooled(bodies, foreign_gpu_pods, tolerations)
    if not found:
        return (), ()
    main, others = found[0], found[1:]
    gpu = pool_gpu(main.product, main.nodes, discovered)
    kept = tuple(Node(name=name, gpus=main.per_node, gpu=gpu) for name in plan_nodes(main, shapes))
    left = tuple(sorted(name for pool in others for name in pool.nodes))
    return kept, left


def fleet_nodes(
    bodies: Iterable[NodeBody],
    foreign_gpu_pods: Iterable[Any] = (),
    tolerations: Iterable[Any] = GPU_TOLERATIONS,
    discovered: Mapping[str, GpuSpec] = NO_DISCOVERY,
) -> tuple[tuple[Node, ...], tuple[str, ...]]:
    """The nodes of every pool the operator plans, pool by pool (the main pool first,
    each sorted by name), and the names of the pools' nodes it leaves out.

    Arguments as ``cluster_nodes``'. Planned: the main pool, whatever its type, and
    each other pool whose type is known (``known_gpu``: discovered or catalogue),
    each with its own type (``pool_gpu``); ``FleetPolicy`` plans them under one
    budget. Left out: a pool of unknown type beside the main pool (the placeholder
    plans GPU counts only, and one pass tunes all of its GPUs or none:
    ``reconcile``); every other pool when the main pool's type is unknown; and a
    pool of the same type and node size as one planned before it (two product
    labels of one type, or boards whose reports differ: the policy plans one spec
    per type and size, and the scheduler extender places a gang within one pool).
    With one pool this is ``cluster_nodes``.
    """
    shapes, found = _pooled(bodies, foreign_gpu_pods, tolerations)
    kept: list[Node] = []
    left: list[str] = []
    planned: set[tuple[str, int]] = set()
    main_tuned = False
    for rank, pool in enumerate(found):
        gpu = pool_gpu(pool.product, pool.nodes, discovered)
        key = (gpu.name, pool.per_node)
        if rank == 0:
            main_tuned = tunes(gpu)
        elif not (main_tuned and tunes(gpu)) or key in planned:
            left.extend(pool.nodes)
            continue
        planned.add(key)
        names = plan_nodes(pool, shapes)
        kept.extend(Node(name=name, gpus=pool.per_node, gpu=gpu) for name in names)
    return tuple(kept), tuple(sorted(left))
