"""The equal-energy JCT ratios of the comparison, on hand-made curves."""

from __future__ import annotations

import pytest

from powerflow.lab.sim.compare import WINDOW, Curve, curves, jct_ratios, versus, zeus_energy
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.experiments import (
    QUICK_HOURS,
    comparison,
    comparison_window,
)
from powerflow.lab.sim.priors import HELD_OUT, RECURRING, main_run
from powerflow.lab.sim.runner import TraceSpec


def _row(name: str, energy: float, jct: float, **extra: object) -> dict[str, object]:
    return {"scheduler": name, "total_energy_j": energy, "avg_jct_s": jct, **extra}


def test_pareto_front_drops_dominated_points() -> None:
    curve = Curve.of([(10.0, 5.0), (8.0, 6.0), (12.0, 7.0), (14.0, 4.0)])
    assert curve.energy_j.tolist() == [8.0, 10.0, 14.0]
    assert curve.at(12.0) == pytest.approx(4.5)
    assert curve.at(7.0) is None
    assert curve.at(7.8, tolerance=0.05) == 6.0


def test_ratios_at_equal_energy_and_at_zeus_level() -> None:
    rows = [
        _row("powerflow", 10.0, 2.0),
        _row("powerflow", 20.0, 1.0),
        _row("gandiva", 10.0, 6.0),
        _row("gandiva", 20.0, 2.0),
        _row("gandiva+zeus", 15.0, 5.0),
        _row("powerflow", 15.0, 9.0, oracle=True),  # ignored: oracle run
    ]
    ratios = jct_ratios(rows)
    # gandiva / powerflow along the common range 10..20: 3.0 at 10, 2.0 at 20
    assert ratios["gandiva"]["max"] == pytest.approx(3.0)
    # at the Zeus energy 15: gandiva 4.0, powerflow 1.5
    assert ratios["gandiva"]["at_zeus_energy"] == pytest.approx(4.0 / 1.5)
    assert ratios["gandiva+zeus"]["at_zeus_energy"] == pytest.approx(5.0 / 1.5)
    assert ratios["gandiva+zeus"]["max"] == pytest.approx(5.0 / 1.5)
    # dominance, measured points only, PowerFlow's energy <= the baseline's:
    # gandiva (10, 6) / pf (10, 2) = 3.0; (20, 2) / pf (20, 1) = 2.0, / pf (10, 2) = 1.0
    assert ratios["gandiva"]["dominance"] == pytest.approx(3.0)
    # gandiva+zeus (15, 5) may only meet pf (10, 2): 2.5, below the interpolated 5 / 1.5
    assert ratios["gandiva+zeus"]["dominance"] == pytest.approx(2.5)


def test_zeus_point_outside_the_sweep_uses_the_5_percent_rule() -> None:
    rows = [
        _row("powerflow", 10.0, 2.0),
        _row("powerflow", 20.0, 1.0),
        _row("tiresias+zeus", 9.6, 3.0),  # 4% below PowerFlow's cheapest point
        _row("gandiva+zeus", 8.0, 3.0),  # 20% below: no fair comparison
    ]
    ratios = jct_ratios(rows)
    assert ratios["tiresias+zeus"]["at_zeus_energy"] == pytest.approx(1.5)
    assert ratios["gandiva+zeus"]["at_zeus_energy"] is None


def test_dominance_when_powerflow_is_cheaper_and_faster_than_every_baseline_run() -> None:
    rows = [
        _row("powerflow", 5.0, 2.0),
        _row("powerflow", 8.0, 1.5),
        _row("tiresias", 10.0, 4.0),
        _row("tiresias", 12.0, 3.0),
    ]
    r = jct_ratios(rows)["tiresias"]
    assert r["max"] is None  # the energy ranges 5..8 and 10..12 do not meet
    assert r["at_zeus_energy"] is None
    # pairs: 4/2 = 2.0, 4/1.5 = 8/3, 3/2 = 1.5, 3/1.5 = 2.0
    assert r["dominance"] == pytest.approx(8.0 / 3.0)


def test_no_dominance_when_powerflow_is_dearer_or_slower() -> None:
    dearer = [
        _row("powerflow", 20.0, 1.0),
        _row("powerflow", 30.0, 0.5),
        _row("gandiva", 10.0, 4.0),
        _row("gandiva", 12.0, 3.0),
    ]
    r = jct_ratios(dearer)["gandiva"]
    assert r["max"] is None
    assert r["dominance"] is None  # no PowerFlow point at or below 12
    slower = [
        _row("powerflow", 5.0, 5.0),
        _row("powerflow", 20.0, 1.0),
        _row("gandiva", 10.0, 4.0),
    ]
    # the only allowed pair, 4 / 5 = 0.8, is not a win, although PowerFlow's
    # interpolated JCT at 10 is 5 - 4 * 5/15 = 11/3: dominance is conservative
    r = jct_ratios(slower)["gandiva"]
    assert r["dominance"] is None
    assert r["max"] == pytest.approx(4.0 / (11.0 / 3.0))


