"""The paper's headline comparison: average JCT at equal total energy.

Each scheduler's runs give points (total energy, average JCT). A sweep's
points are reduced to their Pareto front (a setting that costs more energy
AND more time is never the one anyone would pick; the paper drops baseline
clocks below 1020 MHz for that reason) and interpolated linearly in energy.
For every baseline, the ratio of its average JCT to PowerFlow's at the same
energy (above 1 means PowerFlow is faster) is reported as the maximum over
the energies both curves cover, and at the Zeus energy level: the energy of
Gandiva+Zeus (Tiresias+Zeus for Tiresias) at Zeus's default ``eta_knob``
(``zeus_energy``), where a curve that does not reach it may stand in with its
nearest point if that lies within 5% (as in §6.4). The Zeus variants are
curves too: their ``eta_knob`` sweep (``ZEUS_ETA_KNOBS``) is interpolated like
the baselines' clocks.

Both need the energy ranges to meet; when PowerFlow is cheaper AND faster than
every baseline run they do not, and both read n/a although PowerFlow wins. So a
third figure, ``dominance``, is reported as well: the largest ``J_b / J_p`` over
pairs of Pareto points, one baseline ``(E_b, J_b)`` and one PowerFlow
``(E_p, J_p)``, with ``E_p <= E_b`` (PowerFlow spends no more energy and is that
many times faster); None when no such pair exists or none has a ratio above 1.
It uses measured points only, no interpolation or extrapolation. Since a Pareto
front's JCT falls with energy, it never exceeds the equal-energy ratio at any
``E_b`` PowerFlow's curve covers: it is a lower bound on that ratio, and out of
PowerFlow's range it is one as long as more energy would not make PowerFlow slower.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from powerflow.lab.schedulers import ZEUS_ETA_KNOB
from powerflow.lab.sim.priors import HELD_OUT, main_run

TOTAL = "total_energy_j"
WINDOW = "window_energy_j"
ENERGIES = {TOTAL: "total energy", WINDOW: "in-window energy"}
"""The energies a ratio is taken at: the whole run's, and the submission window's
(first to last submission), which the trace's longest jobs, draining for days
after it, do not decide. Energy per GPU-hour of work is the total over the
trace's work, the same for every scheduler, so its ratios are the total's."""

REFERENCE = "powerflow"
CHALLENGERS = ("powerflow+",)
"""Not baselines: PowerFlow's own variants, compared by ``versus`` instead."""
ZEUS_TOLERANCE = 0.05
ZEUS_LEVEL_OF = {
    "gandiva": "gandiva+zeus",
    "tiresias": "tiresias+zeus",
    "afs": "gandiva+zeus",
    "gandiva+zeus": "gandiva+zeus",
    "tiresias+zeus": "tiresias+zeus",
}


@dataclass(frozen=True)
class Curve:
    """Pareto front of (energy, JCT), sorted by energy, JCT falling."""

    energy_j: np.ndarray
    jct_s: np.ndarray

    @staticmethod
    def of(points: Iterable[tuple[float, float]]) -> Curve:
        pts = sorted(points)
        energy: list[float] = []
        jct: list[float] = []
        # Walk from the cheapest: keep a point only if it is faster than every cheaper one.
        for e, j in pts:
            if not jct or j < jct[-1]:
                energy.append(e)
                jct.append(j)
        return Curve(np.asarray(energy), np.asarray(jct))

    @property
    def lo(self) -> float:
        return float(self.energy_j[0])

    @property
    def hi(self) -> float:
        return float(self.energy_j[-1])

    def at(self, energy: float, tolerance: float = 0.0) -> float | None:
        """JCT at ``energy``; outside the curve only within ``tolerance`` of an end."""
        if self.lo <= energy <= self.hi:
            return float(np.interp(energy, self.energy_j, self.jct_s))
        nearest = 0 if energy < self.lo else -1
        if abs(self.energy_j[nearest] - energy) <= tolerance * energy:
            return float(self.jct_s[nearest])
        return None


