"""Zeus (You et al., NSDI'23) on top of a non-elastic scheduler: per-job power limits.

Zeus picks, per training job, the GPU setting that minimises its cost
``eta_knob * E + (1 - eta_knob) * MAXPOWER * T`` (``zeus.utils.metric.
zeus_cost``; default ``eta_knob = 0.5``, Zeus's own default). In Zeus's
``ZeusCost`` selector ``E`` is the energy summed over the job's GPUs and
``MAXPOWER`` is the highest power limit it profiled (the board's maximum)
times the job's world size, so here, per iteration of a job on ``n`` GPUs::

    cost(f) = eta_knob * E_iter(n, r, bs, f) + (1 - eta_knob) * n * P_max * T_iter(n, r, bs, f)

with ``P_max`` the GPU's board power limit (``GpuSpec.max_power_w``) and
``f`` the clock the job's GPUs run at. The wrapped scheduler (Gandiva or
Tiresias in the comparison; AFS in ``afs+zeus`` and ``afs+job-clocks``, which
``powerflow sweep job-clocks`` runs) decides who runs where and on how many GPUs;
``ZeusPolicy`` only sets each running job's GPU knob, so apart from that and the
predicted power its plan is the inner plan. Zeus itself is energy-aware but not
elastic, and it does not enforce the cluster's power limit either (it has none).

Faithful:

- **The knob is the power limit** (``knob="power_limit"``, the default), as
  in Zeus's ``GlobalPowerLimitOptimizer``: the candidates are the board's
  limits from the highest down to the lowest in steps of ``pl_step_w``
  (Zeus's ``pl_step``, 25 W: ``range(max, min - step, -step)``; A100:
  400, 375, ..., 100 W), the optimum is the candidate of least ``ZeusCost``,
  and the highest limit wins ties (Zeus's ``min`` over its measurements,
  which it takes from the highest limit down). The plan sets it as
  ``JobPlan.power_cap_w`` with the clock unlocked (the top clock), so the
  simulator runs the job at the highest clock whose true power fits the
  limit (``TruthRates.capped``), the rule the simulated GPUs follow.
- The ``ZeusCost`` formula, its ``MAXPOWER`` (board limit x world size) and
  ``eta_knob`` default.
- Just-in-time profiling during the job's first minutes: the simulator
  charges Zeus a profiling phase on each job's first run on a GPU count
  (``powerflow.lab.schedulers.ZEUS_PROFILING``): once per job under Tiresias and
  Gandiva (whose grow-shrink, which would resize jobs, is off by default); at every
  new count under AFS. A job planned onto a GPU count
  not yet in its ``profiled_gpus`` (profiling, or about to: starting, resumed
  or resized there) is left uncapped: Zeus's profiler sets the limits itself,
  from the highest down. The simulator runs that phase as its clock sweep
  (``ZEUS_PROFILING.sweep``, the paper's ladder), not as a sweep of Zeus's limits (see
  "Simplified").

Simplified, and why:

- The profiling phase sweeps the simulator's profiling clocks (210-1410 MHz)
  rather than the clocks Zeus's 13 limits give (none below the clock the
  lowest limit allows): per job it loses more progress (36 % of the phase
  against 16 %) at lower power (243 W against 334 W, means over the trace's
  jobs, ``scripts/zeus_knob_cost.py``), about 48 s of JCT per job. Sweeping
  limits would need the engine to profile under a sequence of caps.
- Which clock a limit gives, and the time and energy there, are read from the
  job's model (the ground truth: Zeus's profiling is not fitted, see
  ``ZEUS_PROFILING``) rather than from Zeus's 40 measured iterations per
  limit: the measurements Zeus would take, without their noise, and without
  charging Zeus a second profiling phase.
- ``knob="clock"`` keeps the earlier variant reachable (schedulers
  ``gandiva+zeus-clock`` and ``tiresias+zeus-clock``): the same ``ZeusCost``
  minimised over every supported locked clock. Per job its cost is never
  higher (a limit reaches only the clocks whose power fits one of Zeus's
  limits, and none below the clock the lowest limit allows); over the
  trace's jobs the power-limit optimum costs 0.16 % more on average, 0.74 %
  at most (``scripts/zeus_knob_cost.py``; docs/baselines.md, "Zeus", with
  the whole-trace runs of both).
- The batch-size half of Zeus is left out: the trace fixes each job's global
  batch, and changing it would change the iterations to convergence, which
  the simulator does not model.
- The setting is chosen for the configuration the inner scheduler gives the
  job (its GPU count, placement and local batch), re-evaluated at every event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import FloatArray, PerfModel
from powerflow.core.policy.snapshot import Job, JobPlan, Plan, Policy, Snapshot
from powerflow.lab.baselines.common import (
    Decides,
    Decision,
    ModelMemo,
    PlanWatts,
    budget_limit_w,
    cluster_gpu,
    evaluate,
    per_node,
    plan_jobs,
)

ZeusKnob = Literal["power_limit", "clock"]

ZEUS_PL_STEP_W = 25.0
"""Zeus's ``GlobalPowerLimitOptimizer(pl_step=25)``: watts between profiled limits."""


