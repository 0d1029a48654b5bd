"""Every job's predicted step time and energy over its GPU counts x clocks, in bulk.

The policy's heap loops only read these tables, so one decision costs one call
of ``step_time_s`` and one of ``energy_per_iter_j`` per distinct model object
(jobs sharing a model are evaluated together), however many steps the greedy
takes. Rows of all jobs are stacked in one array (job ``j`` owns rows
``offsets[j]:offsets[j + 1]``, smallest count first), so memory is
``jobs x log2(G) x clocks`` floats and the bookkeeping is vectorised.

Local batch and divisibility: a job on ``n`` GPUs runs ``ceil(global / n)``
samples per GPU. When ``n`` does not divide the global batch the effective
global batch rounds up to ``n * ceil(global / n)`` (fewer than ``n`` extra
samples, under one per GPU), the iteration count stays as submitted, and the
models are asked about the local batch actually run. ``n`` is only allowed if
that local batch fits in memory (``<= max_local_batch_size``) and is at least
one sample (``n <= global``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from powerflow.errors import SnapshotError
from powerflow.models.protocol import FloatArray, PerfModel
from powerflow.policy.snapshot import Job
from powerflow.policy.validate import Cluster

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Tables:
    """Stacked predictions: one row per (job, allowed GPU count), one column per clock."""

    offsets: IntArray
    counts: IntArray
    gpus_per_node: IntArray
    local_batch: IntArray
    step_time_s: FloatArray
    energy_j: FloatArray
    requested_gpu_power_w: FloatArray
    """Per job: power per GPU on the requested count at the highest clock (for ``P_max``)."""

    def rows(self, job: int) -> range:
        return range(int(self.offsets[job]), int(self.offsets[job + 1]))

    def levels(self, job: int) -> int:
        return int(self.offsets[job + 1] - self.offsets[job])


def ceil_div(a: IntArray | int, b: IntArray | int) -> IntArray:
    return np.asarray(-(-np.asarray(a) // np.asarray(b)), dtype=np.int64)


def allowed_mask(jobs: Sequence[Job], cluster: Cluster, elastic: bool) -> npt.NDArray[np.bool_]:
    """``mask[j, k]``: may job ``j`` run on ``2**k`` GPUs now (pinned jobs: all False).

    Elastic: powers of two within min/max GPUs, the cluster, the global batch
    and the memory cap. Non-elastic: only the smallest such count at least the
    requested one (placement works in power-of-two blocks, so a request of 3
    runs on 4 with a smaller local batch), or none.
    """
    total = cluster.total_gpus
    powers = np.left_shift(1, np.arange(total.bit_length(), dtype=np.int64))
    col = np.asarray
    lo = col([j.min_gpus for j in jobs], dtype=np.int64)[:, None]
    hi = col([min(j.max_gpus or total, total, j.global_batch_size) for j in jobs])[:, None]
    cap = col([j.max_local_batch_size or j.global_batch_size for j in jobs])[:, None]
    batch = col([j.global_batch_size for j in jobs], dtype=np.int64)[:, None]
    pinned = col([j.pinned for j in jobs], dtype=bool)[:, None]
    mask = (powers >= lo) & (powers <= hi) & (ceil_div(batch, powers) <= cap) & ~pinned
    if not elastic:
        req = col([j.requested_gpus for j in jobs], dtype=np.int64)[:, None]
        mask &= powers >= req
        first = np.argmax(mask, axis=1)
        keep = np.zeros_like(mask)
        keep[np.arange(len(jobs)), first] = True
        mask &= keep
    out: npt.NDArray[np.bool_] = mask.reshape(len(jobs), powers.size)
    return out


def build_tables(
    jobs: Sequence[Job], cluster: Cluster, clocks_mhz: Sequence[int], elastic: bool
) -> Tables:
    """Evaluate every job's grid plus its ``P_max`` point, one call per model object."""
    gpn = cluster.gpus_per_node
    clocks = np.asarray(clocks_mhz, dtype=np.float64)
    width = clocks.size
    mask = allowed_mask(jobs, cluster, elastic) if jobs else np.zeros((0, 1), dtype=bool)
    per_job = [np.flatnonzero(m) for m in mask]
    counts_list: list[IntArray] = []
    r_list: list[IntArray] = []
    for j, job in enumerate(jobs):
        if job.pinned:
            nodes = [node for node, _ in job.placement]
            counts_list.append(np.asarray([len(nodes)], dtype=np.int64))
            r_list.append(np.asarray([max(nodes.count(n) for n in set(nodes))], dtype=np.int64))
        else:
            c = np.left_shift(1, per_job[j]).astype(np.int64)
            counts_list.append(c)
            r_list.append(np.minimum(c, gpn))
    sizes = np.asarray([c.size for c in counts_list], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    counts = np.concatenate(counts_list) if jobs else np.zeros(0, dtype=np.int64)
    r = np.concatenate(r_list) if jobs else np.zeros(0, dtype=np.int64)
    job_of_row = np.repeat(np.arange(len(jobs)), sizes)
    batch = np.asarray([j.global_batch_size for j in jobs], dtype=np.int64)
    bs = ceil_div(batch[job_of_row], counts)
    req = np.asarray([j.requested_gpus for j in jobs], dtype=np.int64)

    # Each job gets one extra row for its P_max point (requested count, top clock
    # in every column), and jobs are ordered by model object, so that each
    # model's points form one contiguous slice: one call per model, no copies.
    groups: dict[int, list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(id(job.model), []).append(j)
    job_order = np.asarray([j for members in groups.values() for j in members], dtype=np.int64)
    ext_sizes = sizes[job_order] + 1
    ext_job = np.repeat(job_order, ext_sizes)
    pos = np.arange(ext_job.size) - np.repeat(np.cumsum(ext_sizes) - ext_sizes, ext_sizes)
    is_req = pos == sizes[ext_job]
    row_of_ext = np.where(is_req, counts.size, offsets[ext_job] + pos)
    pad = np.zeros(1, dtype=np.int64)
    n_ext = np.where(is_req, req[ext_job], np.concatenate((counts, pad))[row_of_ext])
    r_ext = np.where(is_req, np.minimum(req[ext_job], gpn), np.concatenate((r, pad))[row_of_ext])
    bs_ext = np.where(
        is_req, ceil_div(batch[ext_job], req[ext_job]), np.concatenate((bs, pad))[row_of_ext]
    )
    n_pts, r_pts, bs_pts = (np.repeat(a.astype(np.float64), width) for a in (n_ext, r_ext, bs_ext))
    f_pts = np.where(
        np.repeat(is_req, width), float(cluster.gpu.max_clock_mhz), np.tile(clocks, ext_job.size)
    )
    t = np.empty(n_pts.size)
    e = np.empty(n_pts.size)
    at = 0
    for members in groups.values():
        hi = at + (int(sum(int(sizes[j]) for j in members)) + len(members)) * width
        model: PerfModel = jobs[members[0]].model
        args = (n_pts[at:hi], r_pts[at:hi], bs_pts[at:hi], f_pts[at:hi])
        t[at:hi] = _call(model.step_time_s, args, jobs[members[0]].id, "step time")
        e[at:hi] = _call(model.energy_per_iter_j, args, jobs[members[0]].id, "energy")
        at = hi
    _check_predictions(jobs, np.repeat(ext_job, width), n_pts, f_pts, t, e)
    t_ext, e_ext = t.reshape(-1, width), e.reshape(-1, width)
    step = np.empty((counts.size, width))
    energy = np.empty((counts.size, width))
    grid = ~is_req
    step[row_of_ext[grid]] = t_ext[grid]
    energy[row_of_ext[grid]] = e_ext[grid]
    req_power = np.empty(len(jobs))
    req_power[ext_job[is_req]] = e_ext[is_req, 0] / t_ext[is_req, 0] / req[ext_job[is_req]]
    return Tables(
        offsets=offsets,
        counts=counts,
        gpus_per_node=r,
        local_batch=bs,
        step_time_s=step,
        energy_j=energy,
        requested_gpu_power_w=req_power,
    )


def _call(
    fn: Callable[..., FloatArray], args: tuple[FloatArray, ...], job_id: str, what: str
) -> FloatArray:
    out = np.asarray(fn(*args), dtype=np.float64)
    if out.shape != args[0].shape:
        raise SnapshotError(
            f"job {job_id!r}: model returned {what} of shape {out.shape}, expected {args[0].shape}"
        )
    return out


def _check_predictions(
    jobs: Sequence[Job],
    point_job: IntArray,
    n: FloatArray,
    f: FloatArray,
    step: FloatArray,
    energy: FloatArray,
) -> None:
    for what, values in (("step time", step), ("energy per iteration", energy)):
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            k = int(np.argmax(bad))
            raise SnapshotError(
                f"job {jobs[int(point_job[k])].id!r}: model predicts {what} {float(values[k])} on "
                f"{int(n[k])} GPUs at {int(f[k])} MHz; need a finite positive value"
            )