def curves(rows: Sequence[Mapping[str, Any]], energy: str = TOTAL) -> dict[str, Curve]:
    """One curve per scheduler from the main comparison's rows (``main_run``: no
    oracle, recurring-job or tagged runs), against ``energy`` (``ENERGIES``). A run
    whose budget is below its GPUs at their lowest power cap (``below_cap_floor``)
    is no point of a curve: it queues jobs by design, and ratios taken there would
    measure the budget, not the scheduler."""
    points: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if not main_run(row) or row.get(energy) is None or row.get("below_cap_floor"):
            continue
        points.setdefault(row["scheduler"], []).append(
            (float(row[energy]), float(row["avg_jct_s"]))
        )
    return {name: Curve.of(pts) for name, pts in points.items()}


def zeus_energy(rows: Sequence[Mapping[str, Any]], name: str, energy: str = TOTAL) -> float | None:
    """The Zeus energy level: ``energy`` of ``name``'s main run at Zeus's default
    ``eta_knob`` (``ZEUS_ETA_KNOB``; a row without the column counts as at it). The
    paper compares at the energy Zeus spends as its users run it, which is one
    point of the sweep, not its cheapest or dearest end. None without that run."""
    for row in rows:
        if (
            row["scheduler"] == name
            and main_run(row)
            and row.get("eta_knob", ZEUS_ETA_KNOB) == ZEUS_ETA_KNOB
            and row.get(energy) is not None
        ):
            return float(row[energy])
    return None


