"""The sweeps' terminal tables fit 80 columns, as printed piped (``stdout_console``: 140
columns) and on an 80-column terminal, with no label or number cut."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.table import Table

from powerflow.commands.sweep import job_clocks_table, plus_tuning_table, tuning_table
from powerflow.lab.sim import job_clocks, plus_tuning, tuning
from powerflow.lab.sim.windows import TUNING_WINDOWS

OPTIONS = (
    ("queue_thresholds_gpu_s", (32500.0, 72000.0, 180000.0)),
    ("promote_knob", None),
    ("skew_slowdown", 0.03),
)
"""Options with a label longer than any the grids have, and a word longer than a wrapped
column."""
LONG = "queue_thresholds_gpu_s=(32500, 72000, 180000), promote_knob=none, skew_slowdown=0.03"


def _lines(table: Table, width: int) -> list[str]:
    console = Console(record=True, width=width)
    console.print(table)
    return console.export_text().splitlines()


def _unwrapped(lines: list[str]) -> str:
    """The first column's text, its wrapped lines joined, without spaces."""
    cells = (line.split("│")[1] for line in lines if line.startswith("│"))
    return "".join(cells).replace(" ", "")


@pytest.mark.parametrize("width", [140, 80])
def test_the_tuning_table_fits_80_columns_and_keeps_the_whole_label(width: int) -> None:
    setting = tuning.Setting("tiresias", OPTIONS)
    assert setting.label == LONG
    scored = [tuning.Scored(setting, 1.049, (8.58, 7.92, 4.77, 123.45))]
    lines = _lines(tuning_table("tiresias placement", scored), width)
    assert max(map(len, lines)) <= 80
    assert _unwrapped(lines) == LONG.replace(" ", "")
    text = "\n".join(lines)
    assert "…" not in text and "123.45" in text and "1.049" in text


@pytest.mark.parametrize("width", [140, 80])
def test_the_plus_tuning_table_fits_80_columns_with_both_ratios_of_each_window(
    width: int,
) -> None:
    ratios = tuple(1.11 + k / 100 for k in range(2 * len(TUNING_WINDOWS)))
    scored = [plus_tuning.Scored(tuning.Setting("powerflow+", OPTIONS), 1.034, ratios, 1_234_567)]
    lines = _lines(plus_tuning_table("tournament, oracle", scored), width)
    assert max(map(len, lines)) <= 80
    assert _unwrapped(lines) == LONG.replace(" ", "")
    text = "\n".join(lines)
    assert "…" not in text and "1,234,567" in text
    for r in ratios:
        assert f"{r:.2f}" in text


@pytest.mark.parametrize("width", [140, 80])
def test_the_job_clocks_table_fits_80_columns(width: int) -> None:
    ratios = tuple(1.111 + k / 1000 for k in range(2 * len(TUNING_WINDOWS)))
    scored = [job_clocks.Versus(name, ratios, (1.014, 0.967)) for name in job_clocks.VARIANTS]
    lines = _lines(job_clocks_table(scored), width)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert "…" not in text and "in-window energy" in text
    for cell in (*job_clocks.VARIANTS, *(f"{r:.3f}" for r in ratios), "1.014", "0.967"):
        assert cell in text
