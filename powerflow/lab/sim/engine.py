"""The event-driven engine: replays a trace on simulated "real GPUs".

Simulated time jumps from event to event: arrivals (batched per instant),
the end of a pre-run, a checkpoint restart or a profiling phase, a
completion, a periodic re-evaluation, and each edge of a budget schedule
(``powerflow.core.budget_schedule``, read on the simulated clock: ``t = 0``
is 00:00 of day one), where the policy is called at once, even within
``batch_s`` of its last call, so that a lower budget is planned for from
its first second. Between events every job's rate is
constant, so progress and energy are exact integrals. At each scheduling
event the engine is the ``Backend`` of ``schedule_once``: it builds a
snapshot, the policy plans, the engine applies the plan. It decides nothing
itself; what differs between schedulers comes from their ``Configured``
(budget and profiling), never from their names.

Accounting. A job computing on ``n`` GPUs draws the ground truth's
``E_iter / T_iter`` at its actual (n, r, bs, f); GPUs time-sliced between
jobs give each job an equal share (its throughput and its power scale by
``1/k`` on a GPU shared by ``k`` jobs, so a GPU's energy is counted once).
Every GPU of a powered-on node not computing (free, or held by a job that is
restarting or waiting for its node to boot) draws idle power; nodes that are
off draw nothing. With ``SimConfig.idle_nodes_off`` (the default) every node
holding no job after a scheduling decision is off, whatever the scheduler;
otherwise only the plan's ``powered_down_nodes``. A job placed on a node that
is off waits ``power_on_s`` for it to boot (``_switch_nodes``, ``_power_on``).
The offline pre-run's energy is counted apart from the cluster's power series.

A mixed cluster (``SimConfig.pools``: several GPU types or node sizes) is the
same loop: each job runs on the type of the nodes it holds (``SimJob.on``),
whose ground truth, clocks, power-limit range, profiling ladder and learner
it uses; each node's GPUs idle at their type's power; the policy plans inside
``FleetPolicy``. What spans the types (each job's models on every type, the
per-type totals) is kept in ``mixed.py``.

Power caps and the budget. A plan's per-GPU ``power_cap_w``, clamped into the
board's power-limit range as the node agent clamps it, holds the job's
GPUs at the highest clock whose true power fits it (``TruthRates.capped``),
so a capped job runs slower and draws less, and its time and energy say so.
Time above the admin's limit is measured from the ground truth with every
profiling job at its sweep's hungriest slice (the slices are not simulated
one by one; the mean is what its energy counts), so a sweep that would pass
the limit for one slice counts. A job running at its planned configuration
is measured once there (its true power with the profiler's noise), as the
node agent's windows do: ``Job.measured_power_w`` in the snapshot, and the
snapshot's ``power_ratio`` is the largest ratio of true to planned power of
the jobs running as planned over the last hour (``powerflow.core.policy.power_ratio``)
(``powerflow.core.policy.power_loop``).
"""

from __future__ import annotations

import gc
import heapq
import math
import sys
import time
import weakref
from dataclasses import dataclass

import numpy as np

from powerflow.core.backend import schedule_once
from powerflow.core.budget_schedule import DAY_S, BudgetSchedule
from powerflow.core.errors import SimulationError
from powerflow.core.learning import FittedLearner, Learner, OracleLearner
from powerflow.core.models.priors import held_out_prior
from powerflow.core.models.protocol import PerfModel
from powerflow.core.models.samples import Samples
from powerflow.core.policy.power_ratio import BELIEVED, RatioWindow
from powerflow.core.policy.snapshot import GpuSlot, Job, Plan, Snapshot
from powerflow.lab.groundtruth.measure import noisy_power_w
from powerflow.lab.schedulers import Configured
from powerflow.lab.sim import kernels
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.jobs import JobArrays, Phase, SimJob
from powerflow.lab.sim.mixed import MixedCluster, for_cluster, on_type
from powerflow.lab.sim.rates import TruthRates
from powerflow.lab.sim.result import JobRecord, RunResult, Series
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.world import World

EPS = 1e-6
"""Events closer than this (seconds) are simultaneous."""

RUN_GC_THRESHOLD = (10_000, 10, 10)
"""``gc.set_threshold`` during a run (``Simulation.run`` says why)."""

MEASURE_WINDOW_S = 60.0
"""A running job's power is measured over this long a window (its noise shrinks
with the iterations the window holds, as the node agent's windows do)."""


@dataclass
class _Totals:
    active_j: float = 0.0
    idle_j: float = 0.0
    prerun_j: float = 0.0
    busy_gpu_s: float = 0.0
    held_gpu_s: float = 0.0
    powered_gpu_s: float = 0.0
    above_limit_s: float = 0.0
    above_limit_j: float = 0.0
    max_over_w: float = 0.0
    max_over_pct: float = 0.0
    lowest_limit_w: float = math.inf
    policy_calls: int = 0
    policy_s: float = 0.0
    fit_s: float = 0.0
    events: int = 0
    power_ons: int = 0
    power_on_j: float = 0.0


