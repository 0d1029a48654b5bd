"""Run configurations, one or many (in worker processes), and keep what plots need.

A ``RunSpec`` is plain, picklable data: worker processes rebuild the trace,
the world and the policy from it, so nothing stateful crosses a process
boundary.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from powerflow.core.budget_schedule import BudgetSchedule
from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.learning import FittedLearner
from powerflow.core.models.priors import load_prior
from powerflow.core.profiling import ClockSweep
from powerflow.lab.schedulers import Configured, Profiling, scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import reference_durations_s, reference_work_gpu_s, summarise
from powerflow.lab.sim.priors import HELD_OUT, PRIORS, RECURRING
from powerflow.lab.sim.result import RunResult, Series
from powerflow.lab.sim.synthetic import SyntheticSpec, generate
from powerflow.lab.sim.trace import (
    ITP_TRACE,
    ReplayCluster,
    TraceJob,
    bundled_trace,
    load_trace,
)
from powerflow.lab.sim.windows import window_named, window_trace
from powerflow.lab.sim.world import World, default_world

PLOT_POINTS = 2000
"""Power/allocation series are resampled to this many points for plots."""


@dataclass(frozen=True)
class TraceSpec:
    """Which jobs: a trace file (default: the bundled ITP window), a named window
    of the whole ElasticFlow trace (``windows``: ``d14``), optionally cut to its
    first ``hours``, or a synthetic trace; ``max_duration_h`` drops the jobs that
    take longer than that (``metrics.reference_durations_s``)."""

    path: str | None = None
    hours: float | None = None
    synthetic: SyntheticSpec | None = None
    seed: int = 0
    max_duration_h: float | None = None
    window: str | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            if self.path is not None or self.synthetic is not None:
                raise SimulationError("a trace window is a trace: give a window or a file")
            window_named(self.window)  # an unknown name refused here, not in a worker

    def describe(self) -> str:
        if self.synthetic is not None:
            s = self.synthetic
            text = f"synthetic({s.jobs} jobs, {s.mean_interval_s:.0f} s, x{s.job_size:g})"
        elif self.window is not None:
            w = window_named(self.window)
            text = f"ElasticFlow window {w.name} ({w.hours:g} h from {w.start_s:,} s)"
            text += f" (first {self.hours:g} h)" if self.hours else ""
        else:
            name = Path(self.path).name if self.path else ITP_TRACE
            text = name + (f" (first {self.hours:g} h)" if self.hours else "")
        if self.max_duration_h is not None:
            text += f" without jobs longer than {self.max_duration_h:g} h"
        return text


@dataclass(frozen=True)
class RunSpec:
    scheduler: str
    value: float | None = None
    trace: TraceSpec = field(default_factory=TraceSpec)
    config: SimConfig = field(default_factory=SimConfig)
    oracle: bool = False
    tag: str = ""
    """Free-form label of the experiment this run belongs to (e.g. a sensitivity axis)."""
    budget_schedule: BudgetSchedule | None = None
    """The budget over the (simulated) day, in place of the knob's fixed budget."""
    policy_options: tuple[tuple[str, Any], ...] = ()
    """Constructor options of the scheduler's policy to change, as (name, value) pairs
    (e.g. PowerFlow's ``strict_power``); empty: the scheduler's own."""
    priors: str = HELD_OUT
    """Where a fitted run's jobs start (``PRIORS``); the ground truth's runs and the
    schedulers that fit no model ignore it."""

    def __post_init__(self) -> None:
        if self.priors not in PRIORS:
            raise SimulationError(f"priors {self.priors!r}: expected one of {', '.join(PRIORS)}")

    @property
    def fits_models(self) -> bool:
        """Whether this run's scheduler learns its models online from priors."""
        return scheduler(self.scheduler).profiling.fitted_models and not self.oracle

    @property
    def knob_value(self) -> float | None:
        """The knob's value this run runs at: ``value``, else the scheduler's default,
        where a clock's default is the top clock of the cluster's GPU type (None on a
        mixed cluster: each pool's type runs its own top clock)."""
        if self.value is not None:
            return self.value
        spec = scheduler(self.scheduler)
        if spec.knob == "frequency_mhz":
            return None if self.config.mixed else self.config.gpu.max_clock_mhz
        return spec.default_value

    @property
    def label(self) -> str:
        spec = scheduler(self.scheduler)
        text = self.scheduler
        value = self.knob_value
        if spec.knob == "eta":
            text += f" eta={value:g}"
        elif spec.knob == "eta_knob":
            text += f" eta_knob={value:g}"
        elif spec.knob == "frequency_mhz":
            text += " at each type's top clock" if value is None else f" {value:.0f} MHz"
        if self.budget_schedule is not None and self.budget_schedule.windows:
            text += f" (schedule {self.budget_schedule.describe()})"
        if self.oracle:
            return text + " (oracle)"
        return text + (" (recurring)" if self.priors == RECURRING and self.fits_models else "")


