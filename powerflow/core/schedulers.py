"""The schedulers the operator runs, by name: how to build each policy and what it profiles.

PowerFlow and PowerFlow+ are policies of the core; a ``SchedulerSpec`` says
everything that differs between schedulers as data (the knob a sweep turns,
the budget, the profiling it pays for: PowerFlow's pre-run and per-GPU-count
profiling), so the operator and the simulator look a scheduler up and never
branch on its name. The lab's registry (``powerflow.lab.schedulers``) adds the
baselines it compares with, which the operator does not run.

Policies are imported inside the factories so that this table loads even
while a policy module is absent or broken; only building that one fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from powerflow.core.errors import SimulationError
from powerflow.core.policy.snapshot import Budget, Policy
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep

PRERUN_S = 240.0
"""PowerFlow pre-runs each job for about four minutes on one GPU (paper §5.1)."""

PROFILE_S = 240.0
"""A first run on a new GPU count sweeps the clocks for four minutes (paper §5.2)."""

DEFAULT_ETAS = (0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Profiling:
    """What profiling a scheduler's jobs go through, and what it is charged.

    ``prerun_s``: seconds a job runs offline on one GPU sweeping clocks before
    it becomes schedulable (counted in its JCT and the energy).
    ``profile_s``: seconds of a job's first run at each GPU count spent sliced
    across the clocks of ``sweep`` (the job makes progress meanwhile).
    ``fitted_models``: the policy sees models fitted to the samples so far;
    otherwise it sees the ground truth (a scheduler that measures directly,
    like Zeus, or one given perfect knowledge, like the baselines).
    """

    prerun_s: float = 0.0
    profile_s: float = 0.0
    fitted_models: bool = False
    sweep: ClockSweep = PAPER_SWEEP


ORACLE = Profiling()
"""No profiling, ground-truth models: the paper's "pre-profiled" case (Fig. 10)."""


@dataclass(frozen=True)
class Configured:
    """A policy ready to run, with the budget it is given and its profiling."""

    policy: Policy
    budget: Budget
    profiling: Profiling
    knob: str | None
    value: float | None


@dataclass(frozen=True)
class SchedulerSpec:
    """One scheduler: its factory and the knob a sweep turns."""

    name: str
    description: str
    knob: str | None
    """``"eta"``, ``"frequency_mhz"``, ``"eta_knob"`` (Zeus's energy-vs-time
    preference) or ``None`` (a single operating point)."""
    build_policy: Callable[[float | None], Policy]
    budget: Callable[[float | None], Budget]
    profiling: Profiling
    sweep: tuple[float, ...] = field(default=())
    is_baseline: bool = True
    compared: bool = True
    """In the default comparison; ``False``: reachable by name only (a variant)."""
    default: float | None = None
    """The knob's value when none is given; ``None``: the sweep's last (the top clock,
    eta 1). Zeus's is its own default ``eta_knob``, inside its sweep, not at its end."""

    @property
    def default_value(self) -> float | None:
        """What a run without a knob value runs at (``None`` for a knobless scheduler)."""
        if self.knob is None:
            return None
        return self.default if self.default is not None else self.sweep[-1]

    def configure(self, value: float | None = None, *, oracle: bool = False) -> Configured:
        if self.knob is None and value is not None:
            raise SimulationError(f"{self.name} has no knob to set")
        if value is None:
            value = self.default_value
        return Configured(
            self.build_policy(value),
            self.budget(value),
            ORACLE if oracle else self.profiling,
            self.knob,
            value,
        )


def _eta_budget(value: float | None) -> Budget:
    return Budget(eta=value)


def _powerflow(**options: bool) -> Callable[[float | None], Policy]:
    def build(_: float | None) -> Policy:
        from powerflow.core.policy.powerflow import PowerFlowPolicy

        return PowerFlowPolicy(**options)

    return build


