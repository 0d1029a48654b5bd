"""The comparison's headline in words: one sentence per baseline, for a person.

A reader of ``powerflow simulate`` should not have to read a ratio table to
know who won: the terminal (and the report) ends with one sentence per
baseline, from ``compare.jct_ratios``: how many times lower PowerFlow's
average JCT is at the same energy, over which energies. Where the
equal-energy ratio does not exist, the sentence says why in the same place
(the two sweeps' energies do not meet, with both spans) and gives the
dominance view instead, naming the two runs it compares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from powerflow.lab.sim.compare import REFERENCE, TOTAL, WINDOW, jct_ratios
from powerflow.lab.sim.output import knob_text
from powerflow.lab.sim.priors import main_run
from powerflow.lab.sim.runner import TraceSpec

GJ = 1e9
DISPLAY = {
    "powerflow": "PowerFlow",
    "powerflow+": "PowerFlow+",
    "gandiva": "Gandiva",
    "tiresias": "Tiresias",
    "afs": "AFS",
    "gandiva+zeus": "Gandiva+Zeus",
    "tiresias+zeus": "Tiresias+Zeus",
}


def display(name: str) -> str:
    """A scheduler's name as a paper writes it (``afs`` -> ``AFS``)."""
    return DISPLAY.get(name, name)


def possessive(name: str) -> str:
    """``Tiresias'``, ``Gandiva's``."""
    shown = display(name)
    return shown + ("'" if shown.lower().endswith("s") else "'s")


def _unit(x: float) -> tuple[float, str]:
    """GJ for a whole trace's energies, MJ for a small trace's (0.00 GJ says nothing)."""
    return (GJ, "GJ") if abs(x) >= 0.1 * GJ else (1e6, "MJ")


def _gj(x: float) -> str:
    scale, unit = _unit(x)
    return f"{x / scale:.2f} {unit}"


def _times(ratio: float) -> tuple[str, str]:
    """``("N.NNx", "lower" | "higher")`` for a baseline/PowerFlow JCT ratio: how many
    times lower (or higher) PowerFlow's JCT is."""
    if ratio >= 1.0:
        return f"{ratio:.2f}x", "lower"
    return f"{1.0 / ratio:.2f}x", "higher"


def _run_named(
    rows: Sequence[Mapping[str, Any]], name: str, energy_j: float | None, energy: str = TOTAL
) -> str:
    """``Gandiva 1410 MHz`` for the main comparison's run of ``name`` at ``energy_j``
    (of ``energy``)."""
    for row in rows:
        if (
            row["scheduler"] == name
            and main_run(row)
            and energy_j is not None
            and row.get(energy) is not None
            and math.isclose(float(row[energy]), energy_j, rel_tol=1e-12)
        ):
            knob = knob_text(row)
            return display(name) + ("" if knob == "-" else f" {knob}")
    return display(name)


def sentence(
    name: str,
    r: Mapping[str, float | None],
    rows: Sequence[Mapping[str, Any]] = (),
    energy: str = TOTAL,
) -> str:
    """The headline for one baseline (``r`` is its entry of ``compare.jct_ratios``,
    taken at ``energy``)."""
    them = possessive(name)
    best, worst = r.get("max"), r.get("min")
    lo, hi, at = r.get("energy_lo_j"), r.get("energy_hi_j"), r.get("max_at_j")
    if best is not None and worst is not None and lo is not None and hi is not None:
        same = f"At the same {_SAME[energy]}, PowerFlow's average JCT is"
        where = f"{_span(lo, hi)}, the energies both sweeps reach"
        single = r.get("baseline_lo_j") == r.get("baseline_hi_j")
        if single or math.isclose(best, worst, rel_tol=5e-3):
            n, way = _times(best)
            if single:
                where = f"{_gj(lo)}, {them} run" + _nearest(lo, r)
            at_or_over = "at" if single or math.isclose(lo, hi, rel_tol=1e-9) else "over"
            return f"{same} {n} {way} than {them} ({at_or_over} {where})."
        if worst >= 1.0:
            peak = "" if at is None else f" (at {_gj(at)})"
            return (
                f"{same} {best:.2f}x lower than {them} at most{peak} and {worst:.2f}x"
                f" lower at least (over {where})."
            )
        if best <= 1.0:
            return (
                f"{same} {1 / worst:.2f}x higher than {them} at most and {1 / best:.2f}x"
                f" higher at least (over {where})."
            )
        peak = "" if at is None else f" (at {_gj(at)})"
        return (
            f"{same} up to {best:.2f}x lower than {them}{peak} and up to"
            f" {1 / worst:.2f}x higher elsewhere (over {where})."
        )
    return _missing(name, r, rows, energy)


_SAME = {TOTAL: "energy", WINDOW: "in-window energy"}


def _nearest(energy: float, r: Mapping[str, float | None]) -> str:
    """Where a single baseline point lies just outside PowerFlow's energies and was
    matched with PowerFlow's nearest run (``compare.ZEUS_TOLERANCE``), say so."""
    p_lo, p_hi = r.get("powerflow_lo_j"), r.get("powerflow_hi_j")
    if p_lo is not None and energy < p_lo:
        return f"; PowerFlow's cheapest run, at {_gj(p_lo)}, is within 5 % of it"
    if p_hi is not None and energy > p_hi:
        return f"; PowerFlow's costliest run, at {_gj(p_hi)}, is within 5 % of it"
    return ""


