"""PowerFlow+'s changes to the greedy's priorities: a floor on returns, the rescale cost.

The paper's greedy (``allocation.py``, ``frequency.py``) takes any doubling
or clock raise that shortens a job's predicted JCT, as long as GPUs and
power are left. When few jobs remain (the end of a trace) nothing competes
for the budget, so a few long jobs take the whole cluster for near-zero
gains: a doubling of a 64-GPU job that saves a few percent of its JCT costs
as much energy as dozens of small jobs. Two rules (``PowerFlowPolicy``'s
``min_return``, ``budget_price``, ``rescale_cost_s`` and ``rescale_margin``)
change that; the
experiments behind them are in docs/policy.md, section "PowerFlow+".

* **Floor.** The paper ranks steps by ``priority = (dJCT / JCT_total) /
  (dE / E_total)``. PowerFlow+ takes a doubling or a raise only if its
  priority is at least the floor ``min_return + budget_price * (1 / eta -
  1)`` (``floor_of``): ``dJCT / dE >= floor * JCT_total / E_total``.
  ``JCT_total`` and ``E_total`` are the sums of the unfinished jobs'
  predicted JCT and remaining energy, each on its first allowed GPU count at
  its most efficient clock (the state the greedy starts from, known before
  any step, so the floor is one number per decision). A floor of 1 takes a
  step only if it lowers the cluster's ``JCT_total x E_total`` (to first
  order).
* **Rescale cost.** A running job that ends on another GPU count is
  checkpointed and restarted: ``restart_s`` seconds on its JCT (and idle
  power on its GPUs meanwhile). The step into its current count gains that
  cost, the step out of it pays it (``greedy_kernels._doubling_key``), so a
  job grows only for a gain larger than a restart and is shrunk last.
  Counting it ``1 + margin`` times is the hysteresis against thrashing.
* **Short first** (``short_first``, an exponent; off by default, 0.5 in
  PowerFlow+: docs/policy.md, "Short first"). The ratio
  ``dJCT / dE`` of a doubling (and with ``short_first_clocks`` of a raise)
  does not depend on how long the job has left: for a job that scales the
  same, doubling it saves a fraction of its remaining time for the same
  fraction more energy. For the average JCT the shorter job's step is worth
  more (it frees its GPUs sooner: the SRPT argument, and AFS-L's rule), so
  the ratio is multiplied by ``(R_ref / R) ** short_first``, ``R`` the job's
  predicted remaining time on its count before the step and ``R_ref`` the
  mean over the unfinished jobs on their first counts (one number per
  decision, so a job of average length keeps its ratio and the floor its
  meaning for it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.allocation import Returns
from powerflow.core.policy.curves import Curves
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.tables import IntArray


def floor_of(min_return: float, budget_price: float, eta: float) -> float:
    """The floor on a step's cluster-normalised priority at a budget of ``eta``.

    ``min_return`` plus ``budget_price * (1 / eta - 1)``: the price of energy
    against time rises as the budget tightens (a Lagrangian reading of the
    power budget), and is ``min_return`` alone at ``eta`` 1 or above. A zero
    budget refuses every doubling and raise.
    """
    if budget_price <= 0 or eta >= 1:
        return min_return
    if eta <= 0:
        return math.inf
    return min_return + budget_price * (1.0 / eta - 1.0)


def returns_of(
    floor: float,
    restart_s: float,
    restart_w: float,
    curves: Curves,
    jobs: Sequence[Job],
    short_first: float = 0.0,
    held: IntArray | None = None,
) -> Returns | None:
    """The kernel's inputs for PowerFlow+'s rules, or ``None`` when all are off.

    ``floor``: on the cluster-normalised priority (``floor_of``); ``restart_s``:
    the rescale cost with its margin; ``restart_w``: per-GPU power during it;
    ``short_first``: the exponent of the short-first factor. ``held``: per job,
    the GPUs it holds, when the caller has them already (and the remaining
    iterations come from ``curves.remaining`` when it has them).
    """
    if floor <= 0 and restart_s <= 0 and short_first <= 0:
        return None
    tables = curves.tables
    start, sizes = tables.start, tables.sizes
    current = np.full(len(jobs), -1, dtype=np.int64)
    if restart_s > 0:
        # A job's rows hold its allowed counts, each double the one before, so
        # the row of ``n`` GPUs is ``start + log2(n / first count)`` when that
        # is a whole number within its rows.
        if held is None:
            held = np.asarray([len(job.placement) for job in jobs], dtype=np.int64)
        on = np.flatnonzero((held > 0) & (sizes > 0))
        first = tables.counts[start[on]]
        level = np.log2(held[on] / first)
        k = np.rint(level).astype(np.int64)
        ok = (np.abs(level - k) < 1e-9) & (k >= 0) & (k < sizes[on])
        current[on[ok]] = start[on[ok]] + k[ok]
    min_ratio = ref_s = 0.0
    if floor > 0 or short_first > 0:
        remaining = curves.remaining
        if remaining is None:
            remaining = np.asarray([job.remaining_iterations for job in jobs], dtype=np.float64)
        unfinished = (remaining > 0) & (sizes > 0)
        rows = start[unfinished]
        energy = float(curves.energy_j[rows].sum())
        if floor > 0 and energy > 0:
            min_ratio = floor * float(curves.jct_s[rows].sum()) / energy
        if short_first > 0 and rows.size:
            ref_s = float(np.mean(curves.jct_s[rows] - curves.age_s[unfinished]))
    return Returns(current, restart_s, restart_w, min_ratio, short_first, ref_s)


def short_first_weights(
    returns: Returns | None, curves: Curves, rows: IntArray, jobs: IntArray
) -> FloatArray | None:
    """Per running job (its table row in ``rows``, its index in ``jobs``), the
    short-first factor on its raises' ratio at its efficient clock; ``None``
    when the rule is off."""
    if returns is None or returns.short_first <= 0 or returns.short_ref_s <= 0:
        return None
    left = np.maximum(curves.jct_s[rows] - curves.age_s[jobs], 1e-9)
    out: FloatArray = (returns.short_ref_s / left) ** returns.short_first
    return out