def power_limits_w(spec: GpuSpec, step_w: float = ZEUS_PL_STEP_W) -> tuple[float, ...]:
    """The limits Zeus profiles, highest first: ``range(max, min - step, -step)``.

    A value below the board's minimum (when the range is not a multiple of the
    step) is raised to the minimum, as the board would clamp it. A board
    without a settable limit (``min_power_limit_w`` None) has only its default.
    """
    if step_w <= 0:
        raise SnapshotError(f"power-limit step {step_w} W must be positive")
    low = spec.min_power_limit_w
    if low is None:
        return (spec.max_power_w,)
    out: list[float] = []
    p = spec.max_power_w
    while p > low - step_w:
        value = max(p, low)
        if value not in out:
            out.append(value)
        p -= step_w
    return tuple(out)


def _costs(
    t: FloatArray, e: FloatArray, n: FloatArray | float, spec: GpuSpec, eta: float
) -> FloatArray:
    cost: FloatArray = eta * e + (1.0 - eta) * n * spec.max_power_w * t
    return cost


def zeus_cost(
    model: PerfModel, n: int, r: int, bs: int, spec: GpuSpec, eta_knob: float
) -> FloatArray:
    """Zeus's cost per iteration at each supported clock of ``spec``."""
    t, e = evaluate([model], [[n]], [[r]], [[bs]], [spec.clocks_mhz])
    return _costs(t[0], e[0], float(n), spec, eta_knob)


def zeus_clock(model: PerfModel, n: int, r: int, bs: int, spec: GpuSpec, eta_knob: float) -> int:
    """The clock minimising Zeus's cost (the lowest such clock on ties)."""
    cost = zeus_cost(model, n, r, bs, spec, eta_knob)
    return int(spec.clocks_mhz[int(np.argmin(cost))])


def _capped_index(power: FloatArray, limits: FloatArray) -> np.ndarray:
    """Per row and limit: index of the highest clock whose per-GPU power fits the
    limit, 0 where none does (``powerflow.core.devices.capped_clock_mhz``'s rule).

    ``power`` is ``(rows, clocks)``, ascending clocks; the result ``(rows, limits)``.
    """
    fits = power[:, None, :] <= limits[None, :, None]
    last = fits.shape[2] - 1 - np.argmax(fits[:, :, ::-1], axis=2)
    return np.where(fits.any(axis=2), last, 0)


def zeus_power_limit(
    model: PerfModel,
    n: int,
    r: int,
    bs: int,
    spec: GpuSpec,
    eta_knob: float,
    step_w: float = ZEUS_PL_STEP_W,
) -> tuple[float, int]:
    """Zeus's power limit for one configuration, and the clock it runs at there."""
    limit, clock = _power_limits([model], [(n, r, bs)], spec, eta_knob, step_w)[0]
    return limit, clock


def _power_limits(
    models: list[PerfModel],
    configs: list[tuple[int, int, int]],
    spec: GpuSpec,
    eta_knob: float,
    step_w: float,
) -> list[tuple[float, int]]:
    """``zeus_power_limit`` for many ``(n, r, bs)`` rows in one grouped evaluation."""
    clocks = np.asarray(spec.clocks_mhz, dtype=np.float64)
    n = np.array([[c[0]] for c in configs], dtype=np.float64)
    t, e = evaluate(
        models, n, [[c[1]] for c in configs], [[c[2]] for c in configs], clocks[None, :]
    )
    limits = np.asarray(power_limits_w(spec, step_w), dtype=np.float64)
    at = _capped_index(e / (n * t), limits)  # (rows, limits): the clock each limit gives
    cost = np.take_along_axis(_costs(t, e, n, spec, eta_knob), at, axis=1)
    best = np.argmin(cost, axis=1)  # the first, i.e. the highest limit, on ties
    return [(float(limits[k]), int(spec.clocks_mhz[int(at[i, k])])) for i, k in enumerate(best)]