def test_comparison_defaults_to_its_window_unless_told() -> None:
    assert comparison_window(TraceSpec()).hours is None
    assert comparison_window(TraceSpec(), quick=True).hours == QUICK_HOURS
    assert comparison_window(TraceSpec(hours=24.0), quick=True).hours == 24.0
    specs = comparison(TraceSpec(), SimConfig())
    assert {s.trace.hours for s in specs} == {None}
    quick = comparison(TraceSpec(), SimConfig(), quick=True)
    assert {s.trace.hours for s in quick} == {QUICK_HOURS}


def test_powerflow_plus_is_compared_with_powerflow_not_ranked_as_a_baseline() -> None:
    rows = [
        _row("powerflow", 10.0, 4.0),
        _row("powerflow", 20.0, 2.0),
        _row("powerflow+", 5.0, 3.0),
        _row("powerflow+", 15.0, 1.5),
        _row("powerflow+", 25.0, 1.0),
        _row("powerflow", 10.0, 8.0, oracle=True),
        _row("powerflow", 20.0, 4.0, oracle=True),
        _row("powerflow+", 10.0, 4.0, oracle=True),
        _row("powerflow+", 20.0, 3.0, oracle=True),
    ]
    assert "powerflow+" not in jct_ratios(rows)
    fitted = versus(rows, "powerflow+")
    assert fitted is not None
    # common range 10..20: powerflow+ 2.25 at 10 (over powerflow's 4.0), 1.5 at 15 (3.0),
    # 1.25 at 20 (2.0)
    assert (fitted["energy_lo_j"], fitted["energy_hi_j"]) == (10.0, 20.0)
    assert fitted["best"] == pytest.approx(0.5)
    assert fitted["worst"] == pytest.approx(1.25 / 2.0)
    assert 0.5 < fitted["mean"] < 1.25 / 2.0
    oracle = versus(rows, "powerflow+", oracle=True)
    assert oracle is not None
    assert oracle["best"] == pytest.approx(0.5) and oracle["worst"] == pytest.approx(0.75)
    assert (
        versus([_row("powerflow", 10.0, 4.0), _row("powerflow+", 5.0, 1.0)], "powerflow+") is None
    )
    assert versus(rows[:2], "powerflow+") is None


def test_the_comparison_sweeps_powerflow_plus_and_runs_it_with_the_oracle() -> None:
    """The sweep from held-out priors; the ground truth's runs and the recurring-job
    runs (own model's prior) at the oracle's etas, for both PowerFlows."""
    specs = comparison(TraceSpec(), SimConfig())
    for name in ("powerflow", "powerflow+"):
        mine = [s for s in specs if s.scheduler == name]
        held = [s for s in mine if not s.oracle and s.priors == HELD_OUT]
        assert len(held) == (7 if name == "powerflow" else 4)
        assert sorted(s.value for s in mine if s.oracle) == [0.6, 1.0]
        assert sorted(s.value for s in mine if s.priors == RECURRING) == [0.6, 1.0]
        assert not any(s.oracle and s.priors == RECURRING for s in mine)
    plus = [
        s
        for s in specs
        if s.scheduler == "powerflow+" and main_run({"priors": s.priors, "oracle": s.oracle})
    ]
    assert sorted(s.value for s in plus) == [0.4, 0.6, 0.8, 1.0]
    assert comparison(TraceSpec(), SimConfig(), oracle=False) == [
        s for s in specs if not s.oracle and s.priors == HELD_OUT
    ]


def test_the_report_ranks_baselines_not_powerflow_plus_against_powerflow() -> None:
    """PowerFlow+ faster than PowerFlow's fastest run is its own section's news, not a
    baseline that "wins at the fast, energy-hungry end"."""
    from powerflow.lab.sim.report import _fastest, _plus_section

    rows = [
        _row("powerflow", 10e9, 4.0, eta=0.6),
        _row("powerflow", 20e9, 2.0, eta=1.0),
        _row("powerflow+", 15e9, 1.5, eta=0.6),
        _row("powerflow+", 25e9, 1.0, eta=1.0),
        _row("gandiva", 30e9, 1.8, frequency_mhz=1410),
    ]
    lines = _fastest(rows)
    assert any(line.startswith("- gandiva") for line in lines)
    assert not any("powerflow+" in line for line in lines)
    section = "\n".join(_plus_section(rows))
    assert "## PowerFlow+ against PowerFlow" in section
    assert "over 15.00-20.00 GJ (best 0.50x" in section


