"""What a person reads from a comparison: the metrics beside total energy, the
headline sentences, the duration bound, the terminal tables and the figures.

Metrics and sentences are checked on hand-made results and rows whose numbers
are derived by hand; figures by their matplotlib objects (titles, axis units,
point labels, one colour and marker per scheduler).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex
from rich.console import Console

from powerflow.lab.groundtruth import ground_truth
from powerflow.lab.sim import plots
from powerflow.lab.sim.compare import jct_ratios
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.headline import closing_lines, headlines, sentence
from powerflow.lab.sim.metrics import (
    energy_between,
    reference_durations_s,
    reference_work_gpu_s,
    summarise,
)
from powerflow.lab.sim.output import VERSUS_ROWS, ratio_table, results_table, versus_table
from powerflow.lab.sim.result import JobRecord, RunResult, Series
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec, load_jobs, run_one

GJ = 1e9


def _job(i: int, submit: float, finish: float) -> JobRecord:
    return JobRecord(f"j{i}", "toy", 1, submit, finish, 0.0, 0.0, 0, 0, 0, 0, 0, 0)


def _series(t: list[float], power: list[float], limit: float = math.inf) -> Series:
    n = len(t)
    z = np.zeros(n)
    return Series(np.array(t), np.array(power), z, z, z, z, np.full(n, limit))


def _result(jobs: list[JobRecord], series: Series, prerun_j: float = 0.0) -> RunResult:
    cluster = energy_between(series, series.t_s[0], series.t_s[-1])
    return RunResult(
        tuple(jobs), series, 8, cluster, 0.0, prerun_j, 1.0, 1.0, 1.0,
        0.0, 0.0, 0.0, 0.0, math.inf, 1, 0.0, 0.0, 1, 1.0,
    )  # fmt: skip


def test_energy_between_integrates_the_step_function_within_the_bounds() -> None:
    # 100 W on [0, 10), 300 W on [10, 20), 50 W on [20, 40); the last row holds no time
    s = _series([0.0, 10.0, 20.0, 40.0], [100.0, 300.0, 50.0, 999.0])
    assert energy_between(s, 0.0, 40.0) == pytest.approx(1000 + 3000 + 1000)
    assert energy_between(s, 5.0, 15.0) == pytest.approx(500 + 1500)
    assert energy_between(s, 15.0, 100.0) == pytest.approx(1500 + 1000)
    assert energy_between(s, 30.0, 30.0) == 0.0


def test_window_energy_percentiles_and_energy_per_work() -> None:
    """Submissions at 10, 20 and 30 s: the window is 10..30 s; the last job runs to 100."""
    jobs = [_job(0, 10.0, 20.0), _job(1, 20.0, 60.0), _job(2, 30.0, 100.0)]
    series = _series([10.0, 25.0, 100.0], [200.0, 100.0, 0.0])
    m = summarise(_result(jobs, series, prerun_j=50.0), work_gpu_s=2 * 3600.0)
    # 200 W x 15 s + 100 W x 5 s inside the window, plus the pre-runs
    assert m["window_s"] == 20.0
    assert m["window_energy_j"] == pytest.approx(3000 + 500 + 50)
    total = 200 * 15 + 100 * 75 + 50
    assert m["total_energy_j"] == pytest.approx(total)
    assert m["work_gpu_h"] == 2.0
    assert m["energy_per_work_gpu_h_j"] == pytest.approx(total / 2.0)
    # JCTs 10, 40, 70: numpy's linear percentiles
    assert m["median_jct_s"] == 40.0
    assert m["p90_jct_s"] == pytest.approx(40 + 0.8 * 30)
    assert m["p99_jct_s"] == pytest.approx(40 + 0.98 * 30)
    assert summarise(_result(jobs, series))["energy_per_work_gpu_h_j"] is None


def test_reference_work_is_the_trace_duration_times_its_gpus() -> None:
    """The ITP trace's durations are measured at the requested GPUs and full clock; the
    reference work reproduces them (the ground truth is within 0.11 % of them)."""
    jobs = load_jobs(TraceSpec(hours=1.0), SimConfig())
    durations = reference_durations_s(jobs, ground_truth, gpus_per_node=8)
    measured = np.array([j.duration_s for j in jobs])
    assert np.allclose(durations, measured, rtol=2e-3)
    work = reference_work_gpu_s(jobs, ground_truth, gpus_per_node=8)
    assert work == pytest.approx(float(np.dot(measured, [j.num_gpu for j in jobs])), rel=2e-3)


def test_max_duration_leaves_out_the_long_jobs_and_says_so() -> None:
    whole = load_jobs(TraceSpec(hours=4.0), SimConfig())
    cut_spec = TraceSpec(hours=4.0, max_duration_h=6.0)
    cut = load_jobs(cut_spec, SimConfig())
    long = [j for j in whole if j.duration_s is not None and j.duration_s > 6.0 * 3600 * 1.002]
    assert long  # the first 4 h hold jobs longer than 6 h
    assert len(cut) < len(whole) and not {j.job_id for j in long} & {j.job_id for j in cut}
    assert all(j.duration_s is not None and j.duration_s <= 6.0 * 3600 * 1.002 for j in cut)
    assert "without jobs longer than 6 h" in cut_spec.describe()


def test_a_run_carries_window_energy_and_work(tmp_path: Path) -> None:
    """The series' integral over the whole run is the cluster's books (active + idle)."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_time,num_gpu,duration,model_name,global_batch_size,num_iteration,cluster\n"
        "a,0,1,0,resnet50,128,3000,c\nb,600,2,0,gpt2,256,2000,c\nc,1200,1,0,bert,64,4000,c\n"
    )
    cfg = SimConfig(nodes=1, gpus_per_node=4)
    o = run_one(RunSpec("gandiva", 1410, TraceSpec(str(trace)), cfg))
    m = o.metrics
    books = m["total_energy_j"] - m["prerun_energy_j"]
    assert m["window_s"] == 1200.0
    assert 0 < m["window_energy_j"] < m["total_energy_j"]
    assert m["work_gpu_h"] > 0
    assert m["energy_per_work_gpu_h_j"] == pytest.approx(m["total_energy_j"] / m["work_gpu_h"])
    from powerflow.lab.sim.runner import simulate

    res = simulate(RunSpec("gandiva", 1410, TraceSpec(str(trace)), cfg))
    assert energy_between(res.series, res.series.t_s[0], res.series.t_s[-1]) == pytest.approx(
        books, rel=1e-9
    )


