"""What every baseline needs and none of them decides: clocks, batches, GPUs, watts.

Shared here so that the baselines differ only in their scheduling rules, and so
that a plan from any of them is valid in the same way (``gpus ==
len(placement)``, a supported clock, ``local_batch_size = ceil(global /
gpus)``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, eq, itemgetter, le, truediv
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import FloatArray, PerfModel
from powerflow.core.policy.budget import limit_w
from powerflow.core.policy.snapshot import (
    Budget,
    GpuSlot,
    Job,
    JobPlan,
    Migration,
    Node,
    Plan,
    Snapshot,
)


def cluster_gpu(snapshot: Snapshot) -> GpuSpec:
    """The cluster's GPU type; the baselines, like their papers, assume one type."""
    if not snapshot.nodes:
        raise SnapshotError("snapshot has no nodes")
    # Checked once per node tuple (``_Layout``), not at each call: a Gandiva replay of
    # the default trace asks 5,090 times, 0.009 s of CPU against 0.017 s
    # (``time.process_time`` around each call, three alternations).
    spec = _Layout.of(snapshot.nodes).gpu
    if spec is None:
        raise SnapshotError("the baselines need a cluster of one GPU type")
    return spec


def fixed_clock(spec: GpuSpec, frequency_mhz: int | None) -> int:
    """The cluster-wide clock of a non-energy-aware baseline (default: the highest)."""
    if frequency_mhz is None:
        return spec.max_clock_mhz
    if frequency_mhz not in spec.clocks_mhz:
        raise SnapshotError(
            f"{frequency_mhz} MHz is not a supported {spec.name} clock "
            f"({spec.min_clock_mhz}-{spec.max_clock_mhz} MHz in steps of the GPU's table)"
        )
    return frequency_mhz


def local_batch(global_batch_size: int, gpus: int) -> int:
    """Per-GPU batch: the global batch split evenly, rounded up (0 GPUs: all of it)."""
    return math.ceil(global_batch_size / max(gpus, 1))


def per_node(placement: Sequence[GpuSlot]) -> int:
    """The model's ``r``: most GPUs the job uses on any one node."""
    if not placement:
        return 0
    counts: dict[str, int] = defaultdict(int)
    for node, _ in placement:
        counts[node] += 1
    return max(counts.values())


def node_count(placement: Sequence[GpuSlot]) -> int:
    return len({node for node, _ in placement})


ARRIVAL_KEY = attrgetter("arrival_s", "id")
"""The FIFO sort key, ``(arrival_s, id)``."""


def arrival_order(jobs: Iterable[Job]) -> list[Job]:
    """FIFO order; the id breaks ties so that every baseline is deterministic.

    Every decision orders every job, and the engine lists them in this order
    already: the jobs are checked to be in it (arrival times non-decreasing,
    ids increasing where they tie) and then kept as they are, which is what a
    stable sort of an ordered list returns. Checking reads a float per job and
    an id per tie, where a sort builds a ``(arrival_s, id)`` key per job: over
    the 2,545 snapshots ``python benchmarks/replay_bench.py --runs gandiva``
    records of the default trace (every one ordered), 0.124 -> 0.070 s of CPU
    for the ordering alone. Any other list is sorted.
    """
    listed = list(jobs)
    arrivals = list(map(_ARRIVAL, listed))
    later = arrivals[1:]
    if all(map(le, arrivals, later)):
        ties = compress(range(len(later)), map(eq, arrivals, later))
        if all(listed[i].id < listed[i + 1].id for i in ties):
            return listed
    return sorted(listed, key=ARRIVAL_KEY)


_ARRIVAL = attrgetter("arrival_s")


