"""What a clock per job adds to AFS's allocation, measured on the tuning windows.

PowerFlow+ is judged by its average JCT against AFS's at equal energy, and AFS runs
every GPU at one clock (its sweep over ``DEFAULT_FREQUENCIES_MHZ`` traces its curve).
PowerFlow+'s extra freedom is a clock per job. This study measures what per-job
clocks are worth on their own, with AFS's allocation kept:

- ``afs+job-clocks`` runs each job at the locked clock of least Zeus cost,
  ``eta_knob * E + (1 - eta_knob) * n * P_max * T`` per iteration
  (``baselines/zeus.py``): one price of energy against time shared by every job,
  each job's time and energy read from the ground truth, no profiling charged. A
  sweep of ``eta_knob`` moves the price. It is a strong per-job rule at no cost, not
  an upper bound: a rule that also weighed each job's effect on the average JCT
  (PowerFlow+'s short-first factor on clock raises) is outside it.
- ``afs+zeus`` is the same idea as Zeus ships it (power limits, its profiling phase
  charged at each GPU count a job first runs on: AFS resizes jobs), the baseline a
  reader would build from the paper's two.

Each scores, per tuning window and energy (total and in-window, ``compare.ENERGIES``),
AFS's average JCT over its own at equal energy (the ratio's mean over the energies
both curves cover, as ``compare.jct_ratios`` takes it), and per energy the geometric
mean over the windows. Above 1, per-job clocks beat AFS's single clock at equal
energy by that factor.

    powerflow sweep job-clocks           # the four tuning windows, 68 runs
    powerflow sweep job-clocks --quick   # the first 2 h of each, 8 nodes
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ, clocks_on
from powerflow.lab.sim.compare import ENERGIES, geomean, ratios_by_window
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import TUNING_WINDOWS

RIVAL = "afs"
VARIANTS = ("afs+job-clocks", "afs+zeus")
"""Per-job clocks with the ground truth and nothing charged, then Zeus as it runs."""
KNOBS = (0.0, 0.25, 0.5, 0.6, 0.75, 1.0)
"""``eta_knob`` values of each variant: 0 is the top clock (AFS's fastest point), 1 the
least energy per iteration; the curve flattens above 0.75 on the tuning windows."""
TAG = "job-clocks"
WINDOWS = TUNING_WINDOWS


def specs(config: SimConfig, *, hours: float | None = None) -> list[RunSpec]:
    """AFS's clock sweep (on ``config``'s GPU type) and each variant's ``KNOBS`` on every
    tuning window; tagged."""
    clocks = clocks_on(config.gpu, DEFAULT_FREQUENCIES_MHZ)
    out: list[RunSpec] = []
    for window in WINDOWS:
        trace = TraceSpec(window=window.name, hours=hours)
        out += [RunSpec(RIVAL, float(mhz), trace, config, tag=TAG) for mhz in clocks]
        out += [RunSpec(name, k, trace, config, tag=TAG) for name in VARIANTS for k in KNOBS]
    return out


@dataclass(frozen=True)
class Versus:
    """One variant against AFS."""

    variant: str
    ratios: tuple[float | None, ...]
    """Per tuning window, then per energy (``ENERGIES``' order): AFS's JCT over the
    variant's at equal energy, or None where the curves' energies do not meet."""
    geomean: tuple[float | None, ...]
    """Per energy, the geometric mean over the windows that have a ratio."""


def score(outcomes: Sequence[RunOutcome]) -> list[Versus]:
    """Each variant against AFS, in ``VARIANTS`` order (one without runs is left out)."""
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for o in outcomes:
        # Untagged and as measured, so that ``compare`` counts the run.
        row = {**o.row(), "tag": "", "oracle": False}
        rows.setdefault(o.spec.scheduler, {}).setdefault(o.spec.trace.window or "", []).append(row)
    afs = rows.get(RIVAL, {})
    windows = [w.name for w in WINDOWS]
    per = len(ENERGIES)
    out = []
    for name in VARIANTS:
        mine = rows.get(name)
        if mine is None:
            continue
        ratios = ratios_by_window(afs, mine, windows, RIVAL, name)
        out.append(Versus(name, ratios, tuple(geomean(ratios[k::per]) for k in range(per))))
    return out


def rows(scored: Sequence[Versus]) -> list[dict[str, Any]]:
    """One flat row per variant, for the CSV and JSON."""
    names = [f"{w.name}_{e}" for w in WINDOWS for e in ENERGIES]
    return [
        {
            "variant": v.variant,
            **{f"afs_over_variant_{e}": g for e, g in zip(ENERGIES, v.geomean, strict=True)},
            **{f"afs_over_variant_{n}": r for n, r in zip(names, v.ratios, strict=True)},
        }
        for v in scored
    ]