def test_ratios_at_equal_in_window_energy_read_the_window_column() -> None:
    """The same runs compared on another energy: PowerFlow's tail costs it total
    energy (its total curve lies right of Gandiva's) but not in-window energy."""
    rows = [
        _row("powerflow", 30.0, 4.0, window_energy_j=10.0, eta=0.6),
        _row("powerflow", 40.0, 2.0, window_energy_j=20.0, eta=1.0),
        _row("gandiva", 20.0, 6.0, window_energy_j=10.0, frequency_mhz=1110),
        _row("gandiva", 25.0, 3.0, window_energy_j=20.0, frequency_mhz=1410),
    ]
    total = jct_ratios(rows)["gandiva"]
    window = jct_ratios(rows, WINDOW)["gandiva"]
    assert total["max"] is None  # 20-25 against 30-40: the ranges do not meet
    assert window["max"] == pytest.approx(1.5) and window["min"] == pytest.approx(1.5)
    assert (window["energy_lo_j"], window["energy_hi_j"]) == (10.0, 20.0)
    plus = [
        _row("powerflow+", 30.0, 2.0, window_energy_j=10.0, eta=0.6),
        _row("powerflow+", 40.0, 1.0, window_energy_j=20.0, eta=1.0),
    ]
    by_window, by_total = (
        versus(rows + plus, "powerflow+", energy=WINDOW),
        versus(rows + plus, "powerflow+"),
    )
    assert by_window is not None and by_total is not None
    assert (by_window["energy_lo_j"], by_window["energy_hi_j"]) == (10.0, 20.0)
    assert (by_total["energy_lo_j"], by_total["energy_hi_j"]) == (30.0, 40.0)
    assert by_window["best"] == by_total["best"] == pytest.approx(0.5)
    # rows without the column (an older results file) give no ratio, not a crash
    bare = [{k: v for k, v in r.items() if k != "window_energy_j"} for r in rows]
    assert jct_ratios(bare, WINDOW) == {}


def test_a_budget_below_the_cap_floor_is_listed_but_no_point_of_a_curve() -> None:
    """On 64 x 8 A100 (board's lowest cap 100 W) the floor is 51,200 W: eta 0.3's
    46,095 W is below it, eta 0.4's 61,460 W is not; the flag comes with the row and
    keeps the run out of every equal-energy curve."""
    import numpy as np

    from powerflow.lab.sim.result import Series
    from powerflow.lab.sim.runner import RunOutcome, RunSpec

    series = Series(*(np.zeros(2) for _ in range(7)))
    flags = {
        limit: RunOutcome(RunSpec("powerflow", 0.3), {"limit_w": limit}, series).row()[
            "below_cap_floor"
        ]
        for limit in (46_095.0, 51_199.0, 51_200.0, 61_460.0, None)
    }
    assert flags == {46_095.0: True, 51_199.0: True, 51_200.0: False, 61_460.0: False, None: False}
    rows = [
        _row("powerflow", 28.0, 16.0, eta=0.2, below_cap_floor=True),
        _row("powerflow", 34.0, 6.0, eta=0.4, below_cap_floor=False),
        _row("powerflow", 40.0, 4.0, eta=1.0),
        _row("gandiva", 27.0, 9.0, frequency_mhz=1020),
        _row("gandiva", 36.0, 5.0, frequency_mhz=1410),
    ]
    assert curves(rows)["powerflow"].energy_j.tolist() == [34.0, 40.0]
    ratio = jct_ratios(rows)["gandiva"]
    assert ratio["energy_lo_j"] == 34.0  # not 28: no ratio taken at the eta 0.2 run
    plus = [_row("powerflow+", 30.0, 5.0, eta=0.4, below_cap_floor=True)]
    plus += [_row("powerflow+", 36.0, 4.0, eta=0.6), _row("powerflow+", 40.0, 3.0, eta=1.0)]
    r = versus(rows + plus, "powerflow+")
    assert r is not None and r["energy_lo_j"] == 36.0


def test_the_comparison_sweeps_zeus_eta_knob_for_both_zeus_variants() -> None:
    """Four points in full (0.25 spends within 1 % of 0.0's energy on the default
    trace), two with ``quick``; Zeus's default 0.5 in both (the Zeus energy level)."""
    for quick, grid in ((False, [0.0, 0.5, 0.75, 1.0]), (True, [0.5, 1.0])):
        specs = comparison(TraceSpec(), SimConfig(), quick=quick)
        for name in ("gandiva+zeus", "tiresias+zeus"):
            assert sorted(s.value for s in specs if s.scheduler == name) == grid  # type: ignore[type-var]
        assert not any(s.scheduler.endswith("zeus-clock") for s in specs)
    assert len(comparison(TraceSpec(), SimConfig())) == 42
    assert len(comparison(TraceSpec(), SimConfig(), quick=True)) == 22