def evaluate(
    models: Sequence[PerfModel],
    n: npt.ArrayLike,
    r: npt.ArrayLike,
    bs: npt.ArrayLike,
    f: npt.ArrayLike,
) -> tuple[FloatArray, FloatArray]:
    """Step time and energy per iteration of many configurations.

    Row ``i`` of each array (first axis, any trailing shape) belongs to
    ``models[i]``. Rows that share a model object go to it in one vectorised
    call: a model call costs tens of microseconds whatever its size, and the
    simulator's oracle mode shares one model between all jobs of a DNN.
    """
    cols = np.broadcast_arrays(*(np.asarray(c, dtype=np.float64) for c in (n, r, bs, f)))
    if cols[0].shape[:1] != (len(models),):
        raise SnapshotError("one model per configuration row is needed")
    groups: dict[int, list[int]] = defaultdict(list)
    for i, model in enumerate(models):
        groups[id(model)].append(i)
    t = np.empty(cols[0].shape)
    e = np.empty(cols[0].shape)
    for rows in groups.values():
        idx = np.asarray(rows)
        model = models[rows[0]]
        args = [c[idx] for c in cols]
        t[idx] = np.asarray(model.step_time_s(*args), dtype=np.float64)
        e[idx] = np.asarray(model.energy_per_iter_j(*args), dtype=np.float64)
    return t, e


class _Layout(NamedTuple):
    """What a ``Pool`` derives from the nodes alone: their order, rank and sizes,
    and their one GPU type (``cluster_gpu``; None: several, or no node).

    Shared, never changed, by every pool of one node tuple: the engine hands
    the same tuple to decision after decision while no node switches on or
    off, and deriving it afresh took a sort of every node per decision (0.08 s
    of the 1.6 s of policy CPU of a Gandiva run of the default trace, replayed
    with ``benchmarks/replay_bench.py``). Only
    a tuple is remembered (a list could change in place), and it is held, so
    the identity check can never match another tuple at a reused address.
    """

    nodes: Sequence[Node]
    order: list[str]
    rank: dict[str, int]
    size: dict[str, int]
    gpus: list[tuple[str, range]]
    total: int
    biggest: int
    gpu: GpuSpec | None
    slots: frozenset[GpuSlot] | None
    """Every GPU of the cluster (None where two nodes share a name)."""
    gpu_count: int
    """Every node's GPUs, summed (``total`` counts a shared name once)."""

    @staticmethod
    def of(nodes: Sequence[Node]) -> _Layout:
        last = _LAST_LAYOUT[0]
        if last is not None and last.nodes is nodes:
            return last
        order = [node.name for node in sorted(nodes, key=lambda node: not node.powered_on)]
        rank: dict[str, int] = {}
        for i, name in enumerate(order):
            rank.setdefault(name, i)  # ``order.index``: the first one
        size = {node.name: node.gpus for node in nodes}
        gpus = [(node.name, range(node.gpus)) for node in nodes]
        spec: GpuSpec | None = nodes[0].gpu if nodes else None
        if any(node.gpu is not spec and node.gpu != spec for node in nodes):
            spec = None
        slots = frozenset((node.name, i) for node in nodes for i in range(node.gpus))
        layout = _Layout(
            nodes,
            order,
            rank,
            size,
            gpus,
            sum(size.values()),
            max(size.values(), default=0),
            spec,
            slots if len(slots) == sum(size.values()) else None,
            sum(node.gpus for node in nodes),
        )
        if type(nodes) is tuple:
            _LAST_LAYOUT[0] = layout
        return layout


_LAST_LAYOUT: list[_Layout | None] = [None]