@dataclass(frozen=True)
class RunOutcome:
    spec: RunSpec
    metrics: dict[str, Any]
    series: Series

    def row(self) -> dict[str, Any]:
        """The run as one flat row: what it was, then what it measured."""
        spec = scheduler(self.spec.scheduler)
        head: dict[str, Any] = {"scheduler": self.spec.scheduler}
        if spec.knob is not None:
            head[spec.knob] = self.spec.knob_value
        head["oracle"] = self.spec.oracle
        if self.spec.config.mixed:
            head["nodes"] = self.spec.config.describe_nodes()
        elif self.spec.config.gpu != A100:
            head["gpu"] = self.spec.config.gpu.name
        if self.spec.fits_models:
            head["priors"] = self.spec.priors
        head["idle_nodes_off"] = self.spec.config.idle_nodes_off
        if self.spec.tag:
            head["tag"] = self.spec.tag
        if self.spec.budget_schedule is not None:
            head["budget_schedule"] = self.spec.budget_schedule.describe()
        return {**head, **self.metrics, "below_cap_floor": self.below_cap_floor}

    @property
    def below_cap_floor(self) -> bool:
        """Whether the run's lowest power limit is below every GPU of the cluster at the
        board's lowest power cap (A100: 100 W, so eta under 0.33 of 300 W): such a
        budget cannot keep the cluster's GPUs computing, so the run queues by design
        rather than trading clock for energy. Its row is reported, but it is no point
        of an equal-energy curve (``compare.curves``)."""
        limit = self.metrics.get("limit_w")
        config = self.spec.config
        if config.mixed:
            pools = config.node_pools
            if limit is None or any(p.gpu.min_power_limit_w is None for p in pools):
                return False
            return bool(limit < sum((p.gpu.min_power_limit_w or 0.0) * p.gpus for p in pools))
        floor = config.gpu.min_power_limit_w
        if limit is None or floor is None:
            return False
        return bool(limit < floor * config.total_gpus)


@functools.cache
def _world(gpu: GpuSpec = A100) -> World:
    """The ground truth a run's jobs run on (``gpu``); the A100's also reads the
    trace (``load_jobs``) and measures its work, whatever the cluster's type."""
    return default_world(gpu)


def load_jobs(
    spec: TraceSpec, config: SimConfig, world: World | None = None
) -> tuple[TraceJob, ...]:
    """The run's jobs. By default read with the A100's ground truth on every GPU
    type: the trace's durations were measured there, so a Philly job's iterations,
    the horizon check and ``--max-duration`` are the A100's, and a faster type
    runs the same iterations in less time."""
    world = world or _world()
    jobs: tuple[TraceJob, ...]
    if spec.synthetic is not None:
        jobs = generate(
            spec.synthetic,
            world.pool,
            world.truth,
            gpus_per_node=config.gpus_per_node,
            max_gpus=config.max_job_gpus,
        )
    else:
        if spec.window is not None:
            path = window_trace(window_named(spec.window))
        else:
            path = Path(spec.path) if spec.path else bundled_trace(ITP_TRACE)
        jobs = load_trace(
            path,
            world.model_names,
            world.pool,
            world.truth,
            seed=spec.seed,
            cluster=ReplayCluster(config.gpus_per_node, config.max_job_gpus, config.horizon_s),
            hours=spec.hours,
        )
    if spec.max_duration_h is not None:
        durations = reference_durations_s(jobs, world.truth, gpus_per_node=config.gpus_per_node)
        jobs = tuple(
            j for j, d in zip(jobs, durations, strict=True) if d <= spec.max_duration_h * 3600
        )
        if not jobs:
            raise SimulationError(f"no job of the trace takes at most {spec.max_duration_h:g} h")
    return jobs