def _missing(
    name: str, r: Mapping[str, float | None], rows: Sequence[Mapping[str, Any]], energy: str
) -> str:
    """Why there is no equal-energy ratio, and the dominance view in its place."""
    shown = display(name)
    b_lo, b_hi = r.get("baseline_lo_j"), r.get("baseline_hi_j")
    p_lo, p_hi = r.get("powerflow_lo_j"), r.get("powerflow_hi_j")
    if None in (b_lo, b_hi, p_lo, p_hi):
        why = f"No equal-energy ratio for {shown}: one of the two has no run."
    else:
        assert b_lo is not None and b_hi is not None and p_lo is not None and p_hi is not None
        side = "below" if b_hi < p_lo else "above"
        why = (
            f"No equal-energy ratio for {shown} (n/a): its runs span"
            f" {_span(b_lo, b_hi)}, all {side} PowerFlow's {_span(p_lo, p_hi)}, so neither"
            " sweep reaches an energy of the other and a ratio there would be an"
            " extrapolation."
        )
    dom = r.get("dominance")
    if dom is None:
        return (
            f"{why} Dominance (n/a): no PowerFlow run spends no more energy than"
            f" {_article(shown)} {shown} run and finishes jobs faster on average."
        )
    mine = _run_named(rows, REFERENCE, r.get("dominance_powerflow_j"), energy)
    theirs = _run_named(rows, name, r.get("dominance_baseline_j"), energy)
    e_p, e_b = r.get("dominance_powerflow_j"), r.get("dominance_baseline_j")
    energies = "" if e_p is None or e_b is None else f" ({_gj(e_p)} against {_gj(e_b)})"
    return (
        f"{why} Dominance instead: {mine} spends no more energy than {theirs}{energies}"
        f" and its average JCT is {dom:.2f}x lower."
    )


def _span(lo: float, hi: float) -> str:
    """``12.00 GJ`` or ``12.00-18.00 GJ``."""
    scale, _ = _unit(hi)
    return _gj(lo) if math.isclose(lo, hi, rel_tol=1e-9) else f"{lo / scale:.2f}-{_gj(hi)}"


def headlines(
    ratios: Mapping[str, Mapping[str, float | None]],
    rows: Sequence[Mapping[str, Any]] = (),
    energy: str = TOTAL,
) -> list[str]:
    """One sentence per baseline, in the order of ``ratios`` (taken at ``energy``)."""
    return [sentence(name, r, rows, energy) for name, r in ratios.items()]


def budget_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """PowerFlow's power budget of each run, in watts (None without a PowerFlow run)."""
    parts = [
        f"{knob_text(r)}: {r['limit_w']:,.0f} W"
        for r in rows
        if r["scheduler"] == REFERENCE and main_run(r) and r.get("limit_w") is not None
    ]
    if not parts:
        return None
    line = "PowerFlow's power budget (the lowest limit in force) per run: " + "; ".join(parts) + "."
    floor = [
        knob_text(r)
        for r in rows
        if r["scheduler"] in (REFERENCE, "powerflow+") and main_run(r) and r.get("below_cap_floor")
    ]
    if floor:
        line += (
            f" Below every GPU at its lowest power cap ({', '.join(dict.fromkeys(floor))}) a"
            " budget cannot keep the cluster computing: those runs are listed but no ratio is"
            " taken at them."
        )
    return line


def closing_lines(
    rows: Sequence[Mapping[str, Any]],
    ratios: Mapping[str, Mapping[str, float | None]],
    trace: TraceSpec,
) -> list[str]:
    """What the terminal ends with: the trace (and its duration bound), PowerFlow's
    budgets in watts, the submission window, then one headline sentence per baseline."""
    lines = [f"Trace: {trace.describe()}."]
    if trace.max_duration_h is not None:
        lines.append(
            f"Jobs longer than {trace.max_duration_h:g} h (at their requested GPUs and full"
            " clock) were left out of every run."
        )
    first = next((r for r in rows if not r.get("tag")), None)
    if first is not None and first.get("window_s") is not None:
        lines.append(
            f"Submission window (energy 'in window'): the {first['window_s'] / 3600:.1f} h from"
            " the first submission to the last."
        )
    budget = budget_line(rows)
    if budget is not None:
        lines.append(budget)
    if ratios:
        plus = any(r["scheduler"] == "powerflow+" for r in rows)
        window = jct_ratios(rows, WINDOW)
        lines += [
            "",
            "Headline (average JCT at equal total energy, PowerFlow's eta sweep: the paper's"
            " algorithm"
            + ("; PowerFlow+ against the baselines is a section of the report" if plus else "")
            + "). Total energy, as the paper measures it: what the cluster draws for the"
            " trace's whole work"
            + (
                "; then in-window energy, which the long jobs draining after the last"
                " submission do not decide"
                if window
                else ""
            )
            + ":",
        ]
        lines += [f"- {text}" for text in headlines(ratios, rows)]
        if window:
            lines += [
                "",
                "The same at equal in-window energy (the tail of long jobs draining after"
                " the last submission left out):",
            ]
            lines += [f"- {text}" for text in headlines(window, rows, WINDOW)]
    return lines


def _article(name: str) -> str:
    """The article before ``name``: "an" where it is said with a vowel first (AFS is
    said "ay-ef-es"), else "a"."""
    return "an" if name[:1].upper() in tuple("AEIOU") else "a"