class Pool:
    """Free GPUs of the cluster during one ``plan`` call (mutable, never shared).

    Every node is usable: the baselines are not energy-aware and never keep a
    node powered down. Nodes that are on rank before nodes that are off (each
    group in cluster order): where a baseline's own rule leaves a choice
    between two empty nodes, it takes the one that runs at once rather than
    one that must boot first (``SimConfig.idle_nodes_off``, ``power_on_s``), as
    PowerFlow's placement does; with every node on, the order is the cluster's.
    The free count and each node's rank are kept alongside the free lists: a
    round asks for them once per waiting job, and most of those asks fail on
    the count alone.
    """

    def __init__(self, nodes: Sequence[Node], held: Iterable[GpuSlot] = ()) -> None:
        """Every GPU free, then ``held`` taken: ``take``'s free lists and errors.

        The running jobs' GPUs are taken at every decision, most of the cluster
        at a loaded event. Where more than half are held, the free lists are
        built from the GPUs left over (one set difference, then the few left
        are grouped), which a count shows to be exact: as many left as the
        cluster has less the held ones only when these are distinct GPUs of the
        cluster; otherwise, and where few are held, ``take`` takes them one by
        one (and raises its error). Over the snapshots of a Tiresias run of the
        default trace, building the pools takes 0.046 s of CPU against 0.078 s
        taking one by one (``time.process_time``, three alternations).
        """
        layout = _Layout.of(nodes)
        self.order = layout.order
        self.rank = layout.rank
        self.size = layout.size
        self._count = layout.total
        self.biggest = layout.biggest
        # (whole_free_gpus, most_free), until the free lists change
        self._summary: tuple[int, int] | None = None
        self.free: dict[str, list[int]]
        slots = held if isinstance(held, list | tuple) else list(held)
        if layout.slots is not None and 2 * len(slots) > layout.total:
            left: frozenset[GpuSlot] | None
            try:
                left = layout.slots.difference(slots)
            except TypeError:  # slots not hashable (lists): taken one by one below
                left = None
            # every slot distinct and the cluster's exactly when this many are left
            if left is not None and len(left) == layout.total - len(slots):
                free: dict[str, list[int]] = {name: [] for name in layout.size}
                for node, i in left:
                    free[node].append(i)
                for idx in free.values():
                    if len(idx) > 1:
                        idx.sort()
                self.free = free
                self._count -= len(slots)
                return
        self.free = {name: list(gpus) for name, gpus in layout.gpus}
        if slots:
            self.take(slots)

    def copy(self) -> Pool:
        other = Pool.__new__(Pool)
        other.order = self.order
        other.rank = self.rank
        other.size = self.size
        other.free = {name: list(idx) for name, idx in self.free.items()}
        other._count = self._count
        other.biggest = self.biggest
        other._summary = self._summary
        return other

    @property
    def free_count(self) -> int:
        return self._count

    def is_free(self, slots: Iterable[GpuSlot]) -> bool:
        return all(node in self.free and i in self.free[node] for node, i in slots)

    def whole_free_gpus(self) -> int:
        """GPUs of the nodes that are entirely free.

        Kept, with ``most_free``, until the free lists change: Tiresias asks
        once per spread running job at every event, and between its moves the
        answer stays put (0.25 s of a Tiresias run of the default trace counted
        the 64 nodes afresh each time).
        """
        return self._summarise()[0]

    def most_free(self) -> int:
        """The most free GPUs on one node (0 without nodes)."""
        return self._summarise()[1]

    def _summarise(self) -> tuple[int, int]:
        if self._summary is None:
            size, free = self.size, self.free
            whole = sum(size[m] for m, idx in free.items() if len(idx) == size[m] > 0)
            self._summary = (whole, max(map(len, free.values()), default=0))
        return self._summary

    def block_after_release(self, n: int, own: Sequence[GpuSlot]) -> bool:
        """Whether ``take_consolidated(n)`` would find GPUs once ``own`` is free.

        Counted without releasing: a spread job finds no block at most events
        (Tiresias's re-consolidation, Gandiva's consolidation), and releasing
        and taking back its GPUs costs more than the count.
        """
        free, size = self.free, self.size
        mine: dict[str, int] = {}
        for node, _ in own:
            mine[node] = mine.get(node, 0) + 1
        # Plain loops, no generators: asked for ~20 jobs at each Tiresias event.
        summary = self._summary if self._summary is not None else self._summarise()
        if n <= self.biggest:
            if summary[1] >= n:
                return True
            for m, k in mine.items():
                if len(free[m]) + k >= n:
                    return True
        # whole nodes: the free ones now (none holds one of the job's GPUs) and the job's own
        whole = summary[0]
        for m, k in mine.items():
            if len(free[m]) + k == size[m]:
                whole += size[m]
        return whole >= n

    def take(self, slots: Iterable[GpuSlot]) -> None:
        self._summary = None
        free = self.free
        for node, i in slots:
            try:
                free[node].remove(i)  # one scan of the free list, not a test and a removal
            except (KeyError, ValueError):
                raise SnapshotError(f"GPU {node}/{i} is used twice or does not exist") from None
            self._count -= 1

    def release(self, slots: Iterable[GpuSlot]) -> None:
        self._summary = None
        for node, i in slots:
            self.free[node].append(i)
            self.free[node].sort()
            self._count += 1

    def _grab(self, node: str, k: int) -> tuple[GpuSlot, ...]:
        self._summary = None
        got = self.free[node][:k]
        del self.free[node][:k]
        self._count -= len(got)
        return tuple((node, i) for i in got)

    def take_consolidated(
        self,
        n: int,
        affinity: Mapping[str, bool] | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> tuple[GpuSlot, ...] | None:
        """``n`` GPUs on as few nodes as the job needs, or ``None``.

        A job that fits a node gets one node, best fit (fewest free GPUs left
        over), preferring nodes marked in ``affinity``; a larger job gets whole
        free nodes. This is the locality every baseline's paper asks for.
        """
        if n > self._count:  # no node, and no set of whole nodes, has n free
            return None
        free = self.free
        names = [name for name in self.order if name not in exclude] if exclude else self.order
        fits = [name for name in names if len(free[name]) >= n]
        if fits:
            aff = affinity or {}
            rank = self.rank
            best = min(
                fits,
                key=lambda name: (not aff.get(name, False), len(free[name]), rank[name]),
            )
            return self._grab(best, n)
        whole = [name for name in names if len(free[name]) == self.size[name] > 0]
        chosen: list[str] = []
        total = 0
        for name in whole:
            if total >= n:
                break
            chosen.append(name)
            total += self.size[name]
        if total < n:
            return None
        slots: list[GpuSlot] = []
        for name in chosen:
            slots.extend(self._grab(name, min(self.size[name], n - len(slots))))
        return tuple(slots)

    def take_spread(self, n: int) -> tuple[GpuSlot, ...] | None:
        """``n`` GPUs anywhere, on as few nodes as the free GPUs allow."""
        if self._count < n:
            return None
        slots: list[GpuSlot] = []
        rank = self.rank
        for name in sorted(self.order, key=lambda m: (-len(self.free[m]), rank[m])):
            if len(slots) == n:
                break
            slots.extend(self._grab(name, min(len(self.free[name]), n - len(slots))))
        return tuple(slots)

    def min_nodes(self, n: int) -> int:
        """Fewest nodes a job of ``n`` GPUs can span in this cluster."""
        return math.ceil(n / self.biggest)


class LastSeen(dict[Hashable, tuple[Any, ...]]):
    """Job id -> what a job was last evaluated at for one purpose, and the result.

    ``recall`` answers only when the model object and the whole configuration
    tuple match, so an answer is what evaluating afresh would give.
    """

    __slots__ = ()

    def recall(self, job_id: Hashable, model: PerfModel, config: tuple[object, ...]) -> Any:
        """The remembered result, or None when the job's model or configuration changed."""
        hit = self.get(job_id)
        if hit is not None and hit[0] is model and hit[1] == config:
            return hit[2]
        return None

    def remember(
        self, job_id: Hashable, model: PerfModel, config: tuple[object, ...], value: object
    ) -> None:
        self[job_id] = (model, config, value)


class ModelMemo:
    """A policy's memo of model predictions, keyed by model object and configuration.

    A fitted model costs about 0.1 ms a call and the simulator plans at every
    event, mostly for jobs whose model and configuration did not change since
    the last event. Predictions are pure, so remembering them changes no
    decision; the memo holds each model it has seen, so an ``id`` in a key
    can never be reused by another object while its entry lives. It empties
    itself when full. Policies own one each (a dataclass field excluded from
    equality), so no state is shared between policy objects.

    ``last(purpose)`` remembers, per job id, the last configuration a job was
    evaluated at for that purpose (model object included) and what it came
    to: between events a job mostly keeps both, and one lookup by id is
    cheaper than building its key again. An entry is used only when the
    model object and the whole configuration match (``LastSeen.recall``), so
    it is the same memo, reached faster.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._table: dict[tuple[object, ...], tuple[PerfModel, object]] = {}
        self._last: dict[Hashable, LastSeen] = {}

    def get(self, model: PerfModel, key: tuple[object, ...]) -> object | None:
        hit = self._table.get((id(model), *key))
        return hit[1] if hit is not None and hit[0] is model else None

    def put(self, model: PerfModel, key: tuple[object, ...], value: object) -> None:
        if len(self._table) >= self.max_entries:
            self._table.clear()
            self._last.clear()
        self._table[(id(model), *key)] = (model, value)

    def last(self, purpose: Hashable) -> LastSeen:
        """Job id -> last configuration and result, for one purpose (see above).

        What is the same for every job of a call (the clock, the cluster's
        shape) goes into ``purpose``, so that an entry's check is short.
        """
        table = self._last.get(purpose)
        if table is None:
            table = self._last[purpose] = LastSeen()
        return table

    def rows(
        self, models: Sequence[PerfModel], configs: Sequence[tuple[int, int, int, int]]
    ) -> tuple[list[float], list[float]]:
        """Step time and energy of ``(n, r, bs, f)`` rows, model calls only for new rows."""
        t = [0.0] * len(models)
        e = [0.0] * len(models)
        miss: list[int] = []
        table = self._table
        for i, (model, cfg) in enumerate(zip(models, configs, strict=True)):
            hit = table.get((id(model), *cfg))
            if hit is None or hit[0] is not model:
                miss.append(i)
            else:
                t[i], e[i] = hit[1]  # type: ignore[misc]
        if miss:
            cols = np.array([configs[i] for i in miss], dtype=np.float64).T
            tm, em = evaluate([models[i] for i in miss], *cols)
            for k, i in enumerate(miss):
                t[i], e[i] = float(tm[k]), float(em[k])
                self.put(models[i], configs[i], (t[i], e[i]))
        return t, e


def predicted_w(
    snapshot: Snapshot,
    jobs: Sequence[JobPlan],
    spec: GpuSpec,
    models: Sequence[PerfModel],
    memo: ModelMemo,
    runs_at: Mapping[str, int] | None = None,
) -> float:
    """Cluster power of a plan by the jobs' models, plus idle power of unused GPUs.

    ``models[i]`` is the model of ``jobs[i]``'s job. Jobs that time-slice one
    set of GPUs (Gandiva) each run a ``1/k`` share of the time, so each adds
    ``1/k`` of its power. ``runs_at``: the clock a job really runs at where it
    differs from its plan's (a power limit holds it lower).
    """
    gathered = PlanWatts(memo)
    running, run_models, clocks, watts = (
        gathered.running,
        gathered.models,
        gathered.clocks,
        gathered.watts,
    )
    lookup = gathered.lookup
    seen = gathered.by_plan.get
    for jp, model in zip(jobs, models, strict=True):
        if not jp.gpus > 0:
            continue
        f = jp.frequency_mhz if runs_at is None else runs_at.get(jp.job_id, jp.frequency_mhz)
        running.append(jp)
        run_models.append(model)
        clocks.append(f)
        last = seen(jp.job_id)  # ``lookup``'s first check, inline: most plans pass it
        if last is not None and last[1] is jp and last[0] is model and last[2] == f:
            watts.append(last[3])
        else:
            watts.append(lookup(jp, model, f))
    return gathered.total(snapshot, spec)


class PlanWatts:
    """The running jobs of one plan, in plan order, with the watts of each that a
    memo already knows (None: not yet): ``total`` asks the models for the rest in
    one grouped call and adds the cluster's power up (``predicted_w``).

    A wrapper that visits every running job anyway (Zeus) fills these lists in
    its own pass, with the watts it keeps beside its plans, rather than handing
    the plan to ``predicted_w`` for a second pass over the same jobs.
    """

    __slots__ = ("_known", "_memo", "by_plan", "clocks", "models", "running", "sharing", "watts")

    def __init__(self, memo: ModelMemo) -> None:
        self.running: list[JobPlan] = []
        self.models: list[PerfModel] = []
        self.clocks: list[int] = []
        self.watts: list[float | None] = []
        self._memo = memo
        self._known = memo.last("watts")
        # Job id -> (model, plan, clock, watts): the very plan object of last time
        # (the baselines reuse them) at the same clock and model has the same watts,
        # found without building and comparing its configuration (this function's
        # CPU in a Gandiva+Zeus run of the default trace 0.43 -> 0.32 s).
        self.by_plan = memo.last("watts_by_plan")
        # Set by a baseline that knows its GPU sets (``Sharing``): ``total`` reads it
        # rather than counting every slot of every plan (a Gandiva+Zeus replay of
        # the default trace: 0.09-0.10 s of CPU in ``total`` against 0.19-0.27 s,
        # ``time.process_time`` around each call, two alternations).
        self.sharing: Sharing | None = None

    def lookup(self, jp: JobPlan, model: PerfModel, f: int) -> float | None:
        """The watts of ``jp`` at clock ``f`` by ``model`` if the memo has them."""
        last = self.by_plan.get(jp.job_id)
        if last is not None and last[1] is jp and last[0] is model and last[2] == f:
            w: float = last[3]
            return w
        hit: float | None = self._known.recall(
            jp.job_id, model, (jp.gpus, jp.local_batch_size, f, jp.placement)
        )
        if hit is not None:
            self.by_plan[jp.job_id] = (model, jp, f, hit)
        return hit

    def total(self, snapshot: Snapshot, spec: GpuSpec, shared: bool = False) -> float:
        """Cluster watts: every running job's (the missing ones from their models,
        then remembered), each divided by the jobs sharing its first GPU, plus
        the idle power of the GPUs no job uses.

        ``shared``: GPUs are likely time-sliced (Gandiva), so the sharers are
        counted at once rather than after a set finds that some are; the same
        figure either way (a share of 1 divides by 1), only sooner.
        """
        running, models, clocks, found = self.running, self.models, self.clocks, self.watts
        miss = [i for i, w in enumerate(found) if w is None]
        if miss:
            t, e = self._memo.rows(
                [models[i] for i in miss],
                [
                    (jp.gpus, per_node(jp.placement), jp.local_batch_size, clocks[i])
                    for i, jp in ((i, running[i]) for i in miss)
                ],
            )
            for i, ti, ei in zip(miss, t, e, strict=True):
                jp, model = running[i], models[i]
                found[i] = ei / ti
                config = (jp.gpus, jp.local_batch_size, clocks[i], jp.placement)
                self._known.remember(jp.job_id, model, config, found[i])
                self.by_plan[jp.job_id] = (model, jp, clocks[i], found[i])
        watts: list[float] = found  # type: ignore[assignment]  # every entry is filled now
        total = _Layout.of(snapshot.nodes).gpu_count
        active: float
        if self.sharing is not None:
            used, sharers_of = self.sharing
            if not sharers_of:
                active = sum(watts)
            else:  # w / k for each job, k the jobs on its GPU set (1 where it has them alone)
                active = sum(
                    map(truediv, watts, map(sharers_of.get, map(_JOB_ID, running), repeat(1)))
                )
            return active + (total - used) * spec.idle_power_w
        placements = list(map(_PLACEMENT, running))
        slots = list(chain.from_iterable(placements))
        if shared:
            sharers = Counter(slots)
            used = len(sharers)
        else:
            used = len(set(slots))
        if used == len(slots):
            active = sum(watts)  # no GPU time-sliced: every share is 1, and w / 1 is w
        else:
            # w / k for each job, k the sharers of its first GPU, summed in job order
            if not shared:
                sharers = Counter(slots)
            active = sum(map(truediv, watts, map(sharers.__getitem__, map(_FIRST, placements))))
        return active + (total - used) * spec.idle_power_w


_PLACEMENT = attrgetter("placement")
_FIRST = itemgetter(0)


class Decision(NamedTuple):
    """A baseline's choices before they are priced: job plans in the snapshot's
    job order (``job_plans`` over ``snapshot.jobs`` gives them so), and the
    moves among them."""

    jobs: tuple[JobPlan, ...]
    migrations: tuple[Migration, ...]
    sharing: Sharing | None = None
    """How the running jobs share GPUs, where the baseline knows (Gandiva)."""


class Sharing(NamedTuple):
    """GPUs in use and each time-sliced job's sharers, from a baseline that keeps
    its jobs' GPU sets disjoint or equal (Gandiva): what ``PlanWatts.total``
    counts over every GPU of every plan otherwise."""

    used: int
    """The distinct GPUs the running plans hold."""
    sharers: dict[str, int]
    """Job id -> jobs on its GPU set, for every job whose set has more than one."""


@runtime_checkable
class Decides(Protocol):
    """A baseline whose plan is ``finish(decide(...))``: a wrapper that reprices
    the plan anyway (Zeus) takes the decision and skips the first pricing."""

    def decide(self, snapshot: Snapshot) -> Decision:
        """The plan's jobs and migrations, without its power figures."""
        ...


