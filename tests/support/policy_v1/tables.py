"""Every job's predicted step time and energy over its GPU counts x clocks, in bulk.

The policy's heap loops only read these tables, so one decision costs one call
of ``step_time_s`` and one of ``energy_per_iter_j`` per distinct model object
(jobs sharing a model are evaluated together), however many steps the greedy
takes. Rows of all jobs are stacked in one array (job ``j`` owns a contiguous
run of rows, smallest count first), so memory is ``jobs x log2(G) x clocks``
floats for the two tables and the bookkeeping is vectorised.

Local batch and divisibility: a job on ``n`` GPUs runs ``ceil(global / n)``
samples per GPU. When ``n`` does not divide the global batch the effective
global batch rounds up to ``n * ceil(global / n)`` (fewer than ``n`` extra
samples, under one per GPU), the iteration count stays as submitted, and the
models are asked about the local batch actually run. ``n`` is only allowed if
that local batch fits in memory (``<= max_local_batch_size``) and is at least
one sample (``n <= global``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from powerflow.errors import SnapshotError
from powerflow.models.protocol import FloatArray, PerfModel
from powerflow.policy.snapshot import Job
from support.policy_v1.tablecache import CachedRows, TableCache
from support.policy_v1.validate import Cluster

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Tables:
    """Stacked predictions: one row per (job, allowed GPU count), one column per clock.

    Job ``j`` owns rows ``rows(j)`` (contiguous, smallest count first). Rows
    of no job (each job's ``P_max`` point) may sit between them.
    """

    start: IntArray
    sizes: IntArray
    row_job: IntArray
    """The job each row belongs to (``P_max`` rows: the job they were evaluated for)."""
    counts: IntArray
    gpus_per_node: IntArray
    local_batch: IntArray
    step_time_s: FloatArray
    energy_j: FloatArray
    requested_gpu_power_w: FloatArray
    """Per job: power per GPU on the requested count at the highest clock (for ``P_max``)."""

    def rows(self, job: int) -> range:
        first = int(self.start[job])
        return range(first, first + int(self.sizes[job]))

    def levels(self, job: int) -> int:
        return int(self.sizes[job])


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
    jobs: Sequence[Job],
    cluster: Cluster,
    clocks_mhz: Sequence[int],
    elastic: bool,
    cache: TableCache | None = None,
) -> Tables:
    """Evaluate every job's grid plus its ``P_max`` point, one call per model object.

    A model that also offers ``predict(n, r, bs, f) -> (step_time_s,
    energy_per_iter_j)`` (``FittedModel`` does, sharing the step-time terms)
    is called once instead of twice.

    Arguments go to the models as broadcasting columns (rows x 1) and a clock
    row (1 x clocks), so no point grid is materialised. Each job gets one more
    row for its ``P_max`` point (requested count; read at the top clock), and
    jobs are ordered by model object, so each model's rows are one slice.

    With a ``cache`` (``tablecache.py``) a job whose model object and row
    arguments were evaluated before reuses those rows; the jobs of a model
    that miss are evaluated together in one call, as without a cache.
    """
    gpn = cluster.gpus_per_node
    top = cluster.gpu.max_clock_mhz
    ext_clocks = sorted({*clocks_mhz, top})
    columns = np.asarray([ext_clocks.index(c) for c in clocks_mhz], dtype=np.int64)
    top_column = ext_clocks.index(top)
    f_row = np.asarray(ext_clocks, dtype=np.float64)[None, :]
    count = len(jobs)
    mask = allowed_mask(jobs, cluster, elastic) if jobs else np.zeros((0, 1), dtype=bool)

    groups: dict[int, list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(id(job.model), []).append(j)
    job_order = np.asarray([j for members in groups.values() for j in members], dtype=np.int64)
    pinned = np.asarray([job.pinned for job in jobs], dtype=bool)
    sizes = np.where(pinned, 1, mask.sum(axis=1)).astype(np.int64)
    ext_sizes = sizes[job_order] + 1
    ext_start = np.cumsum(ext_sizes) - ext_sizes
    start = np.empty(count, dtype=np.int64)
    start[job_order] = ext_start
    ext_job = np.repeat(job_order, ext_sizes)
    pos = np.arange(ext_job.size) - np.repeat(ext_start, ext_sizes)
    is_req = pos == sizes[ext_job]

    # Counts per row: the k-th allowed power of two, a pinned job's own count,
    # or the requested count on P_max rows.
    req = np.asarray([j.requested_gpus for j in jobs], dtype=np.int64)
    batch = np.asarray([j.global_batch_size for j in jobs], dtype=np.int64)
    ks = np.nonzero(mask[job_order])[1] if count else np.zeros(0, dtype=np.int64)
    counts = req[ext_job].copy()
    counts[~is_req & ~pinned[ext_job]] = np.left_shift(1, ks)
    r = np.minimum(counts, gpn)
    for j in np.flatnonzero(pinned).tolist():
        nodes = [node for node, _ in jobs[j].placement]
        counts[start[j]] = len(nodes)
        r[start[j]] = max(nodes.count(n) for n in set(nodes))
    bs = ceil_div(batch[ext_job], counts)

    n_col, r_col, bs_col = (a.astype(np.float64)[:, None] for a in (counts, r, bs))
    t = np.empty((ext_job.size, f_row.shape[1]))
    e = np.empty_like(t)
    # Each row's model arguments (n, r, local batch) as 24 bytes, sliced per job for the key.
    args_bytes = np.stack([counts, r, bs], axis=1).astype(np.int64).tobytes() if count else b""
    clock_key = tuple(ext_clocks)
    if cache is not None:
        cache.fit(count)
    start_l, ext_l = start.tolist(), (sizes + 1).tolist()
    new_rows: list[IntArray] = []
    at = 0
    for members in groups.values():
        hi = at + sum(ext_l[j] for j in members)
        model: PerfModel = jobs[members[0]].model
        rows: slice | IntArray = slice(at, hi)
        if cache is not None:
            miss = []
            for j in members:
                lo = start_l[j]
                end = lo + ext_l[j]
                hit = cache.get((id(model), clock_key, args_bytes[24 * lo : 24 * end]), model)
                if hit is None:
                    miss.append(j)
                else:
                    t[lo:end], e[lo:end] = hit.step_time_s, hit.energy_j
            if len(miss) < len(members):
                rows = np.asarray(
                    [k for j in miss for k in range(start_l[j], start_l[j] + ext_l[j])],
                    dtype=np.int64,
                )
        at = hi
        if isinstance(rows, np.ndarray):
            if not rows.size:
                continue
            new_rows.append(rows)
        else:
            new_rows.append(np.arange(rows.start, rows.stop))
        args = (n_col[rows], r_col[rows], bs_col[rows], f_row)
        predict = getattr(model, "predict", None)
        job_id = jobs[members[0]].id
        if callable(predict):
            both = predict(*args)
            t[rows] = _checked_shape(both[0], args, job_id, "step time")
            e[rows] = _checked_shape(both[1], args, job_id, "energy")
        else:
            t[rows] = _checked_shape(model.step_time_s(*args), args, job_id, "step time")
            e[rows] = _checked_shape(model.energy_per_iter_j(*args), args, job_id, "energy")
    if cache is None:
        _check_predictions(jobs, ext_job, counts, ext_clocks, t, e)
    elif new_rows:
        # Only new rows need the check (cached ones passed it), in row order
        # so that the error names the same row as a check of the whole table.
        fresh = np.concatenate(new_rows)
        _check_predictions(jobs, ext_job[fresh], counts[fresh], ext_clocks, t[fresh], e[fresh])
        bounds = np.flatnonzero(np.diff(ext_job[fresh], prepend=-1, append=-1))
        for lo, end in zip(
            fresh[bounds[:-1]].tolist(), (fresh[bounds[1:] - 1] + 1).tolist(), strict=True
        ):
            j = int(ext_job[lo])
            model = jobs[j].model
            key = (id(model), clock_key, args_bytes[24 * lo : 24 * end])
            cache.put(key, CachedRows(model, t[lo:end].copy(), e[lo:end].copy()))
    req_rows = np.flatnonzero(is_req)
    req_power = np.empty(count)
    req_power[ext_job[req_rows]] = (
        e[req_rows, top_column] / t[req_rows, top_column] / req[ext_job[req_rows]]
    )
    if columns.size != len(ext_clocks):
        t, e = t[:, columns], e[:, columns]
    return Tables(
        start=start,
        sizes=sizes,
        row_job=ext_job,
        counts=counts,
        gpus_per_node=r,
        local_batch=bs,
        step_time_s=t,
        energy_j=e,
        requested_gpu_power_w=req_power,
    )


def _checked_shape(
    values: object, args: tuple[FloatArray, ...], job_id: str, what: str
) -> FloatArray:
    out = np.asarray(values, dtype=np.float64)
    shape = (args[0].shape[0], args[3].shape[1])
    if out.shape != shape:
        raise SnapshotError(
            f"job {job_id!r}: model returned {what} of shape {out.shape}, expected {shape} "
            "(PerfModel arguments broadcast)"
        )
    return out


def _check_predictions(
    jobs: Sequence[Job],
    row_job: IntArray,
    counts: IntArray,
    clocks: Sequence[int],
    step: FloatArray,
    energy: FloatArray,
) -> None:
    for what, values in (("step time", step), ("energy per iteration", energy)):
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            row, col = (int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
            raise SnapshotError(
                f"job {jobs[int(row_job[row])].id!r}: model predicts {what} "
                f"{float(values[row, col])} on {int(counts[row])} GPUs at {clocks[col]} MHz; "
                "need a finite positive value"
            )
