"""Each job's predicted JCT, remaining energy and power over its GPU counts x clocks.

Derived once per decision from the stacked model tables (``tables.py``, same
rows and columns); the greedy loops then only index these arrays. JCT counts
from arrival: ``JCT = (now - arrival) + remaining_iterations * T_iter``, so the
objective is the paper's average JCT and a job's wait so far is part of it.
Energy is what the job still needs: ``remaining_iterations * E_iter``. Power
is ``E_iter / T_iter`` (paper §5.2), summed over the job's GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.models.protocol import FloatArray
from powerflow.policy.snapshot import Job
from powerflow.policy.tables import IntArray, Tables


@dataclass(frozen=True)
class Curves:
    """Rows as in ``Tables`` (job ``j`` owns ``offsets[j]:offsets[j + 1]``)."""

    tables: Tables
    job_ids: tuple[str, ...]
    arrival_s: tuple[float, ...]
    age_s: FloatArray
    jct_s: FloatArray
    energy_j: FloatArray
    power_w: FloatArray
    efficient: IntArray
    """Per row, the clock column with the least energy per iteration (lowest on ties)."""


def curves_of(tables: Tables, jobs: Sequence[Job], now_s: float) -> Curves:
    sizes = np.diff(tables.offsets)
    age = np.maximum(0.0, now_s - np.asarray([j.arrival_s for j in jobs], dtype=np.float64))
    remaining = np.asarray([j.remaining_iterations for j in jobs], dtype=np.float64)
    row_age = np.repeat(age, sizes)[:, None]
    row_remaining = np.repeat(remaining, sizes)[:, None]
    t, e = tables.step_time_s, tables.energy_j
    width = t.shape[1]
    efficient = np.argmin(e, axis=1).astype(np.int64) if width else np.zeros(len(e), dtype=np.int64)
    return Curves(
        tables=tables,
        job_ids=tuple(j.id for j in jobs),
        arrival_s=tuple(j.arrival_s for j in jobs),
        age_s=age,
        jct_s=row_age + row_remaining * t,
        energy_j=row_remaining * e,
        power_w=e / t,
        efficient=efficient,
    )