def _row(name: str, energy_gj: float, jct_h: float, **knob: float) -> dict[str, object]:
    return {"scheduler": name, "total_energy_j": energy_gj * GJ, "avg_jct_s": jct_h * 3600, **knob}


def test_headline_interpolates_a_number_where_the_sweeps_overlap() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.4),
        _row("powerflow", 20, 2.0, eta=1.0),
        _row("tiresias", 12, 9.0, frequency_mhz=1020),
        _row("tiresias", 18, 6.0, frequency_mhz=1410),
    ]
    r = jct_ratios(rows)["tiresias"]
    # over 12..18 GJ: PowerFlow 3.6 h at 12, 2.4 h at 18; Tiresias 9 and 6: 2.5x throughout
    assert r["max"] == pytest.approx(2.5) and r["min"] == pytest.approx(2.5)
    assert (r["energy_lo_j"], r["energy_hi_j"]) == (12 * GJ, 18 * GJ)
    text = sentence("tiresias", r, rows)
    assert text == (
        "At the same energy, PowerFlow's average JCT is 2.50x lower than Tiresias'"
        " (over 12.00-18.00 GJ, the energies both sweeps reach)."
    )


def test_headline_gives_the_largest_and_smallest_gap_and_where() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.4),
        _row("powerflow", 20, 2.0, eta=1.0),
        _row("gandiva", 10, 12.0, frequency_mhz=1020),
        _row("gandiva", 20, 3.0, frequency_mhz=1410),
    ]
    r = jct_ratios(rows)["gandiva"]
    assert r["max"] == pytest.approx(3.0) and r["min"] == pytest.approx(1.5)
    assert r["max_at_j"] == 10 * GJ
    text = sentence("gandiva", r, rows)
    assert "3.00x lower than Gandiva's at most (at 10.00 GJ)" in text
    assert "1.50x lower at least (over 10.00-20.00 GJ" in text


