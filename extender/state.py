"""The extender's view of the cluster and its gang reservations; no I/O.

Nodes and GPU-holding pods come in from the API watch (``upsert_*``,
``delete_*``, ``replace``); the scheduler's questions go out as plain answers
(``filter``, ``prioritize``, ``begin_bind``). Everything runs on one event
loop, so no locks: a bind records its pod as *assumed* before it awaits the
API, and the next filter already counts it.

A gang's block is chosen by the core's placement module (buddy allocation
with network packing) when its first worker is filtered, and written on each
bound pod's ``powerflow.io/placement`` annotation; ``replace`` rebuilds the
gangs from those annotations, so a restarted extender continues where the old
one stopped. A gang that does not complete within ``ttl_s`` keeps only the
GPUs of its bound workers; a late worker reserves what is missing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from powerflow.errors import PlacementError
from powerflow.policy.snapshot import GpuSlot, Node

from .objects import GangKey, PodInfo, node_gpus, node_product, pod_info
from .objects import name_of as _name_of
from .placing import choose_block, gpu_spec_for, occupied_indices
from .wire import MAX_EXTENDER_PRIORITY

PodKey = tuple[str, str]


class NotSynced(PlacementError):
    """The cache has not (or no longer) mirrored the cluster; deciding would be guessing."""


@dataclass(frozen=True)
class NodeEntry:
    name: str
    gpus: int
    product: str


@dataclass
class Gang:
    """A gang's reservation: its block, and which of its workers hold GPUs where."""

    key: GangKey
    block: tuple[GpuSlot, ...]
    workers: int
    created_s: float
    assumed: dict[PodKey, tuple[str, int]] = field(default_factory=dict)
    """Workers being bound (or bound but not yet seen by the watch): node and GPUs."""
    expired: bool = False
    started: bool = False
    """A worker has been bound; once none is left, the gang has finished."""
    settled: bool = False
    """Every worker has been placed once: the block is the job's until it ends, never expires."""


