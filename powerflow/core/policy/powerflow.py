"""PowerFlow's policy (paper §5, Algorithm 1): GPUs, then clocks, then exact GPUs.

One decision, start to finish:

1. Validate the snapshot (``validate.py``) and predict every job's step time
   and energy over its allowed power-of-two GPU counts x clocks in one model
   call per model object (``tables.py``).
2. Resolve the budget to a limit in watts (``budget.py``).
3. Pinned jobs keep their GPUs and are counted first. GPU allocation
   (``allocation.py``): every other unfinished job starts at 0 GPUs at its
   most energy-efficient clock; a heap hands out power-of-two steps by
   marginal return until GPUs run out or no step fits the power check.
4. Clock configuration (``frequency.py``): raise the clock of the job with the
   best marginal return, one hardware step (``frequency_step``) at a time,
   while the predicted power stays within the limit.
5. Placement (``placement.place_columns``: ``place`` on columns): exact GPUs
   with network packing, buddy blocks and stability; nodes to power down;
   migrations. A job placement cannot fit waits.
6. The plan's ``predicted_w`` is recomputed from the actual placement:
   the placed jobs' ``E_iter / T_iter`` at their clocks (on the GPUs per node
   they actually got) plus idle power for every unallocated GPU on a node that
   is not powered down; powered-down nodes count zero.

Power-limit guarantee for the returned plan (``L`` the limit, ``P`` its
``predicted_w``, ``g`` GPUs per node):

* if the clock phase raised any job above its most energy-efficient clock,
  ``P <= L`` (with ``frequency_scaling`` off there is no clock phase and
  only the next bullet applies);
* otherwise, for a snapshot without pinned jobs and when placement packs (at
  most one node partly used, as buddy allocation promises),
  ``P <= L + (g - 1) * delta``, where ``delta`` is the largest increase of
  predicted power per added GPU over the allocation steps that fit within one
  node (a job's first count below ``g``, or a doubling ``n -> 2n <= g``, each
  at the efficient clocks), i.e. less than one node's worth of GPUs;
* with pinned jobs the same holds with ``L`` replaced by ``max(L, P_pinned)``,
  ``P_pinned`` the pinned jobs' power plus idle power on their nodes.

With ``strict_power`` (the default) every allocation step is checked and the
bound is ``P <= max(L, P_pinned)`` (when placement packs), the choice for a
hard facility cap; ``strict_power=False`` follows Algorithm 1 (the bullets
above), for the paper's reproduction.

Keeping the budget with wrong models (``power_loop.py``): all power above is
the *counted* power, each job's prediction times its measured correction
(``Job.measured_power_w``), and ``L`` the *planning* limit,
``limit / max(1, Snapshot.power_ratio) * (1 - power_margin)``; the plan's
``limit_w`` stays the admin's limit. Each placed job's ``JobPlan.power_w``
is its counted power, and when the plan leaves less than ``cap_headroom`` of
the admin's limit free (profiling sweeps at their peak), every placed job
gets a per-GPU ``power_cap_w``, the caps and idle GPUs summing to the limit
(``power_loop.caps_w``). No cap is below the board's lowest power limit, so
with caps on, allocation runs at most ``power_loop.cappable_gpus`` GPUs (with
the pinned ones): as many as caps at that floor and the idle GPUs of the
nodes they pack fit in the admin's limit; a job whose smallest count is more waits
with a note.

If placement leaves more GPUs powered than the packing estimate, clock raises
are undone (latest first) until ``P`` is back within ``max(L, P_before)``,
``P_before`` the prediction before placement.

Ablations (constructor options, never separate copies): ``frequency_scaling``
off runs every job at ``fixed_frequency_mhz`` (default the GPU's highest
clock) and skips step 4; ``elastic`` off gives each job exactly its requested
count (rounded up to a power of two, see ``tables.allowed_mask``) or makes
it wait, first come first served; ``energy_aware`` off orders both heaps by
JCT reduction alone (the energy denominator dropped) while still starting at
the efficient clocks and still respecting the power limit, so that the
ablation isolates the energy term of the priority rather than the budget.

PowerFlow+ (``powerflow+`` in ``powerflow.lab.schedulers``) is this policy with
``min_return``/``budget_price`` (a floor on the priority of a doubling or a
clock raise), ``rescale_cost_s``/``rescale_margin`` (a running job's
checkpoint-restart inside its doubling priorities) and ``short_first`` (a factor
favouring short jobs' doublings) set; ``returns.py`` states the rules. All five
default to off, the paper's rules above.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from powerflow.core.errors import PlacementError, SnapshotError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.allocation import PowerModel, allocate
from powerflow.core.policy.budget import resolve_limit_w
from powerflow.core.policy.curves import Curves, curves_of
from powerflow.core.policy.frequency import ClockRules, raise_clocks
from powerflow.core.policy.greedy_kernels import Matrices
from powerflow.core.policy.memo import PolicyMemo
from powerflow.core.policy.placement import place_columns
from powerflow.core.policy.power_loop import (
    Correction,
    LoopOptions,
    cap_array,
    cappable_gpus,
    planning_limit_w,
    steady_caps,
)
from powerflow.core.policy.returns import floor_of, returns_of, short_first_weights
from powerflow.core.policy.snapshot import GpuSlot, JobPlan, Plan, Snapshot
from powerflow.core.policy.static import (
    Carried,
    Checked,
    StaticPart,
    check_progress,
    index_of,
    kept_owners,
    static_inputs,
    static_part,
)
from powerflow.core.policy.tables import IntArray, JobRows, Previous, build_tables
from powerflow.core.policy.validate import Cluster, cluster_of, validate_jobs


@dataclass(frozen=True)
class PowerFlowPolicy:
    """PowerFlow and its ablations; see the module docstring for the exact rules."""

    frequency_scaling: bool = True
    fixed_frequency_mhz: int | None = None
    elastic: bool = True
    energy_aware: bool = True
    frequency_step: int = 1
    """Hardware clock steps per raise (1: the GPU's own step, e.g. 15 MHz on A100)."""
    strict_power: bool = True
    """Check the power limit on every allocation step; False: only at node boundaries,
    as Algorithm 1 does (the paper's reproduction)."""
    power_correction: bool = True
    """Correct predicted power by measurement: per job and by the cluster ratio
    (``power_loop.py``)."""
    power_margin: float = 0.0
    """Fraction of the limit never planned (on top of the measured ratio)."""
    power_caps: bool = True
    """Give placed jobs per-GPU power caps when the plan leaves little room (``power_loop``)."""
    cap_headroom: float = 0.1
    """Caps are set when the plan leaves less than this fraction of the limit free."""
    memo: PolicyMemo[JobRows] = field(
        default_factory=PolicyMemo, init=False, compare=False, repr=False
    )
    """What this policy keeps between calls (``memo.py``): never changes a plan.

    Not a constructor argument; ``dataclasses.replace(policy)`` gives a copy with an
    empty memo.
    """

    min_return: float = 0.0
    """PowerFlow+: the floor on a step's return. A doubling or a clock raise is taken
    only if its cluster-normalised ratio ``(dJCT / JCT_total) / (dE / E_total)``
    is at least this (``returns.py``); 0 takes any step that shortens the JCT."""
    budget_price: float = 0.0
    """PowerFlow+: the floor grows by ``budget_price * (1 / eta - 1)`` (``eta`` the
    limit over ``G * P_max``): the tighter the budget, the dearer a joule
    (``returns.py``); 0 at or above ``eta`` 1."""
    rescale_cost_s: float = 0.0
    """PowerFlow+: checkpoint-restart seconds a running job pays to change its GPU
    count, counted in the doubling priorities (0: the paper's greedy, blind to it)."""
    rescale_margin: float = 0.0
    """PowerFlow+ hysteresis: the rescale cost is counted ``1 + rescale_margin`` times,
    so a running job changes its count only for a gain that beats it by that margin."""
    short_first: float = 0.0
    """PowerFlow+: the exponent of the short-first factor on a doubling's
    ``dJCT / dE``, ``(mean remaining / the job's remaining) ** short_first``
    (``returns.py``); 0: off."""
    short_first_clocks: bool = False
    """With ``short_first``: the same factor on the clock raises' ratios."""
    tournament: bool = False
    """GPU steps go to the winners of AFS-L's pairwise tournament (shorter remaining
    time first unless the longer job gains much more per GPU) instead of the heap
    on ``dJCT / dE`` (``allocation.allocate``); the power checks, the floor and the
    rescale cost stay, then the clock phase as always. Needs ``elastic``, and
    excludes ``short_first`` (a heap key)."""

    def __post_init__(self) -> None:
        if self.frequency_step < 1:
            raise SnapshotError(f"frequency_step {self.frequency_step} < 1")
        self.loop_options()  # validates the options
        options = (
            self.min_return,
            self.budget_price,
            self.rescale_cost_s,
            self.rescale_margin,
            self.short_first,
        )
        if not all(x >= 0 and math.isfinite(x) for x in options):
            raise SnapshotError(
                "min_return, budget_price, rescale_cost_s, rescale_margin and short_first"
                " must be finite, >= 0"
            )
        if (self.min_return > 0 or self.budget_price > 0) and not self.energy_aware:
            raise SnapshotError("a floor on returns (dJCT / dE) needs energy_aware")
        if self.tournament and (not self.elastic or self.short_first > 0):
            raise SnapshotError("the tournament needs elastic and no short_first")

    def loop_options(self) -> LoopOptions:
        return LoopOptions(
            correction=self.power_correction,
            margin=self.power_margin,
            caps=self.power_caps,
            cap_headroom=self.cap_headroom,
        )

    def clocks(self, gpu: GpuSpec) -> tuple[int, ...]:
        """The clocks this policy may choose from on ``gpu``."""
        if self.frequency_scaling:
            return gpu.clocks_mhz
        fixed = gpu.max_clock_mhz if self.fixed_frequency_mhz is None else self.fixed_frequency_mhz
        if fixed not in gpu.clocks_mhz:
            raise SnapshotError(f"fixed frequency {fixed} MHz is not a {gpu.name} clock")
        return (fixed,)

    def plan(self, snapshot: Snapshot) -> Plan:
        kept = self.memo.cluster
        if kept is not None and kept[0] is snapshot.nodes:
            cluster = cast(Cluster, kept[1])  # the very nodes of the last call (memo.py)
        else:
            cluster = cluster_of(snapshot)
            self.memo.cluster = (snapshot.nodes, cluster)
        jobs = snapshot.jobs
        options = self.loop_options()
        inputs = static_inputs(jobs)
        last = self.memo.static
        if not (
            isinstance(last, StaticPart) and (last.cluster is cluster or last.cluster == cluster)
        ):
            last = None
        if last is not None and last.same_jobs(*inputs):
            # Only progress changed since the last call (static.py).
            check_progress(jobs)
            part = last
            limit_w = resolve_limit_w(snapshot.budget, cluster.total_gpus, cluster.gpu.p_max_w)
        else:
            positions = index_of(inputs[0])
            index = None if last is None else last.matches(*inputs)
            checked = None if index is None else index >= 0
            taken = None if last is None or index is None else kept_owners(last, index)
            owners = validate_jobs(snapshot, cluster, checked, len(positions) == len(jobs), taken)
            clocks = self.clocks(cluster.gpu)
            earlier = None if last is None or index is None else Previous(last.tables, index)
            tables = build_tables(jobs, cluster, clocks, self.elastic, self.memo, earlier)
            limit_w = resolve_limit_w(snapshot.budget, cluster.total_gpus, cluster.gpu.p_max_w)
            carried = None if last is None or index is None else Carried(last, index)
            part = static_part(
                jobs,
                cluster,
                inputs,
                clocks,
                tables,
                carried,
                options.correction,
                Checked(positions, owners),
            )
            self.memo.static = part
        curves = curves_of(part.tables, jobs, snapshot.now_s, part.tie_rank, part.arrival_s)
        return _Decision(
            self,
            snapshot,
            cluster,
            part.clocks,
            curves,
            limit_w,
            options,
            part.fix,
            part.pinned,
            part.held,
        ).run()


@dataclass
class _Decision:
    """The working state of one ``plan`` call (never escapes it)."""

    policy: PowerFlowPolicy
    snapshot: Snapshot
    cluster: Cluster
    clocks: tuple[int, ...]
    curves: Curves
    limit_w: float
    """The admin's limit (the plan's ``limit_w``)."""
    options: LoopOptions
    fix: Correction
    """Predicted power -> the power the plan counts (``power_loop``)."""
    pinned: list[int]
    """The pinned jobs' positions."""
    held: IntArray
    """Per job, the GPUs it holds."""
    cappable: int | None = None
    """With caps: the most GPUs caps at the board's lowest limit can hold (``run`` sets it)."""

    def run(self) -> Plan:
        jobs = self.snapshot.jobs
        # Allocation and the clock phase work with the counted power (each job's
        # prediction times its measured correction) against the planning limit.
        self.curves = replace(self.curves, power_w=self.fix.efficient(self.curves.power_w))
        plan_limit_w = planning_limit_w(self.limit_w, self.snapshot.power_ratio, self.options)
        first = self.curves.tables.start
        eff = self.curves.efficient
        pinned = self.pinned
        base_w = sum(float(self.curves.power_w[first[i]]) for i in pinned)
        base_gpus = sum(len(jobs[i].placement) for i in pinned)
        free_gpus = self.cluster.total_gpus - base_gpus
        if self.options.caps:
            # Caps cannot go below the board's lowest limit: run no more GPUs than
            # caps at that floor can hold within the admin's limit (power_loop).
            gpu = self.cluster.gpu
            most = cappable_gpus(
                self.limit_w,
                gpu.min_power_limit_w or 0.0,
                gpu.idle_power_w,
                self.cluster.gpus_per_node,
                self.cluster.total_gpus,
            )
            free_gpus = max(0, min(free_gpus, most - base_gpus))
            self.cappable = most
        power = PowerModel(
            gpus_per_node=self.cluster.gpus_per_node,
            idle_w=self.cluster.gpu.idle_power_w,
            limit_w=plan_limit_w,
            free_gpus=free_gpus,
            base_gpus=base_gpus,
            base_nodes=len({node for i in pinned for node, _ in jobs[i].placement}),
            base_power_w=base_w,
        )
        remaining = self.curves.remaining
        if remaining is None:
            candidates: Sequence[int] | IntArray = [
                i for i, job in enumerate(jobs) if not job.pinned and job.remaining_iterations > 0
            ]
        else:
            unfinished = remaining > 0
            unfinished[pinned] = False
            candidates = np.flatnonzero(unfinished)
        budget = self.snapshot.budget
        p_max = budget.p_max_w or self.cluster.gpu.p_max_w
        eta = self.limit_w / (self.cluster.total_gpus * p_max)
        returns = returns_of(
            floor_of(self.policy.min_return, self.policy.budget_price, eta),
            self.policy.rescale_cost_s * (1.0 + self.policy.rescale_margin),
            self.cluster.gpu.idle_power_w,
            self.curves,
            jobs,
            short_first=self.policy.short_first,
            held=self.held,
        )
        alloc = allocate(
            self.curves,
            candidates,
            power,
            energy_aware=self.policy.energy_aware,
            elastic=self.policy.elastic,
            strict=self.policy.strict_power,
            returns=returns,
            tournament=self.policy.tournament,
        )
        # Each job's row (-1: it waits), the pinned ones first, then in allocation order
        # (the order of the notes of jobs placement leaves out).
        row_of = np.full(len(jobs), -1, dtype=np.int64)
        given = alloc.jobs
        row_of[given] = alloc.job_rows
        row_of[pinned] = first[pinned]
        rows = _Rows(row_of, [*pinned, *given.tolist()])
        running_at = np.flatnonzero(row_of >= 0)
        running = running_at.tolist()
        row_idx = row_of[running_at]
        start = eff[row_idx].tolist()
        # Clocks only go up from the efficient ones, so the columns below the
        # lowest of them are never read: the clock phase and the pricing work
        # on columns ``low ..`` (the same floats, shifted; see raise_clocks).
        low = min(start, default=0)
        jct_m, energy_m, power_m = self.curves.matrices(row_idx, low, self.policy.memo)
        matrices = Matrices(jct_m, energy_m, self.fix.matrix(row_idx, power_m))
        columns = start
        raises: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        predicted = alloc.power_w
        if self.policy.frequency_scaling:
            result = raise_clocks(
                matrices,
                [c - low for c in start],
                None,
                alloc.power_w,
                plan_limit_w,
                rules=ClockRules(
                    step=self.policy.frequency_step,
                    energy_aware=self.policy.energy_aware,
                    min_ratio=0.0 if returns is None else returns.min_ratio,
                    weight=short_first_weights(
                        returns if self.policy.short_first_clocks else None,
                        self.curves,
                        row_idx,
                        np.asarray(running, dtype=np.int64),
                    ),
                ),
                # The jobs' places in (arrival, id) order among all jobs: the same
                # comparisons as their places among the running ones.
                ranks=self.curves.tie_rank[np.asarray(running, dtype=np.int64)],
            )
            columns = list(map(operator.add, result.columns, itertools.repeat(low)))
            # Shifted back by ``low`` only where the undo loop reads one (rarely).
            raises = (result.raised_rows, result.raised_from)
            predicted = result.power_w
        priced = _Power(matrices.power, low)
        return self._place(rows, running, row_idx, priced, columns, raises, predicted, plan_limit_w)

    def _place(
        self,
        rows: _Rows,
        running: list[int],
        row_idx: IntArray,
        power: _Power,
        columns: list[int],
        raises: tuple[tuple[int, ...], tuple[int, ...]],
        predicted: float,
        plan_limit_w: float,
    ) -> Plan:
        """Place, price the placement, undo raises if it costs more.

        ``running`` (sorted job indices), ``row_idx`` (their rows), ``power``
        (their power at every clock) and ``columns`` (their clocks) are
        parallel; ``raises`` index them (its clocks from column ``power.low`` on).
        """
        jobs = self.snapshot.jobs
        tables = self.curves.tables
        counts = tables.counts[row_idx].tolist()
        # map with attrgetter: the same lists as comprehensions, in C.
        chosen = list(map(jobs.__getitem__, running))
        ids = list(map(_ID, chosen))
        memo = self.policy.memo
        inputs = (
            self.snapshot.nodes,
            ids,
            counts,
            list(map(_PLACEMENT, chosen)),
            list(map(operator.not_, map(_PINNED, chosen))),
        )
        before = memo.placement
        if before is not None and before[0] == inputs:
            result = before[1]  # placement is a pure function of these (memo.py)
        else:
            result = place_columns(*inputs)
            memo.placement = (inputs, result)
        gpn = self.cluster.gpus_per_node
        assigned = result.assignments
        got = list(map(assigned.get, ids, itertools.repeat(())))
        where: Sequence[int]
        placed_at: Sequence[int]
        if all(got) and list(map(len, got)) == counts:
            # Every running job placed with its count (the usual case): no per-job checks.
            where, placed_at, placed_got = range(len(ids)), running, got
            where_idx = np.arange(len(ids), dtype=np.int64)
        else:
            where = _checked_places(ids, counts, got)
            placed_at = [running[k] for k in where]
            placed_got = [got[k] for k in where]
            where_idx = np.asarray(where, dtype=np.int64)
        # Placement gives every job an aligned block (placement.py): a job of at most
        # one node gets GPUs of one node, a larger one whole nodes, so a job of ``n``
        # GPUs has ``min(n, gpn)`` per node. ``other``: the power row of a job whose
        # table row assumed another count per node (only a pinned job on GPUs that
        # are not packed: rare).
        per_node = np.minimum(tables.counts[row_idx], gpn)
        odd = np.flatnonzero(per_node[where_idx] != tables.gpus_per_node[row_idx[where_idx]])
        other: dict[int, list[float]] = {}
        for n_placed in odd.tolist():
            k = where[n_placed]
            i = running[k]
            other[k] = self._power_row(i, int(rows.row[i]), counts[k], int(per_node[k]))
        # Every job placed (the usual case): each job's slot is its position, and
        # ``cols`` may be ``columns`` itself (the undo loop sets both alike).
        full = len(where) == len(columns)
        cols = columns if full else [columns[k] for k in where]
        values: list[float] = power.at(where_idx, np.asarray(cols, dtype=np.int64)).tolist()
        slot_of = None if full else {k: n for n, k in enumerate(where)}
        for k, row in other.items():
            values[k if slot_of is None else slot_of[k]] = row[columns[k]]
        down = set(result.powered_down_nodes)
        names = self.cluster.node_names
        nodes_on = len(names) - sum(map(down.__contains__, names))
        gpus = [counts[k] for k in where] if len(where) < len(counts) else counts
        used = sum(gpus)
        idle_w = self.cluster.gpu.idle_power_w * (nodes_on * gpn - used)

        watts = idle_w + sum(values)
        target = max(plan_limit_w, predicted)
        undo = len(raises[0])
        while watts > target and undo:
            undo -= 1
            k = raises[0][undo]
            columns[k] = raises[1][undo] + power.low
            n = k if slot_of is None else slot_of.get(k)
            if n is not None:
                values[n] = other[k][columns[k]] if k in other else float(power.at(k, columns[k]))
                cols[n] = columns[k]
            watts = idle_w + sum(values)

        if len(placed_at) < len(rows.given):
            placed_set = set(placed_at)
            notes = [
                f"{jobs[i].id}: placement found no GPUs; it waits"
                for i in rows.given
                if i not in placed_set
            ]
        else:
            notes = []  # every job with a row is placed
        clocks = self.clocks
        batch = tables.local_batch[row_idx].tolist()
        last = self.policy.memo.plans
        made: dict[str, JobPlan] = {}
        plans: list[JobPlan | None] = [None] * len(jobs)
        caps: list[float] | None = None
        if self.options.caps:
            # As arrays: the caps' arithmetic takes them without converting lists.
            placed_w = np.array(values, dtype=np.float64)
            job_gpus = np.array(gpus, dtype=np.int64)
            cap_w = cap_array(
                placed_w,
                job_gpus,
                self.fix.peak_w[row_idx[where_idx]],
                watts,
                self.limit_w,
                self.options.cap_headroom,
                self.cluster.gpu.min_power_limit_w or 0.0,
            )
            if cap_w is not None:
                placed = chosen if len(where) == len(chosen) else [chosen[k] for k in where]
                caps = steady_caps(
                    cap_w,
                    placed_w / job_gpus,  # each job's ``w / n``
                    list(map(_CAP, placed)),
                    self.cluster.gpu.min_power_limit_w or 0.0,
                    self.cluster.gpu.max_power_w,
                )
        if len(where) < len(batch):
            batch = [batch[k] for k in where]
        placed_ids = ids if len(where) == len(ids) else [ids[k] for k in where]
        get_last = last.get
        for i, job_id, slots, column, bs, job_w, cap in zip(
            placed_at,
            placed_ids,
            placed_got,
            cols,
            batch,
            values,
            [None] * len(values) if caps is None else caps,
            strict=True,
        ):
            clock = clocks[column]
            plan = get_last(job_id)
            if not (
                plan is not None
                and plan.placement is slots
                and plan.frequency_mhz == clock
                and plan.local_batch_size == bs
                and plan.power_w == job_w
                and plan.power_cap_w == cap
            ):
                plan = _job_plan(job_id, len(slots), clock, bs, slots, job_w, cap)
            plans[i] = made[job_id] = plan
        if len(placed_at) < len(jobs):
            self._waiting(plans, notes, last, made)
        self.policy.memo.plans = made
        return Plan(
            jobs=cast(tuple[JobPlan, ...], tuple(plans)),  # every job got one above
            limit_w=self.limit_w,
            predicted_w=watts,
            powered_down_nodes=tuple(sorted(down)),
            migrations=tuple(result.migrations),
            notes=tuple(notes),
        )

    def _waiting(
        self,
        plans: list[JobPlan | None],
        notes: list[str],
        last: Mapping[str, JobPlan],
        made: dict[str, JobPlan],
    ) -> None:
        """Waiting jobs' plans (the ``None`` in ``plans``) show the clock and local batch of
        their first count.

        A job with no allowed count gets a note (in job order) and the top clock; so
        does one whose smallest count is more GPUs than caps can hold (``cappable``):
        it waits rather than pass the limit.
        """
        jobs = self.snapshot.jobs
        tables = self.curves.tables
        waiting = [i for i, plan in enumerate(plans) if plan is None]
        idx = np.asarray(waiting, dtype=np.int64)
        levels = tables.sizes[idx].tolist()
        # A job with no allowed count has no rows (its start is the next job's).
        first = tables.start[idx][tables.sizes[idx] > 0]
        rows = iter(first.tolist())
        column = iter(self.curves.efficient[first].tolist())
        local = iter(tables.local_batch[first].tolist())
        for i, size in zip(waiting, levels, strict=True):
            job = jobs[i]
            if size == 0:
                notes.append(
                    f"{job.id}: no GPU count fits min/max GPUs, memory and batch; it waits"
                )
                clock, bs = self.clocks[-1], job.global_batch_size
            else:
                clock, bs = self.clocks[next(column)], next(local)
                smallest = int(tables.counts[next(rows)])
                if (
                    self.cappable is not None
                    and smallest > self.cappable
                    and job.remaining_iterations > 0
                ):
                    notes.append(
                        f"{job.id}: its smallest count, {smallest} GPUs, is more than caps at"
                        f" the GPUs' lowest power limit can hold within the {self.limit_w:.0f} W"
                        f" limit ({self.cappable} GPUs); it waits"
                    )
            plan = last.get(job.id)
            if not (
                plan is not None
                and plan.gpus == 0
                and plan.frequency_mhz == clock
                and plan.local_batch_size == bs
            ):
                plan = _job_plan(job.id, 0, clock, bs, (), None, None)
            plans[i] = made[job.id] = plan

    def _power_row(self, i: int, row: int, n: int, r: int) -> list[float]:
        """Power per clock of job ``i`` on ``n`` GPUs, ``r`` per node, at its row's local batch.

        For a job that got other GPUs per node than its table row assumed;
        placement packs, so this is rare (pinned jobs).
        """
        job = self.snapshot.jobs[i]
        bs = int(self.curves.tables.local_batch[row])
        f = np.asarray(self.clocks, dtype=np.float64)
        t = np.asarray(job.model.step_time_s(n, r, bs, f), dtype=np.float64)
        e = np.asarray(job.model.energy_per_iter_j(n, r, bs, f), dtype=np.float64)
        if not (np.all(np.isfinite(t) & (t > 0)) and np.all(np.isfinite(e) & (e > 0))):
            raise SnapshotError(f"job {job.id!r}: model predicts nonsense on {r} GPUs per node")
        return self.fix.row(row, (e / t).tolist())


def _job_plan(
    job_id: str,
    gpus: int,
    frequency_mhz: int,
    local_batch_size: int,
    placement: tuple[GpuSlot, ...],
    power_w: float | None,
    power_cap_w: float | None,
) -> JobPlan:
    """``JobPlan(...)`` of these fields, its instance dict filled at once.

    Why: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, 1.27 µs a plan against 0.31 µs here (timeit), and a
    fitted run makes 45,691 new job plans (43 ms). ``JobPlan`` has no
    ``__post_init__`` and no slots; ``tests/test_policy_memo.py`` checks that
    these are its fields and the plan equals the constructor's.
    """
    plan: JobPlan = object.__new__(JobPlan)
    plan.__dict__.update(
        job_id=job_id,
        gpus=gpus,
        frequency_mhz=frequency_mhz,
        local_batch_size=local_batch_size,
        placement=placement,
        power_w=power_w,
        power_cap_w=power_cap_w,
    )
    return plan


_ID = operator.attrgetter("id")
_PLACEMENT = operator.attrgetter("placement")
_PINNED = operator.attrgetter("pinned")
_CAP = operator.attrgetter("power_cap_w")


def _checked_places(
    ids: Sequence[str], counts: Sequence[int], got: Sequence[tuple[GpuSlot, ...]]
) -> list[int]:
    """Positions of the jobs placement placed (in order); ``PlacementError`` for the first
    one placed on another number of GPUs than its count."""
    where: list[int] = []
    for k, (job_id, n, slots) in enumerate(zip(ids, counts, got, strict=True)):
        if not slots:
            continue
        if len(slots) != n:
            raise PlacementError(f"job {job_id!r}: placement returned {len(slots)} GPUs")
        where.append(k)
    return where


@dataclass(frozen=True)
class _Rows:
    """Each job's table row (-1: it waits) and the jobs with one, pinned first, then
    in the order allocation gave them their first step."""

    row: IntArray
    given: list[int]


@dataclass(frozen=True)
class _Power:
    """The running jobs' power per clock, stored from clock column ``low`` up."""

    watts: FloatArray
    low: int

    def at(self, rows: IntArray | int, columns: IntArray | int) -> FloatArray:
        out: FloatArray = self.watts[rows, np.asarray(columns) - self.low]
        return out