def test_headline_says_when_powerflow_is_slower() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.4),
        _row("powerflow", 20, 2.0, eta=1.0),
        _row("afs", 10, 2.0, frequency_mhz=1020),
        _row("afs", 20, 1.0, frequency_mhz=1410),
    ]
    text = sentence("afs", jct_ratios(rows)["afs"], rows)
    assert "PowerFlow's average JCT is 2.00x higher than AFS' (over 10.00-20.00 GJ" in text
    mixed = [*rows[:2], _row("afs", 10, 8.0, frequency_mhz=1020), _row("afs", 20, 1.0)]
    text = sentence("afs", jct_ratios(mixed)["afs"], mixed)
    # 2.0x lower at 10 GJ, 2.0x higher at 20 GJ
    assert "up to 2.00x lower than AFS' (at 10.00 GJ) and up to 2.00x higher elsewhere" in text


def test_headline_of_a_single_zeus_point_names_its_energy_and_the_5_percent_match() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.4),
        _row("powerflow", 20, 2.0, eta=1.0),
        _row("gandiva+zeus", 15, 6.0),
        _row("tiresias+zeus", 9.6, 8.0),  # 4 % below PowerFlow's cheapest run
    ]
    ratios = jct_ratios(rows)
    assert sentence("gandiva+zeus", ratios["gandiva+zeus"], rows) == (
        "At the same energy, PowerFlow's average JCT is 2.00x lower than Gandiva+Zeus'"
        " (at 15.00 GJ, Gandiva+Zeus' run)."
    )
    assert sentence("tiresias+zeus", ratios["tiresias+zeus"], rows) == (
        "At the same energy, PowerFlow's average JCT is 2.00x lower than Tiresias+Zeus'"
        " (at 9.60 GJ, Tiresias+Zeus' run; PowerFlow's cheapest run, at 10.00 GJ,"
        " is within 5 % of it)."
    )


def test_na_is_explained_with_both_spans_and_the_dominance_pair() -> None:
    rows = [
        _row("powerflow", 30, 4.0, eta=0.4),
        _row("powerflow", 40, 3.0, eta=1.0),
        _row("gandiva", 42, 8.0, frequency_mhz=1020),
        _row("gandiva", 47, 7.0, frequency_mhz=1410),
    ]
    r = jct_ratios(rows)["gandiva"]
    assert r["max"] is None
    text = sentence("gandiva", r, rows)
    assert "No equal-energy ratio for Gandiva (n/a)" in text
    assert "42.00-47.00 GJ, all above PowerFlow's 30.00-40.00 GJ" in text
    # best pair: Gandiva 1020 MHz (42 GJ, 8 h) against PowerFlow eta 1 (40 GJ, 3 h)
    assert "PowerFlow eta 1 spends no more energy than Gandiva 1020 MHz" in text
    assert "2.67x lower" in text


def test_na_without_dominance_says_no_run_dominates() -> None:
    rows = [
        _row("powerflow", 30, 4.0, eta=0.4),
        _row("powerflow", 40, 3.0, eta=1.0),
        _row("afs", 20, 2.0, frequency_mhz=1020),
    ]
    text = headlines(jct_ratios(rows), rows)[0]
    assert "all below PowerFlow's" in text and "Dominance (n/a)" in text
    assert "than an AFS run" in text


