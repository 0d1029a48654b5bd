"""The bridge to the core's placement: cache entries in, one aligned block out.

A new gang gets the operator's planned block when it is free (``planned_block``),
else the block ``powerflow.core.policy.placement.reserve_block`` chooses (buddy
allocation with network packing, best fit); this module translates the cache's
view (GPU nodes, GPUs already taken) into the core's types.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from powerflow.core.gpus import GpuSpec, planned_gpu
from powerflow.core.policy.buddy import exact_block, geometry, resolve_slots
from powerflow.core.policy.placement import reserve_block
from powerflow.core.policy.snapshot import GpuSlot, Node


def gpu_spec_for(product: str) -> GpuSpec:
    """The GPU type of a node with this ``nvidia.com/gpu.product`` label: the catalogue's
    (``powerflow.core.gpus.planned_gpu``), else the unknown placeholder.

    Placement only counts GPUs, so the type never changes which block a gang gets,
    and a node of an unknown type is placed on like any other; the extender writes
    no clock. What the node agents discovered (``powerflow.core.gpu_facts``) goes to
    the operator alone, which plans clocks with it.
    """
    return planned_gpu(product)


def occupied_indices(capacity: int, slots: Collection[int], extra: int) -> set[int]:
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
    nodes: Sequence[Node], occupied: Mapping[str, Collection[int]], size: int
) -> tuple[GpuSlot, ...] | None:
    """An aligned block of ``size`` free GPUs, or None when none is free.

    ``nodes`` are the main pool's nodes (equal GPU counts) in a stable order
    (sorted by name, so that block alignment does not depend on the order the
    watch delivered them); nodes the gang may not use are given as full.
    A gang that fits in one node can use neither a full node nor its position
    in the order (single-node blocks align within their node), so full nodes
    are left out: the core then does work in proportion to the nodes with
    room, not to the cluster. Raises ``PlacementError`` for what buddy
    allocation cannot serve at all (a size that is not a power of two).
    """
    # The first node's count settles the common case without scanning for the largest.
    if nodes and (size <= nodes[0].gpus or size <= max(n.gpus for n in nodes)):
        used = occupied.get
        nodes = [n for n in nodes if len(used(n.name, ())) < n.gpus]
        if not nodes:
            return None
    return reserve_block(nodes, occupied, size)


def planned_block(
    nodes: Sequence[Node],
    occupied: Mapping[str, Collection[int]],
    planned: Sequence[GpuSlot],
    size: int,
) -> tuple[GpuSlot, ...] | None:
    """``planned`` (the operator's plan for the gang, ``contract.PLANNED_BLOCK_ANNOTATION``)
    when it is a block of ``size`` GPUs of ``nodes``, all free in ``occupied``: an
    aligned block of one node, or whole nodes; None otherwise, and ``choose_block``
    decides.

    Taking the plan's block keeps the cluster where the policy thinks it is: with a
    block of the extender's own choosing, the next plan found the gang elsewhere and
    moved other jobs again to make room (docs/twin.md, "Churn"). The plan comes
    from a pod annotation anyone who can edit the pod may write, so it is only a
    preference: a block within one node that is not aligned, a block of several nodes
    that is not whole nodes, one not free or on a node the gang may not use
    (``occupied`` marks those full) is ignored.

    Whole nodes need not be aligned in ``nodes``' order: the plan numbers nodes over
    its own list, which leaves out a node partly held by other pods, so a pair of
    nodes aligned there can straddle a pair boundary here.
    """
    if len(planned) != size or not nodes:
        return None
    geo = geometry(nodes)
    slots, valid = resolve_slots(geo, planned)
    if not valid:
        return None
    if size > geo.per_node:
        on = {n for n, _ in slots}
        if slots != {(n, i) for n in on for i in range(geo.per_node)}:
            return None
    elif exact_block(geo, slots, size) is None:
        return None
    if any(index in occupied.get(node, ()) for node, index in planned):
        return None
    return tuple(sorted(planned))
