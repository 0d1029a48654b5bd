"""PowerFlow+'s knobs chosen on the tuning windows, by the figure it is judged by.

PowerFlow+ is judged by its average JCT against the toughest baseline at equal
energy (``compare.jct_ratios``), and the toughest is AFS (docs/results.md). So
each setting of its policy knobs runs at two budgets (``ETAS``) on every tuning
window (``windows.TUNING_WINDOWS``, days no reported result uses), AFS runs its
clock sweep there too, and a setting scores the geometric mean, over the windows
and both energies (total and in-window: ``compare.ENERGIES``), of AFS's average
JCT over PowerFlow+'s at equal energy (the ratio's mean over the energies both
curves cover). Scores within ``TIE`` of the highest are a tie, and of those the
setting with the fewest checkpoint-restarts over all its runs is chosen: each costs
minutes on a cluster (the simulator charges 30 s), and a difference of a tenth of a
percent in the score is no evidence either way. A knob that saves energy at some cost
in JCT (``budget_price``) is then weighed in the units the evaluation uses, which
a JCT-only objective at a fixed budget would not do: it never pays for less energy.

    powerflow sweep plus-tuning              # the grid on the four tuning windows
    powerflow sweep plus-tuning --quick      # the first 2 h of each, 8 nodes

The chosen values are PowerFlow+'s defaults (``powerflow.core.schedulers``:
``PLUS_BUDGET_PRICE``, ``PLUS_RESCALE_MARGIN``); docs/policy.md holds the table
this command printed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ
from powerflow.lab.sim.compare import ENERGIES, jct_ratios
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.tuning import Setting
from powerflow.lab.sim.windows import TUNING_WINDOWS

PLUS = "powerflow+"
RIVAL = "afs"
"""The baseline the comparison finds toughest against PowerFlow+."""
ETAS = (0.6, 1.0)
"""Two budgets: PowerFlow+'s curve on each window spans the energies between them."""
BUDGET_PRICES = (0.0, 0.05, 0.1, 0.2)
RESCALE_MARGINS = (0.0, 1.0, 2.0)
GRID: tuple[Setting, ...] = tuple(
    Setting(PLUS, (("budget_price", price), ("rescale_margin", margin)))
    for price in BUDGET_PRICES
    for margin in RESCALE_MARGINS
)
TIE = 0.005
"""Scores this close to the best (relative) are a tie: the first grid's spread between
rescale margins of 0, 1 and 2 at one budget price was 0.1 %."""
TAG = "tune-plus"
WINDOWS = TUNING_WINDOWS
"""Where the grid runs: the tuning windows, which no reported result uses."""


def specs(config: SimConfig, *, hours: float | None = None) -> list[RunSpec]:
    """Every setting at every eta, and AFS's clock sweep, on every tuning window; tagged
    (no comparison counts them)."""
    out: list[RunSpec] = []
    for window in WINDOWS:
        trace = TraceSpec(window=window.name, hours=hours)
        out += [
            RunSpec(RIVAL, float(mhz), trace, config, tag=TAG) for mhz in DEFAULT_FREQUENCIES_MHZ
        ]
        out += [
            RunSpec(PLUS, eta, trace, config, tag=TAG, policy_options=s.options)
            for s in GRID
            for eta in ETAS
        ]
    return out


@dataclass(frozen=True)
class Scored:
    setting: Setting
    score: float | None
    """Geometric mean of AFS's JCT over PowerFlow+'s at equal energy; None: no ratio."""
    ratios: tuple[float | None, ...]
    """Per tuning window, then per energy (``ENERGIES``' order): the ratio, or None
    where the two curves' energies do not meet."""
    restarts: int
    """Checkpoint-restarts of all the setting's runs."""


def score(outcomes: Sequence[RunOutcome]) -> list[Scored]:
    """The settings from best to worst: those tied with the best score (``TIE``) by
    their restarts, then the others by score, a setting without any ratio last."""
    rows: dict[str, list[dict[str, Any]]] = {}
    mine: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for o in outcomes:
        window = o.spec.trace.window or ""
        row = {**o.row(), "tag": ""}  # untagged, so that ``compare`` counts it
        if o.spec.scheduler == RIVAL:
            rows.setdefault(window, []).append(row)
        elif o.spec.scheduler == PLUS:
            mine.setdefault(o.spec.policy_options, {}).setdefault(window, []).append(row)
    windows = [w.name for w in WINDOWS]  # every one, so each ratio keeps its column
    scored = []
    for setting in GRID:
        runs = mine.get(setting.options)
        if runs is None:
            continue
        restarts = sum(int(r.get("restarts") or 0) for found in runs.values() for r in found)
        ratios: list[float | None] = []
        for w in windows:
            for energy in ENERGIES:
                found = jct_ratios(rows.get(w, []) + runs.get(w, []), energy, reference=PLUS)
                ratios.append(found.get(RIVAL, {}).get("mean"))
        have = [r for r in ratios if r is not None]
        value = math.exp(sum(map(math.log, have)) / len(have)) if have else None
        scored.append(Scored(setting, value, tuple(ratios), restarts))
    best = max((s.score for s in scored if s.score is not None), default=None)

    def rank(s: Scored) -> tuple[int, float, float, str]:
        if s.score is None or best is None:
            return (2, 0.0, 0.0, s.setting.label)
        if s.score >= best * (1.0 - TIE):
            return (0, float(s.restarts), -s.score, s.setting.label)
        return (1, -s.score, 0.0, s.setting.label)

    return sorted(scored, key=rank)


def rows(scored: Sequence[Scored]) -> list[dict[str, Any]]:
    """One flat row per setting, for the CSV and JSON."""
    names = [f"{w.name}_{e}" for w in WINDOWS for e in ENERGIES]
    return [
        {
            "setting": s.setting.label,
            "score": s.score,
            "restarts": s.restarts,
            **{f"afs_over_plus_{n}": r for n, r in zip(names, s.ratios, strict=True)},
            "chosen": k == 0,
        }
        for k, s in enumerate(scored)
    ]


def chosen(scored: Sequence[Scored]) -> Mapping[str, Any]:
    """The best setting's options."""
    return dict(scored[0].setting.options)