PLUS_BUDGET_PRICE = 0.05
"""PowerFlow+'s floor on a step's priority grows by this times ``1 / eta - 1``
(chosen on the tuning windows first: ``powerflow sweep plus-tuning``; docs/policy.md,
"Chosen on the tuning windows")."""
PLUS_RESCALE_COST_S = 30.0
"""PowerFlow+'s checkpoint-restart estimate: the simulator's default ``restart_s`` (a
simulated run counts its own ``restart_s`` instead: ``runner.with_restart_estimate``)."""
PLUS_RESCALE_MARGIN = 8.0
"""PowerFlow+'s hysteresis: a rescale must gain nine times its cost. Chosen on the
tuning windows with ``PLUS_SHORT_FIRST`` (``powerflow sweep plus-tuning --grid
short-first``): the margins 2, 4 and 8 tie on the score and 8 restarts jobs least
(docs/policy.md, "Short first")."""
PLUS_SHORT_FIRST = 0.5
"""The exponent of PowerFlow+'s short-first factor on a doubling's ``dJCT / dE``
(``returns.py``): the best of 0, 0.5 and 1 on the tuning windows, after the budget
price (chosen first, ``powerflow sweep plus-tuning``) and the profiling ladder."""


def _powerflow_plus(_: float | None) -> Policy:
    """PowerFlow+ (docs/policy.md, "PowerFlow+", gives the experiment behind each value)."""
    from powerflow.core.policy.powerflow import PowerFlowPolicy

    return PowerFlowPolicy(
        budget_price=PLUS_BUDGET_PRICE,
        rescale_cost_s=PLUS_RESCALE_COST_S,
        rescale_margin=PLUS_RESCALE_MARGIN,
        short_first=PLUS_SHORT_FIRST,
    )


PLUS_PROFILE_SWEEP = ClockSweep(stride=4, lowest_fraction=0.5)
"""PowerFlow+ sweeps every 4th clock from the top down to half the top clock
(A100: 750-1410 MHz, 12 clocks; the paper's ladder has 21 from 210 MHz). The
policy runs a job at its most energy-efficient clock or above, so slices far
below it measure clocks no plan uses, at a fraction of the speed. Chosen with
``PLUS_PROFILE_S`` and no pre-run on the tuning windows (``powerflow sweep
plus-tuning --grid profiling``; docs/policy.md, "Chosen on the tuning windows")."""
PLUS_PROFILE_S = 138.0
"""Twelve slices of 11.5 s, the paper's slice length (240 s over 21 clocks)."""


POWERFLOW_PROFILING = Profiling(prerun_s=PRERUN_S, profile_s=PROFILE_S, fitted_models=True)
PLUS_PROFILING = Profiling(profile_s=PLUS_PROFILE_S, fitted_models=True, sweep=PLUS_PROFILE_SWEEP)
"""No offline pre-run: as the operator does, a job is schedulable at once with
its prior, and its first GPU count's profile is its first sweep."""

POWERFLOW_SCHEDULERS: dict[str, SchedulerSpec] = {
    spec.name: spec
    for spec in (
        SchedulerSpec(
            "powerflow",
            "PowerFlow: energy-aware, elastic, frequency scaling (paper §5)",
            "eta",
            _powerflow(),
            _eta_budget,
            POWERFLOW_PROFILING,
            DEFAULT_ETAS,
            is_baseline=False,
        ),
        SchedulerSpec(
            "powerflow+",
            "PowerFlow+: PowerFlow with a floor on marginal returns and the rescale cost"
            " in its priorities (docs/policy.md)",
            "eta",
            _powerflow_plus,
            _eta_budget,
            PLUS_PROFILING,
            DEFAULT_ETAS,
            is_baseline=False,
        ),
    )
}
"""What the operator's ``--scheduler`` offers."""


def lookup(table: dict[str, SchedulerSpec], name: str) -> SchedulerSpec:
    """Look ``name`` up in ``table``, with the list of names on a miss."""
    try:
        return table[name.lower()]
    except KeyError:
        raise SimulationError(f"unknown scheduler {name!r}; known: {', '.join(table)}") from None


def scheduler(name: str) -> SchedulerSpec:
    """One of PowerFlow's schedulers by name (``POWERFLOW_SCHEDULERS``)."""
    return lookup(POWERFLOW_SCHEDULERS, name)