def test_ratios_interpolate_along_the_zeus_curve_and_take_its_default_as_the_level() -> None:
    rows = [
        _row("powerflow", 10.0, 2.0, eta=0.4),
        _row("powerflow", 20.0, 1.0, eta=1.0),
        _row("gandiva", 10.0, 6.0, frequency_mhz=1020),
        _row("gandiva", 20.0, 2.0, frequency_mhz=1410),
        _row("gandiva+zeus", 20.0, 2.5, eta_knob=0.0),
        _row("gandiva+zeus", 16.0, 3.0, eta_knob=0.5),
        _row("gandiva+zeus", 12.0, 6.0, eta_knob=1.0),
    ]
    ratios = jct_ratios(rows)
    zeus = ratios["gandiva+zeus"]
    # the Zeus level is the eta_knob 0.5 run's 16 J, not the curve's cheapest end
    assert zeus["zeus_energy_j"] == pytest.approx(16.0)
    assert zeus_energy(rows, "gandiva+zeus") == pytest.approx(16.0)
    assert zeus["at_zeus_energy"] == pytest.approx(3.0 / 1.4)  # PowerFlow at 16 J: 1.4 s
    assert ratios["gandiva"]["at_zeus_energy"] == pytest.approx(3.6 / 1.4)  # Gandiva: 3.6 s
    # interpolated along the Zeus curve over 12..20 J: the largest ratio at its cheap
    # end (6 / 1.8), the smallest at its middle point (3 / 1.4), not at an end (2.5 / 1)
    assert (zeus["energy_lo_j"], zeus["energy_hi_j"]) == (12.0, 20.0)
    assert zeus["max"] == pytest.approx(6.0 / 1.8)
    assert zeus["min"] == pytest.approx(3.0 / 1.4)
    assert zeus["max_at_j"] == pytest.approx(12.0)


def test_no_zeus_level_without_a_run_at_zeus_default() -> None:
    rows = [
        _row("powerflow", 10.0, 2.0),
        _row("powerflow", 20.0, 1.0),
        _row("gandiva+zeus", 12.0, 6.0, eta_knob=1.0),
        _row("gandiva+zeus", 20.0, 2.5, eta_knob=0.0),
    ]
    assert zeus_energy(rows, "gandiva+zeus") is None
    assert jct_ratios(rows)["gandiva+zeus"]["at_zeus_energy"] is None


def test_the_report_holds_powerflow_plus_against_the_baselines_on_both_energies() -> None:
    """PowerFlow+ as the reference of ``jct_ratios``, at equal total and in-window
    energy, each ratio with the energies it was taken over and the paper's factor."""
    from powerflow.lab.sim.report import _plus_vs_baselines

    rows = [
        _row("powerflow", 10e9, 4.0, window_energy_j=2e9, eta=0.6),
        _row("powerflow", 20e9, 2.0, window_energy_j=4e9, eta=1.0),
        _row("powerflow+", 10e9, 2.0, window_energy_j=2e9, eta=0.6),
        _row("powerflow+", 20e9, 1.0, window_energy_j=4e9, eta=1.0),
        _row("gandiva", 10e9, 8.0, window_energy_j=3e9, frequency_mhz=1110),
        _row("gandiva", 20e9, 4.0, window_energy_j=5e9, frequency_mhz=1410),
    ]
    total = jct_ratios(rows, reference="powerflow+")["gandiva"]
    window = jct_ratios(rows, WINDOW, reference="powerflow+")["gandiva"]
    assert total["mean"] == pytest.approx(4.0)  # 8/2 and 4/1 at either end, 4x between
    section = "\n".join(_plus_vs_baselines(rows))
    assert "## PowerFlow+ against the baselines" in section
    total_table, window_table = section.split("At equal in-window energy:")
    assert "| gandiva | 4.00x | 4.00x | 4.00x | 10.00-20.00 | 3.39x |" in total_table
    assert window["energy_lo_j"] == 3e9 and window["energy_hi_j"] == 4e9
    assert f"| gandiva | {window['mean']:.2f}x |" in window_table
    assert "| 3.00-4.00 | 3.39x |" in window_table
    assert _plus_vs_baselines(rows[:2] + rows[4:]) == []  # no PowerFlow+ runs: no section
    no_window = [{k: v for k, v in r.items() if k != "window_energy_j"} for r in rows]
    only_total = "\n".join(_plus_vs_baselines(no_window))  # the energy it has, not none
    assert "| gandiva | 4.00x |" in only_total and "in-window" not in only_total
