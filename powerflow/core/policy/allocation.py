"""GPU allocation (Algorithm 1, lines 2-20): a heap on marginal return, power-of-two steps.

Every job starts with no GPUs, at the most energy-efficient clock of whatever
count it holds. A *step* gives a job its next allowed count: the first step
its smallest allowed power of two (1, or ``min_gpus`` / the memory cap rounded
up), each later step doubles it and costs that many GPUs.

Priorities (larger is served first; ties: earlier arrival, then job id):

* **First step.** At 0 GPUs a job's JCT is infinite, so the paper's
  ``priority_G`` is infinite: any start outranks any speed-up. Among the
  waiting jobs (all infinite) we serve the smallest remaining service first
  (GPUs x predicted remaining time on the first count), the rule that
  minimises average completion time for a fixed set of jobs (SRPT); it also
  lets the most jobs start under a tight power limit.
* **Doubling** ``n -> 2n``: ``priority_G = (dJCT / JCT_total) / (dE / E_total)``
  with ``dJCT`` the job's predicted JCT reduction and ``dE`` its remaining
  energy increase. ``JCT_total / E_total`` is one positive factor common to
  every job at a given moment, so it never changes which job is at the head;
  the heap therefore stores ``dJCT / dE`` (normalised keys stored at different
  moments would go stale whenever one job's step changes the totals). A step
  that saves energy and time (``dE <= 0 < dJCT``) is a free win and outranks
  every ratio (largest ``dJCT`` first); a step that does not shorten the JCT
  is never taken. Without energy awareness the key is ``dJCT`` alone.
* **Non-elastic** (ablation): one step per job, to its requested count,
  first-come first-served by arrival; a job that does not fit waits and later
  jobs may still start (backfilling).

Power (the paper checks only at node boundaries, where a new node would be
switched on): predicted power is the jobs' ``E_iter / T_iter`` plus idle power
for the unallocated GPUs of the powered-on nodes, assuming packing (the nodes
holding pinned jobs, and otherwise ``ceil(allocated / GPUs per node)`` nodes;
placement's buddy allocation leaves at most one node partly used). A step that
needs more nodes than are on is taken only if the predicted power after it,
with the new nodes' free GPUs at idle power, is within the limit. A step that
fits on GPUs already powered on is taken without a check: those GPUs draw idle
power anyway, which is why Algorithm 1 checks only at node boundaries. A step
that does not fit (GPUs or power) drops its job from the heap and the others
go on: Algorithm 1's ``break`` generalised to steps of different sizes and
costs (a smaller step elsewhere may still fit the GPUs or the power left).

PowerFlow+ (``returns.py``, the ``returns`` argument) adds a running job's
rescale cost to its doubling keys and stops the doublings at a floor on
their ratio; without it the rules above are unchanged.

With ``strict`` every step is checked, so allocation never ends above the
limit (or the pinned jobs' own power), at the price of leaving GPUs of a
powered-on node idle when the budget is tight.

Guarantee (not strict): after the last passed check at most
``gpus_per_node - 1`` GPUs were free on powered-on nodes (without pinned
jobs), so the allocation ends at most ``(gpus_per_node - 1) * delta`` watts
above the limit (or above the pinned jobs' own power if that already exceeds
it), ``delta`` being the largest power increase per added GPU of a step that
fits within one node.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.policy.curves import Curves
from powerflow.core.policy.greedy_kernels import (
    JobSteps,
    PowerState,
    Rows,
    StepRules,
    allocate_steps,
    heap_arrays,
    tournament_arrays,
    tournament_steps,
)
from powerflow.core.policy.tables import IntArray


@dataclass(frozen=True)
class PowerModel:
    """Cluster facts the power estimate needs, and what pinned jobs already hold."""

    gpus_per_node: int
    idle_w: float
    limit_w: float
    free_gpus: int
    base_gpus: int = 0
    base_nodes: int = 0
    base_power_w: float = 0.0

    def nodes_on(self, allocated: int) -> int:
        return max(-(-allocated // self.gpus_per_node), self.base_nodes)

    def total_w(self, jobs_power_w: float, allocated: int) -> float:
        idle_gpus = self.nodes_on(allocated) * self.gpus_per_node - allocated
        return jobs_power_w + self.idle_w * idle_gpus


@dataclass(frozen=True)
class Returns:
    """PowerFlow+'s changes to the doubling keys (``greedy_kernels._doubling_key``).

    ``current``: per job, the table row of the GPU count it runs on now (-1:
    none, or a count it may no longer have). ``restart_s``: seconds a job's
    JCT grows when it ends on another count (the checkpoint-restart, with any
    hysteresis margin); ``restart_w``: per-GPU watts during it. ``min_ratio``:
    the floor on a doubling's ``dJCT / dE`` in s/J (0: none). ``short_first``:
    the exponent of the short-first factor on a doubling's ratio, ``(short_ref_s
    / remaining) ** short_first`` (0: none; ``returns.py``).
    """

    current: IntArray
    restart_s: float = 0.0
    restart_w: float = 0.0
    min_ratio: float = 0.0
    short_first: float = 0.0
    short_ref_s: float = 0.0


@dataclass(frozen=True, eq=False)
class Allocation:
    jobs: IntArray
    """The jobs given GPUs, in the order they got their first step; the others wait."""
    job_rows: IntArray
    """Their rows in the tables (the GPU count each got)."""
    power_w: float
    gpus: int

    @functools.cached_property
    def rows(self) -> dict[int, int]:
        """Job index -> its row, in ``jobs``' order. Built on first use only: the
        policy reads the arrays (the dict of 160 jobs costs 5 µs, timeit: 12 ms of
        a fitted run's 2,314 decisions)."""
        return dict(zip(self.jobs.tolist(), self.job_rows.tolist(), strict=True))


def allocate(
    curves: Curves,
    candidates: Sequence[int] | IntArray,
    power: PowerModel,
    *,
    energy_aware: bool,
    elastic: bool,
    strict: bool = False,
    returns: Returns | None = None,
    tournament: bool = False,
) -> Allocation:
    """Run the greedy over the ``candidates`` (job indices: unfinished, not pinned).

    ``returns`` (PowerFlow+) adds the rescale cost to the doubling keys and a
    floor on their return; ``None`` is the paper's greedy. ``tournament``: the
    steps go to the winners of AFS-L's pairwise tournament instead of the heap's
    (``greedy_kernels.tournament_steps``; elastic only, and the short-first
    factor, a heap key, is not used), with the same power checks, floor and
    rescale cost.
    """
    tables = curves.tables
    if returns is None:
        returns = Returns(np.full(tables.start.size, -1, dtype=np.int64))
    cand = np.asarray(candidates, dtype=np.int64)
    if cand.size and not 0 <= cand.min() <= cand.max() < tables.start.size:
        raise ValueError("allocate: a candidate is not a job of the tables")  # no bounds checks
    row = np.full(tables.start.size, -1, dtype=np.int64)
    order = np.empty(cand.size, dtype=np.int64)
    if tournament:
        if not elastic or returns.short_first > 0:
            raise ValueError("allocate: the tournament needs elastic allocation, no short first")
        cand = cand[np.argsort(curves.tie_rank[cand], kind="stable")]  # FIFO
    table = Rows(tables.counts, curves.jct_s, curves.energy_j, curves.power_w)
    steps = JobSteps(tables.start, tables.sizes, curves.age_s, curves.tie_rank, returns.current)
    rules = StepRules(
        bool(energy_aware),
        bool(elastic),
        bool(strict),
        float(returns.restart_s),
        float(returns.restart_w),
        float(returns.min_ratio),
        float(returns.short_first),
        float(returns.short_ref_s),
    )
    state = PowerState(
        int(power.free_gpus),
        int(power.base_gpus),
        float(power.base_power_w),  # an int 0 without pinned jobs: one compiled signature
        int(power.gpus_per_node),
        int(power.base_nodes),
        float(power.idle_w),
        float(power.limit_w),
    )
    if tournament:
        scratch = tournament_arrays(cand.size)
        n_order, allocated, jobs_w = tournament_steps(
            table, steps, cand, rules, state, row, order, scratch
        )
    else:
        heap = heap_arrays(tables.start.size)
        n_order, allocated, jobs_w = allocate_steps(
            table, steps, cand, rules, state, row, order, heap
        )
    jobs = order[:n_order]
    return Allocation(
        jobs=jobs,
        job_rows=row[jobs],
        power_w=power.total_w(jobs_w, allocated),
        gpus=allocated,
    )
