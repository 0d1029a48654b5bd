"""Every scheduler by name: how to build its policy and what it must profile.

The simulator and the operator look a scheduler up here and never
branch on its name: whatever differs between schedulers is data in its
``SchedulerSpec``: the knob its sweep turns (PowerFlow's ``eta``, a
baseline's cluster-wide clock), the budget it is given, and the profiling it
pays for (PowerFlow's pre-run and per-GPU-count profiling; Zeus's just-in-time
power-limit sweep in a job's first minutes).

Policies are imported inside the factories so that this table loads even
while a policy module is absent or broken; only building that one fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from powerflow.errors import SimulationError
from powerflow.policy.snapshot import Budget, Policy
from powerflow.profiling import PAPER_SWEEP, ClockSweep

PRERUN_S = 240.0
"""PowerFlow pre-runs each job for about four minutes on one GPU (paper §5.1)."""

PROFILE_S = 240.0
"""A first run on a new GPU count sweeps the clocks for four minutes (paper §5.2)."""

ZEUS_PROFILE_S = 240.0
"""Zeus's JIT profiler sweeps its knob during the first epoch (Zeus §4.3); we
give it the same four minutes PowerFlow spends per GPU count."""

DEFAULT_FREQUENCIES_MHZ = (1020, 1110, 1200, 1305, 1410)
"""The paper's baseline sweep stops at 1020 MHz: lower clocks cost both JCT and
energy (§6.2)."""

DEFAULT_ETAS = (0.3, 0.4, 0.5, 0.6, 0.8, 1.0)

ZEUS_ETA_KNOB = 0.5
"""Zeus's default ``eta_knob`` (Zeus, NSDI'23, §4)."""


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
    """``"eta"``, ``"frequency_mhz"`` or ``None`` (a single operating point)."""
    build_policy: Callable[[float | None], Policy]
    budget: Callable[[float | None], Budget]
    profiling: Profiling
    sweep: tuple[float, ...] = field(default=())
    is_baseline: bool = True
    compared: bool = True
    """In the default comparison; ``False``: reachable by name only (a variant)."""

    def configure(self, value: float | None = None, *, oracle: bool = False) -> Configured:
        if self.knob is None and value is not None:
            raise SimulationError(f"{self.name} has no knob to set")
        if self.knob is not None and value is None:
            value = self.sweep[-1]
        return Configured(
            self.build_policy(value),
            self.budget(value),
            ORACLE if oracle else self.profiling,
            self.knob,
            value,
        )


def _eta_budget(value: float | None) -> Budget:
    return Budget(eta=value)


def _no_budget(_: float | None) -> Budget:
    return Budget(eta=1.0)


def _powerflow(**options: bool) -> Callable[[float | None], Policy]:
    def build(_: float | None) -> Policy:
        from powerflow.policy.powerflow import PowerFlowPolicy

        return PowerFlowPolicy(**options)

    return build


def _clock(value: float | None) -> int:
    if value is None:
        raise SimulationError("a frequency is required")
    return int(value)


def _gandiva(value: float | None) -> Policy:
    from powerflow.baselines import GandivaPolicy

    return GandivaPolicy(frequency_mhz=_clock(value))


def _tiresias(value: float | None) -> Policy:
    from powerflow.baselines import TiresiasPolicy

    return TiresiasPolicy(frequency_mhz=_clock(value))


def _afs(value: float | None) -> Policy:
    from powerflow.baselines import AfsPolicy

    return AfsPolicy(frequency_mhz=_clock(value))


def _zeus(
    inner: Callable[[float | None], Policy], knob: str = "power_limit"
) -> Callable[[float | None], Policy]:
    def build(_: float | None) -> Policy:
        from powerflow.baselines import ZeusPolicy

        return ZeusPolicy(
            inner=inner(DEFAULT_FREQUENCIES_MHZ[-1]),
            eta_knob=ZEUS_ETA_KNOB,
            knob="clock" if knob == "clock" else "power_limit",
        )

    return build


PLUS_BUDGET_PRICE = 0.05
"""PowerFlow+'s floor on a step's priority grows by this times ``1 / eta - 1``."""
PLUS_RESCALE_COST_S = 30.0
"""PowerFlow+'s checkpoint-restart estimate: the simulator's default ``restart_s``."""
PLUS_RESCALE_MARGIN = 1.0
"""PowerFlow+'s hysteresis: a rescale must gain twice its cost."""