@functools.cache
def _cached_jobs(spec: TraceSpec, config: SimConfig) -> tuple[TraceJob, ...]:
    return load_jobs(spec, config)


def simulate(spec: RunSpec, world: World | None = None) -> RunResult:
    """One run, in this process."""
    configured = scheduler(spec.scheduler).configure(spec.knob_value, oracle=spec.oracle)
    if spec.policy_options:
        configured = with_options(configured, dict(spec.policy_options))
    configured = with_restart_estimate(configured, spec.config.restart_s, spec.policy_options)
    jobs = (
        load_jobs(spec.trace, spec.config, world)
        if world
        else _cached_jobs(spec.trace, spec.config)
    )
    learner = None  # the engine's default: held-out priors, or the ground truth
    if spec.priors == RECURRING and spec.fits_models:
        learner = FittedLearner(spec.config.gpu, prior=load_prior)
    return Simulation(
        jobs,
        configured,
        spec.config,
        world or _world(spec.config.gpu),
        learner,
        budget_schedule=spec.budget_schedule,
    ).run()


def with_restart_estimate(
    configured: Configured, restart_s: float, options: tuple[tuple[str, Any], ...] = ()
) -> Configured:
    """``configured`` with a policy that counts checkpoint-restarts in its priorities
    (PowerFlow+'s ``rescale_cost_s``) counting the simulated cluster's own cost,
    ``restart_s``: a run with ``--restart-s`` should not leave the policy believing the
    default. At 0 it counts none (its margin multiplies the cost, so no hysteresis
    either). A ``rescale_cost_s`` in ``options`` (a study of a wrong estimate) is kept,
    and a policy that counts none stays as it is. The operator's PowerFlow+ counts
    ``PLUS_RESCALE_COST_S``."""
    policy = configured.policy
    cost = getattr(policy, "rescale_cost_s", 0.0)
    if not cost or cost == restart_s or any(name == "rescale_cost_s" for name, _ in options):
        return configured
    rebuilt = dataclasses.replace(policy, rescale_cost_s=restart_s)  # type: ignore[type-var]
    return dataclasses.replace(configured, policy=rebuilt)


PROFILING_OPTIONS = ("prerun_s", "profile_s", "sweep_stride", "sweep_lowest")
"""Options that set a run's profiling (``Profiling``: its pre-run and per-count sweep
seconds, its ladder's stride and lowest fraction of the top clock), not its policy."""


def with_options(configured: Configured, options: dict[str, Any]) -> Configured:
    """``configured`` with its policy rebuilt with ``options`` changed (a frozen dataclass
    policy's constructor options) and its profiling with ``PROFILING_OPTIONS``; an
    option neither has is an error, and so is profiling a run that does not profile
    (the oracle's, or a baseline's)."""
    profiling = {k: v for k, v in options.items() if k in PROFILING_OPTIONS}
    options = {k: v for k, v in options.items() if k not in PROFILING_OPTIONS}
    policy = configured.policy
    known: set[str] = set()
    if dataclasses.is_dataclass(policy):
        known = {f.name for f in dataclasses.fields(policy) if f.init}
    unknown = sorted(options.keys() - known)
    if unknown:
        raise SimulationError(f"{type(policy).__name__} has no option(s) {', '.join(unknown)}")
    if options:
        rebuilt = dataclasses.replace(policy, **options)  # type: ignore[type-var]
        configured = dataclasses.replace(configured, policy=rebuilt)
    if profiling:
        configured = dataclasses.replace(
            configured, profiling=_profiling(configured.profiling, profiling)
        )
    return configured


