"""Every scheduler the lab runs, by name: PowerFlow's (``powerflow.core.schedulers``)
and the baselines of the paper's evaluation (Gandiva, Tiresias, AFS and the Zeus
variants), each a ``SchedulerSpec`` so the simulator never branches on a name.

Baseline policies are imported inside the factories so that this table loads even
while a policy module is absent or broken; only building that one fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.policy.snapshot import Budget, Policy
from powerflow.core.schedulers import (
    DEFAULT_ETAS,
    ORACLE,
    POWERFLOW_SCHEDULERS,
    PRERUN_S,
    PROFILE_S,
    Configured,
    Profiling,
    SchedulerSpec,
    lookup,
)

__all__ = [
    "DEFAULT_ETAS",
    "DEFAULT_FREQUENCIES_MHZ",
    "ORACLE",
    "PRERUN_S",
    "PROFILE_S",
    "SCHEDULERS",
    "ZEUS_ETA_KNOB",
    "ZEUS_ETA_KNOBS",
    "ZEUS_PROFILE_S",
    "ZEUS_PROFILING",
    "Configured",
    "Profiling",
    "SchedulerSpec",
    "clocks_on",
    "scheduler",
]

ZEUS_PROFILE_S = 240.0
"""Zeus's JIT profiler sweeps its knob during the first epoch (Zeus §4.3); we
give it the same four minutes PowerFlow spends per GPU count."""

DEFAULT_FREQUENCIES_MHZ = (1020, 1110, 1200, 1305, 1410)
"""The paper's baseline sweep stops at 1020 MHz: lower clocks cost both JCT and
energy (§6.2). A100 clocks; ``clocks_on`` takes them to another type."""


def clocks_on(gpu: GpuSpec, a100_clocks_mhz: Sequence[float]) -> tuple[int, ...]:
    """A100 clocks on ``gpu``: each at the same fraction of the top clock, snapped
    to the nearest clock ``gpu`` supports (the lower of two equally near), without
    repeats; the A100's own clocks come back unchanged.

    Why relative: the ground truth's clock curves are the A100's at the same
    fraction of the top clock on every type (``powerflow.lab.groundtruth``), so
    the sweep keeps its meaning (from the least energy's neighbourhood to the top).
    """
    top = A100.max_clock_mhz
    out: list[int] = []
    for mhz in a100_clocks_mhz:
        target = mhz / top * gpu.max_clock_mhz
        snapped = min(gpu.clocks_mhz, key=lambda c: (abs(c - target), c))
        if snapped not in out:
            out.append(snapped)
    return tuple(out)


ZEUS_ETA_KNOB = 0.5
"""Zeus's default ``eta_knob`` (Zeus, NSDI'23, §4): what a Zeus run without
``--eta-knob`` uses, and the run whose energy is the comparison's "Zeus energy
level" (``compare.zeus_energy``)."""

ZEUS_ETA_KNOBS = (0.0, 0.5, 0.75, 1.0)
"""The Zeus variants' sweep of ``eta_knob`` in the comparison. ``eta_knob`` is the
user's energy-vs-time preference, so like PowerFlow's eta it traces a curve of
(energy, JCT) rather than having a best value. On the default trace 0.25 spends
within 1 % of 0.0's energy (every job stays at or near the board's top limit), so
the grid skips it; 0.5 is Zeus's default and must be in it (the Zeus energy level).
docs/baselines.md, "Zeus", gives each point's energy and JCT with the command."""


def _no_budget(_: float | None) -> Budget:
    return Budget(eta=1.0)


def _clock(value: float | None) -> int | None:
    """The baseline's clock; None: the cluster's top clock (``fixed_clock``)."""
    return None if value is None else int(value)


def _gandiva(value: float | None) -> Policy:
    from powerflow.lab.baselines import GandivaPolicy

    return GandivaPolicy(frequency_mhz=_clock(value))


def _tiresias(value: float | None) -> Policy:
    from powerflow.lab.baselines import TiresiasPolicy

    return TiresiasPolicy(frequency_mhz=_clock(value))


def _afs(value: float | None) -> Policy:
    from powerflow.lab.baselines import AfsPolicy

    return AfsPolicy(frequency_mhz=_clock(value))


def _zeus(
    inner: Callable[[float | None], Policy], knob: str = "power_limit"
) -> Callable[[float | None], Policy]:
    def build(value: float | None) -> Policy:
        from powerflow.lab.baselines import ZeusPolicy

        return ZeusPolicy(
            inner=inner(None),  # the top clock of the cluster's type
            eta_knob=ZEUS_ETA_KNOB if value is None else value,
            knob="clock" if knob == "clock" else "power_limit",
        )

    return build


ZEUS_PROFILING = Profiling(profile_s=ZEUS_PROFILE_S)


def _zeus_spec(
    name: str,
    description: str,
    build: Callable[[float | None], Policy],
    *,
    compared: bool = True,
    profiling: Profiling = ZEUS_PROFILING,
) -> SchedulerSpec:
    """A Zeus variant: its knob is ``eta_knob``, swept over ``ZEUS_ETA_KNOBS``; it pays
    Zeus's profiling unless ``profiling`` says otherwise."""
    return SchedulerSpec(
        name,
        description,
        "eta_knob",
        build,
        _no_budget,
        profiling,
        ZEUS_ETA_KNOBS,
        compared=compared,
        default=ZEUS_ETA_KNOB,
    )


SCHEDULERS: dict[str, SchedulerSpec] = {
    **POWERFLOW_SCHEDULERS,
    **{
        spec.name: spec
        for spec in (
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
            _zeus_spec(
                "gandiva+zeus",
                "Gandiva with each job at Zeus's optimal GPU power limit",
                _zeus(_gandiva),
            ),
            _zeus_spec(
                "tiresias+zeus",
                "Tiresias with each job at Zeus's optimal GPU power limit",
                _zeus(_tiresias),
            ),
            _zeus_spec(
                "gandiva+zeus-clock",
                "Gandiva with each job at the locked clock of least Zeus cost",
                _zeus(_gandiva, "clock"),
                compared=False,
            ),
            _zeus_spec(
                "tiresias+zeus-clock",
                "Tiresias with each job at the locked clock of least Zeus cost",
                _zeus(_tiresias, "clock"),
                compared=False,
            ),
            _zeus_spec(
                "afs+zeus",
                "AFS with each job at Zeus's optimal GPU power limit",
                _zeus(_afs),
                compared=False,
            ),
            _zeus_spec(
                "afs+job-clocks",
                "AFS with each job at the locked clock of least Zeus cost, known without"
                " profiling: what per-job clocks can add to AFS's allocation",
                _zeus(_afs, "clock"),
                compared=False,
                profiling=ORACLE,
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
    },
}


def scheduler(name: str) -> SchedulerSpec:
    """Any scheduler of the lab by name, with the list of names on a miss."""
    return lookup(SCHEDULERS, name)
