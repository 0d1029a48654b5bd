"""The extender's view of the cluster and its gang reservations; no I/O.

Nodes and GPU-holding pods come in from the API watch (``upsert_*``,
``delete_*``, ``replace``); the scheduler's questions go out as plain answers
(``filter``, ``prioritize``, ``begin_bind``). Everything runs on one event
loop, so no locks: a bind records its pod as *assumed* before it awaits the
API, and the next filter already counts it.

A gang's block is chosen by the core's placement module (buddy allocation
with network packing) when its first worker is filtered: within the node pool
of the operator's planned block for it (``pool_rank``, ``pool_view``: the
operator plans every pool of a known GPU type; the main pool for a gang
without a plan), on nodes among that
worker's candidates that it may use (Ready, not cordoned, hard taints
tolerated); a block whose nodes go away or turn unusable before its workers
hold them is chosen again (``_prune``). It is written on each bound pod's
``powerflow.io/placement`` annotation; ``replace`` rebuilds the
gangs from those annotations, so a restarted extender continues where the old
one stopped. A gang that does not complete within ``ttl_s`` keeps only the
GPUs of its bound workers; a late worker reserves what is missing.

Anyone who may create a pod can write the job label and a placement
annotation, so a gang is rebuilt (*adopted*) only from the operator's own
workers: pods a DLJob controls (``ownerReferences``, the UID of a DLJob the
mirror holds, in the pod's namespace and of the label's name), of the
DLJob's current allocation generation (``status.allocation.generation``),
that request GPUs; the block adopted is at most the gang's size, and the gang
at most the DLJob's ``status.allocation.gpus``. Pods join a gang only with
the same controller (``GangKey.owner``): a pod that copies a job's label and
generation without being its worker reserves GPUs of its own, never a GPU of
that job's block. Other pods
with the label are never a reservation (their GPUs, if they request any,
count as they do for any pod). An adopted gang that is not complete expires
like any other.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from powerflow.core.errors import PlacementError
from powerflow.core.policy.buddy import is_power_of_two
from powerflow.core.policy.pools import NodeShape, Pool, pools, serves, taken_by_others
from powerflow.core.policy.snapshot import GpuSlot, Node
from powerflow.core.taints import (
    GPU_TOLERATIONS,
    hard_taints,
    node_cordoned,
    node_ready,
    untolerated,
)

from .candidates import AllBut
from .candidates import index as candidate_index
from .objects import GangKey, PodInfo, describe, node_gpus, node_product, pod_info
from .objects import _dict as _dict_of
from .objects import name_of as _name_of
from .placing import choose_block, gpu_spec_for, occupied_indices, planned_block
from .wire import MAX_EXTENDER_PRIORITY

PodKey = tuple[str, str]
_K = TypeVar("_K")
DELETED_UIDS = 4096
"""Deleted pods remembered, for binds answered after their pod's deletion was seen."""
log = logging.getLogger(__name__)


class NotSynced(PlacementError):
    """The cache has not (or no longer) mirrored the cluster; deciding would be guessing."""


@dataclass(frozen=True)
class NodeEntry:
    """What the extender keeps of a node: its GPUs and whether pods may be placed on it."""

    name: str
    gpus: int
    product: str
    ready: bool = True
    cordoned: bool = False
    taints: tuple[dict[str, Any], ...] = ()
    """The ``NoSchedule``/``NoExecute`` taints only."""

    def pooled(self, tolerations: Iterable[dict[str, Any]]) -> bool:
        """In a pool: Ready, not cordoned, and every hard taint among those the pools
        accept (``tolerations``: ``--tolerate``). The operator's inventory applies the
        same test (``operator/nodes.py``), so both pool the same nodes when given the
        same tolerations.
        """
        return self.ready and not self.cordoned and not untolerated(self.taints, tolerations)

    def why_not_for(self, tolerations: tuple[dict[str, Any], ...]) -> str:
        """Why a pod with ``tolerations`` can never be placed here now ("" when it can)."""
        if not self.ready:
            return "the node is not Ready"
        if self.cordoned:
            return "the node is cordoned (spec.unschedulable)"
        taints = untolerated(self.taints, tolerations) if self.taints else ()
        return f"the pod does not tolerate the node's taint {taints[0]}" if taints else ""


def node_entry(body: Any) -> NodeEntry:
    return NodeEntry(
        _name_of(body),
        node_gpus(body),
        node_product(body),
        ready=node_ready(body),
        cordoned=node_cordoned(body),
        taints=hard_taints(body),
    )


