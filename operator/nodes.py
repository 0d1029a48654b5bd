"""Node objects -> the core's ``Node``s: the GPU inventory the policy plans on.

GPUs come from ``status.allocatable["nvidia.com/gpu"]`` and the GPU type from
the ``nvidia.com/gpu.product`` label (set by NVIDIA's GPU feature discovery,
e.g. ``NVIDIA-A100-SXM4-40GB``), matched to ``powerflow.gpus`` by name.
An unknown or missing product falls back to ``FALLBACK_GPU`` (A100, the only
profiled type). Nodes that are cordoned, not Ready or without GPUs are left
out. PowerFlow plans one node shape; when shapes differ, the most common shape
(ties: more GPUs) is kept and the others are reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from powerflow.operator.bodies import NodeBody

from powerflow import contract
from powerflow.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.policy.snapshot import Node

FALLBACK_GPU = A100


def gpu_of(product: str | None) -> GpuSpec:
    """The spec whose name appears in the product label; the fallback otherwise."""
    text = (product or "").upper()
    for name, spec in sorted(GPU_SPECS.items(), key=lambda kv: -len(kv[0])):
        if name.upper() in text:
            return spec
    return FALLBACK_GPU


def _ready(body: NodeBody) -> bool:
    conditions = body.get("status", {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return not ready or ready[-1].get("status") == "True"


def parse_node(body: NodeBody) -> Node | None:
    """One node's GPUs, or ``None`` when it offers none to schedule on."""
    if body.get("spec", {}).get("unschedulable") or not _ready(body):
        return None
    raw = (body.get("status", {}).get("allocatable") or {}).get(contract.GPU_RESOURCE, "0")
    try:
        gpus = int(str(raw))
    except ValueError:
        return None
    if gpus < 1:
        return None
    labels = body.get("metadata", {}).get("labels") or {}
    name = body.get("metadata", {}).get("name", "")
    return Node(name=name, gpus=gpus, gpu=gpu_of(labels.get(contract.GPU_PRODUCT_LABEL)))


def cluster_nodes(bodies: Iterable[NodeBody]) -> tuple[tuple[Node, ...], tuple[str, ...]]:
    """The nodes the policy may plan on, sorted by name, and the names left out for shape."""
    nodes = [n for n in (parse_node(b) for b in bodies) if n is not None]
    if not nodes:
        return (), ()
    shapes = Counter((n.gpu.name, n.gpus) for n in nodes)
    keep = max(shapes, key=lambda s: (shapes[s], s[1]))
    kept = tuple(sorted((n for n in nodes if (n.gpu.name, n.gpus) == keep), key=lambda n: n.name))
    left = tuple(sorted(n.name for n in nodes if (n.gpu.name, n.gpus) != keep))
    return kept, left
