"""Node pools: the sets of nodes that buddy allocation may treat as equal.

Buddy placement (``buddy.py``) needs nodes with one power-of-two GPU count, and
a gang should run on one GPU product. Real clusters mix 8- and 4-GPU nodes,
several products, and nodes whose kubelet offers 7 GPUs after one failed. So
each node joins the pool of (its GPU product label, its *capacity*: the
largest power of two that fits in the GPUs it offers, ``usable_gpus`` of its
allocatable count); the GPUs above it stay unused by PowerFlow. Each gang is
placed within one pool.

A single-pool policy plans one node shape, so one pool is the main pool: the
one with the most GPUs by capacity (ties: larger nodes, then the product
name), ``pools``'s first. Pools are made from allocatable counts only, never
from what other pods hold right now: a pool chosen by free GPUs would flip to
a small idle pool whenever others' pods fill the large one, and then the
large pool's nodes would be reported as never able to host a gang (so
preemption could never free them), and the plan's shape would change with
foreign load. The operator plans the main pool and every other pool of a
known GPU type, one plan per pool under one budget (``fleet.FleetPolicy``);
the scheduler extender places each gang within the pool its plan names (the
main pool for a gang without a plan), so the plan's GPU counts and the
placements agree (a pool's plan never counts GPUs of another pool, and a gang
on another product would run at speeds and powers the plan did not assume).

GPUs held by pods PowerFlow does not place (``NodeShape.held``) are taken
*within* their node. The scheduler extender, which knows exactly which GPUs
are taken, places on the main pool's *key* (product and count) rather than
its exact members: every node of that product that offers at least the
pool's count serves as one of its nodes (``serves``), with other pods' GPUs
counted as taken there (``taken_by_others``). The plan needs equal nodes, so
it counts only the members none of whose pool GPUs others hold
(``plan_nodes``); a node partly held by others is left out of the plan (its
free GPUs still take gangs the extender places), and counts again once they
go. So the extender's nodes are a superset of the plan's, each with at least
the room the plan assumes, and a gang the plan admits finds its block.

Pure: plain names and counts in, frozen pools out; no Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def usable_gpus(allocatable: int, held: int = 0) -> int:
    """The largest power of two at most ``allocatable - held`` (0 when none is free).

    ``held`` GPUs always fit in what is left over (``allocatable - usable >=
    held``), so the pods holding them never take one of the pool's GPUs.
    """
    free = allocatable - held
    return 1 << (free.bit_length() - 1) if free >= 1 else 0


@dataclass(frozen=True)
class NodeShape:
    """What pooling reads of one node."""

    name: str
    product: str
    """The GPU product label (``nvidia.com/gpu.product``); empty when unlabelled."""
    allocatable: int
    """GPUs the kubelet offers to pods."""
    held: int = 0
    """GPUs held by pods PowerFlow does not place (taken within the node; the pool
    it joins does not depend on them)."""

    @property
    def capacity(self) -> int:
        """GPUs per node of the pool it joins: the largest power of two in ``allocatable``."""
        return usable_gpus(self.allocatable)


@dataclass(frozen=True)
class Pool:
    """Nodes of one GPU product with the same power-of-two capacity."""

    product: str
    per_node: int
    nodes: tuple[str, ...]
    """Sorted by name: the stable order that multi-node blocks are aligned in."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.product, self.per_node)

    @property
    def gpus(self) -> int:
        return self.per_node * len(self.nodes)


def pools(shapes: Iterable[NodeShape]) -> tuple[Pool, ...]:
    """The pools of nodes with at least one allocatable GPU, the main pool first.

    Ranked by GPUs by capacity (more first), then GPUs per node (more first:
    fewer nodes per multi-node gang), then product name, so the order never
    depends on the order of ``shapes``, nor on the GPUs others hold.
    """
    members: dict[tuple[str, int], list[str]] = {}
    for shape in shapes:
        capacity = shape.capacity
        if capacity:
            members.setdefault((shape.product, capacity), []).append(shape.name)
    found = [Pool(product, n, tuple(sorted(names))) for (product, n), names in members.items()]
    found.sort(key=lambda p: (-p.gpus, -p.per_node, p.product))
    return tuple(found)


def main_pool(shapes: Iterable[NodeShape]) -> Pool | None:
    """The pool PowerFlow plans and places on (``pools``'s first), or None without GPUs."""
    found = pools(shapes)
    return found[0] if found else None


def serves(pool: Pool, shape: NodeShape) -> bool:
    """Whether a node can act as one of ``pool``'s nodes when others' GPUs count as taken."""
    return shape.product == pool.product and shape.allocatable >= pool.per_node >= 1


def taken_by_others(pool: Pool, shape: NodeShape) -> int:
    """GPUs of the pool's ``per_node`` that others' pods hold on a node that ``serves`` it.

    They fill the GPUs beyond ``per_node`` first (the device plugin hands out
    whole devices, so which ones is not PowerFlow's to know, only how many).
    """
    return min(pool.per_node, max(0, shape.held - (shape.allocatable - pool.per_node)))


def plan_nodes(pool: Pool, shapes: Iterable[NodeShape]) -> tuple[str, ...]:
    """The pool's members whose ``per_node`` GPUs are all free of others' pods, sorted.

    The nodes the plan counts: it needs equal nodes, so a member that others'
    pods hold GPUs of is left out until they go, not planned smaller.
    """
    members = set(pool.nodes)
    return tuple(
        sorted(s.name for s in shapes if s.name in members and not taken_by_others(pool, s))
    )