def test_closing_lines_print_the_bound_the_window_budgets_and_one_line_per_baseline() -> None:
    rows = [
        {**_row("powerflow", 10, 4.0, eta=0.4), "limit_w": 61440.0, "window_s": 83000.0},
        {**_row("powerflow", 20, 2.0, eta=1.0), "limit_w": 153600.0, "window_s": 83000.0},
        _row("gandiva", 12, 9.0, frequency_mhz=1020),
        _row("tiresias", 50, 9.0, frequency_mhz=1020),
    ]
    lines = closing_lines(rows, jct_ratios(rows), TraceSpec(max_duration_h=24.0))
    text = "\n".join(lines)
    assert "without jobs longer than 24 h" in text
    assert "Jobs longer than 24 h" in text
    assert "23.1 h from the first submission to the last" in text
    assert "eta 0.4: 61,440 W; eta 1: 153,600 W" in text
    assert [line for line in lines if line.startswith("- ")] == [
        f"- {s}" for s in headlines(jct_ratios(rows), rows)
    ]
    assert len([line for line in lines if line.startswith("- ")]) == 2


def test_terminal_table_shows_the_sensitivity_value_p95_and_time_above_the_limit() -> None:
    row = {
        **_row("powerflow", 10, 4.0, eta=0.6),
        "p95_jct_s": 9 * 3600.0,
        "window_energy_j": 5 * GJ,
        "time_above_limit_s": 1800.0,
        "x": 300.0,
    }
    console = Console(record=True, width=250)
    console.print(results_table([row], "t", value=("x", "interval")))
    text = console.export_text()
    assert "interval" in text and "300" in text
    assert "win GJ" in text and "5.00" in text
    assert "p95 h" in text and "9.00" in text
    assert "over h" in text and "0.50" in text
    assert "powerflow eta" in text and "0.6" in text  # the run's name wraps, to fit 80
    assert max(map(len, text.splitlines())) <= 80  # though the console has 250


def test_a_comparisons_terminal_table_fits_80_columns() -> None:
    """The longest run names the comparison has, with numbers of its widths."""
    rows = [
        {
            **_row(name, 42.58, 11.12, **knob),
            "oracle": oracle,
            **({"priors": "recurring"} if recurring else {}),
            "p95_jct_s": 123.45 * 3600,
            "window_energy_j": 40.0 * GJ,
            "time_above_limit_s": 2.7 * 3600,
            "gpu_utilisation": 0.87,
        }
        for name, knob, oracle, recurring in (
            ("powerflow+", {"eta": 0.6}, False, True),
            ("powerflow+", {"eta": 0.6}, True, False),
            ("tiresias+zeus", {}, False, False),
            ("tiresias", {"frequency_mhz": 1410}, False, False),
        )
    ]
    console = Console(record=True, width=80)
    console.print(results_table(rows, "a title"))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    for cell in ("123.45", "42.58", "40.00", "2.70", "0.87", "11.12"):
        assert cell in text  # no number cut to fit


def test_the_ratio_tables_fit_80_columns_as_piped_and_cut_no_name_or_number() -> None:
    """As the comparison prints them piped (140 columns: ``stdout_console``) and on an
    80-column terminal: every line within 80, every baseline's name and figure whole."""
    wide = {"max": 12.34, "min": 10.5, "at_zeus_energy": 11.11, "dominance": 13.57}
    span = {"energy_lo_j": 123.45 * GJ, "energy_hi_j": 678.9 * GJ}
    names = ("gandiva", "tiresias", "gandiva+zeus", "tiresias+zeus", "afs")
    ratios = {name: {**wide, **span} for name in names}
    plus = {key: {"mean": 0.75, "best": 0.55, "worst": 10.97, **span} for key, _ in VERSUS_ROWS}
    for width in (140, 80):
        for table, cells in (
            (ratio_table(ratios), (*names, "12.34x", "10.50x", "11.11x", "13.57x")),
            (versus_table(plus), (*(label for _, label in VERSUS_ROWS), "10.97x")),
        ):
            console = Console(record=True, width=width)
            console.print(table)
            lines = console.export_text().splitlines()
            assert max(len(line) for line in lines) <= 80
            text = "\n".join(lines)
            assert "…" not in text
            for cell in (*cells, "123.45-678.90"):
                assert cell in text


