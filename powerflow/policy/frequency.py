"""GPU frequency configuration (Algorithm 1, lines 22-30): spend the power left on clocks.

After allocation each running job sits at its most energy-efficient clock.
The job with the largest ``priority_F = (dJCT / JCT_total) / (dE / E_total)``
for one more clock step is raised, its priority recomputed, and so on. As in
``allocation.py`` the common factor ``JCT_total / E_total`` is left out of the
heap keys, a step saving both time and energy outranks every ratio, a step
that does not shorten the JCT is never taken, and without energy awareness
the key is ``dJCT`` alone.

Guarantee: a raise is committed only if the predicted cluster power after it
is within the limit, so this phase never ends above the limit, nor above the
power it started from when allocation already overshot. A job whose next step
does not fit leaves the heap; the others go on (a smaller raise may still
fit). The raises are returned in order so that they can be undone, last
first, if placement powers on more GPUs than predicted.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.models.protocol import FloatArray
from powerflow.policy.tables import IntArray


@dataclass(frozen=True)
class Clocks:
    columns: tuple[int, ...]
    power_w: float
    raised_rows: tuple[int, ...]
    raised_from: tuple[int, ...]
    """Each committed raise, in order: its row and the clock column before it."""

    @property
    def raises(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.raised_rows, self.raised_from, strict=True))


def raise_clocks(
    jct_s: FloatArray,
    energy_j: FloatArray,
    power_w: FloatArray,
    start: Sequence[int],
    order: Sequence[tuple[float, str]],
    total_w: float,
    limit_w: float,
    *,
    step: int,
    energy_aware: bool,
) -> Clocks:
    """Raise clocks by ``step`` columns at a time while the limit allows.

    Row ``i`` of the matrices is one running job at its GPU count (columns:
    clocks); ``order[i]`` is its tie-break (arrival, id); ``total_w`` the
    predicted cluster power at ``start``.
    """
    width = jct_s.shape[1] if jct_s.ndim == 2 else 0
    if width < 2 or not len(start):
        return Clocks(columns=tuple(start), power_w=total_w, raised_rows=(), raised_from=())
    nxt = np.minimum(np.arange(width) + step, width - 1)
    d_jct = jct_s - jct_s[:, nxt]
    d_energy = energy_j[:, nxt] - energy_j
    if energy_aware:
        free = d_energy <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(free, -d_jct, -d_jct / np.where(free, 1.0, d_energy))
        cls = np.where(free, 1, 2)
    else:
        value, cls = -d_jct, np.full(d_jct.shape, 2)
    # Never raise at the top clock or when it does not shorten the JCT.
    cls = np.where((d_jct > 0) & (np.arange(width) < width - 1), cls, 3)
    d_power = power_w[:, nxt] - power_w
    fast = _sorted_order(cls, value, d_power, nxt, start, order, total_w, limit_w, step)
    if fast is not None:
        return fast
    return _heap_order(cls, value, d_power, nxt, start, order, total_w, limit_w)


def _heap_order(
    cls: IntArray,
    value: FloatArray,
    d_power: FloatArray,
    nxt: IntArray,
    start: Sequence[int],
    order: Sequence[tuple[float, str]],
    total_w: float,
    limit_w: float,
) -> Clocks:
    """Algorithm 1's loop as written: pop the best next raise, push the job's next one."""
    cls_l, value_l, d_power_l = cls.tolist(), value.tolist(), d_power.tolist()
    nxt_l = nxt.tolist()
    columns = list(start)
    heap = [
        (cls_l[i][c], value_l[i][c], order[i][0], order[i][1], i)
        for i, c in enumerate(columns)
        if cls_l[i][c] < 3
    ]
    heapq.heapify(heap)
    raised_rows: list[int] = []
    raised_from: list[int] = []
    while heap:
        i = heapq.heappop(heap)[-1]
        col = columns[i]
        new_total = total_w + d_power_l[i][col]
        if new_total > limit_w:
            continue
        total_w = new_total
        columns[i] = up = nxt_l[col]
        raised_rows.append(i)
        raised_from.append(col)
        if cls_l[i][up] < 3:
            heapq.heappush(heap, (cls_l[i][up], value_l[i][up], order[i][0], order[i][1], i))
    return Clocks(tuple(columns), total_w, tuple(raised_rows), tuple(raised_from))


def _sorted_order(
    cls: IntArray,
    value: FloatArray,
    d_power: FloatArray,
    nxt: IntArray,
    start: Sequence[int],
    order: Sequence[tuple[float, str]],
    total_w: float,
    limit_w: float,
    step: int,
) -> Clocks | None:
    """The same result without a heap when every job's raises come in heap order.

    If along each job's chain of raises the keys never improve (diminishing
    returns, the usual shape), the heap pops steps in the global order of
    (key, job tie-break, position in chain): a merge of sorted lists. Then one
    sort and a scan replace ~two heap operations per raise; the committed
    prefix before the first refusal is found with one cumulative sum (left to
    right, so the floating-point totals equal the heap loop's). ``None`` when
    some chain is not monotone: the caller runs the heap.
    """
    rows, width = cls.shape
    depth = -(-(width - 1) // step) + 1
    pos = np.minimum(np.asarray(start)[:, None] + step * np.arange(depth), width - 1)
    r_idx = np.arange(rows)[:, None]
    c = cls[r_idx, pos]
    v = value[r_idx, pos]
    valid = np.logical_and.accumulate(c < 3, axis=1)
    later = valid[:, 1:]
    worse = (c[:, 1:] > c[:, :-1]) | ((c[:, 1:] == c[:, :-1]) & (v[:, 1:] >= v[:, :-1]))
    if np.any(later & ~worse):
        return None
    # Rows in tie-break order, so that np.nonzero lists steps by (job, chain
    # position); two stable sorts then order them by class, then value.
    by_rank = np.asarray(sorted(range(rows), key=order.__getitem__), dtype=np.int64)
    row_p, k_k = np.nonzero(valid[by_rank])
    row_k = by_rank[row_p]
    before = pos[row_k, k_k]
    v_k, c_k = v[row_k, k_k], c[row_k, k_k]
    keys = np.lexsort((v_k, c_k))  # by class, then value, then position (stable)
    row_s, before_s = row_k[keys], before[keys]
    after_s = nxt[before_s]
    dp_s = d_power[row_s, before_s]
    totals = np.cumsum(np.concatenate(([total_w], dp_s)))[1:]
    within = totals <= limit_w
    k = int(np.argmin(within)) if not within.all() else within.size
    columns = np.asarray(start, dtype=np.int64).copy()
    np.maximum.at(columns, row_s[:k], after_s[:k])
    if k:
        total_w = float(totals[k - 1])
    raised_rows = row_s[:k].tolist()
    raised_from = before_s[:k].tolist()
    # After the first refusal the head room only shrinks (raises cost power),
    # so a step dearer than it is now is refused whenever it comes: it drops
    # its job. Only the cheaper steps before their job's first such refusal
    # need the sequential scan.
    tail = np.arange(k, row_s.size)
    if np.all(dp_s[k:] >= 0):
        dear = dp_s[k:] > limit_w - total_w
        first_dear = np.full(rows, row_s.size, dtype=np.int64)
        np.minimum.at(first_dear, row_s[k:][dear], tail[dear])
        tail = tail[~dear & (tail < first_dear[row_s[k:]])]
    dropped = [False] * rows
    cols = columns.tolist()
    for i, col, up, dp in zip(
        row_s[tail].tolist(),
        before_s[tail].tolist(),
        after_s[tail].tolist(),
        dp_s[tail].tolist(),
        strict=True,
    ):
        if dropped[i]:
            continue
        new_total = total_w + dp
        if new_total > limit_w:
            dropped[i] = True
            continue
        total_w = new_total
        cols[i] = up
        raised_rows.append(i)
        raised_from.append(col)
    return Clocks(tuple(cols), total_w, tuple(raised_rows), tuple(raised_from))