def finish(
    snapshot: Snapshot,
    spec: GpuSpec,
    decided: Decision,
    memo: ModelMemo,
    priced: PlanWatts | None = None,
    shared: bool = False,
) -> Plan:
    """The plan of a decision, with its power figures (``priced``: its running
    plans gathered already, by ``job_plans``; ``shared``: ``PlanWatts.total``'s).

    The limit is the admin's budget as PowerFlow reads it; the baselines only
    report it (none of them is power-capped).
    """
    watts = (
        predicted_w(snapshot, decided.jobs, spec, job_models(snapshot, decided.jobs), memo)
        if priced is None
        else priced.total(snapshot, spec, shared)
    )
    return Plan(
        jobs=decided.jobs,
        limit_w=budget_limit_w(snapshot),
        predicted_w=watts,
        powered_down_nodes=(),
        migrations=decided.migrations,
    )


def budget_limit_w(snapshot: Snapshot) -> float:
    """``limit_w``, kept while the node tuple and the budget are the very same objects
    (it reads nothing else): the engine hands both on from decision to decision, and
    the sums over every node took 0.02-0.03 s of a baseline replay's CPU
    (``benchmarks/replay_bench.py``)."""
    nodes, budget = snapshot.nodes, snapshot.budget
    last = _LAST_LIMIT[0]
    if last is not None and last[0] is nodes and last[1] is budget:
        return last[2]
    value = limit_w(snapshot)
    if type(nodes) is tuple:  # held, so the identity check can never match a reused address
        _LAST_LIMIT[0] = (nodes, budget, value)
    return value


