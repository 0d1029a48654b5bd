"""The experiments of paper §6 as lists of runs: the comparison and the sensitivity studies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from powerflow.lab.schedulers import (
    DEFAULT_FREQUENCIES_MHZ,
    SCHEDULERS,
    ZEUS_ETA_KNOB,
    ZEUS_ETA_KNOBS,
    clocks_on,
)
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.priors import RECURRING
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.synthetic import SyntheticSpec

DEFAULT_ETAS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
"""PowerFlow's sweep. 0.2 and 0.3 are run and listed, but their budgets (60 and 90 W
per GPU on A100s) are below every GPU at the board's lowest power cap (100 W), so
the runs queue jobs by design; no equal-energy ratio is taken at them
(``RunOutcome.below_cap_floor``, ``compare.curves``). From 0.4 up PowerFlow's
energies no longer reach the baselines' cheapest runs (1020 MHz, idle nodes off),
and the headline says so instead of extrapolating (``headline``)."""
PLUS_ETAS = (0.4, 0.6, 0.8, 1.0)
"""PowerFlow+'s sweep: compared with PowerFlow (``compare.versus``) and with the
baselines (``heldout``); its energies already reach down to 23 GJ at 0.4."""
ETAS_OF = {"powerflow": DEFAULT_ETAS, "powerflow+": PLUS_ETAS}
DEFAULT_FREQUENCIES = DEFAULT_FREQUENCIES_MHZ
"""The baselines' clocks, from the lowest efficient one up (``schedulers``' sweep):
below 1020 MHz a run costs more energy AND time (Gandiva, idle nodes off: 27.8 GJ and
11.1 h at 900 MHz against 27.4 GJ and 9.7 h at 1020), as the paper found (§6.2)."""
ORACLE_ETAS = (0.6, 1.0)
ORACLE_SCHEDULERS = ("powerflow", "powerflow+")
"""Run again with ground-truth models and again from each job's own model's prior
(the recurring-job case), at ``ORACLE_ETAS``: Fig. 10, the fitted-vs-oracle gaps."""
QUICK_ETAS = (0.5, 1.0)
QUICK_FREQUENCIES = (1110, 1410)
QUICK_ZEUS_ETA_KNOBS = (0.5, 1.0)
"""Zeus's default and its most energy-saving end: the Zeus energy level stays measured."""
QUICK_HOURS = 2.0
QUICK_NODES = 8
"""``--quick``: the first two hours of the trace (108 jobs) on 8 x 8 GPUs, so
that the smaller load still contends for the smaller cluster."""


def comparison_window(trace: TraceSpec, *, quick: bool = False) -> TraceSpec:
    """The trace cut to ``--quick``'s window unless ``--hours`` or a synthetic
    trace says otherwise; the full comparison keeps the whole trace (all 1,901
    jobs of the ITP window on the default 64 x 8 A100)."""
    if not quick or trace.hours is not None or trace.synthetic is not None:
        return trace
    return replace(trace, hours=QUICK_HOURS)


def comparison(
    trace: TraceSpec, config: SimConfig, *, quick: bool = False, oracle: bool = True
) -> list[RunSpec]:
    """PowerFlow's eta sweep, PowerFlow+'s, every baseline's clock sweep, the Zeus
    variants' ``eta_knob`` sweep, and (for Fig. 10) PowerFlow and PowerFlow+ again
    with ground-truth models and from their own models' priors
    (``powerflow.lab.sim.priors``).

    Enough points that every baseline's energies overlap PowerFlow's on the whole
    trace, so the equal-energy ratios are interpolated, not n/a: 7 PowerFlow etas,
    5 clocks per baseline, 4 ``eta_knob`` values per Zeus variant (``ZEUS_ETA_KNOBS``;
    2 with ``quick``), 42 runs in all (22 with ``quick``). What each run and the whole
    comparison cost is in docs/simulator.md, "Speed" (``python -m benchmarks main_job``)."""
    trace = comparison_window(trace, quick=quick)
    specs: list[RunSpec] = []
    for spec in SCHEDULERS.values():
        if not spec.compared:
            continue
        if spec.knob is None:
            specs.append(RunSpec(spec.name, None, trace, config))
            continue
        if spec.knob == "eta":
            values: Sequence[float] = QUICK_ETAS if quick else ETAS_OF.get(spec.name, PLUS_ETAS)
        elif spec.knob == "eta_knob":
            values = QUICK_ZEUS_ETA_KNOBS if quick else ZEUS_ETA_KNOBS
        else:
            values = clocks_on(config.gpu, QUICK_FREQUENCIES if quick else DEFAULT_FREQUENCIES)
        specs += [RunSpec(spec.name, v, trace, config) for v in values]
    if oracle:
        etas = QUICK_ETAS if quick else ORACLE_ETAS
        for name in ORACLE_SCHEDULERS:
            specs += [RunSpec(name, v, trace, config, oracle=True) for v in etas]
            specs += [RunSpec(name, v, trace, config, priors=RECURRING) for v in etas]
    return specs


@dataclass(frozen=True)
class Study:
    """One sensitivity axis: a name, its label and the runs along it."""

    name: str
    label: str
    values: tuple[float, ...]


STUDIES = (
    Study("interval", "mean job arrival interval (s)", (120.0, 300.0, 600.0, 1200.0)),
    Study("cluster", "cluster size (GPUs)", (16.0, 32.0, 64.0, 128.0)),
    Study("job_size", "job size (x requested GPUs)", (0.5, 1.0, 2.0, 4.0)),
)
SENSITIVITY_SCHEDULERS = (
    ("powerflow", 0.6),
    ("gandiva", 1410.0),
    ("tiresias", 1410.0),
    ("afs", 1410.0),
    ("gandiva+zeus", ZEUS_ETA_KNOB),
    ("tiresias+zeus", ZEUS_ETA_KNOB),
)
BASE_SYNTHETIC = SyntheticSpec(jobs=100, mean_interval_s=300.0, job_size=1.0, seed=0)
BASE_GPUS = 32


def sensitivity(config: SimConfig, *, quick: bool = False) -> list[RunSpec]:
    """100-job synthetic traces (Gavel's generator) along the three axes of Fig. 11.

    Schedulers run at one operating point each (PowerFlow eta 0.6, baselines
    at full clock, the Zeus variants at their own power limits for Zeus's default
    ``eta_knob``); the paper instead
    matches each baseline to the Zeus energy, which needs a sweep per point.
    """
    specs: list[RunSpec] = []
    for study in STUDIES:
        values = study.values[::2] if quick else study.values
        for x in values:
            syn, cfg = BASE_SYNTHETIC, replace(config, nodes=BASE_GPUS // config.gpus_per_node)
            if study.name == "interval":
                syn = replace(syn, mean_interval_s=x)
            elif study.name == "cluster":
                cfg = replace(config, nodes=max(1, int(x) // config.gpus_per_node))
            else:
                syn = replace(syn, job_size=x)
            for name, value in SENSITIVITY_SCHEDULERS:
                specs.append(
                    RunSpec(name, value, TraceSpec(synthetic=syn), cfg, tag=f"{study.name}={x:g}")
                )
    return specs


def sensitivity_rows(outcomes: Sequence[RunOutcome]) -> dict[str, list[dict[str, Any]]]:
    """Rows per study with the axis value as ``x``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for o in outcomes:
        study, _, x = o.spec.tag.partition("=")
        out.setdefault(study, []).append({**o.row(), "x": float(x)})
    return out