@dataclass(frozen=True)
class PoolView:
    """The main pool (``powerflow.core.policy.pools``) and its nodes as the core sees them."""

    pool: Pool | None
    nodes: list[Node]
    """Sorted by name: the stable order that blocks are aligned in."""
    members: frozenset[str]
    taken: dict[str, int]
    """GPUs of the pool's count that other pods hold, per member node (nonzero only)."""

    @property
    def max_block(self) -> int:
        """The largest aligned block the pool has: the largest power-of-two run of whole nodes."""
        if self.pool is None or not self.nodes:
            return 0
        return self.pool.per_node * (1 << (len(self.nodes).bit_length() - 1))


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
    tolerations: tuple[dict[str, Any], ...] = ()
    """The workers' tolerations: which tainted nodes the block may keep."""
    checked: int = -1
    """The node epoch at which the block was last checked against its nodes."""
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
        self.span = 0
        """One more than the largest GPU index any block has held (it never shrinks)."""
        self._jobs: dict[tuple[str, str], set[GangKey]] = {}

    def of_job(self, key: GangKey) -> frozenset[GangKey]:
        """The live gangs of ``key``'s job (namespace and name), ``key`` included if live:
        a copy, so that deleting while going through it is safe."""
        return frozenset(self._jobs.get((key.namespace, key.job), ()))

    def __setitem__(self, key: GangKey, gang: Gang) -> None:
        old = self.get(key)
        super().__setitem__(key, gang)
        self._jobs.setdefault((key.namespace, key.job), set()).add(key)
        self._move(old.block if old is not None else (), gang.block)

    def __delitem__(self, key: GangKey) -> None:
        old = self[key]
        super().__delitem__(key)
        job = (key.namespace, key.job)
        self._jobs[job].discard(key)
        if not self._jobs[job]:
            del self._jobs[job]
        self._move(old.block, ())

    def pop(self, key: GangKey, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        gang = self[key]
        del self[key]
        return gang

    def clear(self) -> None:
        super().clear()
        self._jobs.clear()
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
            if index >= self.span:
                self.span = index + 1
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
    """Admitted candidates; failed ones that pods going away could free (``FailedNodes``);
    and those that can never host the pod (``FailedAndUnresolvableNodes``: kube-scheduler
    then evicts nothing there to make room)."""

    admitted: list[str]
    failed: dict[str, str]
    unresolvable: Mapping[str, str] = field(default_factory=dict)


class ClusterState:
    """Nodes, GPU pods and gang reservations, with indexes kept for O(candidates) answers.

    ``pool_tolerations``: the node taints PowerFlow's pools accept (``--tolerate``;
    default: the managed GPU pools' ``nvidia.com/gpu`` taint). Each pod may still
    use only the pool's nodes whose taints its own tolerations tolerate.
    """

    def __init__(
        self,
        ttl_s: float = 120.0,
        clock: Callable[[], float] | None = None,
        pool_tolerations: Iterable[dict[str, Any]] = GPU_TOLERATIONS,
    ) -> None:
        import time

        self.ttl_s = ttl_s
        self.pool_tolerations = tuple(pool_tolerations)
        self._clock = clock or time.monotonic
        self.nodes: dict[str, NodeEntry] = {}
        self.pods: dict[PodKey, PodInfo] = {}
        self.gangs = Reservations()
        self._bound_gpus: dict[str, int] = {}  # node -> GPUs of bound, running pods
        self._members: dict[GangKey, dict[PodKey, str]] = {}  # bound pods of each gang
        self._known: dict[GangKey, int] = {}  # cached pods (bound or not) of each gang
        self._in_flight: dict[str, int] = {}  # node -> GPUs of binds not yet seen bound
        self._foreign: dict[str, int] = {}  # node -> GPUs of bound pods of no gang
        self._deleted: dict[str, None] = {}  # uids of the last pods deleted, oldest first
        self.dljobs: dict[tuple[str, str], tuple[str, str, int]] = {}
        """(namespace, name) -> the DLJob's UID, its current allocation generation ("" if
        none) and GPUs (``status.allocation``; 0 if none)."""
        self._unadopted: set[GangKey] = set()
        """Annotated gangs not adopted for want of their DLJob's view (retried on its news)."""
        self._strays: set[PodKey] = set()
        """Bound workers whose placement may name GPUs of their node that no reservation
        of their gang covers: their gang is not reserved (not adopted yet, or expired),
        or a bind an earlier extender sent landed after this one, which did not see it,
        reserved the gang another block (killed mid-bind, a slow API). ``occupied``
        counts those GPUs exactly, checking each worker again at every call (one whose
        reservation covers it drops out), or they would go to another gang. Workers are
        added where a reservation is made, shrunk or dropped while they are bound."""
        self._views: dict[int, PoolView] = {}  # by pool rank (0: main), rebuilt after changes
        self._pools: tuple[Pool, ...] | None = None  # ``pools``' answer, rebuilt alike
        self._ranks: dict[str, int] = {}  # node -> its pool's rank in ``_pools``
        self._epoch = 0  # bumped by every node change: blocks are checked again
        self.synced = False
        self.expired_total = 0
        self._last_expiry = float("-inf")
        self.unsynced_reason = "the Kubernetes API has not been listed yet"

    # -- keeping the cache -----------------------------------------------------------------

    def mark_synced(self) -> None:
        self.synced, self.unsynced_reason = True, ""

    def mark_unsynced(self, reason: str) -> None:
        self.synced, self.unsynced_reason = False, reason

    def replace(
        self, nodes: Iterable[Any], pods: Iterable[Any], dljobs: Iterable[Any] = ()
    ) -> None:
        """Take a full listing as the truth (startup and every relist)."""
        self.dljobs.clear()
        for job in dljobs:
            self._skip_bad(self._put_job, job)
        self.nodes.clear()
        self.pods.clear()
        self._strays.clear()  # found again as the listing's bound workers are put
        self._bound_gpus.clear()
        self._members.clear()
        self._known.clear()
        self._foreign.clear()
        self._forget_pools()
        self._epoch += 1
        for node in nodes:
            self._skip_bad(self.upsert_node, node)
        for pod in pods:
            self._skip_bad(lambda body: self._put_pod(pod_info(body)), pod)
        for key, gang in list(self.gangs.items()):
            # In-memory reservations survive a relist, but a gang whose workers all
            # went away while we were not watching has finished (or was rescaled).
            if self._abandoned(gang):
                del self.gangs[key]
        self._adopt_annotated()
        self.mark_synced()

    @staticmethod
    def _skip_bad(apply: Callable[[Any], object], body: Any) -> None:
        """Apply one object of a listing; one that cannot be read is logged and skipped."""
        try:
            apply(body)
        except Exception as exc:  # one bad object must not keep the cache from syncing
            log.warning("skipping %s: %s: %s", describe(body), type(exc).__name__, exc)

    def upsert_job(self, body: Any) -> None:
        """A DLJob's news: a gang waiting for its view may be adopted now."""
        key = self._put_job(body)
        if key is not None and any(g[:2] == key for g in self._unadopted):
            self._adopt_annotated()

    def delete_job(self, body: Any) -> None:
        meta = _dict_of(_dict_of(body).get("metadata"))
        self.dljobs.pop((str(meta.get("namespace") or "default"), _name_of(body)), None)

    def _put_job(self, body: Any) -> tuple[str, str] | None:
        meta = _dict_of(_dict_of(body).get("metadata"))
        name, uid = _name_of(body), meta.get("uid")
        if not name or not isinstance(uid, str):
            return None
        allocation = _dict_of(_dict_of(_dict_of(body).get("status")).get("allocation"))
        generation, gpus = allocation.get("generation"), allocation.get("gpus")
        ok = isinstance(generation, int) and not isinstance(generation, bool)
        planned = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 0
        key = (str(meta.get("namespace") or "default"), name)
        self.dljobs[key] = (uid, str(generation) if ok else "", planned)
        return key

    def upsert_node(self, body: Any) -> None:
        name = _name_of(body)
        if not name:
            return
        entry = node_entry(body)
        if self.nodes.get(name) == entry:
            return  # a heartbeat: nothing placement cares about changed
        self.nodes[name] = entry
        self._forget_pools()
        self._epoch += 1

    def delete_node(self, body: Any) -> None:
        name = _name_of(body)
        self.nodes.pop(name, None)
        self._forget_pools()
        self._epoch += 1

    def _shapes(self) -> list[NodeShape]:
        return [
            NodeShape(e.name, e.product, e.gpus, self._foreign.get(e.name, 0))
            for e in self.nodes.values()
            if e.gpus > 0 and e.pooled(self.pool_tolerations)
        ]

    def _forget_pools(self) -> None:
        self._views.clear()
        self._pools = None

    def _all_pools(self) -> tuple[Pool, ...]:
        if self._pools is None:
            self._pools = pools(self._shapes())
            self._ranks = {n: rank for rank, pool in enumerate(self._pools) for n in pool.nodes}
        return self._pools

    def pool_rank(self, slots: Iterable[GpuSlot]) -> int:
        """The pool a gang goes to: that of the first node of ``slots`` (its planned
        block, or the block it holds) among the pools (``pools``' order), else the main
        pool (0): a gang the operator planned on another pool's nodes is placed there."""
        first = next(iter(slots), None)
        if first is None:
            return 0
        self._all_pools()
        return self._ranks.get(first[0], 0)

    def pool_view(self, rank: int = 0) -> PoolView:
        """Where new gangs go: the nodes of the pool ``rank`` (0: the operator's main
        pool; ``pool_rank``).

        The pools come from the same rule and inputs as the operator's inventory
        (``powerflow.core.policy.pools``: pooled nodes by allocatable GPUs, so others'
        pods never change which pool is which); every pooled node that ``serves`` the
        main pool is a member of it, with others' GPUs counted as taken (``occupied``);
        another pool's members are its own nodes. A gang is placed within one pool: the
        plan's GPU counts are per pool, and each pool is one GPU type. Rebuilt after a
        node or a foreign GPU pod changes, at the next new gang.
        """
        view = self._views.get(rank)
        if view is None:
            shapes = self._shapes()
            found = self._all_pools()
            if rank >= len(found):
                view = PoolView(None, [], frozenset(), {})  # no GPU node
            else:
                pool = found[rank]
                own = set(pool.nodes)
                usable = [s for s in shapes if serves(pool, s) and (rank == 0 or s.name in own)]
                members = sorted(s.name for s in usable)
                gpu = gpu_spec_for(pool.product)
                nodes = [Node(name, pool.per_node, gpu) for name in members]
                taken = {s.name: taken_by_others(pool, s) for s in usable}
                view = PoolView(
                    pool, nodes, frozenset(members), {n: k for n, k in taken.items() if k}
                )
            self._views[rank] = view
        return view

    def core_nodes(self) -> list[Node]:
        """The main pool's nodes sorted by name: the stable order blocks are aligned in."""
        return self.pool_view().nodes

    def upsert_pod(self, body: Any) -> None:
        info = pod_info(body)
        self._put_pod(info)
        if info.gang is not None and info.gang not in self.gangs and info.block and info.bound:
            self._adopt_annotated()

    def delete_pod(self, body: Any) -> None:
        info = pod_info(body)
        if info.uid:
            self._deleted[info.uid] = None
            if len(self._deleted) > DELETED_UIDS:
                del self._deleted[next(iter(self._deleted))]
        self._drop_pod(info.key)
        self._release_if_done(info.gang)

    def _put_pod(self, info: PodInfo) -> None:
        if info.gang is not None and info.gpus == 0:
            # The job label on a pod that holds no GPU (a tenant's, bound by hand): never
            # a gang's worker, or it would keep a finished gang's block reserved.
            info = dataclasses.replace(info, gang=None, block=(), planned=(), owner="")
        old = self.pods.get(info.key)
        stale = old is not None and old.bound and old.uid == info.uid
        if stale and not info.bound and not info.terminal:
            # The watch lags our own bind (``end_bind``): this body predates it. A bound
            # pod never unbinds (``spec.nodeName`` is immutable), and forgetting the
            # worker even briefly let an expiry shrink its gang's block below the
            # workers bound there.
            return
        self._drop_pod(info.key)
        if info.terminal or (info.gang is None and info.gpus == 0):
            self._release_if_done(info.gang)
            return
        self.pods[info.key] = info
        if info.gang is not None:
            self._known[info.gang] = self._known.get(info.gang, 0) + 1
        if info.bound:
            self._bound_gpus[info.node] = self._bound_gpus.get(info.node, 0) + info.gpus
            if info.gang is None:
                self._foreign[info.node] = self._foreign.get(info.node, 0) + info.gpus
                self._forget_pools()
            else:
                self._members.setdefault(info.gang, {})[info.key] = info.node
                gang = self.gangs.get(info.gang)
                if gang is not None:
                    self._unassume(gang, info.key)
                    gang.started = True
                    gang.settled = gang.settled or self._complete(gang)
                    if (
                        info.block
                        and info.block != gang.block
                        and _outside(info, gang)
                        and self._adoptable(info)
                    ):
                        if info.key not in self._strays:
                            log.warning(
                                "%s/%s is bound to block %s, outside its gang's reservation "
                                "%s: both stay taken",
                                info.namespace,
                                info.name,
                                list(info.block),
                                list(gang.block),
                            )
                        self._strays.add(info.key)
                elif info.block and self._adoptable(info):
                    self._strays.add(info.key)  # its GPUs exactly, not the lowest free ones

    def _drop_pod(self, key: PodKey) -> None:
        old = self.pods.pop(key, None)
        if old is not None and old.gang is not None:
            _subtract(self._known, old.gang, 1)
        if old is None or not old.bound:
            return
        _subtract(self._bound_gpus, old.node, old.gpus)
        if old.gang is None:
            _subtract(self._foreign, old.node, old.gpus)
            self._forget_pools()
        else:
            members = self._members.get(old.gang, {})
            members.pop(key, None)
            if not members:
                self._members.pop(old.gang, None)

    def _release_if_done(self, key: GangKey | None) -> None:
        """Forget a gang once none of its workers holds GPUs (finished or rescaled)."""
        gang = self.gangs.get(key) if key is not None else None
        if gang is not None and self._abandoned(gang):
            del self.gangs[gang.key]

    def _abandoned(self, gang: Gang) -> bool:
        """No worker of the gang holds or is being given GPUs, and none is left to come.

        A started gang with no bound worker has finished. A gang none of whose
        workers ever bound (every bind failed, whatever the API answered) is
        over once the watch has none of its pods: the operator deleted them (a
        rescale starts a new gang). While its pods are pending (or not seen by
        the watch yet), its reservation is kept until they bind or it expires.
        """
        if gang.assumed or gang.key in self._members:
            return False
        return gang.started or not self._known.get(gang.key)

    def _adopt_annotated(self) -> None:
        """Rebuild gangs from bound pods' placement annotations (restart, or another
        extender), only from the operator's own workers (``_adoptable``)."""
        found: dict[GangKey, tuple[list[GpuSlot], int]] = {}
        waiting: set[GangKey] = set()
        for info in self.pods.values():
            if info.gang is None or not info.bound or not info.block or info.gang in self.gangs:
                continue
            if not self._adoptable(info):
                waiting.add(info.gang)
                continue
            slots, workers = found.setdefault(info.gang, ([], info.workers))
            slots.extend(s for s in info.block if s not in slots)
            found[info.gang] = (slots, max(workers, info.workers))
        now = self._clock()
        tolerations = {i.gang: i.tolerations for i in self.pods.values() if i.gang in found}
        for key, (slots, workers) in found.items():
            # A gang holds one GPU per worker, and its DLJob's allocation says how many:
            # a longer block, or more workers than that (annotations anyone who may
            # patch the pods can edit), is not the operator's.
            planned = self.dljobs.get((key.namespace, key.job), ("", "", 0))[2]
            workers = min(workers, planned) if planned else workers
            gang = Gang(key, tuple(slots[:workers]), workers, created_s=now, started=True)
            gang.tolerations = tolerations.get(key, ())
            gang.settled = self._complete(gang)
            self.gangs[key] = gang
            self._strays.update(self._members.get(key, ()))  # a block of several
        new = waiting - set(found) - self._unadopted
        for key in sorted(new):
            log.warning(
                "not adopting the placement of %s: its pods are not the workers of a DLJob's "
                "current allocation that request GPUs (yet)",
                key,
            )
        self._unadopted = waiting - set(found)

    def _adoptable(self, info: PodInfo) -> bool:
        """A worker of a DLJob this mirror holds, of its current generation, with GPUs."""
        assert info.gang is not None
        job = self.dljobs.get((info.namespace, info.gang.job))
        return (
            job is not None
            and info.gpus > 0
            and bool(info.owner)
            and info.owner == job[0]
            and bool(job[1])
            and info.gang.generation == job[1]
        )

    def _assume(self, gang: Gang, key: PodKey, node: str, gpus: int) -> None:
        self._unassume(gang, key)
        gang.assumed[key] = (node, gpus)
        self._in_flight[node] = self._in_flight.get(node, 0) + gpus
        # Not settled yet: a bind may still fail (whatever the API answers), and a gang
        # settled by binds that all failed would hold its block for ever. ``_put_pod``
        # settles it once its workers are seen bound.

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
            self._strays.update(self._members.get(key, ()))  # their block shrinks or goes
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

    def _count_strays(
        self, slots: dict[str, frozenset[int] | set[int]]
    ) -> tuple[set[PodKey], set[str]]:
        """Add to ``slots`` the GPUs of their node that ``_strays``' workers hold and no
        reservation of their gang covers. Returns the workers of gangs not reserved
        counted so (``occupied`` counts them no other way) and the nodes whose slots
        changed. A worker gone, or covered, drops out."""
        counted: set[PodKey] = set()
        touched: set[str] = set()
        for key in list(self._strays):
            info = self.pods.get(key)
            gang = None if info is None or info.gang is None else self.gangs.get(info.gang)
            # Only the operator's own workers (``_adoptable``, as adoption trusts them): a
            # placement anyone who may create a pod can write takes no GPU of its naming.
            if info is None or not info.bound or info.gang is None or not self._adoptable(info):
                self._strays.discard(key)
                continue
            if gang is not None and not _outside(info, gang):
                self._strays.discard(key)  # its reservation covers it (again)
                continue
            entry = self.nodes.get(info.node)
            size = 0 if entry is None else entry.gpus
            own = {i for name, i in info.block if name == info.node and 0 <= i < size}
            if len(own) > info.workers * info.gpus:  # never more than its gang holds
                own = set(sorted(own)[: info.workers * info.gpus])
            held = slots.get(info.node, frozenset())
            if not own:
                self._strays.discard(key)
                continue
            if own <= held:  # taken already: a worker of a gang not reserved is then
                continue  # counted as one without a placement (``extra``), never less
            if gang is None:
                counted.add(key)
            slots[info.node] = {*held, *own}
            touched.add(info.node)
        return counted, touched

    def occupied(self, rank: int = 0) -> dict[str, frozenset[int] | set[int]]:
        """GPU indices taken on each node of pool ``rank`` (``pool_view``), in its geometry.

        Every live block's indices, plus GPUs held outside any live block (pods
        that are not PowerFlow's, as ``pools.taken_by_others`` counts them, and
        PowerFlow's bound workers of a gang no longer reserved) on the lowest
        free indices; but the GPUs of their node that bound workers' placements
        name where no reservation of their gang covers them (``_strays``) are
        counted exactly. A block index beyond the pool's count (a block chosen
        when the node served a larger pool) counts as one taken GPU. Nodes
        outside the pool keep their blocks' indices, for the record.
        """
        view = self.pool_view(rank)
        slots: dict[str, frozenset[int] | set[int]] = dict(self.gangs.held)
        counted, touched = self._count_strays(slots)
        if view.pool is None:
            return slots
        cap = view.pool.per_node
        extra = dict(view.taken)
        for key in self._members.keys() - self.gangs.keys():  # bound, no longer reserved
            for pod, node in self._members[key].items():
                if pod not in counted:  # no placement to read: counted on the lowest free
                    extra[node] = extra.get(node, 0) + self.pods[pod].gpus
        wide: set[str] = set()
        if self.gangs.span > cap:  # some block was chosen when nodes served a larger pool
            wide = {
                n for n, held in self.gangs.held.items() if n in view.members and max(held) >= cap
            }
        wide |= {n for n in touched if n in view.members and max(slots[n]) >= cap}
        for node in (extra.keys() & view.members) | wide:
            held = slots.get(node, frozenset())
            inside = {i for i in held if i < cap} if node in wide else held
            count = extra.get(node, 0) + len(held) - len(inside)
            slots[node] = occupied_indices(cap, inside, count) if count else inside
        return slots

    def _allowed(self, info: PodInfo, candidates: Iterable[str] | None, rank: int = 0) -> set[str]:
        """Pool ``rank``'s nodes the pod may get a block on: among the candidates
        kube-scheduler's own filters passed (all, when ``None``), Ready, not cordoned,
        every hard taint tolerated."""
        view = self.pool_view(rank)
        names = view.members if candidates is None else view.members.intersection(candidates)
        nodes = self.nodes
        return {n for n in names if not nodes[n].why_not_for(info.tolerations)}

    def _prune(self, gang: Gang) -> Gang | None:
        """Drop the block's GPUs on nodes the gang can no longer use; None if nothing is left.

        A node deleted, NotReady, cordoned or newly tainted keeps only the GPUs
        its placed workers hold; a gang left with no placed worker loses its
        reservation (its next worker chooses a new block), else the workers
        still to come reserve what is missing (``expired``). Checked once per
        node change (``_epoch``).
        """
        if gang.checked == self._epoch:
            return gang
        gang.checked = self._epoch
        bad = set()
        for name in {n for n, _ in gang.block}:
            entry = self.nodes.get(name)
            if entry is None or entry.why_not_for(gang.tolerations):
                bad.add(name)
        if not bad:
            return gang
        use = self._node_use(gang)
        if not any(use.values()):
            del self.gangs[gang.key]
            return None
        kept = [s for s in gang.block if s[0] not in bad]
        for name in sorted(bad):
            kept.extend(sorted(s for s in gang.block if s[0] == name)[: use.get(name, 0)])
        self.gangs.reblock(gang, tuple(kept))
        gang.expired = True
        return gang

    def reserve(
        self,
        key: GangKey,
        workers: int,
        gpus_per_pod: int,
        info: PodInfo | None = None,
        candidates: Iterable[str] | None = None,
    ) -> Gang | None:
        """The gang's reservation, made now if needed; None when no aligned block is free.

        A new gang reserves ``workers * gpus_per_pod`` GPUs at once, in the pool of
        its planned block (``pool_rank``; the main pool without one), on nodes
        ``_allowed`` for ``info`` (the worker being filtered) among
        ``candidates``: the operator's planned block when it is free there
        (``placing.planned_block``), else ``choose_block``'s. A worker of an
        expired gang (its reservation shrank to its bound workers) finds no room
        in the block and reserves its own GPUs, so late workers still run.
        """
        gang = self.gangs.get(key)
        if gang is not None:
            gang = self._prune(gang)
        if gang is not None and (not gang.expired or sum(self.room(gang).values()) >= gpus_per_pod):
            return gang
        need = gpus_per_pod if gang is not None else workers * gpus_per_pod
        held = gang.block if gang is not None else ()
        pod = info or PodInfo("", "", "", "", gpus_per_pod, key, workers, (), False)
        if pod.tolerations == () and gang is not None:
            pod = dataclasses.replace(pod, tolerations=gang.tolerations)
        if gang is None:
            self._drop_superseded(key)
        rank = self.pool_rank(held or pod.planned)
        view = self.pool_view(rank)
        occupied = self.occupied(rank)
        allowed = self._allowed(pod, candidates, rank)
        if view.pool is not None and len(allowed) < len(view.members):
            full = frozenset(range(view.pool.per_node))
            for name in view.members - allowed:
                occupied[name] = full
        block = None
        if gang is None and pod.planned:  # a new gang: the plan's block if it is free
            block = planned_block(view.nodes, occupied, pod.planned, need)
        if block is None:
            block = choose_block(view.nodes, occupied, need)
        if block is None:
            return None
        new = Gang(key, tuple(held) + tuple(block), workers, created_s=self._clock())
        new.tolerations = gang.tolerations if gang is not None else pod.tolerations
        new.checked = self._epoch
        if gang is not None:
            new.assumed, new.started, new.expired = gang.assumed, gang.started, True
            new.settled = gang.settled
        self.gangs[key] = new
        return new

    def _drop_superseded(self, key: GangKey) -> None:
        """Forget the job's reservations of earlier generations that no worker was placed in.

        The operator creates a generation's workers only once the last one's are
        gone, but the extender learns of their deletion from its watch, which can
        lag the scheduler's question about a new worker. An earlier generation's
        block kept until then made the new gang's planned block look taken (it is
        often the same GPUs), the gang went elsewhere, and the operator's next pass
        moved it back, a checkpoint-restart each time: under load the twin's mini
        trace restarted jobs 146 and 236 times where the simulator did 53 times
        (docs/twin.md, "Restarts"). A block with a placed worker stays: its GPUs may
        still be in use. Only the same DLJob's (its UID: ``GangKey.owner``) gangs
        count, so a pod made up by a tenant can drop no other job's reservation.
        """
        if not key.owner or not key.generation.isdigit():
            return
        for old in self.gangs.of_job(key):
            gang = self.gangs[old]
            if (
                old.owner == key.owner
                and old.generation.isdigit()
                and int(old.generation) < int(key.generation)
                and not gang.assumed
                and old not in self._members
            ):
                del self.gangs[old]

    # -- the scheduler's questions ---------------------------------------------------------

    def _gang_for(self, info: PodInfo, candidates: Iterable[str] | None = None) -> Gang | None:
        if not self.synced:
            raise NotSynced(f"PowerFlow cannot place this pod yet: {self.unsynced_reason}")
        if info.gang is None or info.gpus < 1:
            raise PlacementError(f"pod {info.namespace}/{info.name} is not a PowerFlow GPU worker")
        size = info.workers * info.gpus
        if not is_power_of_two(size):
            raise PlacementError(
                f"gang {info.gang}: {info.workers} workers x {_short(info.gpus)} GPUs = "
                f"{_short(size)} GPUs; a gang must have a power-of-two size >= 1"
            )
        self.expired_total += len(self.expire())
        return self.reserve(info.gang, info.workers, info.gpus, info, candidates)

    def _no_block(self, info: PodInfo) -> str:
        size = info.workers * info.gpus
        return f"no aligned block of {size} free GPUs for gang {info.gang} (buddy allocation)"

    def _no_room(self, info: PodInfo, candidates: list[str]) -> FilterAnswer:
        """No block is free for the gang: say, per candidate, whether it ever could be.

        Only the nodes of the gang's pool (``pool_rank``) that the pod may use and
        whose GPUs other pods hold can host it once pods go away (``FailedNodes``);
        every other node never can (``FailedAndUnresolvableNodes``), so
        kube-scheduler's preemption evicts nothing there.
        """
        view = self.pool_view(self.pool_rank(info.planned))
        size = info.workers * info.gpus
        pool = view.pool
        if pool is None:
            why = (
                "no GPU node is Ready, schedulable and free of taints that PowerFlow's pools "
                "tolerate (the extender's --tolerate): PowerFlow's pool is empty"
            )
            return FilterAnswer([], {}, dict.fromkeys(candidates, why))
        shape = f"{pool.product or 'unlabelled GPUs'}, {pool.per_node} per node"
        if info.gpus > pool.per_node or size > view.max_block:
            why = (
                f"gang {info.gang} of {size} GPUs ({info.gpus} per pod) can never fit in "
                f"PowerFlow's GPU pool ({len(pool.nodes)} nodes of {shape})"
            )
            return FilterAnswer([], {}, dict.fromkeys(candidates, why))
        busy = self._no_block(info)
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        for name in candidates:
            entry = self.nodes.get(name)
            if entry is None:
                failed[name] = busy  # not in the cache yet
                continue
            why = entry.why_not_for(info.tolerations)
            if not why and name not in view.members:
                why = f"the node is not in PowerFlow's GPU pool ({shape})"
            if why:
                never[name] = why
            else:
                failed[name] = busy
        return FilterAnswer([], failed, never)

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
        """Admit the candidates where the pod's gang block still has room for it.

        Nodes outside the block can never host this worker while the gang's
        reservation stands, so they are unresolvable; the block's nodes whose
        share is taken by the gang's other workers are merely failed.
        """
        gang = self._gang_for(info, candidates)
        if gang is None:
            return self._no_room(info, candidates)
        placed = self.member_node(gang, info)
        members, distinct = candidate_index(candidates)
        if placed is not None:
            why = f"pod {info.namespace}/{info.name} is already placed on {placed}"
            chosen = {placed} if placed in members else set()
            never = AllBut(candidates, chosen, why, distinct)
            return FilterAnswer(_in_order(candidates, chosen, distinct), {}, never)
        # Every candidate fails as outside the block but the block's few nodes: the
        # answer says so without a dict of a thousand names (``AllBut``), and settles
        # the block's nodes.
        outside = f"not in the GPU block reserved for gang {gang.key}"
        full = f"the GPUs of gang {gang.key}'s block on this node are taken by its other workers"
        failed: dict[str, str] = {}
        fits: set[str] = set()
        inside: set[str] = set()
        for name, free in self.room(gang).items():
            if name not in members:
                continue
            inside.add(name)
            if free < info.gpus:
                failed[name] = full
            else:
                fits.add(name)
        never = AllBut(candidates, inside, outside, distinct)
        return FilterAnswer(_in_order(candidates, fits, distinct), failed, never)

    def prioritize(self, info: PodInfo, candidates: list[str]) -> list[tuple[str, int]]:
        """Prefer the fullest nodes of the block, so that a gang fills one node before the next."""
        scores = self.block_scores(info, candidates)
        return [(name, scores.get(name, 0)) for name in candidates]

    def block_scores(self, info: PodInfo, candidates: list[str] | None = None) -> dict[str, int]:
        """The nonzero scores of ``prioritize``: only nodes of the gang's block with room.

        Every other candidate scores 0, so the answer for a thousand candidates
        costs one lookup each, not a score each.
        """
        gang = self._gang_for(info, candidates)
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
        gang = self._gang_for(info, [node])
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
        """The API answered: record the binding (``node``) or forget the attempt (``None``).

        A pod whose deletion the watch delivered while its bind was in flight is
        not recorded: no later event would ever remove it, and its GPUs would
        stay taken.
        """
        if info.gang is not None and info.gang in self.gangs:
            self._unassume(self.gangs[info.gang], info.key)
        gone = bool(info.uid) and info.uid in self._deleted
        if node is not None and not gone and (info.gang is not None or info.gpus > 0):
            self._put_pod(dataclasses.replace(info, node=node))
        else:  # the pod, or all its gang's pods, may have gone while the bind was in flight
            self._release_if_done(info.gang)

    def gauges(self) -> Mapping[str, float]:
        return {
            "nodes": len(self.nodes),
            "pods": len(self.pods),
            "gangs": len(self.gangs),
            "pending_gangs": sum(1 for g in self.gangs.values() if not self._complete(g)),
        }


def _outside(info: PodInfo, gang: Gang) -> bool:
    """Whether a bound worker's placement names GPUs of its node and none of them is in
    its gang's reservation (a shrunk reservation keeps some: that is not outside)."""
    own = {index for name, index in info.block if name == info.node}
    return bool(own) and own.isdisjoint(index for name, index in gang.block if name == info.node)


def _in_order(candidates: list[str], chosen: set[str], distinct: bool) -> list[str]:
    """The candidates in ``chosen`` (each one of them), in the candidates' order, a name
    as often as it was sent; ``distinct``: no name was sent twice.

    One node, the usual case (a gang within a node, a placed worker), needs no pass
    over the candidates when they are distinct (kube-scheduler's always are), and one
    in C when not; a Python loop over five thousand candidates is a quarter of the
    decision."""
    if len(chosen) == 1:
        (name,) = chosen
        return [name] if distinct else [name] * candidates.count(name)
    return [name for name in candidates if name in chosen] if chosen else []


def _short(number: int) -> str:
    """A count for a message: ``10**400`` must not fill the scheduler's event with digits."""
    text = str(number)
    return text if len(text) <= 12 else f"{text[:3]}...({len(text)} digits)"


def _subtract(counts: dict[_K, int], key: _K, amount: int) -> None:
    left = counts.get(key, 0) - amount
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