_LAST_LIMIT: list[tuple[Sequence[Node], Budget, float] | None] = [None]

_MODEL = attrgetter("model")
_JOB_ID = attrgetter("job_id")
_ID = attrgetter("id")


def plan_jobs(snapshot: Snapshot, plans: Sequence[JobPlan]) -> Sequence[Job]:
    """The snapshot's job of each plan. ``plans`` are usually in the snapshot's job
    order (a ``Decision``'s are): that is checked, and then the snapshot's jobs are
    the answer, without a mapping by id built at every event (with ``PlanWatts``,
    the policy CPU of a Gandiva+Zeus run of the default trace 2.89 -> 2.58 s,
    ``python benchmarks/replay_bench.py --runs gandiva+zeus``)."""
    jobs = snapshot.jobs
    if len(jobs) == len(plans) and list(map(_ID, jobs)) == list(map(_JOB_ID, plans)):
        return jobs
    by_id = {job.id: job for job in jobs}
    return [by_id[jp.job_id] for jp in plans]


def job_models(snapshot: Snapshot, plans: Sequence[JobPlan]) -> list[PerfModel]:
    """Each plan's job's model (``plan_jobs``)."""
    return list(map(_MODEL, plan_jobs(snapshot, plans)))


def waiting(job: Job, clock: int) -> JobPlan:
    """The plan of a job that gets no GPU this round."""
    return JobPlan(job.id, 0, clock, local_batch(job.global_batch_size, job.requested_gpus))


