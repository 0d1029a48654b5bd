"""How much per-job clocks can add to AFS's allocation, measured on the tuning windows.

PowerFlow+ is judged by its average JCT against AFS's at equal energy, and AFS runs
every GPU at one clock (its sweep over ``DEFAULT_FREQUENCIES_MHZ`` traces its curve).
PowerFlow+'s extra freedom is a clock per job. This study measures what that freedom
is worth on its own, with AFS's allocation kept: ``afs+clock-bound`` runs each job at
the locked clock of least Zeus cost, ``eta_knob * E + (1 - eta_knob) * n * P_max * T``
per iteration (``baselines/zeus.py``), read from the ground truth with no profiling
charged, so a sweep of ``eta_knob`` traces every trade-off between a job's time and
energy that a per-iteration price can express, for free. ``afs+zeus`` is the same
idea as Zeus ships it (power limits, and its profiling phase charged), the baseline a
reader would build.

Each scores, per tuning window and energy (total and in-window, ``compare.ENERGIES``),
AFS's average JCT over its own at equal energy (the ratio's mean over the energies
both curves cover, as ``compare.jct_ratios`` takes it), and the geometric mean of
those. Above 1, per-job clocks beat AFS's single clock at equal energy by that factor.

    powerflow sweep clock-bound           # the four tuning windows, about 70 runs
    powerflow sweep clock-bound --quick   # the first 2 h of each, 8 nodes
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ
from powerflow.lab.sim.compare import ENERGIES, jct_ratios
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import TUNING_WINDOWS

RIVAL = "afs"
VARIANTS = ("afs+clock-bound", "afs+zeus")
"""The bound (ground-truth clocks, nothing charged), then Zeus as it runs."""
KNOBS = (0.0, 0.25, 0.5, 0.6, 0.75, 1.0)
"""``eta_knob`` values of each variant: 0 is the top clock (AFS's fastest point), 1 the
least energy per iteration; the curve flattens above 0.75 on the default trace."""
TAG = "clock-bound"
WINDOWS = TUNING_WINDOWS


def specs(config: SimConfig, *, hours: float | None = None) -> list[RunSpec]:
    """AFS's clock sweep and each variant's ``KNOBS`` on every tuning window; tagged."""
    out: list[RunSpec] = []
    for window in WINDOWS:
        trace = TraceSpec(window=window.name, hours=hours)
        out += [
            RunSpec(RIVAL, float(mhz), trace, config, tag=TAG) for mhz in DEFAULT_FREQUENCIES_MHZ
        ]
        out += [RunSpec(name, k, trace, config, tag=TAG) for name in VARIANTS for k in KNOBS]
    return out


@dataclass(frozen=True)
class Bound:
    variant: str
    ratios: tuple[float | None, ...]
    """Per tuning window, then per energy (``ENERGIES``' order): AFS's JCT over the
    variant's at equal energy, or None where the curves' energies do not meet."""
    geomean: tuple[float | None, ...]
    """Per energy, the geometric mean over the windows that have a ratio."""


def score(outcomes: Sequence[RunOutcome]) -> list[Bound]:
    """Each variant against AFS, in ``VARIANTS`` order (one without runs is left out)."""
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for o in outcomes:
        # Untagged and as measured, so that ``compare`` counts the run.
        row = {**o.row(), "tag": "", "oracle": False}
        rows.setdefault(o.spec.scheduler, {}).setdefault(o.spec.trace.window or "", []).append(row)
    afs = rows.get(RIVAL, {})
    out = []
    for name in VARIANTS:
        mine = rows.get(name)
        if mine is None:
            continue
        ratios: list[float | None] = []
        for w in WINDOWS:
            for energy in ENERGIES:
                found = jct_ratios(afs.get(w.name, []) + mine.get(w.name, []), energy, name)
                ratios.append(found.get(RIVAL, {}).get("mean"))
        per = len(ENERGIES)
        means = tuple(_geomean(ratios[k::per]) for k in range(per))
        out.append(Bound(name, tuple(ratios), means))
    return out


def _geomean(values: Sequence[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return math.exp(sum(map(math.log, have)) / len(have)) if have else None


def rows(bounds: Sequence[Bound]) -> list[dict[str, Any]]:
    """One flat row per variant, for the CSV and JSON."""
    names = [f"{w.name}_{e}" for w in WINDOWS for e in ENERGIES]
    return [
        {
            "variant": b.variant,
            **{f"afs_over_variant_{e}": g for e, g in zip(ENERGIES, b.geomean, strict=True)},
            **{f"afs_over_variant_{n}": r for n, r in zip(names, b.ratios, strict=True)},
        }
        for b in bounds
    ]
