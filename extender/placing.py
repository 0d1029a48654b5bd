"""The bridge to the core's placement: cache entries in, one aligned block out.

Placement decisions come from ``powerflow.policy.placement.reserve_block``
(buddy allocation with network packing); this module only translates the
cache's view (GPU nodes, GPUs already taken) into the core's types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from powerflow.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.policy.placement import reserve_block
from powerflow.policy.snapshot import GpuSlot, Node


class _Entry(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def product(self) -> str: ...


def gpu_spec_for(product: str) -> GpuSpec:
    """The GPU type named in a node's ``nvidia.com/gpu.product`` label.

    Placement only counts GPUs, so an unknown product falls back to the
    default type rather than refusing the node.
    """
    text = product.lower()
    for name, spec in GPU_SPECS.items():
        if name.lower() in text:
            return spec
    return A100


def occupied_indices(capacity: int, slots: set[int], extra: int) -> set[int]:
    """Exact taken slots plus ``extra`` GPUs counted on the lowest free indices."""
    taken = {i for i in slots if 0 <= i < capacity}
    for index in range(capacity):
        if extra <= 0:
            break
        if index not in taken:
            taken.add(index)
            extra -= 1
    return taken


def choose_block(
    nodes: Iterable[_Entry], slots: Mapping[str, set[int]], extra: Mapping[str, int], size: int
) -> tuple[GpuSlot, ...] | None:
    """An aligned block of ``size`` free GPUs, or None when none is free.

    Nodes go to the core sorted by name, so block alignment does not depend
    on the order the watch delivered them. Raises ``PlacementError`` for what
    buddy allocation cannot serve at all (a size that is not a power of two,
    nodes with unequal GPU counts).
    """
    gpu_nodes = sorted((n for n in nodes if n.gpus > 0), key=lambda n: n.name)
    core = [Node(n.name, n.gpus, gpu_spec_for(n.product)) for n in gpu_nodes]
    occupied = {
        n.name: occupied_indices(n.gpus, slots.get(n.name, set()), extra.get(n.name, 0))
        for n in gpu_nodes
        if n.name in slots or n.name in extra
    }
    return reserve_block(core, occupied, size)