def test_jct_vs_energy_labels_every_point_with_distinct_styles() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.4),
        _row("powerflow", 20, 2.0, eta=1.0),
        _row("gandiva", 12, 9.0, frequency_mhz=1020),
        _row("gandiva", 18, 6.0, frequency_mhz=1410),
        _row("tiresias", 12, 9.5, frequency_mhz=1020),
        _row("afs", 12, 5.0, frequency_mhz=1020),
        _row("gandiva+zeus", 13, 7.5, eta_knob=1.0),
        _row("gandiva+zeus", 15, 7.0, eta_knob=0.5),
        _row("tiresias+zeus", 15, 8.0, eta_knob=0.5),
        _row("powerflow+", 15, 3.0, eta=0.6),
        _row("newcomer", 15, 3.0),
        {**_row("powerflow", 15, 2.0, eta=0.6), "oracle": True},
    ]
    fig = plots.jct_vs_energy_figure(rows, "trace X")
    ax = fig.axes[0]
    assert "trace X" in ax.get_title()
    assert "(GJ)" in ax.get_xlabel() and "(h)" in ax.get_ylabel()
    labels = sorted(t.get_text() for t in ax.texts if t.get_text())
    clocks = ["1020 MHz", "1410 MHz", "1020 MHz", "1020 MHz"]
    # the oracle run is on this figure too, dashed (tests/test_sim_plots.py)
    etas = ["eta 0.4", "eta 1", "eta 0.6", "eta 0.6"]
    zeus = ["eta_knob 1", "eta_knob 0.5", "eta_knob 0.5"]
    assert labels == sorted([*etas, *clocks, *zeus, "own clock"])
    assert "eta_knob" in ax.get_legend().get_title().get_text()
    names = list(dict.fromkeys(r["scheduler"] for r in rows))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [*names, "fitted, held-out priors", "oracle (ground truth)"]
    lines = [ln for ln in ax.get_lines() if str(ln.get_label()).endswith("held-out priors")]
    assert [str(ln.get_label()).split(",")[0] for ln in lines] == names
    colours = [to_hex(ln.get_color()) for ln in lines]
    markers = [ln.get_marker() for ln in lines]
    assert len(set(colours)) == len(lines) and len(set(markers)) == len(lines)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _outcome(name: str, value: float | None, limit: float) -> RunOutcome:
    t = [0.0, 3600.0, 7200.0]
    s = Series(*(np.array(v, dtype=float) for v in (t, [1e4, 2e4, 0], [8, 16, 0], t, t, t)),
               np.full(3, limit))  # fmt: skip
    return RunOutcome(RunSpec(name, value), {}, s)


