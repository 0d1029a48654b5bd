"""Every job's predicted step time and energy over its GPU counts x clocks, in bulk.

The policy's heap loops only read these tables, so one decision costs one call
of ``step_time_s`` and one of ``energy_per_iter_j`` per distinct model object
(jobs sharing a model are evaluated together), however many steps the greedy
takes. Each job's rows are built once per distinct ``JobKey`` (its model
object and the fields that choose its GPU counts) and, with the policy's
``PolicyMemo``, kept across calls; a call stacks the per-row vectors (count,
GPUs per node, local batch, the efficient clock, the step time and energy
there and the highest power over the clocks) of all jobs (job ``j`` owns a
contiguous run of rows, smallest count first) and gathers full rows over the
clocks only for the rows it asks for (``Tables.values``: the running jobs).
Memory is ``jobs x log2(G) x clocks`` floats for the two tables, held per job.

Local batch and divisibility: a job on ``n`` GPUs runs ``ceil(global / n)``
samples per GPU. When ``n`` does not divide the global batch the effective
global batch rounds up to ``n * ceil(global / n)`` (fewer than ``n`` extra
samples, under one per GPU), the iteration count stays as submitted, and the
models are asked about the local batch actually run. ``n`` is only allowed if
that local batch fits in memory (``<= max_local_batch_size``) and is at least
one sample (``n <= global``).
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from powerflow.core.errors import SnapshotError
from powerflow.core.models.protocol import FloatArray, PerfModel
from powerflow.core.policy.memo import PolicyMemo
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.validate import Cluster

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Tables:
    """Stacked predictions: one row per (job, allowed GPU count), one column per clock.

    Job ``j`` owns rows ``rows(j)`` (contiguous, smallest count first; none
    when no count is allowed, ``start[j]`` then the next job's first row). The per-row
    vectors are stacked; the full step time and energy rows stay with each
    job (``job_rows``) and are gathered on demand (``values``), since a
    decision reads only the rows of the jobs it runs.
    """

    start: IntArray
    sizes: IntArray
    row_job: IntArray
    """The job each row belongs to."""
    counts: IntArray
    gpus_per_node: IntArray
    local_batch: IntArray
    efficient: IntArray
    """Per row, the clock column with the least energy per iteration (lowest on ties)."""
    efficient_step_time_s: FloatArray
    efficient_energy_j: FloatArray
    peak_w: FloatArray
    """Per row, its highest predicted power over the clocks (what a clock sweep peaks at)."""
    job_rows: tuple[JobRows, ...]
    """Per job (index as in the snapshot), its rows; row ``start[j] + k`` is its ``k``-th."""
    width: int
    """Clock columns."""
    vectors: FloatArray | None = None
    """The stacked ``JobRows.vectors`` the per-row columns were cut from (``build_tables``
    keeps them: a later call takes an unchanged job's rows from here, ``Previous``)."""
    moved: tuple[IntArray, IntArray] | None = None
    """With ``Previous``: where the rows taken from its tables lie here and lay there
    (``row_moves``), for the arrays kept per row with those tables (``static.py``)."""

    def rows(self, job: int) -> range:
        first = int(self.start[job])
        return range(first, first + int(self.sizes[job]))

    def levels(self, job: int) -> int:
        return int(self.sizes[job])

    def values(
        self, rows: IntArray, first: int = 0, memo: PolicyMemo[JobRows] | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """Step time and energy of ``rows`` at the clock columns from ``first`` up.

        With a ``memo`` the rows the last such call gathered are taken from its
        answer (``Gathered``) and only the others from their jobs' rows.
        """
        if not rows.size:
            both = np.zeros((0, 2, self.width))
        elif memo is None or self.vectors is None:
            both = self._gathered(rows)
        else:
            uids = self.vectors[rows, UID]
            last = memo.gathered
            if isinstance(last, Gathered) and np.array_equal(last.uids, uids):
                both = last.both  # the same rows as the last call (most decisions)
            else:
                both = self._gathered(rows, last if isinstance(last, Gathered) else None, uids)
                memo.gathered = Gathered(uids, both)
        both = both[:, :, first:]
        return both[:, 0], both[:, 1]

    def _gathered(
        self, rows: IntArray, last: Gathered | None = None, uids: FloatArray | None = None
    ) -> FloatArray:
        """Step time and energy of ``rows`` at every clock, (rows, 2, clocks): each row
        ``last`` has (the same ``uids``) copied from it in one gather, the others from
        their jobs' rows."""
        if (
            last is not None
            and uids is not None
            and last.uids.size
            and last.both.shape[2] == self.width  # else (other clocks) none is the same
        ):
            pos = np.searchsorted(last.sorted_uids, uids)
            pos[pos == last.uids.size] = 0
            # ``take`` of whole rows, then the missed ones written over: several times
            # faster than assigning the hits through an index.
            both = last.both.take(last.order[pos], axis=0)
            missed = np.flatnonzero(last.sorted_uids[pos] != uids)
            if missed.size:
                both[missed] = self._gathered(rows[missed])
            return both
        owners = self.row_job[rows]
        ks = (rows - self.start[owners]).tolist()
        entries = self.job_rows
        # Whole rows (views kept per job): fewer Python steps per row than slicing each.
        return np.array(
            [entries[j].row_views[k] for j, k in zip(owners.tolist(), ks, strict=True)]
        ).reshape(rows.size, 2, self.width)


UID = 7
"""The column of ``Tables.vectors`` (and ``JobRows.vectors``) holding each row's serial
number (``_serials``): unique to the row's values for the life of the process."""


class Gathered:
    """The step time and energy rows one ``Tables.values`` call gathered (``both``,
    (rows, 2, clocks)) and their serials (``uids``, column ``UID``): what the next call
    (``PolicyMemo.gathered``) takes instead of gathering them again.

    A decision's clock phase reads the rows of the jobs it runs, and most decisions
    run the jobs of the last one on the same counts: a fitted PowerFlow run's
    2,314 decisions gather 160 rows each on average, all but 3 % of them rows
    the last call had, a Python step per row that this spares: ``Curves.matrices``
    0.24 -> 0.15 s of CPU in a replay of them (``time.process_time`` around
    it, least of 3 replays of the snapshots ``benchmarks/replay_bench.py
    --runs powerflow`` records, alternated with the code without it). Exact: a
    serial names one row of one ``JobRows``, whose values never change, and
    serials are never reused; ``tests/test_policy_memo.py`` compares warm and
    fresh plans, and gathers against the memo over changing tables.
    """

    __slots__ = ("both", "order", "sorted_uids", "uids")

    def __init__(self, uids: FloatArray, both: FloatArray) -> None:
        self.uids = uids
        self.both = both
        self.order = np.argsort(uids, kind="stable")
        self.sorted_uids = uids[self.order]


_serial_lock = threading.Lock()
_serial_next = [0]


def _serials(count: int) -> int:
    """The first of ``count`` row serial numbers never handed out before (exact as
    float64 up to 2**53 rows)."""
    with _serial_lock:
        first = _serial_next[0]
        _serial_next[0] = first + count
    return first


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


def counts_of(job: Job, total_gpus: int, elastic: bool) -> list[int]:
    """The counts ``allowed_mask`` allows ``job`` (its row's powers of two), smallest
    first, as Python ints: the same rules one job at a time, for the few jobs a
    decision evaluates (about 5 in a fitted run), where a dozen numpy calls on
    arrays that small cost more than this loop (``_evaluate``: 0.30 -> 0.28 s of
    CPU over the 1,223 calls of a fitted run's replay)."""
    if job.pinned:
        return []
    batch = job.global_batch_size
    lo = job.min_gpus
    hi = min(job.max_gpus or total_gpus, total_gpus, batch)
    cap = job.max_local_batch_size or batch
    out = []
    for k in range(total_gpus.bit_length()):
        n = 1 << k
        if lo <= n <= hi and -(-batch // n) <= cap:
            if not elastic:
                if n >= job.requested_gpus:
                    return [n]  # the smallest allowed count at least the requested one
                continue
            out.append(n)
    return out


@dataclass(frozen=True)
class Previous:
    """Rows a call takes from an earlier call's ``tables`` built with the same clocks,
    cluster and options: per job of this call, ``index`` is the job of those tables
    with the very same rows (``JobRows``), or -1 (``static.py`` decides which)."""

    tables: Tables
    index: IntArray


def row_moves(
    start: IntArray, sizes: IntArray, before: IntArray, index: IntArray
) -> tuple[IntArray, IntArray]:
    """Where each row of the jobs with an ``index`` (>= 0) lies now (``start``) and lay
    in the earlier tables (``before``: their starts there), the jobs' sizes unchanged."""
    hit = np.flatnonzero(index >= 0)
    reps = sizes[hit]
    within = np.arange(int(reps.sum()), dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    return np.repeat(start[hit], reps) + within, np.repeat(before[index[hit]], reps) + within


def build_tables(
    jobs: Sequence[Job],
    cluster: Cluster,
    clocks_mhz: Sequence[int],
    elastic: bool,
    memo: PolicyMemo[JobRows] | None = None,
    previous: Previous | None = None,
) -> Tables:
    """Evaluate every job's grid, one call per model object.

    A model that also offers ``predict(n, r, bs, f) -> (step_time_s,
    energy_per_iter_j)`` (``FittedModel`` does, sharing the step-time terms)
    is called once instead of twice; one that offers ``predict_grid`` (the same
    of 1-D rows at a 1-D row of clocks, ``FittedModel`` again) is asked that.

    Arguments go to the models as broadcasting columns (rows x 1) and a clock
    row (1 x clocks), so no point grid is materialised, and
    jobs are ordered by model object, so each model's rows are one slice.

    A job's rows depend only on its model object, the fields that choose its
    GPU counts (``JobKey``) and the call's clocks and the cluster's shape, so they are
    built once per distinct key (``JobRows``) and stacked; with a ``memo``
    (``memo.py``) also across calls, so that a replan with unchanged models
    calls no model. The jobs whose key misses are evaluated together, one
    model call per model object. ``previous``: the rows of the jobs an earlier
    call had with the same rows, taken from its tables (``static.py``: built
    for the same model object and fields, clocks and cluster) as they are, so
    that only the other jobs' rows are looked up and stacked one by one.
    """
    count = len(jobs)
    context = (
        tuple(clocks_mhz),
        elastic,
        cluster.total_gpus,
        cluster.gpus_per_node,
    )
    if memo is None:
        memo = PolicyMemo()
    memo.fit(count)
    tag = memo.tag(context)
    missing: dict[JobKey, int] = {}
    absent: list[int] = []
    kept = memo.rows
    mids = list(map(id, map(_MODEL, jobs)))
    keys: list[JobKey | None] = [None] * count
    entries: list[JobRows | None]
    if previous is None:
        entries = [None] * count
        lookup: Sequence[int] = range(count)
    else:
        before = previous.tables.job_rows
        entries = [None if p < 0 else before[p] for p in previous.index.tolist()]
        lookup = np.flatnonzero(previous.index < 0).tolist()
    for j in lookup:
        job = jobs[j]
        model = job.model
        mid = mids[j]
        key = (
            mid,
            tag,
            job.min_gpus,
            job.max_gpus,
            job.max_local_batch_size,
            job.global_batch_size,
            job.requested_gpus,
            _pinned_shape(job.placement) if job.pinned else None,
        )
        keys[j] = key
        hit = kept(key, model)
        if hit is None:
            missing.setdefault(key, j)
            absent.append(j)
        entries[j] = hit
    distinct = len(set(mids)) == count
    if distinct:
        job_order = list(range(count))  # every job its own model object (fitted models)
    else:
        groups: dict[int, list[int]] = {}
        for j, mid in enumerate(mids):
            members = groups.get(mid)
            if members is None:
                groups[mid] = [j]
            else:
                members.append(j)
        job_order = [j for members in groups.values() for j in members]
    if missing:
        # The first job of each missing key, in job order.
        if distinct:
            fresh = sorted(missing.values())
        else:
            fresh = [j for j in job_order if (k := keys[j]) is not None and missing.get(k) == j]

        def first_of_model(mid: int) -> str:
            """The first job of the model ``mid`` (the one an error names)."""
            return jobs[mids.index(mid)].id

        made = _evaluate([jobs[j] for j in fresh], cluster, clocks_mhz, elastic, first_of_model)
        for j, rows in zip(fresh, made, strict=True):
            memo.keep(keys[j], rows)
        by_key = dict(zip((keys[j] for j in fresh), made, strict=True))
        for j in absent:
            entries[j] = by_key[keys[j]]
    stacked = [e for e in entries if e is not None]
    return _stack(stacked, job_order, len(clocks_mhz), previous)


JobKey = tuple[int, int, int, int | None, int | None, int, int, tuple[int, int] | None]
"""(id of the model, context tag, min GPUs, max GPUs, max local batch, global batch,
requested GPUs, a pinned job's (GPUs, GPUs per node)): all that a job's rows depend on."""


@dataclass(frozen=True)
class JobRows:
    """One job's rows: its allowed counts, smallest first.

    ``both`` holds the policy's clock columns only. ``vectors`` holds per row
    (count, GPUs per node, local batch, efficient column, step time and
    energy there, highest power, the row's serial ``UID``) as floats (the ints are
    small, so exact), so that stacking the jobs is one ``concatenate``.
    """

    model: object
    """The model the rows came from (kept alive: ``PolicyMemo`` keys on its id)."""

    both: FloatArray
    """Step time and energy as one (rows, 2, clocks) array, so that gathering a row of
    each is one slice."""
    vectors: FloatArray
    size: int
    """Allowed counts (its rows)."""
    row_of: dict[tuple[int, int, int], int]
    """The row of each (GPUs, GPUs per node, local batch) the model was asked about."""

    def power_w(self, n: int, r: int, bs: int, column: int) -> float | None:
        """Predicted power on ``n`` GPUs, ``r`` per node, local batch ``bs`` at clock
        ``column``, where one of the rows is that configuration (else None)."""
        k = self.row_of.get((n, r, bs))
        if k is None:
            return None
        both = self.both
        return both.item(k, 1, column) / both.item(k, 0, column)  # the same IEEE division

    @functools.cached_property
    def row_views(self) -> tuple[FloatArray, ...]:
        """``both[k]`` for each row ``k``: (2, clocks) views, made once."""
        return tuple(self.both)

    @functools.cached_property
    def counts(self) -> tuple[int, ...]:
        """Its rows' GPU counts, smallest first."""
        return tuple(n for n, _, _ in self.row_of)


def _pinned_shape(placement: Sequence[tuple[str, int]]) -> tuple[int, int]:
    """A pinned job's GPU count and the most GPUs it has on one node."""
    nodes = [node for node, _ in placement]
    return len(nodes), max(nodes.count(n) for n in set(nodes))


_SIZE = operator.attrgetter("size")
_MODEL = operator.attrgetter("model")


def _stack(
    entries: Sequence[JobRows], job_order: list[int], width: int, previous: Previous | None = None
) -> Tables:
    """Stack per-job rows, the jobs of each model object adjacent (``job_order``).

    With ``previous``, the rows of the jobs it has are copied from its stacked
    vectors in one gather (``row_moves``) and only the others' are copied job by
    job: the same array, without a Python step and an array per job.
    """
    count = len(entries)
    earlier = previous.tables if previous is not None else None
    if previous is None or earlier is None or earlier.vectors is None:
        sizes = np.fromiter(map(_SIZE, entries), dtype=np.int64, count=count)
        fresh: Sequence[int] = range(count)
    else:
        index = previous.index
        sizes = np.zeros(count, dtype=np.int64)
        hit = index >= 0
        sizes[hit] = earlier.sizes[index[hit]]
        fresh = np.flatnonzero(~hit).tolist()
        for j in fresh:
            sizes[j] = entries[j].size
    order = np.asarray(job_order, dtype=np.int64)
    ordered = sizes[order]
    start = np.empty(count, dtype=np.int64)
    start[order] = np.cumsum(ordered) - ordered
    moved = None
    if len(fresh) == count:
        parts = [entries[j].vectors for j in job_order]
        vectors = np.concatenate(parts) if parts else np.zeros((0, UID + 1))
    else:
        assert previous is not None and earlier is not None and earlier.vectors is not None
        # Every row taken from the earlier vectors in one ``take`` (the fresh jobs'
        # from row 0, written over below): 3 µs against 14 µs assigning the kept rows
        # through an index at 900 rows (``timeit``).
        moved = to, source = row_moves(start, sizes, earlier.start, previous.index)
        taken = np.zeros(int(ordered.sum()), dtype=np.int64)
        taken[to] = source
        if len(earlier.vectors):
            vectors = earlier.vectors.take(taken, axis=0)
        else:  # none kept (the earlier jobs had no rows): every row is a fresh job's
            vectors = np.empty((taken.size, UID + 1))
        for j in fresh:
            first = int(start[j])
            vectors[first : first + int(sizes[j])] = entries[j].vectors
    ints = vectors[:, :4].astype(np.int64)
    return Tables(
        moved=moved,
        start=start,
        sizes=sizes,
        row_job=np.repeat(order, ordered),
        counts=ints[:, 0],
        gpus_per_node=ints[:, 1],
        local_batch=ints[:, 2],
        efficient=ints[:, 3],
        efficient_step_time_s=vectors[:, 4].copy(),
        efficient_energy_j=vectors[:, 5].copy(),
        peak_w=vectors[:, 6].copy(),
        job_rows=tuple(entries),
        width=width,
        vectors=vectors,
    )


def _evaluate(
    jobs: Sequence[Job],
    cluster: Cluster,
    clocks_mhz: Sequence[int],
    elastic: bool,
    names: Callable[[int], str],
) -> list[JobRows]:
    """Rows of ``jobs`` (each model object's jobs adjacent), one model call per model,
    or one call for all of them where their type offers ``predict_grids``
    (``_grids_of``).

    ``names`` gives, for a model's id, the job named when that model's output has
    the wrong shape.
    """
    gpn = cluster.gpus_per_node
    total = cluster.total_gpus
    f_row = np.asarray(clocks_mhz, dtype=np.float64)[None, :]
    count = len(jobs)
    # Per row: the job's k-th allowed count (``counts_of``), or a pinned job's own
    # count, the GPUs per node and the local batch.
    n_rows: list[int] = []
    r_rows: list[int] = []
    bs_rows: list[int] = []
    first_row: list[int] = []
    for job in jobs:
        first_row.append(len(n_rows))
        batch = job.global_batch_size
        if job.pinned:
            n, per_node = _pinned_shape(job.placement)
            n_rows.append(n)
            r_rows.append(per_node)
            bs_rows.append(-(-batch // n))
        else:
            allowed = counts_of(job, total, elastic)
            n_rows += allowed
            r_rows += [min(n, gpn) for n in allowed]
            bs_rows += [-(-batch // n) for n in allowed]
    size = len(n_rows)
    ends = [*first_row[1:], size]
    ext_job = np.repeat(np.arange(count), [b - a for a, b in zip(first_row, ends, strict=True)])
    counts, r, bs = (np.asarray(a, dtype=np.int64).reshape(size) for a in (n_rows, r_rows, bs_rows))

    n_col, r_col, bs_col = (a.astype(np.float64)[:, None] for a in (counts, r, bs))
    bounds = [0, *(j for j in range(1, count) if jobs[j].model is not jobs[j - 1].model), count]
    models = [jobs[lo].model for lo in bounds[:-1]]
    row_bounds = [*(first_row[lo] for lo in bounds[:-1]), ext_job.size]
    together = _grids_of(models)
    if together is not None:
        t, e = together(models, row_bounds, n_col, r_col, bs_col, f_row)
        args = (n_col, r_col, bs_col, f_row)
        t = _checked_shape(t, args, lambda: names(id(models[0])), "step time")
        e = _checked_shape(e, args, lambda: names(id(models[0])), "energy")
    else:
        t = np.empty((ext_job.size, f_row.shape[1]))
        e = np.empty_like(t)
    for k, model in enumerate(models if together is None else ()):
        rows = slice(row_bounds[k], row_bounds[k + 1])
        if rows.start == rows.stop:
            continue  # none of these jobs may run on any count now
        args = (n_col[rows], r_col[rows], bs_col[rows], f_row)
        grid = getattr(model, "predict_grid", None)
        predict = getattr(model, "predict", None)

        def job_id(model: PerfModel = model) -> str:
            return names(id(model))

        if callable(grid):  # the rows at every clock without a grid of arguments
            both = grid(*(a.ravel() for a in args))
            t[rows] = _checked_shape(both[0], args, job_id, "step time")
            e[rows] = _checked_shape(both[1], args, job_id, "energy")
        elif callable(predict):
            both = predict(*args)
            t[rows] = _checked_shape(both[0], args, job_id, "step time")
            e[rows] = _checked_shape(both[1], args, job_id, "energy")
        else:
            t[rows] = _checked_shape(model.step_time_s(*args), args, job_id, "step time")
            e[rows] = _checked_shape(model.energy_per_iter_j(*args), args, job_id, "energy")
    _check_predictions(jobs, ext_job, counts, clocks_mhz, t, e)
    idx = np.arange(ext_job.size)
    efficient = (
        np.argmin(e, axis=1).astype(np.int64)
        if t.shape[1]
        else np.zeros(ext_job.size, dtype=np.int64)
    )
    t_eff, e_eff = t[idx, efficient], e[idx, efficient]
    peak = (e / t).max(axis=1) if t.shape[1] else np.full(ext_job.size, np.nan)
    serials = _serials(ext_job.size) + np.arange(ext_job.size)
    vectors = np.stack([counts, r, bs, efficient, t_eff, e_eff, peak, serials], axis=1).astype(
        np.float64
    )
    both_all = np.stack([t, e], axis=1)
    shapes = list(zip(n_rows, r_rows, bs_rows, strict=True))
    # Each job's arrays are views of the call's (its rows are contiguous), not
    # copies: a call's arrays stay alive until the last of its jobs' rows is
    # dropped, so memory is at most the rows of the calls whose jobs are still kept.
    out = []
    for job, lo, hi in zip(jobs, first_row, ends, strict=True):
        out.append(
            JobRows(
                model=job.model,
                both=both_all[lo:hi],
                vectors=vectors[lo:hi],
                size=hi - lo,
                row_of=dict(zip(shapes[lo:hi], range(hi - lo), strict=True)),
            )
        )
    return out


GridsCall = Callable[
    [Sequence[PerfModel], Sequence[int], FloatArray, FloatArray, FloatArray, FloatArray],
    tuple[FloatArray, FloatArray],
]
"""``predict_grids``' signature (``_grids_of``)."""


def _grids_of(models: Sequence[PerfModel]) -> GridsCall | None:
    """The ``predict_grids`` of ``models``' type when they are all of one type that
    offers it (``FittedModel``: every model a fitted run makes), else None.

    ``predict_grids(models, bounds, n, r, bs, f)``: ``predict_grid`` of each
    ``models[k]`` on rows ``bounds[k]`` to ``bounds[k + 1] - 1``, (rows, clocks)
    arrays. A decision evaluates about 5 new models; one call for all of them
    spares the Python steps of a call per model (``_evaluate``).
    """
    kind = type(models[0]) if models else None
    grids = getattr(kind, "predict_grids", None)
    if not callable(grids) or not all(type(m) is kind for m in models):
        return None
    return cast(GridsCall, grids)


def _checked_shape(
    values: object, args: tuple[FloatArray, ...], job_id: Callable[[], str], what: str
) -> FloatArray:
    """``values`` as float64, refused unless (rows of ``args``, clocks); ``job_id``: the
    job the error names (looked up only then)."""
    out = np.asarray(values, dtype=np.float64)
    shape = (args[0].shape[0], args[3].shape[1])
    if out.shape != shape:
        raise SnapshotError(
            f"job {job_id()!r}: model returned {what} of shape {out.shape}, expected {shape} "
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
