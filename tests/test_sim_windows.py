"""Windows of the whole ElasticFlow trace, and the comparison on the held-out ones."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from powerflow.cli import main
from powerflow.core.errors import DataError, SimulationError
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.trace import ITP_TRACE, bundled_trace
from powerflow.lab.sim.windows import (
    DEFAULT_WINDOW,
    EVALUATION_WINDOWS,
    HEADER,
    TUNING_WINDOWS,
    TraceWindow,
    window_named,
    window_rows,
    window_trace,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_the_default_window_is_the_bundled_trace_row_for_row() -> None:
    with bundled_trace(ITP_TRACE).open(newline="") as fh:
        header, *bundled = list(csv.reader(fh))
    assert tuple(header) == HEADER
    assert sorted(window_rows(DEFAULT_WINDOW)) == sorted(tuple(r) for r in bundled)
    assert DEFAULT_WINDOW.start_s == 2_473_200


def test_tuning_and_evaluation_windows_are_disjoint_days_of_the_trace() -> None:
    assert len(EVALUATION_WINDOWS) >= 4 and DEFAULT_WINDOW in EVALUATION_WINDOWS
    for tune in TUNING_WINDOWS:
        assert not any(tune.overlaps(w) for w in EVALUATION_WINDOWS), tune.name
    every = [*EVALUATION_WINDOWS, *TUNING_WINDOWS]
    assert len({w.name for w in every}) == len(every)
    assert TraceWindow(3).overlaps(TraceWindow(3, hours=1))
    assert not TraceWindow(3).overlaps(TraceWindow(4))  # one ends where the next starts


def test_every_window_has_jobs_submitted_inside_it_from_time_zero() -> None:
    for window in EVALUATION_WINDOWS:
        rows = window_rows(window)
        submits = [int(r[1]) for r in rows]
        assert len(rows) > 500 and min(submits) >= 0 and max(submits) < 86_400
        assert submits == sorted(submits)
        assert len({r[7] for r in rows}) > 1  # clusters merged


def test_a_window_is_a_trace_file_made_once(tmp_path: Path) -> None:
    path = window_trace(TraceWindow(14), tmp_path)
    made = path.stat().st_mtime_ns
    assert window_trace(TraceWindow(14), tmp_path) == path
    assert path.stat().st_mtime_ns == made
    assert not list(tmp_path.glob("*.part"))  # written aside and renamed
    jobs = load_jobs(TraceSpec(window="d14", hours=1.0), SimConfig(nodes=8))
    assert len(jobs) == sum(1 for r in window_rows(TraceWindow(14)) if int(r[1]) < 3600)


def test_bad_window_names_and_mixed_traces_are_refused() -> None:
    for name in ("d59", "x14", "d", "14", "dd1"):
        with pytest.raises(DataError, match="dNN for a day"):
            window_named(name)
    assert window_named("d14") == TraceWindow(14) and window_named("d03") == TraceWindow(3)
    with pytest.raises(SimulationError, match="a window or a file"):
        TraceSpec(path="x.csv", window="d14")
    assert "ElasticFlow window d14" in TraceSpec(window="d14").describe()


def test_window_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scheduler", "gandiva", "--frequency", "1410", "--window", "d37"]
    assert main([*args, "--hours", "0.5", "--nodes", "4", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["jobs"] == sum(1 for r in window_rows(TraceWindow(37)) if int(r[1]) < 1800)
    assert main([*args, "--trace", __file__]) == 2
    assert "--window or --trace" in capsys.readouterr().err
    assert main(["simulate", "--scheduler", "afs", "--window", "d77"]) == 2
    err = capsys.readouterr().err
    assert "d77" in err and err.count("\n") == 1


def test_held_out_runs_the_comparison_on_every_evaluation_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--held-out", "--quick", "--hours", "1", "--nodes", "2"]
    assert main([*args, "--workers", "1", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [w.name for w in EVALUATION_WINDOWS]
    assert list(data["windows"]) == names
    assert {r["window"] for r in data["runs"]} == set(names)
    assert not any(r["oracle"] or r.get("priors") == "recurring" for r in data["runs"])
    # every figure of every window is in the spread, and the spread bounds it
    for key, per_baseline in data["spread"].items():
        if key.startswith("powerflow+_vs"):
            continue
        for baseline, s in per_baseline.items():
            have = [w[key][baseline] for w in data["windows"].values() if w[key].get(baseline)]
            assert s["windows"] == len(have) and s["missing"] == len(names) - len(have)
            if have:
                assert (s["lowest"], s["highest"]) == (min(have), max(have))
    assert json.loads((out / "held_out.json").read_text())["spread"] == data["spread"]
    assert data["headline"][1].startswith("windows: d28")
    for bad in (
        ["--scheduler", "afs"],
        ["--window", "d14"],
        ["--oracle"],
        ["--priors", "recurring"],
    ):
        assert main(["simulate", "--held-out", *bad]) == 2
        err = capsys.readouterr().err
        assert "--held-out" in err and err.count("\n") == 1


def test_the_report_summarises_the_held_out_windows_where_they_were_written(
    tmp_path: Path,
) -> None:
    from powerflow.lab.sim.report import _held_out

    folder = tmp_path / "held-out"
    assert _held_out(folder) == []  # not run: no section
    folder.mkdir()
    words = ["Held-out windows (...):", "windows: d28 (1901 jobs)", "- powerflow vs afs: 0.9"]
    (folder / "held_out.json").write_text(json.dumps({"headline": words}))
    section = _held_out(folder)
    assert section[0] == "## Held-out windows"
    assert all(w in section for w in words)


def test_the_held_out_lines_count_the_windows_a_spread_was_taken_over() -> None:
    from powerflow.lab.sim import heldout
    from powerflow.lab.sim.compare import ENERGIES

    entry: dict[str, object] = {"jobs": 10}
    spread: dict[str, object] = {}
    for energy in ENERGIES:
        for mine in heldout.SCHEDULERS:
            entry[f"{mine}@{energy}"] = {"afs": 1.1, "gandiva": None}
        entry[f"powerflow+_vs_powerflow@{energy}"] = 0.9
    windows = {"d28": entry, "d14": {**entry}}
    for key in entry:
        if key != "jobs" and not key.startswith("powerflow+_vs"):
            spread[key] = {
                "afs": heldout._spread([1.1, 1.3]),
                "gandiva": heldout._spread([1.2, None]),
            }
    words = "\n".join(heldout.lines({"windows": windows, "spread": spread}))
    assert "1.10-1.30x over 2 windows" in words
    assert "1.20-1.20x over 1 window)" in words and "1 windows" not in words


def _outcome(window: str, scheduler: str, energy_gj: float, jct_h: float) -> object:
    from types import SimpleNamespace

    row = {
        "scheduler": scheduler,
        "jobs": 10,
        "avg_jct_s": jct_h * 3600.0,
        "total_energy_j": energy_gj * 1e9,
        "window_energy_j": energy_gj * 0.25e9,
        "oracle": False,
        "below_cap_floor": False,
    }
    return SimpleNamespace(
        spec=SimpleNamespace(trace=SimpleNamespace(window=window)), row=lambda: row
    )


def test_held_out_ratios_keep_the_energies_they_were_taken_over() -> None:
    """Each window's ratio names the energies where both sweeps meet (those of
    ``compare.jct_ratios``), in the summary and in its lines; PowerFlow+'s ratio at
    total energy is held against the paper's factor over the windows that have one."""
    from powerflow.lab.sim import heldout
    from powerflow.lab.sim.compare import TOTAL, WINDOW, jct_ratios

    curves = {  # (energy GJ, avg JCT h) per scheduler; AFS meets PowerFlow+ over 30-40 GJ
        "powerflow": [(25.0, 8.0), (35.0, 5.0)],
        "powerflow+": [(20.0, 7.0), (30.0, 4.0), (40.0, 3.0)],
        "afs": [(30.0, 6.0), (45.0, 4.0)],
        "gandiva": [(28.0, 20.0), (34.0, 14.0)],
    }
    far = {**curves, "gandiva": [(90.0, 20.0), (95.0, 14.0)]}  # d14: Gandiva meets no one
    outcomes = [
        _outcome(w, name, e, t)
        for w, sweeps in (("d28", curves), ("d14", far))
        for name, pts in sweeps.items()
        for e, t in pts
    ]
    result = heldout.summary(outcomes)  # type: ignore[arg-type]
    d28, d14 = result["windows"]["d28"], result["windows"]["d14"]
    rows = [o.row() for o in outcomes[: len(outcomes) // 2]]  # type: ignore[attr-defined]
    want = jct_ratios(rows, TOTAL, reference="powerflow+")["afs"]
    got = d28[heldout.RANGES][f"powerflow+@{TOTAL}"]["afs"]
    assert got == [want["energy_lo_j"], want["energy_hi_j"]] == [30e9, 40e9]
    assert d28[f"powerflow+@{TOTAL}"]["afs"] == want["mean"]
    inside = jct_ratios(rows, WINDOW, reference="powerflow+")["afs"]  # a quarter of each
    assert d28[heldout.RANGES][f"powerflow+@{WINDOW}"]["afs"] == [7.5e9, 10e9]
    assert d28[f"powerflow+@{WINDOW}"]["afs"] == inside["mean"]
    assert d14[f"powerflow+@{TOTAL}"]["gandiva"] is None
    assert d14[heldout.RANGES][f"powerflow+@{TOTAL}"]["gandiva"] is None
    lines = heldout.lines(result)
    words = "\n".join(lines)
    assert f"{want['mean']:.2f} (30.00-40.00 GJ)" in words
    assert f"{inside['mean']:.2f} (7.50-10.00 GJ)" in words

    def line(start: str) -> str:
        return next(w for w in lines if w.startswith(start))

    gandiva = line("- powerflow+ vs gandiva, total")  # 14/3 h at 34 GJ on d28; n/a on d14
    assert ", n/a (spread" in gandiva and gandiva.endswith(
        "the paper's 3.39x reached on 1 of 1 window"
    )
    assert line("- powerflow+ vs afs, total").endswith(
        "the paper's 1.57x reached on 0 of 2 windows"
    )
    assert "paper" not in line("- powerflow+ vs gandiva, in-window")  # total energy only
    assert "paper" not in line("- powerflow vs afs")
    plus = line("- powerflow+ JCT / powerflow JCT, total")
    assert "(25.00-35.00 GJ)" in plus