def test_allocation_power_has_a_title_the_budget_line_and_names() -> None:
    outcomes = [
        _outcome("powerflow", 0.6, 92160.0),
        _outcome("gandiva", 1410, 153600.0),
        _outcome("tiresias", 1410, 153600.0),
    ]
    fig = plots.allocation_and_power_figure(outcomes)
    top, bottom = fig.axes
    assert fig.get_suptitle()
    assert top.get_title() and bottom.get_title()
    assert "(kW)" in bottom.get_ylabel() and "(h)" in bottom.get_xlabel()
    names = [t.get_text() for t in top.get_legend().get_texts()]
    assert names == ["powerflow eta=0.6", "gandiva 1410 MHz", "tiresias 1410 MHz"]
    dashed = [ln for ln in bottom.get_lines() if ln.get_linestyle() == "--"]
    # PowerFlow's budget and the baselines' limit, once
    assert [ln.get_label() for ln in dashed] == [
        "powerflow eta=0.6 budget (92,160 W)",
        "baselines' limit (all GPUs at full power)",
    ]
    assert dashed[0].get_ydata()[0] == pytest.approx(92.16)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    fig.tight_layout()
    for ax in (top, bottom):  # each legend beside its axes, over no line
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.x0 > ax.get_window_extent(renderer).x1
        assert legend.x1 <= fig.bbox.x1  # and inside the figure
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_fitted_vs_oracle_and_sensitivity_have_titles_and_units() -> None:
    rows = [
        _row("powerflow", 10, 4.0, eta=0.6),
        {**_row("powerflow", 11, 3.8, eta=0.6), "oracle": True},
    ]
    fig = plots.fitted_vs_oracle_figure(rows)
    ax = fig.axes[0]
    assert ax.get_title() and "(GJ)" in ax.get_xlabel() and "(h)" in ax.get_ylabel()
    assert sorted(t.get_text() for t in ax.texts if t.get_text()) == ["eta 0.6", "eta 0.6"]
    studies = {
        "interval": [
            {"scheduler": "powerflow", "x": 120.0, "avg_jct_s": 3600.0},
            {"scheduler": "powerflow", "x": 600.0, "avg_jct_s": 7200.0},
        ]
    }
    fig2 = plots.sensitivity_figure(studies, {"interval": "mean job arrival interval (s)"})
    assert fig2.get_suptitle()
    (ax2,) = fig2.axes
    assert ax2.get_title() and "(s)" in ax2.get_xlabel() and "(h)" in ax2.get_ylabel()
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(fig2)


TINY_TRACE = (
    "job_id,submit_time,num_gpu,duration,model_name,global_batch_size,num_iteration,cluster\n"
    "a,0,1,0,resnet50,128,3000,c\nb,30,2,0,gpt2,256,2000,c\nc,60,1,0,bert,64,4000,c\n"
    "d,90,4,0,vgg16,128,1500,c\ne,400,1,0,deepspeech2,32,3000,c\n"
    "f,500,1,0,inception3,64,3000,c\ng,700,1,0,resnet50,128,900000,c\n"
)