def _profiling(profiling: Profiling, options: dict[str, Any]) -> Profiling:
    if not profiling.fitted_models:
        raise SimulationError(
            f"profiling option(s) {', '.join(sorted(options))} for a run that profiles nothing"
        )
    stride = options.get("sweep_stride", profiling.sweep.stride)
    if stride != int(stride):
        raise SimulationError(f"sweep_stride must be a whole number, not {stride:g}")
    return dataclasses.replace(
        profiling,
        prerun_s=float(options.get("prerun_s", profiling.prerun_s)),
        profile_s=float(options.get("profile_s", profiling.profile_s)),
        sweep=ClockSweep(
            int(stride), float(options.get("sweep_lowest", profiling.sweep.lowest_fraction))
        ),
    )


def run_one(spec: RunSpec) -> RunOutcome:
    result = simulate(spec)
    work = reference_work_gpu_s(
        _cached_jobs(spec.trace, spec.config),
        _world().truth,  # the A100's on every type: the same trace is the same work
        gpus_per_node=spec.config.gpus_per_node,
    )
    return RunOutcome(
        spec, summarise(result, work_gpu_s=work), resample(result.series, PLOT_POINTS)
    )


def resample(series: Series, points: int) -> Series:
    """The step function sampled on a regular grid (keeps plots and pickles small)."""
    t = series.t_s
    if len(t) <= points:
        return series
    grid = np.linspace(t[0], t[-1], points)
    idx = np.searchsorted(t, grid, side="right") - 1
    return Series(*(getattr(series, name)[idx] if name != "t_s" else grid for name in _FIELDS))


_FIELDS = ("t_s", "power_w", "busy_gpus", "powered_gpus", "held_gpus", "queued_jobs", "limit_w")


def run_many(
    specs: Sequence[RunSpec],
    *,
    workers: int | None = None,
    on_done: Callable[[int, RunOutcome], None] | None = None,
    order: Sequence[int] | None = None,
) -> list[RunOutcome]:
    """Every spec, in worker processes (default: one per core), in input order.

    ``on_done`` hears of each run as it ends, with its index in ``specs``; ``order`` is
    the order workers take the runs in (default ``start_order``)."""
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(specs) <= 1:
        out = []
        for index, spec in enumerate(specs):
            outcome = run_one(spec)
            if on_done:
                on_done(index, outcome)
            out.append(outcome)
        return out
    results: dict[int, RunOutcome] = {}
    if order is None:
        order = start_order(specs)
    elif sorted(order) != list(range(len(specs))):
        raise SimulationError(f"run order {list(order)} is not each of {len(specs)} runs once")
    # Never more processes than runs: a fork-started pool forks all of them at once
    # (--workers 10000 forked ten thousand copies for a 40-run comparison).
    with ProcessPoolExecutor(max_workers=min(workers, len(specs))) as pool:
        futures = {pool.submit(run_one, specs[i]): i for i in order}
        for future in as_completed(futures):
            outcome = future.result()
            index = futures[future]
            results[index] = outcome
            if on_done:
                on_done(index, outcome)
    return [results[i] for i in range(len(specs))]


def start_order(specs: Sequence[RunSpec]) -> list[int]:
    """The order ``run_many`` hands ``specs`` to its workers: longest first (by
    ``_cost_hint``, ties in input order), which keeps every core busy to the end."""
    return sorted(range(len(specs)), key=lambda i: _cost_hint(specs[i]), reverse=True)


def _cost_hint(spec: RunSpec) -> float:
    """Relative cost guess for handing runs to workers, longest first: a run that fits
    models, then one of the same scheduler on the ground truth (its policy without the
    fitting), then the rest. On the default comparison these take about 5.5, 3.3 and
    1.8 s each (``wall_s`` of ``powerflow simulate --json``, 2 cores). Counted among
    the cheap ones, the four oracle runs would start last and one core would wait
    for most of one at the end."""
    if not scheduler(spec.scheduler).profiling.fitted_models:
        return 1.0
    return 1.8 if spec.oracle else 3.0