class Reservations(dict[GangKey, Gang]):
    """The gangs by key, keeping the union of their blocks on each node as they change.

    A new gang's block is chosen around every live block; rebuilding that
    union for each reservation would cost a pass over every gang on the
    scheduler's critical path. Setting, deleting, popping and clearing keep
    it here (``held``), and a block that shrinks must be set with ``reblock``;
    the ways of changing a dict that would bypass this are refused.
    """

    def __init__(self) -> None:
        super().__init__()
        self._count: dict[str, dict[int, int]] = {}  # node -> index -> blocks holding it
        self.held: dict[str, frozenset[int]] = {}
        """GPU indices of some live block, per node (frozen: read without copying)."""

    def __setitem__(self, key: GangKey, gang: Gang) -> None:
        old = self.get(key)
        super().__setitem__(key, gang)
        self._move(old.block if old is not None else (), gang.block)

    def __delitem__(self, key: GangKey) -> None:
        old = self[key]
        super().__delitem__(key)
        self._move(old.block, ())

    def pop(self, key: GangKey, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        gang = self[key]
        del self[key]
        return gang

    def clear(self) -> None:
        super().clear()
        self._count.clear()
        self.held.clear()

    def reblock(self, gang: Gang, block: tuple[GpuSlot, ...]) -> None:
        """Give a live gang a new block."""
        old, gang.block = gang.block, block
        if self.get(gang.key) is gang:
            self._move(old, block)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Reservations change only by [key] =, del, pop, clear and reblock")

    update = setdefault = popitem = __ior__ = _refuse

    def _move(self, old: tuple[GpuSlot, ...], new: tuple[GpuSlot, ...]) -> None:
        touched: set[str] = set()
        for node, index in new:
            per = self._count.setdefault(node, {})
            per[index] = per.get(index, 0) + 1
            touched.add(node)
        for node, index in old:
            per = self._count[node]
            per[index] -= 1
            if not per[index]:
                del per[index]
            touched.add(node)
        for node in touched:
            if self._count[node]:
                self.held[node] = frozenset(self._count[node])
            else:
                del self._count[node]
                self.held.pop(node, None)


@dataclass(frozen=True)
class FilterAnswer:
    admitted: list[str]
    failed: dict[str, str]


class ClusterState:
    """Nodes, GPU pods and gang reservations, with indexes kept for O(candidates) answers."""

    def __init__(self, ttl_s: float = 120.0, clock: Callable[[], float] | None = None) -> None:
        import time

        self.ttl_s = ttl_s
        self._clock = clock or time.monotonic
        self.nodes: dict[str, NodeEntry] = {}
        self.pods: dict[PodKey, PodInfo] = {}
        self.gangs = Reservations()
        self._bound_gpus: dict[str, int] = {}  # node -> GPUs of bound, running pods
        self._members: dict[GangKey, dict[PodKey, str]] = {}  # bound pods of each gang
        self._in_flight: dict[str, int] = {}  # node -> GPUs of binds not yet seen bound
        self._foreign: dict[str, int] = {}  # node -> GPUs of bound pods of no gang
        self._core_nodes: dict[str, Node] = {}  # the GPU nodes as the core sees them
        self._core_order: list[Node] | None = None
        self.synced = False
        self.expired_total = 0
        self._last_expiry = float("-inf")
        self.unsynced_reason = "the Kubernetes API has not been listed yet"

    # -- keeping the cache -----------------------------------------------------------------

    def mark_synced(self) -> None:
        self.synced, self.unsynced_reason = True, ""

    def mark_unsynced(self, reason: str) -> None:
        self.synced, self.unsynced_reason = False, reason

    def replace(self, nodes: Iterable[Any], pods: Iterable[Any]) -> None:
        """Take a full listing as the truth (startup and every relist)."""
        self.nodes.clear()
        self.pods.clear()
        self._bound_gpus.clear()
        self._members.clear()
        self._foreign.clear()
        self._core_nodes.clear()
        self._core_order = None
        for node in nodes:
            self.upsert_node(node)
        for pod in pods:
            self._put_pod(pod_info(pod))
        for key, gang in list(self.gangs.items()):
            # In-memory reservations survive a relist, but a gang whose workers all
            # went away while we were not watching has finished.
            if gang.started and not gang.assumed and not self._members.get(key):
                del self.gangs[key]
        self._adopt_annotated()
        self.mark_synced()

    def upsert_node(self, body: Any) -> None:
        name = _name_of(body)
        if not name:
            return
        entry = NodeEntry(name, node_gpus(body), node_product(body))
        if self.nodes.get(name) == entry:
            return  # a heartbeat: nothing placement cares about changed
        self.nodes[name] = entry
        self._core_nodes.pop(name, None)
        if entry.gpus > 0:
            self._core_nodes[name] = Node(name, entry.gpus, gpu_spec_for(entry.product))
        self._core_order = None

    def delete_node(self, body: Any) -> None:
        name = _name_of(body)
        self.nodes.pop(name, None)
        if self._core_nodes.pop(name, None) is not None:
            self._core_order = None

    def core_nodes(self) -> list[Node]:
        """The GPU nodes sorted by name: the stable order blocks are aligned in."""
        if self._core_order is None:
            self._core_order = [self._core_nodes[n] for n in sorted(self._core_nodes)]
        return self._core_order

    def upsert_pod(self, body: Any) -> None:
        info = pod_info(body)
        self._put_pod(info)
        if info.gang is not None and info.gang not in self.gangs and info.block and info.bound:
            self._adopt_annotated()

    def delete_pod(self, body: Any) -> None:
        info = pod_info(body)
        self._drop_pod(info.key)
        self._release_if_done(info.gang)

    def _put_pod(self, info: PodInfo) -> None:
        self._drop_pod(info.key)
        if info.terminal or (info.gang is None and info.gpus == 0):
            self._release_if_done(info.gang)
            return
        self.pods[info.key] = info
        if info.bound:
            self._bound_gpus[info.node] = self._bound_gpus.get(info.node, 0) + info.gpus
            if info.gang is None:
                self._foreign[info.node] = self._foreign.get(info.node, 0) + info.gpus
            else:
                self._members.setdefault(info.gang, {})[info.key] = info.node
                gang = self.gangs.get(info.gang)
                if gang is not None:
                    self._unassume(gang, info.key)
                    gang.started = True
                    gang.settled = gang.settled or self._complete(gang)

    def _drop_pod(self, key: PodKey) -> None:
        old = self.pods.pop(key, None)
        if old is None or not old.bound:
            return
        _subtract(self._bound_gpus, old.node, old.gpus)
        if old.gang is None:
            _subtract(self._foreign, old.node, old.gpus)
        else:
            members = self._members.get(old.gang, {})
            members.pop(key, None)
            if not members:
                self._members.pop(old.gang, None)

    def _release_if_done(self, key: GangKey | None) -> None:
        """Forget a started gang once none of its workers holds GPUs (finished or rescaled).

        A reservation whose first worker is still pending is kept until it binds
        or expires.
        """
        gang = self.gangs.get(key) if key is not None else None
        if gang is not None and gang.started and not gang.assumed and gang.key not in self._members:
            del self.gangs[gang.key]

    def _adopt_annotated(self) -> None:
        """Rebuild gangs from bound pods' placement annotations (restart, or another extender)."""
        found: dict[GangKey, tuple[list[GpuSlot], int]] = {}
        for info in self.pods.values():
            if info.gang is None or not info.bound or not info.block or info.gang in self.gangs:
                continue
            slots, workers = found.setdefault(info.gang, ([], info.workers))
            slots.extend(s for s in info.block if s not in slots)
            found[info.gang] = (slots, max(workers, info.workers))
        now = self._clock()
        for key, (slots, workers) in found.items():
            gang = Gang(key, tuple(slots), workers, created_s=now, started=True)
            gang.settled = self._complete(gang)
            self.gangs[key] = gang

    def _assume(self, gang: Gang, key: PodKey, node: str, gpus: int) -> None:
        self._unassume(gang, key)
        gang.assumed[key] = (node, gpus)
        self._in_flight[node] = self._in_flight.get(node, 0) + gpus
        gang.settled = gang.settled or self._complete(gang)

    def _unassume(self, gang: Gang, key: PodKey) -> None:
        entry = gang.assumed.pop(key, None)
        if entry is not None:
            _subtract(self._in_flight, *entry)

    # -- reservations ----------------------------------------------------------------------

    def expire(self) -> list[GangKey]:
        """Shrink reservations of gangs that did not complete in time to their bound workers.

        Checked at most once a second (TTLs are minutes; the scan is over every gang).
        """
        now = self._clock()
        if now - self._last_expiry < 1.0:
            return []
        self._last_expiry = now
        expired = []
        for key, gang in list(self.gangs.items()):
            if gang.settled or now - gang.created_s < self.ttl_s or self._complete(gang):
                continue
            held = self._held_slots(gang)
            if len(held) == len(gang.block):
                continue
            expired.append(key)
            if held:
                self.gangs.reblock(gang, held)
                gang.expired = True
            else:
                for pod in list(gang.assumed):
                    self._unassume(gang, pod)
                del self.gangs[key]
        return expired

    def _node_use(self, gang: Gang) -> dict[str, int]:
        """GPUs the gang's bound and assumed workers take on each node."""
        use: dict[str, int] = {}
        members = self._members.get(gang.key, {})
        for key, node in members.items():
            use[node] = use.get(node, 0) + self.pods[key].gpus
        for key, (node, gpus) in gang.assumed.items():
            if key not in members:
                use[node] = use.get(node, 0) + gpus
        return use

    def _placed(self, gang: Gang) -> dict[PodKey, str]:
        """Where each bound or assumed worker of the gang is."""
        placed = {key: node for key, (node, _) in gang.assumed.items()}
        placed.update(self._members.get(gang.key, {}))
        return placed

    def _complete(self, gang: Gang) -> bool:
        return len(self._placed(gang)) >= gang.workers

    def _held_slots(self, gang: Gang) -> tuple[GpuSlot, ...]:
        use = self._node_use(gang)
        held: list[GpuSlot] = []
        for node, gpus in use.items():
            held.extend(sorted(s for s in gang.block if s[0] == node)[:gpus])
        return tuple(held)

    def occupied(self) -> dict[str, frozenset[int] | set[int]]:
        """GPU indices taken on each node: every live block, plus bound GPUs outside any.

        Those outside (pods of no gang, workers of a gang no longer reserved)
        have no known index; they are counted on the lowest free ones.
        """
        slots: dict[str, frozenset[int] | set[int]] = dict(self.gangs.held)
        extra = dict(self._foreign)
        for key in self._members.keys() - self.gangs.keys():  # bound, no longer reserved
            for pod, node in self._members[key].items():
                extra[node] = extra.get(node, 0) + self.pods[pod].gpus
        for node, count in extra.items():
            entry = self.nodes.get(node)
            if entry is not None:
                slots[node] = occupied_indices(entry.gpus, slots.get(node, frozenset()), count)
        return slots

    def reserve(self, key: GangKey, workers: int, gpus_per_pod: int) -> Gang | None:
        """The gang's reservation, made now if needed; None when no aligned block is free.

        A new gang reserves ``workers * gpus_per_pod`` GPUs at once. A worker of
        an expired gang (its reservation shrank to its bound workers) finds no
        room in the block and reserves its own GPUs, so late workers still run.
        """
        gang = self.gangs.get(key)
        if gang is not None and (not gang.expired or sum(self.room(gang).values()) >= gpus_per_pod):
            return gang
        need = gpus_per_pod if gang is not None else workers * gpus_per_pod
        held = gang.block if gang is not None else ()
        block = choose_block(self.core_nodes(), self.occupied(), need)
        if block is None:
            return None
        new = Gang(key, tuple(held) + tuple(block), workers, created_s=self._clock())
        if gang is not None:
            new.assumed, new.started, new.expired = gang.assumed, gang.started, True
        self.gangs[key] = new
        return new

    # -- the scheduler's questions ---------------------------------------------------------

    def _gang_for(self, info: PodInfo) -> Gang | None:
        if not self.synced:
            raise NotSynced(f"PowerFlow cannot place this pod yet: {self.unsynced_reason}")
        if info.gang is None or info.gpus < 1:
            raise PlacementError(f"pod {info.namespace}/{info.name} is not a PowerFlow GPU worker")
        self.expired_total += len(self.expire())
        return self.reserve(info.gang, info.workers, info.gpus)

    def _no_block(self, info: PodInfo) -> str:
        size = info.workers * info.gpus
        return f"no aligned block of {size} free GPUs for gang {info.gang} (buddy allocation)"

    def room(self, gang: Gang) -> dict[str, int]:
        """Free GPUs of the gang's block on each of its nodes."""
        use = self._node_use(gang)
        room: dict[str, int] = {}
        for node, _ in gang.block:
            room[node] = room.get(node, 0) + 1
        return {node: slots - use.get(node, 0) for node, slots in room.items()}

    def member_node(self, gang: Gang, info: PodInfo) -> str | None:
        return self._placed(gang).get(info.key) or (info.node or None)

    def filter(self, info: PodInfo, candidates: list[str]) -> FilterAnswer:
        """Admit the candidates where the pod's gang block still has room for it."""
        gang = self._gang_for(info)
        if gang is None:
            why = self._no_block(info)
            return FilterAnswer([], {name: why for name in candidates})
        placed = self.member_node(gang, info)
        if placed is not None:
            why = f"pod {info.namespace}/{info.name} is already placed on {placed}"
            return FilterAnswer(
                [n for n in candidates if n == placed],
                {n: why for n in candidates if n != placed},
            )
        # Every candidate fails as outside the block but the block's few nodes: start
        # from that (one C call for a thousand names), then settle the block's nodes.
        outside = f"not in the GPU block reserved for gang {gang.key}"
        full = f"the GPUs of gang {gang.key}'s block on this node are taken by its other workers"
        failed = dict.fromkeys(candidates, outside)
        fits: set[str] = set()
        for name, free in self.room(gang).items():
            if name not in failed:
                continue
            if free < info.gpus:
                failed[name] = full
            else:
                fits.add(name)
                del failed[name]
        admitted = [name for name in candidates if name in fits] if fits else []
        return FilterAnswer(admitted, failed)

    def prioritize(self, info: PodInfo, candidates: list[str]) -> list[tuple[str, int]]:
        """Prefer the fullest nodes of the block, so that a gang fills one node before the next."""
        scores = self.block_scores(info)
        return [(name, scores.get(name, 0)) for name in candidates]

    def block_scores(self, info: PodInfo) -> dict[str, int]:
        """The nonzero scores of ``prioritize``: only nodes of the gang's block with room.

        Every other candidate scores 0, so the answer for a thousand candidates
        costs one lookup each, not a score each.
        """
        gang = self._gang_for(info)
        if gang is None:
            return {}
        in_flight = self._in_flight
        scores: dict[str, int] = {}
        for name, free in self.room(gang).items():
            entry = self.nodes.get(name)
            if free < info.gpus or entry is None or entry.gpus == 0:
                continue
            used = self._bound_gpus.get(name, 0) + in_flight.get(name, 0)
            fullness = min(1.0, used / entry.gpus)
            scores[name] = 1 + math.floor((MAX_EXTENDER_PRIORITY - 1) * fullness)
        return scores

    def begin_bind(self, info: PodInfo, node: str) -> Gang:
        """Check the scheduler's pick against the block and count the pod there from now on."""
        gang = self._gang_for(info)
        if gang is None:
            raise PlacementError(self._no_block(info))
        placed = self.member_node(gang, info)
        if placed is not None and placed != node:
            raise PlacementError(
                f"pod {info.namespace}/{info.name} is already placed on {placed}, not {node}"
            )
        if placed is None and self.room(gang).get(node, 0) < info.gpus:
            raise PlacementError(
                f"node {node} has no room left in the GPU block of gang {gang.key} "
                f"for pod {info.namespace}/{info.name}"
            )
        self._assume(gang, info.key, node, info.gpus)
        return gang

    def end_bind(self, info: PodInfo, node: str | None) -> None:
        """The API answered: record the binding (``node``) or forget the attempt (``None``)."""
        if info.gang is not None and info.gang in self.gangs:
            self._unassume(self.gangs[info.gang], info.key)
        if node is not None and (info.gang is not None or info.gpus > 0):
            self._put_pod(dataclasses.replace(info, node=node))

    def gauges(self) -> Mapping[str, float]:
        return {
            "nodes": len(self.nodes),
            "pods": len(self.pods),
            "gangs": len(self.gangs),
            "pending_gangs": sum(1 for g in self.gangs.values() if not self._complete(g)),
        }


def _subtract(counts: dict[str, int], node: str, amount: int) -> None:
    left = counts.get(node, 0) - amount
    if left > 0:
        counts[node] = left
    else:
        counts.pop(node, None)
