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
    powerflow sweep plus-tuning --grid profiling   # its profiling ladders (PROFILING_GRID)
    powerflow sweep plus-tuning --grid short-first # the short-first factor (SHORT_FIRST_GRID)
    powerflow sweep plus-tuning --grid tournament  # AFS-L's tournament (TOURNAMENT_GRID)
    powerflow sweep plus-tuning --quick      # the first 2 h of each, 8 nodes

The chosen values are PowerFlow+'s defaults (``powerflow.core.schedulers``:
``PLUS_BUDGET_PRICE``, ``PLUS_PROFILING``, ``PLUS_SHORT_FIRST`` and
``PLUS_RESCALE_MARGIN``, chosen in that order, each grid with the earlier choices);
docs/policy.md holds the tables these commands printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ, clocks_on
from powerflow.lab.sim.compare import ENERGIES, geomean, ratios_by_window
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
FIRST_LADDER: tuple[tuple[str, Any], ...] = (
    ("prerun_s", 0.0),
    ("profile_s", 69.0),
    ("sweep_stride", 8),
    ("sweep_lowest", 0.5),
)
"""The profiling ``GRID`` runs with: six clocks from 810 MHz over 69 s, no pre-run (the
profiling grid, tuned second, chose ``PLUS_PROFILING`` among ladders including this)."""
GRID: tuple[Setting, ...] = tuple(
    Setting(
        PLUS,
        (("budget_price", price), ("rescale_margin", margin), ("short_first", 0.0), *FIRST_LADDER),
    )
    for price in BUDGET_PRICES
    for margin in RESCALE_MARGINS
)
"""PowerFlow+'s policy knobs, tuned first: without the short-first factor (tuned last,
``SHORT_FIRST_GRID``) and with ``FIRST_LADDER`` (the profiling is tuned second)."""
PROFILING_GRID: tuple[Setting, ...] = tuple(
    Setting(PLUS, options)
    for ladder in (
        # the paper's: a 240 s pre-run, then 240 s over 21 clocks from the bottom
        (("prerun_s", 240.0), ("profile_s", 240.0), ("sweep_stride", 4), ("sweep_lowest", 0.0)),
        # the paper's ladder without the pre-run
        (("prerun_s", 0.0), ("profile_s", 240.0), ("sweep_stride", 4), ("sweep_lowest", 0.0)),
        # half the slices over the same range, or a third of the time over it
        (("prerun_s", 0.0), ("profile_s", 126.5), ("sweep_stride", 8), ("sweep_lowest", 0.0)),
        (("prerun_s", 0.0), ("profile_s", 69.0), ("sweep_stride", 16), ("sweep_lowest", 0.0)),
        # the top half of the clocks only: 12, 6 or 3 of them
        (("prerun_s", 0.0), ("profile_s", 138.0), ("sweep_stride", 4), ("sweep_lowest", 0.5)),
        (("prerun_s", 0.0), ("profile_s", 69.0), ("sweep_stride", 8), ("sweep_lowest", 0.5)),
        (("prerun_s", 0.0), ("profile_s", 34.5), ("sweep_stride", 16), ("sweep_lowest", 0.5)),
    )
    for options in ((*ladder, ("rescale_margin", 2.0), ("short_first", 0.0)),)
)
"""PowerFlow+'s profiling (``--grid profiling``), tuned second: its budget price at its
chosen value, and ``GRID``'s choice of margin 2 with the factor off:
each ladder (every ``sweep_stride``-th clock from the top, down to ``sweep_lowest`` of
the top clock) with the paper's 11.5 s slices per clock (``profile_s``), with and without
the paper's offline pre-run (``prerun_s``). Scored as ``GRID`` is, on the same windows."""
SHORT_FIRST_GRID: tuple[Setting, ...] = tuple(
    Setting(PLUS, options)
    for options in (
        (("short_first", 0.0), ("rescale_margin", 2.0)),  # the first two grids' choice
        (("short_first", 0.5), ("rescale_margin", 2.0)),
        (("short_first", 0.5), ("rescale_margin", 4.0)),
        (("short_first", 0.5), ("rescale_margin", 8.0)),
        (("short_first", 1.0), ("rescale_margin", 2.0)),
        (("short_first", 1.0), ("rescale_margin", 2.0), ("short_first_clocks", True)),
    )
)
"""PowerFlow+ with the short-first factor on its doublings' ratios (``returns.py``), tuned
last: exponent 0 (off), 0.5 and 1, and on its clock raises too, at the rescale margin
the first grid chose; and 0.5 with larger margins, which damp the rescales it adds
(``--grid short-first``; the budget price and the profiling at their chosen values)."""
TOURNAMENT_GRID: tuple[Setting, ...] = (
    Setting(PLUS, (("short_first", 0.5), ("rescale_margin", 8.0))),  # PowerFlow+ as it runs
    *(
        Setting(PLUS, (("tournament", True), ("short_first", 0.0), ("rescale_margin", margin)))
        for margin in (2.0, 8.0, 32.0)
    ),
)
"""PowerFlow+ with its GPU steps handed out by AFS-L's tournament instead of its heap
(``PowerFlowPolicy.tournament``; the short-first factor, a heap key, off), at three
rescale margins, against PowerFlow+ as it runs (``--grid tournament``: an experiment
after the three grids above, with their choices; not adopted, docs/policy.md)."""
GRID_NAMES = ("knobs", "profiling", "short-first", "tournament")