def _ratios(base: Curve, ref: Curve) -> tuple[np.ndarray, np.ndarray] | None:
    """``base``'s JCT over ``ref``'s at equal energy, and those energies: 201 spanning the
    range both cover, with their own points added; None when the ranges do not meet."""
    lo, hi = max(base.lo, ref.lo), min(base.hi, ref.hi)
    if lo > hi:
        return None
    grid = np.unique(np.concatenate([np.linspace(lo, hi, 201), base.energy_j, ref.energy_j]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    ratio: np.ndarray = np.interp(grid, base.energy_j, base.jct_s) / np.interp(
        grid, ref.energy_j, ref.jct_s
    )
    return ratio, grid


def _dominance(base: Curve, ref: Curve) -> tuple[float, float, float] | None:
    """(ratio, E_b, E_p) of the best dominance pair, or None (see the module docstring)."""
    ratio = base.jct_s[:, None] / ref.jct_s[None, :]
    allowed = ref.energy_j[None, :] <= base.energy_j[:, None]
    if not allowed.any():
        return None
    masked = np.where(allowed, ratio, -np.inf)
    i, k = np.unravel_index(int(np.argmax(masked)), masked.shape)
    best = float(masked[i, k])
    return (best, float(base.energy_j[i]), float(ref.energy_j[k])) if best > 1.0 else None


def jct_ratios(
    rows: Sequence[Mapping[str, Any]], energy: str = TOTAL, reference: str = REFERENCE
) -> dict[str, dict[str, float | None]]:
    """Per baseline: ``max`` and ``min`` of the equal-energy ratio over the energies both
    curves cover (``energy_lo_j``..``energy_hi_j``; ``max_at_j``: where the max is),
    ``at_zeus_energy`` at ``zeus_energy_j``, ``dominance`` with its pair's energies
    (``dominance_baseline_j``, ``dominance_powerflow_j``), and each curve's energy span
    (``baseline_lo_j``, ``baseline_hi_j``, ``powerflow_lo_j``, ``powerflow_hi_j``), which
    says why a ratio is missing. None where a figure does not exist. ``energy``: the
    energy the curves are drawn against (``ENERGIES``); ``reference``: whose JCT is the
    denominator (PowerFlow, or PowerFlow+ against the baselines); ``mean`` is the
    ratio's mean over the common range."""
    by_name = curves(rows, energy)
    ref = by_name.get(reference)
    if ref is None:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for name, curve in by_name.items():
        if name in (REFERENCE, *CHALLENGERS):
            continue
        at_zeus: float | None = None
        zeus_e = zeus_energy(rows, ZEUS_LEVEL_OF.get(name, ""), energy)
        if zeus_e is not None:
            mine = curve.at(zeus_e, ZEUS_TOLERANCE)
            theirs = ref.at(zeus_e, ZEUS_TOLERANCE)
            if mine is not None and theirs is not None:
                at_zeus = mine / theirs
        best = worst = best_at = lo = hi = mean = None
        spread = _ratios(curve, ref)
        if spread is not None:
            ratio, grid = spread
            best, worst, mean = float(ratio.max()), float(ratio.min()), float(ratio.mean())
            best_at = float(grid[int(np.argmax(ratio))])
            lo, hi = float(grid[0]), float(grid[-1])
        elif len(curve.energy_j) == 1 and at_zeus is not None:
            # a single point just outside the common range: its 5% match
            best = worst = mean = at_zeus
            best_at = lo = hi = curve.lo
        dom = _dominance(curve, ref)
        out[name] = {
            "mean": mean,
            "max": best,
            "min": worst,
            "max_at_j": best_at,
            "energy_lo_j": lo,
            "energy_hi_j": hi,
            "at_zeus_energy": at_zeus,
            "zeus_energy_j": zeus_e,
            "dominance": None if dom is None else dom[0],
            "dominance_baseline_j": None if dom is None else dom[1],
            "dominance_powerflow_j": None if dom is None else dom[2],
            "baseline_lo_j": curve.lo,
            "baseline_hi_j": curve.hi,
            "powerflow_lo_j": ref.lo,
            "powerflow_hi_j": ref.hi,
        }
    return out


def ratios_by_window(
    base: Mapping[str, Sequence[Mapping[str, Any]]],
    ref: Mapping[str, Sequence[Mapping[str, Any]]],
    windows: Sequence[str],
    base_name: str,
    ref_name: str,
) -> tuple[float | None, ...]:
    """Per window, then per energy (``ENERGIES``' order): ``base_name``'s average JCT over
    ``ref_name``'s at equal energy (``jct_ratios``' mean over the energies both reach),
    from each one's rows by window; None where the curves do not meet. How a study on
    several windows scores one scheduler against another."""
    return tuple(
        jct_ratios([*base.get(w, ()), *ref.get(w, ())], energy, ref_name)
        .get(base_name, {})
        .get("mean")
        for w in windows
        for energy in ENERGIES
    )


def geomean(values: Iterable[float | None]) -> float | None:
    """The geometric mean of the values that exist, None without any."""
    have = [v for v in values if v is not None]
    return math.exp(sum(map(math.log, have)) / len(have)) if have else None


def versus(
    rows: Sequence[Mapping[str, Any]],
    name: str,
    *,
    oracle: bool = False,
    priors: str = HELD_OUT,
    energy: str = TOTAL,
) -> dict[str, float] | None:
    """``name``'s average JCT over PowerFlow's at equal energy, over the common range.

    Both Pareto fronts are interpolated on 201 energies spanning the range both
    cover (with their own points added); ``mean``, ``best`` (the lowest ratio)
    and ``worst`` summarise the ratio there (below 1: ``name`` is faster), and
    ``energy_lo_j``/``energy_hi_j`` say where. ``oracle`` compares the runs
    with ground-truth models instead, ``priors`` the fitted runs from those priors
    (``powerflow.lab.sim.priors``), ``energy`` another energy (``ENERGIES``). None
    when the ranges do not meet.
    """
    keep = [
        r
        for r in rows
        if bool(r.get("oracle")) == oracle
        and not r.get("tag")
        and (oracle or r.get("priors", HELD_OUT) == priors)
        and r.get(energy) is not None
        and not r.get("below_cap_floor")
    ]
    points: dict[str, list[tuple[float, float]]] = {}
    for row in keep:
        points.setdefault(row["scheduler"], []).append(
            (float(row[energy]), float(row["avg_jct_s"]))
        )
    if name not in points or REFERENCE not in points:
        return None
    mine, ref = Curve.of(points[name]), Curve.of(points[REFERENCE])
    spread = _ratios(mine, ref)
    if spread is None:
        return None
    ratio = spread[0]
    lo, hi = max(mine.lo, ref.lo), min(mine.hi, ref.hi)
    return {
        "mean": float(ratio.mean()),
        "best": float(ratio.min()),
        "worst": float(ratio.max()),
        "energy_lo_j": lo,
        "energy_hi_j": hi,
    }
