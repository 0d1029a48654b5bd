"""The comparison on every evaluation window of the whole trace, with the spread.

One window is one day of one trace; a ranking that holds there may not hold the
next day. ``powerflow simulate --held-out`` runs the default comparison (no
oracle or recurring-job runs) on each of ``windows.EVALUATION_WINDOWS`` and
reports, per window and at equal total and in-window energy, how many times
lower PowerFlow's and PowerFlow+'s average JCT is than each baseline's (the
ratio's mean over the energies both sweeps reach, ``compare.jct_ratios``, and
those energies), and across the windows the lowest and highest of each: the
spread; PowerFlow+'s ratios also by how many windows reach the paper's factor. A figure that
does not exist on a window (the sweeps' energies do not meet there) is counted,
not guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from powerflow.lab.sim.compare import (
    CHALLENGERS,
    ENERGIES,
    REFERENCE,
    TOTAL,
    jct_ratios,
    versus,
)
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.experiments import comparison
from powerflow.lab.sim.report import PAPER_RATIOS
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import EVALUATION_WINDOWS

SCHEDULERS = (REFERENCE, *CHALLENGERS)
RANGES = "energies_j"
"""A window's key for the energies (J, lowest and highest) each of its ratios' means
was taken over, by the same keys as the ratios."""


def held_out_specs(trace: TraceSpec, config: SimConfig, *, quick: bool = False) -> list[RunSpec]:
    """The comparison's runs on every evaluation window (``trace`` gives the rest:
    ``hours``, ``max_duration_h``, the seed)."""
    specs: list[RunSpec] = []
    for window in EVALUATION_WINDOWS:
        windowed = replace(trace, path=None, window=window.name)
        specs += comparison(windowed, config, quick=quick, oracle=False)
    return specs


def summary(outcomes: Sequence[RunOutcome]) -> dict[str, Any]:
    """Per window and across windows, every scheduler's ratios to each baseline."""
    by_window: dict[str, list[dict[str, Any]]] = {}
    for o in outcomes:
        by_window.setdefault(o.spec.trace.window or "", []).append(o.row())
    windows: dict[str, Any] = {}
    for name, rows in by_window.items():
        entry: dict[str, Any] = {"jobs": rows[0]["jobs"]}
        ranges: dict[str, Any] = {}
        for energy in ENERGIES:
            for mine in SCHEDULERS:
                ratios = jct_ratios(rows, energy, reference=mine)
                entry[f"{mine}@{energy}"] = {b: r["mean"] for b, r in ratios.items()}
                ranges[f"{mine}@{energy}"] = {b: _range(r) for b, r in ratios.items()}
            plus = versus(rows, "powerflow+", energy=energy)
            key = f"powerflow+_vs_powerflow@{energy}"
            entry[key] = None if plus is None else plus["mean"]
            ranges[key] = None if plus is None else _range(plus)
        entry[RANGES] = ranges
        windows[name] = entry
    spread: dict[str, Any] = {}
    for key in next(iter(windows.values()), {}):
        if key in ("jobs", RANGES) or key.startswith("powerflow+_vs"):
            continue
        baselines = {b for w in windows.values() for b in w[key]}
        spread[key] = {b: _spread([w[key].get(b) for w in windows.values()]) for b in baselines}
    for energy in ENERGIES:
        key = f"powerflow+_vs_powerflow@{energy}"
        spread[key] = _spread([w.get(key) for w in windows.values()])
    return {"windows": windows, "spread": spread}


def _range(ratio: Mapping[str, Any]) -> list[float] | None:
    """The energies (J) a ratio's mean was taken over: where both sweeps reach."""
    lo, hi = ratio.get("energy_lo_j"), ratio.get("energy_hi_j")
    return None if lo is None or hi is None or ratio.get("mean") is None else [lo, hi]


def _spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    have = [v for v in values if v is not None]
    return {
        "lowest": min(have) if have else None,
        "highest": max(have) if have else None,
        "windows": len(have),
        "missing": len(values) - len(have),
    }


def lines(result: Mapping[str, Any]) -> list[str]:
    """The terminal's (and the report's) words: one line per scheduler, baseline and
    energy, with every window's figure and the spread."""
    out = [
        "Held-out windows (average JCT of each baseline over ours at equal energy, the"
        " ratio's mean over the energies both sweeps reach; above 1: ours is faster;"
        " n/a: the sweeps' energies do not meet on that window):",
    ]
    windows = result["windows"]
    names = list(windows)
    out.append("windows: " + ", ".join(f"{n} ({windows[n]['jobs']} jobs)" for n in names))
    out.append(
        "each window's ratio is followed by the energies (GJ) its mean was taken over (one"
        " energy: a single run matched within 5 %); on PowerFlow+'s total-energy lines, the"
        " paper's factor for that baseline (its PowerFlow's largest ratio, at total energy)"
        " and on how many of the windows with a ratio the mean, as printed, reaches it"
    )
    for energy, label in ENERGIES.items():
        for mine in SCHEDULERS:
            key = f"{mine}@{energy}"
            for baseline, s in sorted(result["spread"][key].items()):
                each = ", ".join(
                    _fmt(windows[n][key].get(baseline), _range_of(windows[n], key, baseline))
                    for n in names
                )
                span = (
                    "n/a"
                    if s["lowest"] is None
                    else f"{s['lowest']:.2f}-{s['highest']:.2f}x over {_windows(s['windows'])}"
                )
                paper = (
                    _paper(mine, baseline, [windows[n][key].get(baseline) for n in names])
                    if energy == TOTAL
                    else ""
                )
                out.append(f"- {mine} vs {baseline}, {label}: {each} (spread {span}){paper}")
        key = f"powerflow+_vs_powerflow@{energy}"
        each = ", ".join(_fmt(windows[n].get(key), _range_of(windows[n], key)) for n in names)
        out.append(f"- powerflow+ JCT / powerflow JCT, {label}: {each}")
    return out


def _range_of(entry: Mapping[str, Any], key: str, baseline: str | None = None) -> Any:
    """The energies of a window's ratio, where the summary kept them."""
    ranges = entry.get(RANGES, {}).get(key)
    return ranges if baseline is None or ranges is None else ranges.get(baseline)


def _paper(mine: str, baseline: str, values: Sequence[float | None]) -> str:
    """PowerFlow+'s ratios against the paper's factor for that baseline: on how many of
    the windows with a ratio its mean, rounded as printed, reaches it (the paper's
    factors are PowerFlow's largest ratios on its own trace, at total energy)."""
    factor = PAPER_RATIOS.get(baseline)
    have = [round(v, 2) for v in values if v is not None]
    if mine != "powerflow+" or factor is None or not have:
        return ""
    reached = sum(1 for v in have if v >= factor)
    return f"; the paper's {factor:.2f}x reached on {reached} of {_windows(len(have))}"


def _windows(count: int) -> str:
    return "1 window" if count == 1 else f"{count} windows"


def _fmt(value: float | None, energies: Sequence[float] | None = None) -> str:
    if value is None:
        return "n/a"
    if energies is None:
        return f"{value:.2f}"
    lo, hi = energies[0] / 1e9, energies[1] / 1e9
    return f"{value:.2f} ({lo:.2f} GJ)" if lo == hi else f"{value:.2f} ({lo:.2f}-{hi:.2f} GJ)"