def grid_named(name: str) -> tuple[Setting, ...]:
    """``GRID`` (``knobs``), ``PROFILING_GRID`` (``profiling``), ``SHORT_FIRST_GRID``
    (``short-first``) or ``TOURNAMENT_GRID`` (``tournament``), read when asked."""
    return {
        "knobs": GRID,
        "profiling": PROFILING_GRID,
        "short-first": SHORT_FIRST_GRID,
        "tournament": TOURNAMENT_GRID,
    }[name]


TIE = 0.005
"""Scores this close to the best (relative) are a tie: the first grid's spread between
rescale margins of 0, 1 and 2 at one budget price was 0.1 %."""
TAG = "tune-plus"
WINDOWS = TUNING_WINDOWS
"""Where the grid runs: the tuning windows, which no reported result uses."""


def specs(
    config: SimConfig,
    *,
    hours: float | None = None,
    grid: Sequence[Setting] | None = None,
    oracle: bool = False,
) -> list[RunSpec]:
    """Every setting of ``grid`` at every eta, and AFS's clock sweep, on every tuning
    window (``GRID`` by default); tagged (no comparison counts them). ``oracle``:
    PowerFlow+ schedules with the ground truth, as the baselines do, and profiles
    nothing (what better models could gain at most)."""
    grid = GRID if grid is None else grid
    out: list[RunSpec] = []
    for window in WINDOWS:
        trace = TraceSpec(window=window.name, hours=hours)
        out += [
            RunSpec(RIVAL, float(mhz), trace, config, tag=TAG)
            for mhz in clocks_on(config.gpu, DEFAULT_FREQUENCIES_MHZ)  # the GPU type's own
        ]
        out += [
            RunSpec(PLUS, eta, trace, config, tag=TAG, policy_options=s.options, oracle=oracle)
            for s in grid
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


def score(outcomes: Sequence[RunOutcome], grid: Sequence[Setting] | None = None) -> list[Scored]:
    """``grid``'s settings from best to worst: those tied with the best score (``TIE``) by
    their restarts, then the others by score, a setting without any ratio last
    (``GRID`` by default). PowerFlow+'s runs are all oracle runs (``specs(oracle=True)``,
    each setting's curve then) or none: mixed, a setting's curve would mix both."""
    grid = GRID if grid is None else grid
    oracle = any(o.spec.oracle for o in outcomes if o.spec.scheduler == PLUS)
    rows: dict[str, list[dict[str, Any]]] = {}
    mine: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for o in outcomes:
        window = o.spec.trace.window or ""
        # Untagged, so that ``compare`` counts it; an oracle run (``specs(oracle=True)``)
        # is the setting's curve here, so it is not set apart as one.
        row = {**o.row(), "tag": "", "oracle": False}
        if o.spec.scheduler == RIVAL:
            rows.setdefault(window, []).append(row)
        elif o.spec.scheduler == PLUS:
            if o.spec.oracle != oracle:
                raise ValueError("score: PowerFlow+'s runs are all oracle runs or none")
            mine.setdefault(o.spec.policy_options, {}).setdefault(window, []).append(row)
    windows = [w.name for w in WINDOWS]  # every one, so each ratio keeps its column
    scored = []
    for setting in grid:
        runs = mine.get(setting.options)
        if runs is None:
            continue
        restarts = sum(int(r.get("restarts") or 0) for found in runs.values() for r in found)
        ratios = ratios_by_window(rows, runs, windows, RIVAL, PLUS)
        scored.append(Scored(setting, geomean(ratios), ratios, restarts))
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