def running(job: Job, placement: tuple[GpuSlot, ...], clock: int) -> JobPlan:
    n = len(placement)
    return JobPlan(job.id, n, clock, local_batch(job.global_batch_size, n), placement)


def job_plans(
    jobs: Iterable[Job],
    where: Mapping[str, tuple[GpuSlot, ...]],
    clock: int,
    memo: ModelMemo,
    priced: PlanWatts | None = None,
) -> list[JobPlan]:
    """``running`` for the jobs in ``where``, ``waiting`` for the others, in order.

    The plan object of a job's last round is reused when it would be equal
    (plans are frozen): most jobs' plans do not change between events, and
    building one costs more than comparing its inputs. With ``priced``, each
    running plan goes into it with its job's model and the watts the memo
    knows, in the same pass (``finish`` then adds them up): what
    ``predicted_w`` would do in a second pass over the plans, which took
    a tenth of a Gandiva decision. Each job's id is read once, and every plan's
    clock is taken as ``clock`` (the memos are the clock's).
    """
    waits = memo.last(("waiting", clock))
    runs = memo.last(("running", clock))
    out: list[JobPlan] = []
    if priced is not None:
        # ``PlanWatts``'s lists, filled inline below: once per running job. Every plan
        # here is at ``clock`` (the memos are the clock's), and a running plan has GPUs
        # exactly when its placement is not empty.
        runs_p, models_p, watts_p = priced.running, priced.models, priced.watts
        seen, lookup = priced.by_plan.get, priced.lookup
    for job in jobs:
        jid = job.id
        placement = where.get(jid)
        if placement is None:
            hit = waits.get(jid)
            if hit is not None and hit[0] == job.global_batch_size and hit[1] == job.requested_gpus:
                out.append(hit[2])
                continue
            plan = waiting(job, clock)
            waits[jid] = (job.global_batch_size, job.requested_gpus, plan)
        else:
            hit = runs.get(jid)
            if hit is not None and hit[0] == job.global_batch_size and hit[1] == placement:
                plan = hit[2]
            else:
                plan = running(job, placement, clock)
                runs[jid] = (job.global_batch_size, placement, plan)
            if placement and priced is not None:
                model = job.model
                runs_p.append(plan)
                models_p.append(model)
                last = seen(jid)
                if last is not None and last[1] is plan and last[0] is model and last[2] == clock:
                    watts_p.append(last[3])
                else:
                    watts_p.append(lookup(plan, model, clock))
        out.append(plan)
    if priced is not None:
        priced.clocks.extend(repeat(clock, len(runs_p) - len(priced.clocks)))
    return out