def test_comparison_ends_with_one_headline_per_baseline_and_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The terminal's last lines: the bound (job g, about 9 h at 1 GPU, is left out),
    the budgets in watts, then a sentence per baseline; results.json keeps them."""
    from powerflow.cli import main

    trace = tmp_path / "tiny.csv"
    trace.write_text(TINY_TRACE)
    out = tmp_path / "out"
    args = ["simulate", "--quick", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "4"]
    args += ["--max-duration", "2", "--no-oracle-runs", "--workers", "1", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    tail = text[text.index("Trace: tiny.csv") :].splitlines()
    assert "without jobs longer than 2 h" in tail[0]
    assert any("PowerFlow's power budget" in line and " W" in line for line in tail)
    sentences = [line for line in tail if line.startswith("- ")]
    baselines = ("Gandiva", "Tiresias", "AFS", "Gandiva+Zeus", "Tiresias+Zeus")
    # one block at equal total energy, then one at equal in-window energy
    assert len(sentences) == 2 * len(baselines)
    total, window = sentences[: len(baselines)], sentences[len(baselines) :]
    for block, same in ((total, "same energy"), (window, "same in-window energy")):
        for name in baselines:
            (line,) = [line for line in block if f" {name}'" in line or f" {name} (" in line]
            assert "lower than" in line or "higher than" in line or "(n/a)" in line
            assert " MJ" in line  # a small trace's energies in MJ, not "0.00 GJ"
            assert "(n/a)" in line or f"At the {same}," in line
    import json

    data = json.loads((out / "results.json").read_text())
    assert [line for line in data["headline"] if line.startswith("- ")] == sentences
    assert set(data["jct_ratio_at_equal_window_energy"]) == set(data["jct_ratio_at_equal_energy"])
    assert "without jobs longer than 2 h" in data["title"]
    assert {r["jobs"] for r in data["runs"]} == {6}


def test_max_duration_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from powerflow.cli import main

    trace = tmp_path / "tiny.csv"
    trace.write_text(TINY_TRACE)
    args = ["simulate", "--scheduler", "afs", "--trace", str(trace), "--max-duration", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--max-duration" in err and err.count("\n") == 1


def test_the_comparison_sweeps_powerflow_low_and_baselines_from_the_lowest_efficient_clock() -> (
    None
):
    """PowerFlow down to eta 0.2 (its energies then reach the baselines' cheapest runs
    with idle nodes off); every baseline over five clocks from 1020 MHz up."""
    from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ
    from powerflow.lab.sim.experiments import comparison
    from powerflow.lab.sim.priors import HELD_OUT

    specs = [s for s in comparison(TraceSpec(), SimConfig()) if not s.oracle]
    specs = [s for s in specs if s.priors == HELD_OUT]
    values: dict[str, list[float | None]] = {}
    for s in specs:
        values.setdefault(s.scheduler, []).append(s.value)
    assert values["powerflow"] == [0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0]
    for name in ("gandiva", "tiresias", "afs"):
        assert values[name] == list(DEFAULT_FREQUENCIES_MHZ)


def test_the_report_says_which_trace_ran() -> None:
    from powerflow.lab.sim.report import _trace_text

    itp = " ".join(_trace_text(TraceSpec()))
    assert "stand-in for the paper's Alibaba PAI subset" in itp
    philly = " ".join(_trace_text(TraceSpec("powerflow/data/traces/philly-24h-1903jobs.csv")))
    assert "Philly" in philly and "Alibaba PAI subset**" not in philly
    assert _trace_text(TraceSpec("x/mine.csv", max_duration_h=5.0)) == [
        "Trace: mine.csv without jobs longer than 5 h."
    ]


def test_the_main_report_summarises_every_other_comparison(tmp_path: Path) -> None:
    """make_results.sh writes each other comparison to its own folder; the main page
    gives each one's title, a link to its report and its headline sentences."""
    import json

    from powerflow.lab.sim.report import _others

    out = tmp_path / "docs" / "results"
    philly = out / "philly"
    philly.mkdir(parents=True)
    (philly / "results.json").write_text(
        json.dumps({"title": "philly on 64 x 8", "headline": ["Trace: p.", "- sentence one"]})
    )
    (philly / "report.md").write_text("# p\n")
    (out / "sensitivity").mkdir()  # no results.json: not a comparison
    lines = _others(out, tmp_path / "docs")
    assert lines[:4] == ["## Other comparisons", "", "### philly on 64 x 8", ""]
    assert "Full report: [philly/report.md](results/philly/report.md)." in lines
    assert "- sentence one" in lines and "Trace: p." in lines
    assert _others(tmp_path / "empty", tmp_path) == []


def test_sweep_sensitivity_rows_show_their_parameter_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each terminal row of ``powerflow sweep sensitivity`` carries the axis value it
    belongs to (two tiny synthetic runs stand in for the study's 72)."""
    from powerflow.cli import main
    from powerflow.lab.sim import experiments
    from powerflow.lab.sim.synthetic import SyntheticSpec

    def tiny(config: SimConfig, *, quick: bool = False) -> list[RunSpec]:
        cfg = SimConfig(nodes=1, gpus_per_node=4)
        return [
            RunSpec(
                "gandiva",
                1410,
                TraceSpec(synthetic=SyntheticSpec(jobs=3, mean_interval_s=x, seed=0)),
                cfg,
                tag=f"interval={x:g}",
            )
            for x in (120.0, 600.0)
        ]

    monkeypatch.setattr(experiments, "sensitivity", tiny)
    out = tmp_path / "s"
    assert main(["sweep", "sensitivity", "--out", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "mean job arrival" in text
    rows = [line for line in text.splitlines() if "gandiva" in line]
    assert len(rows) == 2
    assert "120" in rows[0].split("gandiva")[0] and "600" in rows[1].split("gandiva")[0]
    table = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(map(len, table)) <= 80  # piped: 140 columns, the table in 80
