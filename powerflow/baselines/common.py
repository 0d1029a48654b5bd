"""What every baseline needs and none of them decides: clocks, batches, GPUs, watts.

Shared here so that the baselines differ only in their scheduling rules, and so
that a plan from any of them is valid in the same way (``gpus ==
len(placement)``, a supported clock, ``local_batch_size = ceil(global /
gpus)``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from powerflow.errors import SnapshotError
from powerflow.gpus import GpuSpec
from powerflow.models.protocol import FloatArray, PerfModel
from powerflow.policy.budget import limit_watts
from powerflow.policy.snapshot import GpuSlot, Job, JobPlan, Migration, Node, Plan, Snapshot


def cluster_gpu(snapshot: Snapshot) -> GpuSpec:
    """The cluster's GPU type; the baselines, like their papers, assume one type."""
    if not snapshot.nodes:
        raise SnapshotError("snapshot has no nodes")
    spec = snapshot.nodes[0].gpu
    if any(node.gpu != spec for node in snapshot.nodes):
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


def arrival_order(jobs: Iterable[Job]) -> list[Job]:
    """FIFO order; the id breaks ties so that every baseline is deterministic."""
    return sorted(jobs, key=lambda j: (j.arrival_s, j.id))


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


class Pool:
    """Free GPUs of the cluster during one ``plan`` call (mutable, never shared).

    Every node is usable: the baselines are not energy-aware and never keep a
    node powered down.
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.order = [node.name for node in nodes]
        self.size = {node.name: node.gpus for node in nodes}
        self.free: dict[str, list[int]] = {node.name: list(range(node.gpus)) for node in nodes}

    def copy(self) -> Pool:
        other = Pool.__new__(Pool)
        other.order = self.order
        other.size = self.size
        other.free = {name: list(idx) for name, idx in self.free.items()}
        return other

    @property
    def free_count(self) -> int:
        return sum(len(idx) for idx in self.free.values())

    def is_free(self, slots: Iterable[GpuSlot]) -> bool:
        return all(node in self.free and i in self.free[node] for node, i in slots)

    def take(self, slots: Iterable[GpuSlot]) -> None:
        for node, i in slots:
            if node not in self.free or i not in self.free[node]:
                raise SnapshotError(f"GPU {node}/{i} is used twice or does not exist")
            self.free[node].remove(i)

    def release(self, slots: Iterable[GpuSlot]) -> None:
        for node, i in slots:
            self.free[node].append(i)
            self.free[node].sort()

    def _grab(self, node: str, k: int) -> tuple[GpuSlot, ...]:
        got = self.free[node][:k]
        del self.free[node][:k]
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
        names = [name for name in self.order if name not in exclude]
        fits = [name for name in names if len(self.free[name]) >= n]
        if fits:
            aff = affinity or {}
            best = min(
                fits,
                key=lambda name: (
                    not aff.get(name, False),
                    len(self.free[name]),
                    self.order.index(name),
                ),
            )
            return self._grab(best, n)
        whole = [name for name in names if len(self.free[name]) == self.size[name] > 0]
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
        if self.free_count < n:
            return None
        slots: list[GpuSlot] = []
        for name in sorted(self.order, key=lambda m: (-len(self.free[m]), self.order.index(m))):
            if len(slots) == n:
                break
            slots.extend(self._grab(name, min(len(self.free[name]), n - len(slots))))
        return tuple(slots)

    def min_nodes(self, n: int) -> int:
        """Fewest nodes a job of ``n`` GPUs can span in this cluster."""
        biggest = max(self.size.values())
        return math.ceil(n / biggest)


def predicted_watts(
    snapshot: Snapshot, jobs: Sequence[JobPlan], spec: GpuSpec, models: Mapping[str, PerfModel]
) -> float:
    """Cluster power of a plan by the jobs' models, plus idle power of unused GPUs.

    Jobs that time-slice one set of GPUs (Gandiva) each run a ``1/k`` share of
    the time, so each adds ``1/k`` of its power.
    """
    running = [jp for jp in jobs if jp.gpus > 0]
    sharers: dict[GpuSlot, int] = defaultdict(int)
    for jp in running:
        for slot in jp.placement:
            sharers[slot] += 1
    active = 0.0
    if running:
        t, e = evaluate(
            [models[jp.job_id] for jp in running],
            [jp.gpus for jp in running],
            [per_node(jp.placement) for jp in running],
            [jp.local_batch_size for jp in running],
            [jp.frequency_mhz for jp in running],
        )
        share = np.array([1.0 / max(sharers[jp.placement[0]], 1) for jp in running])
        active = float(np.sum(share * e / t))
    total = sum(node.gpus for node in snapshot.nodes)
    return active + (total - len(sharers)) * spec.idle_power_w


def finish(
    snapshot: Snapshot,
    spec: GpuSpec,
    jobs: Sequence[JobPlan],
    migrations: Sequence[Migration] = (),
    notes: Sequence[str] = (),
) -> Plan:
    """Assemble a plan in the snapshot's job order with its power figures."""
    models = {job.id: job.model for job in snapshot.jobs}
    by_id = {jp.job_id: jp for jp in jobs}
    ordered = tuple(by_id[job.id] for job in snapshot.jobs)
    return Plan(
        jobs=ordered,
        limit_watts=limit_watts(snapshot),
        predicted_watts=predicted_watts(snapshot, ordered, spec, models),
        powered_down_nodes=(),
        migrations=tuple(migrations),
        notes=tuple(notes),
    )


def waiting(job: Job, clock: int) -> JobPlan:
    """The plan of a job that gets no GPU this round."""
    return JobPlan(job.id, 0, clock, local_batch(job.global_batch_size, job.requested_gpus))


def running(job: Job, placement: tuple[GpuSlot, ...], clock: int) -> JobPlan:
    n = len(placement)
    return JobPlan(job.id, n, clock, local_batch(job.global_batch_size, n), placement)
