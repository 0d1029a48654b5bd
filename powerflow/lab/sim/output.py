"""Writing results: CSV and JSON files, and the rich table on the terminal."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerflow.lab.sim.priors import run_name

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# rich is imported by the functions that draw: ``powerflow simulate --json`` prints
# no table, and rich's console and table modules are about 30 ms of its start-up
# (``python -X importtime -c "import rich.console, rich.table"``).

TABLE_COLUMNS = (
    ("avg_jct_s", "JCT h", 1 / 3600),
    ("p95_jct_s", "p95 h", 1 / 3600),
    ("total_energy_j", "GJ", 1e-9),
    ("window_energy_j", "win GJ", 1e-9),
    ("time_above_limit_s", "over h", 1 / 3600),
    ("gpu_utilisation", "util", 1.0),
)
"""The terminal's columns: (row key, header, scale), few enough that a comparison's
table fits 80 columns; every other column is in the run's CSV and JSON (and the
report's table). ``TABLE_CAPTION`` says what the short headers mean."""
TABLE_CAPTION = (
    "JCT: average; p95: its 95th percentile; GJ: total energy; win: energy in the"
    " submission window; over: time above the power limit; util: GPU utilisation."
    " The CSV has every column."
)


def _clean(value: Any) -> Any:
    """JSON has no inf or NaN: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def to_json(data: Any) -> str:
    return json.dumps(_clean(data), indent=2, sort_keys=False)


def write_json(data: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(data) + "\n")
    return path


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(_clean(dict(row)))
    return path


def knob_text(row: Mapping[str, Any]) -> str:
    """A run's setting: ``eta 0.6`` (PowerFlow), ``eta_knob 0.5`` (Zeus), ``1410 MHz``."""
    if row.get("eta") is not None:
        return f"eta {row['eta']:g}"
    if row.get("eta_knob") is not None:
        return f"eta_knob {row['eta_knob']:g}"
    if row.get("frequency_mhz") is not None:
        return f"{row['frequency_mhz']:.0f} MHz"
    return "-"


VALUE_RUN_WIDTH = 15
"""``results_table``'s run column wraps here when a ``value`` column comes first."""


def results_table(
    rows: Sequence[Mapping[str, Any]],
    title: str,
    *,
    value: tuple[str, str] | None = None,
    columns: Sequence[tuple[str, str, float]] = TABLE_COLUMNS,
    caption: str | None = None,
) -> Table:
    """One line per run. ``value``: a (row key, header) column shown first, the
    parameter a sensitivity row belongs to (``x``), with a short header (the title
    says what it is). ``columns``: ``TABLE_COLUMNS``, or the same keys in other units
    (``powerflow demo``'s runs last minutes, not days), with their ``caption``. The
    run's name and setting share one column, which wraps before the numbers do (with
    a ``value`` column, at ``VALUE_RUN_WIDTH``: the table in 80 columns)."""
    from rich.table import Table

    if columns is TABLE_COLUMNS:
        caption = TABLE_CAPTION
    table = Table(title=title, caption=caption)
    if value is not None:
        table.add_column(value[1], justify="right", no_wrap=True)
    table.add_column("run", max_width=None if value is None else VALUE_RUN_WIDTH)
    for _, label, _ in columns:
        table.add_column(label, justify="right", no_wrap=True)
    for row in rows:
        cells = [] if value is None else [_plain(row.get(value[0]))]
        knob = knob_text(row)
        cells.append(run_name(row) + ("" if knob == "-" else f" {knob}"))
        for key, label, scale in columns:
            cells.append(_number(row.get(key), scale, 0 if label == "budget W" else 2))
        table.add_row(*cells)
    return table


def _number(value: Any, scale: float, digits: int) -> str:
    if isinstance(value, bool) or value is None:
        return "-"
    if isinstance(value, int):
        return f"{value * scale:,.0f}" if scale != 1.0 else str(value)
    if isinstance(value, float) and math.isfinite(value):
        return f"{value * scale:,.{digits}f}"
    return "-"


def _plain(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float | int) else str(value)


RATIO_CAPTION = (
    "max, min: of the ratio over the energies both sweeps reach (common GJ); Zeus E: at"
    " the energy of the Zeus variant at eta_knob 0.5 (Gandiva+Zeus's for Gandiva and AFS,"
    " Tiresias+Zeus's for Tiresias); dominance: the largest ratio of a"
    " PowerFlow run spending no more energy than the baseline's run."
)


def ratio_table(ratios: Mapping[str, Mapping[str, float | None]]) -> Table:
    """Each baseline's equal-energy ratios (``compare.jct_ratios``), in 80 columns: short
    headers, explained in the caption, so that no name or number is cut."""
    from rich.table import Table

    table = Table(
        title="Baseline avg JCT / PowerFlow avg JCT at equal energy (>1: PowerFlow faster)",
        caption=RATIO_CAPTION,
    )
    table.add_column("baseline", no_wrap=True)
    for header in ("max", "min", "common GJ", "Zeus E", "dominance"):
        table.add_column(header, justify="right", no_wrap=True)
    for name, r in ratios.items():
        lo, hi = r.get("energy_lo_j"), r.get("energy_hi_j")
        table.add_row(
            name,
            _fmt(r.get("max")),
            _fmt(r.get("min")),
            "none" if lo is None or hi is None else f"{lo / 1e9:.2f}-{hi / 1e9:.2f}",
            _fmt(r.get("at_zeus_energy")),
            _fmt(r.get("dominance")),
        )
    return table


VERSUS_ROWS = (
    ("powerflow+_vs_powerflow", "fitted, held-out priors"),
    ("powerflow+_vs_powerflow_recurring", "fitted, own prior"),
    ("powerflow+_vs_powerflow_oracle", "oracle"),
    ("powerflow+_vs_powerflow_window", "held-out, in-window E"),
)
"""``versus_table``'s rows: the ``compare.versus`` figure and its label; the recurring-job
case is the job's own model's prior, the last row at equal in-window energy."""


def versus_table(plus: Mapping[str, Mapping[str, float] | None]) -> Table:
    """PowerFlow+'s avg JCT over PowerFlow's at equal energy (``compare.versus``), in 80
    columns."""
    from rich.table import Table

    table = Table(
        title="PowerFlow+ avg JCT / PowerFlow avg JCT at equal energy (<1: PowerFlow+ faster)",
        caption="own prior: the recurring job, whose model ran before; E: energy",
    )
    table.add_column("models", no_wrap=True)
    for header in ("mean", "best", "worst", "common GJ"):
        table.add_column(header, justify="right", no_wrap=True)
    for key, label in VERSUS_ROWS:
        r = plus.get(key)
        if r is None:
            table.add_row(label, "n/a", "n/a", "n/a", "none")
            continue
        span = f"{r['energy_lo_j'] / 1e9:.2f}-{r['energy_hi_j'] / 1e9:.2f}"
        table.add_row(label, _fmt(r["mean"]), _fmt(r["best"]), _fmt(r["worst"]), span)
    return table


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def stdout_console() -> Console:
    """Rich's console; 140 columns when piped (its 80-column default truncates the table)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=140)


def print_tables(console: Console, *tables: Table) -> None:
    for t in tables:
        console.print(t)
