"""A job's predicted JCT, remaining energy and power over its GPU counts x clocks.

Derived from the stacked model tables (``tables.py``, same rows and columns).
JCT counts from arrival: ``JCT = (now - arrival) + remaining_iterations *
T_iter``, so the objective is the paper's average JCT and a job's wait so far
is part of it. Energy is what the job still needs: ``remaining_iterations *
E_iter``. Power is ``E_iter / T_iter`` (paper §5.2), summed over the job's
GPUs. Allocation only needs each row at its most energy-efficient clock, so
those are vectors; full rows are derived on demand (``matrices``, from the
step time and energy rows ``Tables.values`` gathers) for the few rows the
clock phase works on, so no JCT, energy or power table over every clock is
built.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.memo import PolicyMemo
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.tables import IntArray, JobRows, Tables


@dataclass(frozen=True)
class Curves:
    """Per table row: the efficient clock column and JCT, energy and power there."""

    tables: Tables
    tie_rank: IntArray
    """Per job, its place in (arrival, id) order: how the heaps break ties."""
    age_s: FloatArray
    row_age_s: FloatArray
    row_remaining: FloatArray
    efficient: IntArray
    """Per row, the clock column with the least energy per iteration (lowest on ties)."""
    jct_s: FloatArray
    energy_j: FloatArray
    power_w: FloatArray
    remaining: FloatArray | None = None
    """Per job, its remaining iterations (None: not kept)."""

    def matrices(
        self, rows: IntArray, first: int = 0, memo: PolicyMemo[JobRows] | None = None
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """JCT, energy and power of ``rows`` at every clock from column ``first`` up
        (``memo``: see ``Tables.values``)."""
        t, e = self.tables.values(rows, first, memo)
        remaining = self.row_remaining[rows, None]
        return self.row_age_s[rows, None] + remaining * t, remaining * e, e / t


def curves_of(
    tables: Tables,
    jobs: Sequence[Job],
    now_s: float,
    tie_rank: IntArray | None = None,
    arrival_s: FloatArray | None = None,
) -> Curves:
    """The curves of ``jobs`` at ``now_s``; ``tie_rank`` (their ``tie_ranks``) and
    ``arrival_s`` (their arrivals as float64) when the caller has them already
    (``static.py``)."""
    if arrival_s is None:
        arrival_s = np.asarray([j.arrival_s for j in jobs], dtype=np.float64)
    age = np.maximum(0.0, now_s - arrival_s)
    remaining = np.fromiter(map(_REMAINING, jobs), dtype=np.float64, count=len(jobs))
    row_job = tables.row_job
    row_age, row_remaining = age[row_job], remaining[row_job]
    t_eff, e_eff = tables.efficient_step_time_s, tables.efficient_energy_j
    return Curves(
        tables=tables,
        tie_rank=tie_ranks([(j.arrival_s, j.id) for j in jobs]) if tie_rank is None else tie_rank,
        age_s=age,
        row_age_s=row_age,
        row_remaining=row_remaining,
        efficient=tables.efficient,
        jct_s=row_age + row_remaining * t_eff,
        energy_j=row_remaining * e_eff,
        power_w=e_eff / t_eff,
        remaining=remaining,
    )


_REMAINING = operator.attrgetter("remaining_iterations")


def tie_ranks(keys: Sequence[tuple[float, str]]) -> IntArray:
    """Each key's place among the distinct ``keys`` in sorted order.

    The heaps break ties by (arrival, id); compiled code compares these
    integers instead. Snapshots list their jobs in that order with distinct
    ids (the simulator's always do), which one pass confirms: then the ranks
    are the positions. Otherwise, when the arrivals are floats, none NaN and
    no two equal, the arrivals alone decide the order: numpy sorts them,
    several times faster than sorting the tuples (a few ms at 8,192 jobs,
    every decision). Any tie (even 0.0 against -0.0), and arrivals of other
    types, take the sort of the distinct tuples, which the fast answer equals.
    """
    if all(map(operator.lt, keys, keys[1:])):
        return np.arange(len(keys), dtype=np.int64)
    arrivals = list(map(operator.itemgetter(0), keys))
    if set(map(type, arrivals)) == {float}:
        arrival = np.array(arrivals, dtype=np.float64)
        order = np.argsort(arrival, kind="stable")
        ordered = arrival[order]
        if not np.isnan(ordered[-1]) and bool((ordered[1:] != ordered[:-1]).all()):
            ranks = np.empty(len(keys), dtype=np.int64)
            ranks[order] = np.arange(len(keys), dtype=np.int64)
            return ranks
    index = {key: rank for rank, key in enumerate(sorted(set(keys)))}
    return np.asarray([index[key] for key in keys], dtype=np.int64)