def _powerflow_plus(_: float | None) -> Policy:
    """PowerFlow+ (docs/policy.md, "PowerFlow+", gives the experiment behind each value)."""
    from powerflow.policy.powerflow import PowerFlowPolicy

    return PowerFlowPolicy(
        budget_price=PLUS_BUDGET_PRICE,
        rescale_cost_s=PLUS_RESCALE_COST_S,
        rescale_margin=PLUS_RESCALE_MARGIN,
    )


PLUS_PROFILE_SWEEP = ClockSweep(stride=8, lowest_fraction=0.5)
"""PowerFlow+ sweeps every 8th clock from the top down to half the top clock
(A100: 810-1410 MHz, 6 clocks; the paper's ladder has 21 from 210 MHz). The
policy runs a job at its most energy-efficient clock or above, and that clock
is 1,065-1,080 MHz for every model, GPU count and batch of the ground truth,
so slices below it measure clocks no plan uses, at a fraction of the speed
(docs/policy.md, "Cheaper profiling")."""
PLUS_PROFILE_S = 69.0
"""Six slices of 11.5 s, the paper's slice length (240 s over 21 clocks)."""


POWERFLOW_PROFILING = Profiling(prerun_s=PRERUN_S, profile_s=PROFILE_S, fitted_models=True)
PLUS_PROFILING = Profiling(profile_s=PLUS_PROFILE_S, fitted_models=True, sweep=PLUS_PROFILE_SWEEP)
"""No offline pre-run: as the operator does, a job is schedulable at once with
its prior, and its first GPU count's profile is its first sweep."""
ZEUS_PROFILING = Profiling(profile_s=ZEUS_PROFILE_S)

SCHEDULERS: dict[str, SchedulerSpec] = {
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
        SchedulerSpec(
            "gandiva",
            "Gandiva: FIFO, packing, time-slicing; fixed clock",
            "frequency_mhz",
            _gandiva,
            _no_budget,
            ORACLE,
            DEFAULT_FREQUENCIES_MHZ,
        ),
        SchedulerSpec(
            "tiresias",
            "Tiresias: 2D-LAS on attained GPU time; fixed clock",
            "frequency_mhz",
            _tiresias,
            _no_budget,
            ORACLE,
            DEFAULT_FREQUENCIES_MHZ,
        ),
        SchedulerSpec(
            "gandiva+zeus",
            "Gandiva with each job at Zeus's optimal GPU power limit (eta_knob 0.5)",
            None,
            _zeus(_gandiva),
            _no_budget,
            ZEUS_PROFILING,
        ),
        SchedulerSpec(
            "tiresias+zeus",
            "Tiresias with each job at Zeus's optimal GPU power limit (eta_knob 0.5)",
            None,
            _zeus(_tiresias),
            _no_budget,
            ZEUS_PROFILING,
        ),
        SchedulerSpec(
            "gandiva+zeus-clock",
            "Gandiva with each job at the locked clock of least Zeus cost (eta_knob 0.5)",
            None,
            _zeus(_gandiva, "clock"),
            _no_budget,
            ZEUS_PROFILING,
            compared=False,
        ),
        SchedulerSpec(
            "tiresias+zeus-clock",
            "Tiresias with each job at the locked clock of least Zeus cost (eta_knob 0.5)",
            None,
            _zeus(_tiresias, "clock"),
            _no_budget,
            ZEUS_PROFILING,
            compared=False,
        ),
        SchedulerSpec(
            "afs",
            "AFS: elastic, marginal-throughput allocation; fixed clock",
            "frequency_mhz",
            _afs,
            _no_budget,
            ORACLE,
            DEFAULT_FREQUENCIES_MHZ,
        ),
    )
}


def scheduler(name: str) -> SchedulerSpec:
    """Look a scheduler up by name, with the list of names on a miss."""
    try:
        return SCHEDULERS[name.lower()]
    except KeyError:
        raise SimulationError(
            f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}"
        ) from None