class Simulation:
    """One run of one configured scheduler over one trace on one cluster."""

    def __init__(
        self,
        trace: tuple[TraceJob, ...],
        configured: Configured,
        config: SimConfig,
        world: World,
        learner: Learner | None = None,
        budget_schedule: BudgetSchedule | None = None,
    ) -> None:
        """``learner``: what the scheduler knows of each job; by default the ground
        truth for a scheduler that does not fit models, else models fitted online
        from each job's held-out prior (``held_out_prior``: nothing learned from
        its own model's reference profile). ``budget_schedule``: the budget over
        time, in place of ``configured.budget`` (its ``default`` outside its
        windows); read on the simulated clock."""
        if not trace:
            raise SimulationError("the trace has no jobs")
        self.cfg = config
        configured = for_cluster(configured, config)  # FleetPolicy on a mixed cluster
        self.configured = configured
        self.profiling = configured.profiling
        self.world = world
        self.rates = TruthRates(world.truth, config.gpu.clocks_mhz)
        if learner is None:
            learner = (
                FittedLearner(config.gpu, prior=held_out_prior)
                if self.profiling.fitted_models
                else OracleLearner()
            )
        self.learner = learner
        # Every job starts on the first pool's type; a mixed cluster's other types
        # and what each job learns on them: ``mixed.py``.
        self._on = on_type(config.gpu, world, learner, self.profiling.sweep, self.rates)
        self._fleet = MixedCluster(config, self._on, self.profiling.sweep) if config.mixed else None
        too_big = [j.job_id for j in trace if j.num_gpu > config.max_job_gpus]
        if too_big:
            where = "the largest pool" if config.mixed else "the cluster"
            raise SimulationError(
                f"{len(too_big)} job(s) ask for more GPUs than {where}'s "
                f"{config.max_job_gpus} (first: {too_big[0]})"
            )
        ordered = sorted(trace, key=lambda j: (j.submit_s, j.job_id))
        self._arrays = JobArrays(len(ordered))
        self.jobs = [
            SimJob(i, tj, self.rates.model(tj.model_name), config.seed, self._arrays, self._on)
            for i, tj in enumerate(ordered)
        ]
        self._by_id = {j.trace.job_id: j for j in self.jobs}
        self._next_arrival = 0
        self._active: dict[int, SimJob] = {}  # submitted, not done
        self._views: dict[int, Job | None] = {}  # the active ones' views (see snapshot)
        self._stale_views: set[int] = set()  # jobs whose views to rebuild
        self._holders: dict[int, SimJob] = {}  # holding GPUs
        self._preruns: list[tuple[float, int]] = []  # heap of (pre-run end, index)
        self._node_index = {name: i for i, name in enumerate(config.node_names())}
        self._powered_down: frozenset[str] = frozenset()  # the last plan's list
        # Nodes switched off now, and when each booting node is ready: with
        # idle_nodes_off every node starts off (nothing runs yet).
        self._off: set[str] = set(config.node_names()) if config.idle_nodes_off else set()
        self._ready: dict[str, float] = {}
        self._nodes = config.make_nodes(frozenset(self._off))
        self._limit_w = math.inf
        self._clocks = frozenset(config.gpu.clocks_mhz)
        self._profile_clocks = self.profiling.sweep.clocks_mhz(config.gpu)
        self.now = 0.0
        self._totals = _Totals()
        self._active_w = 0.0
        self._busy_gpus = 0.0
        self._held_gpus = 0
        self._last_busy_s = 0.0
        self._load: dict[GpuSlot, int] = {}  # holders per GPU, kept by _phase
        self._node_load: dict[str, int] = {}  # the same summed per node (0: absent)
        self._occupants: dict[GpuSlot, set[int]] = {}  # holders' indices per GPU
        self._stale: set[int] = set()  # jobs whose GPUs' load changed: share to redo
        self._shares_dirty = True
        self._power_dirty = True  # a holder's share, rates or phase changed
        self._slots_dirty = True  # the holders changed
        self._computing_dirty = True  # which of them compute changed
        self._held = np.zeros(0, dtype=np.intp)  # holders' rows, in _holders order
        self._computing = np.zeros(0, dtype=np.intp)  # the computing ones among them
        self._next_job_s = math.inf  # soonest next_event_s of a holder, set by _refresh
        self._series: list[tuple[float, float, float, float, int, int, float]] = []
        self._profiling: set[int] = set()  # jobs in PROFILE (their peak counts for the limit)
        self._peak_extra_w = 0.0  # their peak power above their mean, summed
        self._ratios = RatioWindow()  # (time, true / planned power)
        self._meter = np.random.default_rng([config.seed, 0x6D657465])  # measurement noise
        self._budgets = None if budget_schedule is None else budget_schedule.on_sim_clock()

    # ------------------------------------------------------------------ Backend

    def snapshot(self) -> Snapshot:
        """Every schedulable job's view, most of them reused or copied.

        ``_views`` holds each active job's view in ``_active`` order (None
        during its pre-run). A view stays valid until something in it other
        than progress changes: its model, placement, clock or phase
        (``_phase``, ``_assign`` and ``_finish_profile`` put the job in
        ``_stale_views`` then), and is rebuilt (``_view``). A waiting job's
        valid view is reused; a holder's differs only in progress (remaining
        iterations, time and GPU-seconds held), which comes from the arrays
        for all holders at once. It is set on a copy (as ``_with_changes``
        copies) when anything besides ``_views`` still holds the last view (a
        policy's memo, a kept snapshot, a weak reference), else on the last view itself
        (``_unshared``): nothing can see that view change, and updating its
        three fields spares building one object and freeing another.
        """
        a = self._arrays
        held, _ = self._slots()
        views = self._views
        stale = self._stale_views
        progress: dict[int, tuple[float, float, float]] = {}  # stale holders' (for _view)
        if len(held):
            # remaining is max(max(left, 0), 1e-9), as SimJob.remaining and _view have it
            remaining, run_s, attained_s = kernels.progress_rows(held, a.floats).tolist()
            new = _new_object
            set_dict = _set_view_dict
            unshared = _UNSHARED_REFS
            refs = _refcount
            weak = weakref.getweakrefcount
            for i, rem, elapsed, attained in zip(
                held.tolist(), remaining, run_s, attained_s, strict=True
            ):
                if i in stale:
                    progress[i] = (rem, elapsed, attained)
                    continue
                # a holder not stale has had a view since it was placed
                # only _views holds it (_unshared), and no weak reference sees it
                if refs(views[i]) == unshared and not weak(views[i]):
                    fields = views[i].__dict__
                    fields["remaining_iterations"] = rem
                    fields["elapsed_s"] = elapsed
                    fields["attained_gpu_s"] = attained
                    continue
                # dataclasses.replace(view, ...) for the progress fields, the
                # way _with_changes does it (inline: 300k times a run)
                fields = views[i].__dict__.copy()
                fields["remaining_iterations"] = rem
                fields["elapsed_s"] = elapsed
                fields["attained_gpu_s"] = attained
                view = new(Job)
                set_dict(view, fields)
                views[i] = view
        if stale:
            jobs = self.jobs
            prerun = Phase.PRERUN
            for i in stale:
                job = jobs[i]
                if i in views and job.phase is not prerun:  # active, visible
                    views[i] = self._view(job, progress.get(i))
            stale.clear()
        # None marks the jobs still in their pre-run; a Job is never false
        jobs_seen = tuple(filter(None, views.values()))
        budgets = self._budgets
        budget = self.configured.budget if budgets is None else budgets.budget_at(self.now)
        return Snapshot(self._nodes, jobs_seen, budget, self.now, self._power_ratio())

    def apply(self, plan: Plan) -> None:
        down = frozenset(plan.powered_down_nodes)
        unknown = down - self._node_index.keys()
        if unknown:
            raise SimulationError(f"plan powers down unknown node(s) {sorted(unknown)}")
        planned = {jp.job_id: jp for jp in plan.jobs}
        take = planned.pop
        prerun = Phase.PRERUN
        # Only a job holding a GPU on a node to power down can be kept there
        # by mistake; usually no held GPU is on one, and no job needs a look.
        down_held = not down.isdisjoint(self._node_load)
        for job in list(self._active.values()):
            if job.phase is prerun:
                continue
            jp = take(job.job_id, None)
            if jp is not None and jp is job.plan and not down_held:
                continue  # the very plan it runs (a policy may hand out the same one)
            if jp is None or jp.gpus == 0:
                if job.holding:  # _release checks too; this spares queued jobs the call
                    self._release(job)
                continue
            if (
                job.holding
                and jp.placement == job.placement
                and jp.frequency_mhz == job.f
                and jp.local_batch_size == job.bs
                and jp.power_cap_w == job.cap_w
                and not (down_held and any(node in down for node, _ in job.placement))
            ):
                job.set_plan(jp)  # unchanged: the common case at most events
                continue
            clocks = self._check_slots(job, jp.placement, jp.gpus, down)
            if jp.frequency_mhz not in clocks:
                raise SimulationError(
                    f"plan sets job {job.trace.job_id} to unsupported clock {jp.frequency_mhz}"
                )
            cap = jp.power_cap_w
            if cap is not None and not (math.isfinite(cap) and cap > 0):
                raise SimulationError(f"plan caps job {job.trace.job_id} at {cap} W per GPU")
            job.cap_w = cap
            self._assign(job, jp.placement, jp.frequency_mhz, float(jp.local_batch_size))
            job.set_plan(jp)
        if planned:
            raise SimulationError(f"plan names job(s) not schedulable now: {sorted(planned)[:3]}")
        self._powered_down = down
        self._switch_nodes(down)
        self._limit_w = plan.limit_w if math.isfinite(plan.limit_w) else math.inf
        self._totals.lowest_limit_w = min(self._totals.lowest_limit_w, self._limit_w)

    def _switch_nodes(self, down: frozenset[str]) -> None:
        """After a plan: switch off the plan's powered-down nodes and, with
        ``idle_nodes_off``, every node that holds no job; a node that was off
        and is wanted again boots (``_power_on``). Decided here, at the
        scheduling decisions, as an operator acting on its plans would: a
        node emptied by a completion stays on until the next decision (at
        most ``batch_s`` later), when a waiting job may take it."""
        off = set(down)
        if self.cfg.idle_nodes_off:
            load = self._node_load
            off.update(name for name in self._node_index if name not in load)
        if off == self._off:
            return
        for name in self._off - off:
            self._power_on(name)
        for name in off:
            self._ready.pop(name, None)  # a boot cut short: its energy so far is spent
        self._off = off
        self._nodes = self.cfg.make_nodes(frozenset(off))

    def _power_on(self, name: str) -> float:
        """Switch node ``name`` on if it is off; when it can run jobs."""
        if name in self._off:
            self._off.discard(name)
            self._ready[name] = self.now + self.cfg.power_on_s
            self._totals.power_ons += 1
            self._nodes = self.cfg.make_nodes(frozenset(self._off))
        return self._ready.get(name, self.now)

    def _power_ratio(self) -> float:
        """The largest ratio of true to planned power of the jobs running as planned
        over the last hour (``RatioWindow``; 1.0 when none), with this moment's sample.

        The sample's sums come from the arrays in one compiled pass over the
        holders (``kernels.ratio_sums``: the pairs ``RatioWindow.add`` would
        keep, summed in the same order; tests/test_sim_fastpaths.py checks it),
        each plan's power kept there by ``SimJob.set_plan``: 0.02 s against
        0.09 s for a Python pass over the holders' pairs in a fitted run of the
        default trace (``_power_ratio`` timed inside ``run_one``).
        """
        held, _ = self._slots()
        a = self._arrays
        measured, planned = kernels.ratio_sums(held, BELIEVED[0], BELIEVED[1], a.floats, a.flags)
        self._ratios.add_sums(self.now, measured, planned)
        return self._ratios.ratio(self.now)

    # ---------------------------------------------------------------- main loop

    def run(self) -> RunResult:
        """Run the trace to its end.

        What exists before the run (trace, ground truth, models, memos) lives
        through it, so it is frozen out of the garbage collector's passes for
        the run (``gc.freeze``): the collector then scans only what the run
        allocates. Collections took about half their CPU time
        (0.24 -> 0.12 s of a Gandiva run of the default trace, measured with
        ``gc.callbacks``). The run also collects its youngest generation every
        ``RUN_GC_THRESHOLD`` allocations rather than every 700: most of what a
        decision allocates (snapshots, views, plans, tables) is freed by its
        reference count long before that, so far fewer objects are scanned
        (collections during a fitted PowerFlow run of the default trace:
        0.53 -> 0.09 s of CPU). No result depends on either.
        """
        threshold = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(*RUN_GC_THRESHOLD)
        try:
            return self._run()
        finally:
            gc.set_threshold(*threshold)
            gc.unfreeze()

    def _run(self) -> RunResult:
        started = time.perf_counter()
        ordered = self.jobs
        next_tick = math.inf
        pending = False  # a scheduling event awaits the next policy call
        last_call = -math.inf
        gap = self.cfg.batch_s
        self.now = ordered[0].trace.submit_s
        budgets = self._budgets
        next_edge = math.inf if budgets is None else budgets.next_edge_s(self.now) or math.inf
        self._record()
        while self._next_arrival < len(ordered) or self._active:
            t_arrival = (
                ordered[self._next_arrival].trace.submit_s
                if self._next_arrival < len(ordered)
                else math.inf
            )
            t_job = self._next_job_s
            if self._preruns:
                t_job = min(t_job, self._preruns[0][0])
            t_due = max(last_call + gap, self.now) if pending else math.inf
            t_next = min(t_arrival, t_job, next_tick, t_due, next_edge)
            if t_next > self.cfg.horizon_s:
                raise SimulationError(
                    f"not drained by the horizon ({self.cfg.horizon_s:.0f} s): "
                    f"{len(self._active)} job(s) left"
                )
            if not math.isfinite(t_next):
                raise SimulationError("deadlock: jobs wait but no event is due")
            self._advance(t_next)
            self._totals.events += 1
            pending |= self._arrivals()
            while self._preruns and self._preruns[0][0] <= self.now + EPS:
                pending |= self._make_visible(self._active[heapq.heappop(self._preruns)[1]])
            due = self.now + EPS
            if self._next_job_s <= due:
                for job in self._due(due):
                    pending |= self._job_event(job)
            if next_tick <= self.now + EPS:
                pending = True
                next_tick = self.now + self.cfg.interval_s
            edge = next_edge <= self.now + EPS  # the budget changes: plan for it now
            if edge:
                assert budgets is not None
                next_edge = budgets.next_edge_s(max(self.now, next_edge)) or math.inf
            if len(self._active) == len(self._preruns):
                pending = False  # nothing schedulable: nothing to decide
                self._switch_nodes(self._powered_down)  # but emptied nodes go off now
            if edge or (pending and self.now >= last_call + gap - EPS):
                self._schedule()  # at an edge even with nothing to run: the new limit
                pending = False
                last_call = self.now
                next_tick = self.now + self.cfg.interval_s
            if not self._active:
                next_tick = math.inf
            self._refresh()
            self._check_progress()
        wall = time.perf_counter() - started
        return self._result(wall)

    def _check_progress(self) -> None:
        """A policy that leaves an idle cluster idle while jobs wait never ends:
        after two re-evaluations with nothing running and nothing to come, stop.
        Under a budget schedule, only after a whole day more: a window's budget may
        be too low for any job (zero: "no training at the peak") until its end."""
        if self._next_arrival < len(self.jobs) or self._held_gpus > 0:
            self._last_busy_s = self.now
            return
        if self._preruns:
            self._last_busy_s = self.now
            return
        patience = 2 * self.cfg.interval_s
        if self._budgets is not None and self._budgets.windows:
            patience += DAY_S
        if self._active and self.now - self._last_busy_s > patience:
            raise SimulationError(
                f"the policy leaves {len(self._active)} job(s) waiting on an idle cluster "
                f"at t={self.now:.0f} s"
            )

    def _schedule(self) -> None:
        t0 = time.perf_counter()
        schedule_once(self.configured.policy, self)
        self._totals.policy_s += time.perf_counter() - t0
        self._totals.policy_calls += 1

    # ------------------------------------------------------------------- events

    def _arrivals(self) -> bool:
        trigger = False
        while (
            self._next_arrival < len(self.jobs)
            and self.jobs[self._next_arrival].trace.submit_s <= self.now + EPS
        ):
            job = self.jobs[self._next_arrival]
            self._next_arrival += 1
            self._active[job.index] = job
            self._views[job.index] = None
            prerun = self.profiling.prerun_s
            if prerun > 0:
                self._phase(job, Phase.PRERUN)
                job.phase_end_s = job.next_event_s = self.now + prerun
                heapq.heappush(self._preruns, (job.phase_end_s, job.index))
                _step, power = self.rates.sweep(
                    job.trace.model_name,
                    1,
                    1,
                    float(job.trace.global_batch_size),
                    self._profile_clocks,
                )
                job.prerun_energy_j = power * prerun
                self._totals.prerun_j += job.prerun_energy_j
                job.samples.append(
                    self.world.one_gpu_sweep(
                        job.truth,
                        float(job.trace.global_batch_size),
                        rng=job.rng,
                        noise=self.cfg.noise,
                        duration_s=prerun,
                    )
                )
            else:
                trigger |= self._make_visible(job)
        return trigger

    def _make_visible(self, job: SimJob) -> bool:
        self._phase(job, Phase.QUEUED)
        job.phase_end_s = job.next_event_s = math.inf
        job.visible_s = self.now
        samples = _joined(job.samples) if job.samples else None
        t0 = time.perf_counter()
        job.knowledge = self.learner.initial(job.trace.model_name, job.truth, samples)
        if self._fleet is not None:
            self._fleet.visible(job)
        self._totals.fit_s += time.perf_counter() - t0
        return True

    def _job_event(self, job: SimJob) -> bool:
        if job.next_is_completion:
            self._finish_profile(job, complete=False, refit=False)
            self._complete(job)
            return True
        if job.phase is Phase.RESTART:
            self._start_compute(job)
            return False
        if job.phase is Phase.PROFILE:
            self._finish_profile(job, complete=True)
            self._phase(job, Phase.RUN)
            job.phase_end_s = math.inf
            self._set_rates(job)
            return True
        raise SimulationError(f"job {job.trace.job_id}: unexpected event in phase {job.phase}")

    def _complete(self, job: SimJob) -> None:
        job.done_iters = job.trace.iterations
        job.finish_s = self.now
        self._phase(job, Phase.DONE)
        job.next_event_s = math.inf
        job.placement = ()
        job.set_plan(None)
        job.n = 0
        del self._active[job.index]
        del self._views[job.index]

    # --------------------------------------------------------------- transitions

    def _check_slots(
        self, job: SimJob, placement: tuple[GpuSlot, ...], gpus: int, down: frozenset[str]
    ) -> frozenset[int]:
        """Refuse a placement the cluster cannot give; the clocks of its GPU type."""
        if len(placement) != gpus or len(set(placement)) != gpus:
            raise SimulationError(
                f"plan gives job {job.trace.job_id} {gpus} GPU(s) but places it on {placement}"
            )
        fleet = self._fleet
        for node, index in placement:
            if node not in self._node_index or not 0 <= index < (
                self.cfg.gpus_per_node if fleet is None else fleet.node_gpus(node)
            ):
                raise SimulationError(
                    f"plan places job {job.trace.job_id} on no GPU {node}/{index}"
                )
            if node in down:
                raise SimulationError(
                    f"plan places job {job.trace.job_id} on powered-down node {node}"
                )
        return self._clocks if fleet is None else fleet.type_of(job.trace.job_id, placement).clocks

    def _release(self, job: SimJob) -> None:
        if not job.holding:
            return
        self._finish_profile(job, complete=False)
        job.set_plan(None)
        job.cap_w = job.measured_w = job.measured_f = None
        job.preemptions += 1
        self._phase(job, Phase.QUEUED)
        job.placement = ()
        job.n = 0
        job.phase_end_s = job.next_event_s = math.inf

    def _assign(self, job: SimJob, placement: tuple[GpuSlot, ...], f: int, bs: float) -> None:
        self._stale_views.add(job.index)  # its clock or placement changes
        # the same GPUs (the same tuple, as a plan with a new clock or cap has it):
        # the tuples compared first, 0.281 s of _assign in a fitted run against 0.295 s
        # building both sets (medians of six runs)
        if job.holding and (placement == job.placement or set(placement) == set(job.placement)):
            job.f = f
            job.bs = bs
            if job.computing:
                self._set_rates(job)  # a new clock or cap
            return
        job.measured_w = job.measured_f = None  # measured on other GPUs
        restart = job.holding or job.started
        if job.holding:
            self._finish_profile(job, complete=False)
            if len(placement) != job.n:
                job.rescales += 1
            else:
                job.migrations += 1
        if self._fleet is not None:
            self._fleet.move(job, placement)  # onto another GPU type: what it learned there
        job.placement = tuple(placement)
        job.n = len(placement)
        per_node: dict[str, int] = {}
        for node, _ in placement:
            per_node[node] = per_node.get(node, 0) + 1
        job.r = max(per_node.values())
        job.f = f
        job.bs = bs
        ready = max(self._power_on(node) for node in per_node)  # off nodes boot first
        restarting = restart and self.cfg.restart_s > 0
        if restarting or ready > self.now + EPS:
            # holding its GPUs, not computing: a checkpoint restart, a boot or both
            if restarting:
                job.restarts += 1
            self._phase(job, Phase.RESTART)
            job.phase_end_s = max(self.now + (self.cfg.restart_s if restarting else 0.0), ready)
            job.step_s, job.power_w = math.inf, 0.0
        else:
            self._start_compute(job)

    def _start_compute(self, job: SimJob) -> None:
        job.started = True
        if self.profiling.profile_s > 0 and job.n not in job.profiled:
            self._phase(job, Phase.PROFILE)
            job.profilings += 1
            job.profile_start_s = self.now
            job.phase_end_s = self.now + self.profiling.profile_s
            job.profile_clocks = job.on.profile_clocks
        else:
            self._phase(job, Phase.RUN)
            job.phase_end_s = math.inf
        self._set_rates(job)

    def _set_rates(self, job: SimJob) -> None:
        """Rates at the clocks the job's GPUs really run (its cap may hold them lower);
        a job running at its planned clock is measured there."""
        self._power_dirty = True
        name = job.trace.model_name
        rates = job.on.rates
        a = self._arrays
        i = job.index
        if job.phase is Phase.PROFILE:
            clocks = self._swept_clocks(job)
            a.step[i], a.power[i] = rates.sweep(name, job.n, job.r, job.bs, clocks)
            a.peak[i] = rates.peak(name, job.n, job.r, job.bs, clocks)
        else:
            f = rates.capped(name, job.n, job.r, job.bs, job.f, self._board_cap_w(job))
            a.step[i], power = rates.rate(name, job.n, job.r, job.bs, f)
            a.power[i] = a.peak[i] = power
            if job.phase is Phase.RUN and (job.measured_f != f or job.measured_w is None):
                self._measure(job, f)

    def _measure(self, job: SimJob, f: int) -> None:
        """One ``MEASURE_WINDOW_S`` window of the job at clock ``f``, with the profiler's
        noise (``powerflow.lab.groundtruth.measure``), as the node agent reports it."""
        iterations = max(1.0, MEASURE_WINDOW_S / job.step_s)
        # The truth there is what ``rate`` just read for the job's rates (its type's).
        clean = job.on.rates.clean(job.trace.model_name, job.n, job.r, job.bs, f)
        job.measured_w = noisy_power_w(
            clean,
            job.n,
            job.r,
            job.bs,
            float(f),
            rng=self._meter,
            noise=self.cfg.noise,
            iterations=iterations,
        )
        job.measured_f = f
        self._stale_views.add(job.index)

    def _board_cap_w(self, job: SimJob) -> float | None:
        """The power limit the job's GPUs really get: the node agent clamps the plan's
        cap into the board's range (``nodeagent.settings.clamp_power_w``), and a board
        without a settable limit (``min_power_limit_w`` None) keeps its default."""
        gpu = job.on.gpu
        if job.cap_w is None or gpu.min_power_limit_w is None:
            return None
        return min(max(job.cap_w, gpu.min_power_limit_w), gpu.max_power_w)

    def _swept_clocks(self, job: SimJob) -> tuple[int, ...]:
        """The clocks a profiling job's slices really run: each planned one under its cap."""
        cap = self._board_cap_w(job)
        if cap is None:
            return job.profile_clocks
        name, n, r, bs = job.trace.model_name, job.n, job.r, job.bs
        return job.on.rates.capped_each(name, n, r, bs, job.profile_clocks, cap)

    def _finish_profile(self, job: SimJob, *, complete: bool, refit: bool = True) -> None:
        """Collect the samples of the slices run so far; refit if any arrived
        (not for a job that just finished: nobody would use the model)."""
        if job.phase is not Phase.PROFILE:
            return
        clocks = job.profile_clocks
        slice_s = self.profiling.profile_s / len(clocks)
        done = len(clocks) if complete else int((self.now - job.profile_start_s + EPS) // slice_s)
        if complete:
            job.profiled.add(job.n)
        if done <= 0:
            return
        per_slice = max(1, int(slice_s / self.cfg.sample_window_s + EPS))  # full windows
        f = np.repeat(np.asarray(self._swept_clocks(job)[:done], dtype=np.float64), per_slice)
        job.samples.append(
            self.world.measure(
                job.truth, job.n, job.r, job.bs, f, rng=job.rng, noise=self.cfg.noise
            )
        )
        known = job.knowledge
        if known is not None and refit:
            t0 = time.perf_counter()
            job.knowledge = job.on.learner.update(
                job.trace.model_name, job.truth, known, _joined(job.samples)
            )
            self._totals.fit_s += time.perf_counter() - t0
            if job.knowledge.model is not known.model:
                self._stale_views.add(job.index)

    def _phase(self, job: SimJob, phase: Phase) -> None:
        """Change phase and keep the holders and the per-GPU load in step
        (every placement change is followed by a call here). The holders'
        rows change only when a job starts or stops holding or computing (a
        holder stays where it is in ``_holders``)."""
        holding, computing = job.holding, job.computing
        job.set_phase(phase)
        self._stale_views.add(job.index)  # pinned, and the clock only while holding
        if phase is Phase.PROFILE:
            self._profiling.add(job.index)
        else:
            self._profiling.discard(job.index)
        if job.holding is not holding:
            self._slots_dirty = True
        elif job.computing is not computing:
            self._computing_dirty = True
        self._power_dirty = True
        if job.holding:
            self._holders[job.index] = job
            if job.counted is not job.placement:
                self._uncount(job)
                self._count(job)
        else:
            self._holders.pop(job.index, None)
            if job.counted:
                self._uncount(job)

    def _count(self, job: SimJob) -> None:
        load = self._load
        occupants = self._occupants
        stale = self._stale
        nodes = self._node_load
        for slot in job.placement:
            load[slot] = load.get(slot, 0) + 1
            nodes[slot[0]] = nodes.get(slot[0], 0) + 1
            here = occupants.setdefault(slot, set())
            here.add(job.index)
            stale.update(here)
        job.counted = job.placement
        self._shares_dirty = True

    def _uncount(self, job: SimJob) -> None:
        load = self._load
        occupants = self._occupants
        stale = self._stale
        nodes = self._node_load
        for slot in job.counted:
            left = nodes[slot[0]] - 1
            if left:
                nodes[slot[0]] = left
            else:
                del nodes[slot[0]]
            k = load[slot] - 1
            here = occupants[slot]
            here.discard(job.index)
            if k:
                load[slot] = k
                stale.update(here)
            else:
                del load[slot]
                del occupants[slot]
        job.counted = ()
        self._shares_dirty = True

    # ---------------------------------------------------------------- accounting

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt < -EPS:
            raise SimulationError(f"time went backwards: {self.now} -> {t}")
        if dt > 0:
            self._progress(dt)
            tot = self._totals
            if self._ready:
                self._booting(t)
            powered = self._powered_gpus()
            idle_w = self._idle_w(powered)
            if self._fleet is not None:
                self._fleet.account(dt, self._fleet.powered(self._off))
            tot.active_j += dt * self._active_w
            tot.idle_j += dt * idle_w
            tot.busy_gpu_s += dt * self._busy_gpus
            tot.held_gpu_s += dt * self._held_gpus
            tot.powered_gpu_s += dt * powered
            limit = self._limit_w
            over = self._active_w + self._peak_extra_w + idle_w - limit
            if over > limit * 1e-9:
                # Measured from the ground truth's power, never from a model:
                # the admin's question is what the cluster drew.
                tot.above_limit_s += dt
                tot.above_limit_j += dt * over
                tot.max_over_w = max(tot.max_over_w, over)
                if limit > 0:
                    tot.max_over_pct = max(tot.max_over_pct, 100.0 * over / limit)
                else:
                    tot.max_over_pct = math.inf
        self.now = max(t, self.now)

    def _booting(self, t: float) -> None:
        """The power-on energy from now to ``t``: a booting node's GPUs draw idle
        power (counted with the idle energy, as a node that is on; this is the
        part of it spent booting); nodes ready by ``t`` are done booting."""
        per_node_w = self.cfg.gpus_per_node * self.cfg.gpu.idle_power_w
        fleet = self._fleet
        done = []
        for name, ready in self._ready.items():
            if ready > self.now:
                node_w = per_node_w if fleet is None else fleet.boot_w(name)
                self._totals.power_on_j += (min(t, ready) - self.now) * node_w
            if ready <= t:
                done.append(name)
        for name in done:
            del self._ready[name]

    def _progress(self, dt: float) -> None:
        """Every holder's held time, and every computing one's work and energy,
        ``dt`` seconds on (the same float operations as job by job)."""
        held, computing = self._slots()
        kernels.advance(held, computing, dt, self._arrays.floats)

    def _due(self, due: float) -> list[SimJob]:
        """Holders whose next event is at ``due`` or before, in ``_holders`` order."""
        held, _ = self._slots()
        return [self.jobs[i] for i in held[self._arrays.next_event[held] <= due].tolist()]

    def _slots(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the holders (in ``_holders`` order) and of the computing ones."""
        if self._slots_dirty:
            self._held = np.fromiter(self._holders, dtype=np.intp, count=len(self._holders))
            self._slots_dirty = False
            self._computing_dirty = True
        if self._computing_dirty:
            held = self._held
            self._computing = held[self._arrays.computing[held]]
            self._computing_dirty = False
        return self._held, self._computing

    def _powered_gpus(self) -> int:
        if self._fleet is not None:
            return int(self._fleet.powered(self._off).sum())
        return (self.cfg.nodes - len(self._off)) * self.cfg.gpus_per_node

    def _idle_w(self, powered: int) -> float:
        """What the ``powered`` GPUs on and not computing draw (each type's idle power)."""
        if self._fleet is not None:
            return self._fleet.idle_w(self._fleet.powered(self._off))
        return (powered - self._busy_gpus) * self.cfg.gpu.idle_power_w

    def _refresh(self) -> None:
        """Recompute shares, cluster power and every job's next event.

        Shares change only when a job starts or stops holding GPUs or moves
        (``_phase`` keeps the per-GPU load), power only when shares, rates or
        phases do (the dirty flags); the power sums then add the jobs' terms
        one by one in ``_holders`` order, as a loop over the jobs would. Next
        events depend on progress, so they are recomputed every time, all
        holders in one compiled pass (``kernels``).
        """
        held, computing = self._slots()
        a = self._arrays
        if self._shares_dirty:
            # A job's share is 1 / the most jobs on any of its GPUs; only jobs
            # on GPUs whose load changed need it again (_count, _uncount).
            count = self._load.__getitem__
            jobs = self.jobs
            for i in self._stale:
                job = jobs[i]
                if job.holding:
                    job.share = 1.0 / max(map(count, job.placement))
            self._stale.clear()
            self._held_gpus = len(self._load)
            self._shares_dirty = False
            self._power_dirty = True
        if self._power_dirty:
            self._active_w, self._busy_gpus = kernels.draw(computing, a.floats)
            if self._fleet is not None:
                self._fleet.draw(self.jobs, computing, self._load)
            # Each profiling job's term as a job-by-job pass computes it (numpy's
            # elementwise products are the same IEEE operations), summed by sum()
            # in _profiling's order; the columns spare two attribute reads per job:
            # _refresh 0.111 s of a fitted run of the default trace against 0.127 s
            # (process_time around it inside run_one, best of 6 runs, alternated).
            profiling = self._profiling
            rows = np.fromiter(profiling, dtype=np.intp, count=len(profiling))
            extra = a.share[rows] * (a.peak[rows] - a.power[rows])
            self._peak_extra_w = sum(extra.tolist())
            self._power_dirty = False
        self._next_job_s = kernels.next_events(held, computing, self.now, a.floats, a.flags)
        self._record()

    def _record(self) -> None:
        idle_w = self._idle_w(self._powered_gpus())
        point = (
            self.now,
            self._active_w + idle_w,
            self._busy_gpus,
            float(self._powered_gpus()),
            self._held_gpus,
            len(self._active) - len(self._preruns) - len(self._holders),
            self._limit_w,
        )
        if self._series and self._series[-1][0] == self.now:
            self._series[-1] = point
        else:
            self._series.append(point)

    # ------------------------------------------------------------------- output

    def _view(self, job: SimJob, progress: tuple[float, float, float] | None = None) -> Job:
        """The job's view anew: ``_fresh_view``'s fields set on a copy of its
        last view (``_with_changes``), or ``_fresh_view`` for its first.
        ``progress``: its remaining iterations, seconds and GPU-seconds held as
        ``kernels.progress_rows`` gave them for a holder (else read from the job):
        ``_view`` takes 0.096-0.100 s of a fitted run of the default trace against
        0.126-0.130 s reading them back (``time.process_time`` around it inside
        ``run_one(RunSpec("powerflow", 0.6))``, three runs each)."""
        knowledge = job.knowledge
        assert knowledge is not None
        old = self._views[job.index]
        if old is None:
            view = self._fresh_view(job)
        else:
            if progress is None:
                progress = (max(job.remaining, 1e-9), job.run_s, job.attained_gpu_s)
            remaining, run_s, attained_s = progress
            view = _with_changes(
                old,
                knowledge.model,
                remaining,
                run_s,
                job.placement,
                job.f if job.holding else None,
                attained_s,
                job.phase in (Phase.RESTART, Phase.PROFILE),
            )
            _measured(view, job, self._profiled_of(job))
        if self._fleet is not None:  # a fresh object: what it is on every type
            self._fleet.on_every_type(view, job, knowledge.model)
        return view

    def _profiled_of(self, job: SimJob) -> frozenset[int] | None:
        """The GPU counts the job has profiled (None: this scheduler does not profile)."""
        return frozenset(job.profiled) if self.profiling.profile_s > 0 else None

    def _fresh_view(self, job: SimJob) -> Job:
        """The policy's frozen view of a job, built afresh.

        ``elapsed_s`` is the time the job has held GPUs (its age is
        ``now_s - arrival_s``); ``attained_gpu_s`` is GPU-seconds held, which
        Tiresias's LAS ranks on. ``snapshot`` reuses or copies views where
        only progress changed.
        """
        knowledge = job.knowledge
        assert knowledge is not None
        model = knowledge.model
        tj = job.trace
        return Job(
            id=tj.job_id,
            model=model,
            remaining_iterations=max(job.remaining, 1e-9),
            global_batch_size=tj.global_batch_size,
            requested_gpus=tj.num_gpu,
            arrival_s=tj.submit_s,
            elapsed_s=job.run_s,
            placement=job.placement,
            frequency_mhz=job.f if job.holding else None,
            attained_gpu_s=job.attained_gpu_s,
            model_name=tj.model_name,
            pinned=job.phase in (Phase.RESTART, Phase.PROFILE),
            measured_power_w=job.measured_w,
            measured_frequency_mhz=job.measured_f,
            profiled_gpus=self._profiled_of(job),
            power_cap_w=job.cap_w if job.holding else None,
        )

    def _result(self, wall_s: float) -> RunResult:
        records = tuple(
            JobRecord(
                job_id=j.trace.job_id,
                model_name=j.trace.model_name,
                requested_gpus=j.trace.num_gpu,
                submit_s=j.trace.submit_s,
                finish_s=j.finish_s,
                energy_j=j.energy_j + j.prerun_energy_j,
                attained_gpu_s=j.attained_gpu_s,
                rescales=j.rescales,
                migrations=j.migrations,
                preemptions=j.preemptions,
                restarts=j.restarts,
                profilings=j.profilings,
                fits=self._fleet.fits(j)
                if self._fleet
                else (j.knowledge.fits if j.knowledge else 0),
            )
            for j in self.jobs
        )
        arr = np.asarray(self._series, dtype=np.float64)
        series = Series(
            t_s=arr[:, 0],
            power_w=arr[:, 1],
            busy_gpus=arr[:, 2],
            powered_gpus=arr[:, 3],
            held_gpus=arr[:, 4],
            queued_jobs=arr[:, 5],
            limit_w=arr[:, 6],
        )
        tot = self._totals
        return RunResult(
            jobs=records,
            series=series,
            total_gpus=self.cfg.total_gpus,
            active_energy_j=tot.active_j,
            idle_energy_j=tot.idle_j,
            prerun_energy_j=tot.prerun_j,
            busy_gpu_s=tot.busy_gpu_s,
            held_gpu_s=tot.held_gpu_s,
            powered_gpu_s=tot.powered_gpu_s,
            above_limit_s=tot.above_limit_s,
            above_limit_j=tot.above_limit_j,
            max_overshoot_w=tot.max_over_w,
            max_overshoot_pct=tot.max_over_pct,
            limit_w=tot.lowest_limit_w,
            policy_calls=tot.policy_calls,
            policy_s=tot.policy_s,
            fit_s=tot.fit_s,
            events=tot.events,
            wall_s=wall_s,
            power_ons=tot.power_ons,
            power_on_energy_j=tot.power_on_j,
            by_gpu=() if self._fleet is None else self._fleet.totals(),
        )


_new_object = object.__new__
_set_field = object.__setattr__
_set_view_dict = Job.__dict__["__dict__"].__set__
"""Installs an instance dictionary on a ``Job``: what ``object.__setattr__(view,
"__dict__", d)`` ends in, without looking the attribute up: ``snapshot``'s copies of
the holders' views (its CPU less ``_view`` and ``_power_ratio``) take 0.250-0.263 s
of a Gandiva run of the default trace against 0.264-0.275 s (``process_time``
inside ``run_one(RunSpec("gandiva", 1410.0))``, 6 runs each, alternated)."""


def _unshared() -> int:
    """What ``sys.getrefcount`` says of a dictionary's value held by that dictionary
    alone, asked as ``snapshot`` asks it (of the looked-up value itself, never of a
    local name: an interpreter may load a local without counting it); -1 where the
    count is unknown or not 2 (another Python), which turns the in-place update off.

    ``snapshot`` updates a holder's last view in place when its count says only
    ``_views`` holds it, rather than copying it: in a Gandiva run of the default
    trace (566k holder views) ``snapshot`` takes 0.15-0.23 s against 0.27-0.33 s
    copying each (``process_time`` around it inside ``simulate(RunSpec("gandiva",
    1410.0))``, six runs each, alternated, on a shared machine), the whole run
    2.02-2.09 s of CPU against 2.14-2.21 s; a fitted PowerFlow run's 0.22-0.24 s
    against 0.28-0.34 s. Asking for weak references too costs no measurable time.
    tests/test_sim_fastpaths.py checks that a view a policy keeps never changes, that
    views nobody keeps are reused, and that runs match fresh views bit for bit.
    """
    refcount = getattr(sys, "getrefcount", None)
    if refcount is None:
        return -1
    probe = {0: object()}
    count = int(refcount(probe[0]))
    return count if count == 2 else -1


_UNSHARED_REFS = _unshared()
_refcount = getattr(sys, "getrefcount", lambda _: -2)


def _with_changes(
    view: Job,
    model: PerfModel,
    remaining: float,
    elapsed_s: float,
    placement: tuple[GpuSlot, ...],
    frequency_mhz: int | None,
    attained_gpu_s: float,
    pinned: bool,
) -> Job:
    """``dataclasses.replace(view, ...)`` for every field of a job's view that
    can change while it runs (the others, set once by ``_fresh_view``, are
    copied), without running ``Job.__init__``: a frozen dataclass sets each
    field through ``object.__setattr__``, and copying the instance dictionary
    and installing the copy is several times cheaper (``Job`` has no
    ``__post_init__`` to skip)."""
    fields = view.__dict__.copy()
    fields["model"] = model
    fields["remaining_iterations"] = remaining
    fields["elapsed_s"] = elapsed_s
    fields["placement"] = placement
    fields["frequency_mhz"] = frequency_mhz
    fields["attained_gpu_s"] = attained_gpu_s
    fields["pinned"] = pinned
    out = _new_object(Job)
    _set_field(out, "__dict__", fields)
    return out


def _measured(view: Job, job: SimJob, profiled: frozenset[int] | None) -> None:
    """Set the power loop's fields of a fresh copy ``view`` (``_with_changes``'s)."""
    fields = view.__dict__
    fields["measured_power_w"] = job.measured_w
    fields["measured_frequency_mhz"] = job.measured_f
    fields["profiled_gpus"] = profiled
    fields["power_cap_w"] = job.cap_w if job.holding else None


def _joined(parts: list[Samples]) -> Samples:
    """All of a job's samples as one, kept as its only part: each profile
    adds one part and each refit needs them all, so the list never grows
    past two (one part alone is already what joining gives)."""
    if len(parts) > 1:
        parts[:] = [Samples.concat(parts)]
    return parts[0]
