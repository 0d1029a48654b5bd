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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.curves import tie_ranks
from powerflow.core.policy.greedy_kernels import Matrices, RaiseRules, heap_arrays, raise_steps
from powerflow.core.policy.tables import IntArray


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


@dataclass(frozen=True, eq=False)
class ClockRules:
    """How the clock phase raises: ``step`` columns at a time; by ``dJCT / dE`` when
    ``energy_aware``, else by ``dJCT`` alone; ``min_ratio`` (PowerFlow+): no raise whose
    ``dJCT / dE`` (s/J) is below it (0, the paper's rule, takes any); ``weight``
    (PowerFlow+'s short-first rule): per row, a factor on its raises' ``dJCT / dE``
    (None: 1 for every row)."""

    step: int
    energy_aware: bool
    min_ratio: float = 0.0
    weight: FloatArray | None = None


def raise_clocks(
    matrices: Matrices,
    start: Sequence[int],
    order: Sequence[tuple[float, str]] | None,
    total_w: float,
    limit_w: float,
    *,
    rules: ClockRules,
    ranks: IntArray | None = None,
) -> Clocks:
    """Raise clocks by ``rules.step`` columns at a time while the limit allows.

    Row ``i`` of the ``matrices`` (JCT, energy, power) is one running job at
    its GPU count (columns: clocks); ``order[i]`` is its tie-break (arrival,
    id); ``total_w`` the predicted cluster power at ``start``. ``ranks`` in
    place of ``order``: integers in the same order as the rows' tie-breaks
    (equal for equal ones), e.g. the jobs' ranks among more jobs
    (``curves.tie_ranks``); only their comparisons count.
    """
    weight = rules.weight
    if ranks is None:
        if order is None:
            raise ValueError("raise_clocks: give the rows' order or their ranks")
        ranks = tie_ranks(order)
    jct_s, energy_j, power_w = matrices
    width = jct_s.shape[1] if jct_s.ndim == 2 else 0
    if width < 2 or not len(start):
        return Clocks(columns=tuple(start), power_w=total_w, raised_rows=(), raised_from=())
    rows = len(start)
    columns = np.array(start, dtype=np.int64)
    # The compiled loop does not check bounds: refuse inconsistent input here.
    if not (
        jct_s.shape == energy_j.shape == power_w.shape == (rows, width)
        and len(ranks) == rows
        and columns.min() >= 0
        and columns.max() < width
        and (weight is None or len(weight) == rows)
    ):
        raise ValueError("raise_clocks: matrices, start columns and order do not match")
    raised_rows = np.empty(rows * (width - 1), dtype=np.int64)
    raised_from = np.empty(rows * (width - 1), dtype=np.int64)
    n_raised, power = raise_steps(
        Matrices(
            np.ascontiguousarray(jct_s, dtype=np.float64),
            np.ascontiguousarray(energy_j, dtype=np.float64),
            np.ascontiguousarray(power_w, dtype=np.float64),
        ),
        np.ascontiguousarray(ranks, dtype=np.int64),
        float(total_w),
        RaiseRules(
            float(limit_w),
            int(rules.step),
            bool(rules.energy_aware),
            float(rules.min_ratio),
            np.ones(rows) if weight is None else np.asarray(weight, dtype=np.float64),
        ),
        columns,
        raised_rows,
        raised_from,
        heap_arrays(rows),
    )
    return Clocks(
        tuple(columns.tolist()),
        power,
        tuple(raised_rows[:n_raised].tolist()),
        tuple(raised_from[:n_raised].tolist()),
    )