@dataclass(frozen=True)
class ZeusPolicy:
    """``inner``'s plan with each running job at its Zeus-optimal power limit (or clock)."""

    inner: Policy
    eta_knob: float = 0.5
    knob: ZeusKnob = "power_limit"
    pl_step_w: float = ZEUS_PL_STEP_W
    memo: ModelMemo = field(default_factory=ModelMemo, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta_knob <= 1.0:
            raise SnapshotError(f"eta_knob {self.eta_knob} outside [0, 1]")
        if self.knob not in ("power_limit", "clock"):
            raise SnapshotError(f"Zeus knob must be 'power_limit' or 'clock', not {self.knob!r}")
        if not self.pl_step_w > 0:
            raise SnapshotError(f"power-limit step {self.pl_step_w} W must be positive")

    def plan(self, snapshot: Snapshot) -> Plan:
        inner = self.inner
        # A decision, when the inner policy gives one: its plan's figures would be replaced.
        base: Plan | Decision = (
            inner.decide(snapshot) if isinstance(inner, Decides) else inner.plan(snapshot)
        )
        base_jobs = base.jobs
        spec = cluster_gpu(snapshot)
        # A decision lists its plans in the snapshot's job order (``Decision``), so
        # the snapshot's jobs are the plans' jobs without ``plan_jobs``'s check of
        # every id (0.04 s of CPU over the snapshots ``python
        # benchmarks/replay_bench.py --runs gandiva`` records of the default trace).
        # The first and last ids are still compared: a decision in another order
        # takes ``plan_jobs``, which pairs them by id.
        jobs_in = snapshot.jobs
        views: Sequence[Job] = (
            jobs_in
            if isinstance(base, Decision)
            and len(base_jobs) == len(jobs_in)
            and (
                not jobs_in
                or (jobs_in[0].id, jobs_in[-1].id) == (base_jobs[0].job_id, base_jobs[-1].job_id)
            )
            else plan_jobs(snapshot, base_jobs)
        )
        capping = self.knob == "power_limit"
        # Job id -> (inner plan, model, our plan, clock a limit holds it at or None,
        # the plan's watts once priced):
        # what a job got last time, handed back while the inner plan object and
        # the model are the ones it was set for (its setting depends on nothing
        # else). Looking up ~250 settings and building their frozen plans at
        # every event cost more than the rest of this method (gandiva+zeus 4.7 ->
        # 4.0 s of CPU with the watts reuse), and an unchanged object lets the
        # engine skip the job.
        made = self.memo.last(("zeus_plan", spec, self.eta_knob, self.knob, self.pl_step_w))
        jobs = list(base_jobs)
        runs_at: dict[str, int] = {}  # where a power limit holds the clock below the locked one
        # The plan's watts are gathered in this pass (``PlanWatts``): a job handed
        # back from ``made`` comes with the watts it was priced at there, so
        # pricing the plan needs no second pass over its jobs (the policy CPU of a
        # Gandiva+Zeus run of the default trace 2.41 -> 2.08 s, replayed by
        # ``benchmarks/replay_bench.py``).
        gathered = PlanWatts(self.memo)
        if isinstance(base, Decision):
            gathered.sharing = base.sharing
        running, run_models, clocks, watts = (
            gathered.running,
            gathered.models,
            gathered.clocks,
            gathered.watts,
        )
        lookup = gathered.lookup
        todo: list[tuple[int, int]] = []  # (job's index, its slot in ``gathered``)
        priced: list[tuple[int, str]] = []  # (slot, job id): watts to keep in ``made``
        for k, (jp, job) in enumerate(zip(base_jobs, views, strict=True)):
            if jp.gpus == 0:
                continue
            model = job.model
            # A job profiling on the plan's GPU count gets no limit: Zeus's profiler
            # owns it. Not only a job already profiling (pinned): one the plan
            # starts, resumes or resizes onto a count it has not profiled begins
            # its profiling phase with the plan's cap, so it must get none (Zeus
            # sets the highest limit before it profiles); the limit comes at the
            # first plan after the phase.
            profiled = job.profiled_gpus
            if capping and profiled is not None and jp.gpus not in profiled:
                running.append(jp)
                run_models.append(model)
                clocks.append(jp.frequency_mhz)
                watts.append(lookup(jp, model, jp.frequency_mhz))
                continue
            prev = made.get(jp.job_id)
            if prev is not None and prev[0] is jp and prev[1] is model:
                ours, held, w = prev[2], prev[3], prev[4]
                jobs[k] = ours
                if held is not None:
                    runs_at[jp.job_id] = held
                f = ours.frequency_mhz if held is None else held
                if w is None:
                    w = lookup(ours, model, f)
                    priced.append((len(watts), jp.job_id))
                running.append(ours)
                run_models.append(model)
                clocks.append(f)
                watts.append(w)
            else:
                todo.append((k, len(watts)))
                running.append(jp)  # placeholders, set below
                run_models.append(model)
                clocks.append(0)
                watts.append(None)
        if todo:
            models = {base_jobs[k].job_id: views[k].model for k, _ in todo}
            settings = self._settings([base_jobs[k] for k, _ in todo], models, spec)
            for k, slot in todo:
                jp = base_jobs[k]
                clock, cap = settings[jp.job_id]
                locked = spec.max_clock_mhz if capping else clock
                if locked == jp.frequency_mhz and cap is None and jp.power_w is None:
                    ours = jp  # the inner plan's own object: the backend sees it unchanged
                else:
                    ours = JobPlan(
                        jp.job_id, jp.gpus, locked, jp.local_batch_size, jp.placement, None, cap
                    )
                held = clock if clock != locked else None
                if held is not None:
                    runs_at[jp.job_id] = held
                jobs[k] = ours
                f = ours.frequency_mhz if held is None else held
                running[slot] = ours
                clocks[slot] = f
                watts[slot] = lookup(ours, models[jp.job_id], f)
                made[jp.job_id] = (jp, models[jp.job_id], ours, held, None)
                priced.append((slot, jp.job_id))
        total = gathered.total(snapshot, spec, getattr(inner, "time_slices", False))
        for slot, job_id in priced:
            made[job_id] = (*made[job_id][:4], watts[slot])
        if isinstance(base, Plan):
            return replace(base, jobs=tuple(jobs), predicted_w=total)
        return Plan(tuple(jobs), budget_limit_w(snapshot), total, (), base.migrations)

    def _settings(
        self, run: list[JobPlan], models: dict[str, PerfModel], spec: GpuSpec
    ) -> dict[str, tuple[int, float | None]]:
        """Running jobs' (clock, power limit): remembered ones, the rest grouped.

        With the clock knob the limit is ``None`` (no cap).
        """
        out: dict[str, tuple[int, float | None]] = {}
        miss: list[tuple[JobPlan, tuple[object, ...]]] = []
        purpose = ("zeus", spec, self.eta_knob, self.knob, self.pl_step_w)
        known = self.memo.last(purpose)
        for jp in run:
            # The job's last configuration first: one lookup by id, no memo key to build.
            config = (jp.gpus, jp.local_batch_size, jp.placement)
            last = known.recall(jp.job_id, models[jp.job_id], config)
            if last is not None:
                out[jp.job_id] = last
                continue
            key: tuple[object, ...] = (
                *purpose,
                jp.gpus,
                per_node(jp.placement),
                jp.local_batch_size,
            )
            hit = self.memo.get(models[jp.job_id], key)
            if isinstance(hit, tuple):
                out[jp.job_id] = hit
                known.remember(jp.job_id, models[jp.job_id], config, hit)
            else:
                miss.append((jp, key))
        if not miss:
            return out
        rows = [(jp.gpus, per_node(jp.placement), jp.local_batch_size) for jp, _ in miss]
        miss_models = [models[jp.job_id] for jp, _ in miss]
        found: list[tuple[int, float | None]]
        if self.knob == "power_limit":
            found = [
                (clock, limit)
                for limit, clock in _power_limits(
                    miss_models, rows, spec, self.eta_knob, self.pl_step_w
                )
            ]
        else:
            f = np.asarray(spec.clocks_mhz, dtype=np.float64)[None, :]
            n = np.array([[row[0]] for row in rows], dtype=np.float64)
            t, e = evaluate(
                miss_models, n, [[row[1]] for row in rows], [[row[2]] for row in rows], f
            )
            cost = _costs(t, e, n, spec, self.eta_knob)
            found = [(int(spec.clocks_mhz[i]), None) for i in np.argmin(cost, axis=1)]
        for (jp, key), value in zip(miss, found, strict=True):
            self.memo.put(models[jp.job_id], key, value)
            out[jp.job_id] = value
            known.remember(
                jp.job_id, models[jp.job_id], (jp.gpus, jp.local_batch_size, jp.placement), value
            )
        return out
