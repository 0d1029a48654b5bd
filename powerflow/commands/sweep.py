"""``powerflow sweep sensitivity|tuning|plus-tuning|job-clocks|ablation``: parameter studies.

``sensitivity``: the three sensitivity studies of paper §6.4, 100-job
synthetic traces (Gavel's generator) along the mean arrival interval, the
cluster size and the job size; average JCT per scheduler at one operating
point each. Writes CSV, JSON and one PNG with three panels.

``tuning``: the baselines' knob grids on the tuning windows of the whole trace
(``powerflow.lab.sim.tuning``), each setting scored and the best named.

``plus-tuning``: PowerFlow+'s knob grid on the same windows, each setting scored by
its average JCT against AFS's at equal energy (``powerflow.lab.sim.plus_tuning``);
with ``--grid profiling``, its profiling ladders instead of its policy knobs; with
``--grid short-first``, the short-first factor on its priorities and the rescale
margin with it (the three grids run in that order, each with the earlier choices);
with ``--grid tournament``, AFS-L's tournament in place of its heap (an experiment).

``job-clocks``: what a clock per job can add to AFS's allocation at equal energy, on
the same windows (``powerflow.lab.sim.job_clocks``).

``ablation``: the comparison from the paper's setting to this evaluation's, one
change at a time (``powerflow.lab.sim.ablation``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from powerflow.commands import checks
from powerflow.commands.simulate import _run_with_progress, add_cluster_args, config_from
from powerflow.lab.sim import ablation, experiments, job_clocks, output, plus_tuning, tuning
from powerflow.lab.sim.compare import ENERGIES
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, TraceSpec
from powerflow.lab.sim.tuning import Setting
from powerflow.lab.sim.windows import TUNING_WINDOWS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sweep", help="parameter studies (sensitivity, paper Fig. 11)")
    p.add_argument(
        "study",
        choices=["sensitivity", "tuning", "plus-tuning", "job-clocks", "ablation"],
        help="which study",
    )
    add_cluster_args(p, trace=False)  # each study sets its own traces and cluster sizes
    p.add_argument(
        "--quick",
        action="store_true",
        help="every other point of each axis; tuning, plus-tuning and job-clocks: the first"
        " 2 h of each window, 8 nodes",
    )
    p.add_argument(
        "--grid",
        choices=plus_tuning.GRID_NAMES,
        default="knobs",
        help="plus-tuning: PowerFlow+'s policy knobs (default), its profiling ladders,"
        " the short-first factor on its priorities (with the rescale margin) or AFS-L's"
        " tournament in place of its heap",
    )
    p.add_argument(
        "--oracle",
        action="store_true",
        help="plus-tuning: PowerFlow+ schedules with the ground truth, as the baselines do"
        " (what better models could gain at most)",
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="results folder, created with its parents (default results/<timestamp>)",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    if args.workers < 1:
        raise checks.ArgumentError(f"--workers must be at least 1, got {args.workers}")
    if args.grid != "knobs" and args.study != "plus-tuning":
        raise checks.ArgumentError(f"--grid is plus-tuning's; {args.study} has one grid")
    if args.oracle and args.study != "plus-tuning":
        raise checks.ArgumentError(f"--oracle is plus-tuning's, not {args.study}'s")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    default_out = Path("results") / f"{args.study}-{stamp}"
    out = checks.output_folder(args.out or default_out, "--out" if args.out else "--out (default)")
    if args.study == "tuning":
        return _tuning(args, config, out)
    if args.study == "plus-tuning":
        return _plus_tuning(args, config, out)
    if args.study == "job-clocks":
        return _job_clocks(args, config, out)
    if args.study == "ablation":
        return _ablation(args, config, out)
    specs = experiments.sensitivity(config, quick=args.quick)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    studies = experiments.sensitivity_rows(outcomes)
    rows = [row for study in studies.values() for row in study]
    output.write_csv(rows, out / "sensitivity.csv")
    output.write_json(studies, out / "sensitivity.json")
    labels = {s.name: s.label for s in experiments.STUDIES}
    # The title says what the parameter is; its column is headed by the study's name.
    from powerflow.lab.sim import plots  # matplotlib only where a plot is drawn

    plots.sensitivity(studies, labels, out / "sensitivity.png")
    if args.json:
        print(output.to_json(studies))
    else:
        console = output.stdout_console()
        for name, study_rows in studies.items():
            console.print(
                output.results_table(study_rows, f"sensitivity: {labels[name]}", value=("x", name))
            )
        console.print(f"wrote 3 files to {out}/")
    return 0


def _ablation(args: argparse.Namespace, config: SimConfig, out: Path) -> int:
    specs = ablation.ablation_specs(TraceSpec(), config, quick=args.quick)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    entries = ablation.summary(outcomes)
    words = ablation.lines(entries)
    output.write_csv([{**o.row(), "row": o.spec.tag} for o in outcomes], out / "runs.csv")
    output.write_json({"rows": entries, "headline": words}, out / "ablation.json")
    if args.json:
        print(output.to_json({"rows": entries, "headline": words}))
        return 0
    console = output.stdout_console()
    for line in words:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote 2 files to {out}/")
    return 0


def _tuning(args: argparse.Namespace, config: SimConfig, out: Path) -> int:
    specs = tuning.tuning_specs(config, hours=experiments.QUICK_HOURS if args.quick else None)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    result = tuning.score(outcomes)
    if _written(tuning.rows(result), out / "tuning", as_json=args.json):
        return 0
    console = output.stdout_console()
    for name, scored in result.items():
        table = tuning_table(name, scored)
        console.print(table)
        console.print(f"{name}: chosen {scored[0].setting.label}")
    console.print(f"wrote 2 files to {out}/")
    return 0


SETTING_WIDTH = 26
"""The plus-tuning table's setting column wraps at this width (the tuning tables', with
fewer columns, at 36), so that the table fits 80 columns whatever the labels' length;
its numbers never wrap."""


def tuning_table(name: str, scored: list[tuning.Scored]) -> Table:
    """One baseline's grid, best first, in 80 columns."""
    table = Table(
        title=f"{name} at {tuning.CLOCK_MHZ:g} MHz on the tuning windows:"
        " average JCT (h) per window",
        caption="score: the mean over the windows of the setting's average JCT over the"
        " best setting's (1: the best on every window)",
    )
    table.add_column("setting", max_width=36, overflow="fold")
    table.add_column("score", justify="right", no_wrap=True)
    for w in TUNING_WINDOWS:
        table.add_column(w.name, justify="right", no_wrap=True)
    for s in scored:
        cells = (f"{s.score:.3f}", *(f"{h:.2f}" for h in s.jct_h))
        table.add_row(s.setting.label, *cells, end_section=True)
    return table


def plus_tuning_table(grid: str, scored: list[plus_tuning.Scored]) -> Table:
    """PowerFlow+'s settings, best first, in 80 columns: each window's two ratios (equal
    total, then in-window energy) one above the other."""
    etas = " and ".join(f"{e:g}" for e in plus_tuning.ETAS)
    table = Table(
        title=f"powerflow+ ({grid}) at eta {etas} on the tuning windows:"
        " AFS's average JCT over PowerFlow+'s at equal energy",
        caption="each window: at equal total energy, then at equal in-window energy",
    )
    table.add_column("setting", max_width=SETTING_WIDTH, overflow="fold")
    for column in ("score", "restarts", *(w.name for w in plus_tuning.WINDOWS)):
        table.add_column(column, justify="right", no_wrap=True)
    per = len(ENERGIES)
    for s in scored:
        cells = [
            "\n".join("n/a" if r is None else f"{r:.2f}" for r in s.ratios[k : k + per])
            for k in range(0, len(s.ratios), per)
        ]
        score = "n/a" if s.score is None else f"{s.score:.3f}"
        table.add_row(s.setting.label, score, f"{s.restarts:,}", *cells, end_section=True)
    return table


def job_clocks_table(scored: list[job_clocks.Versus]) -> Table:
    """Each variant's ratios against AFS, one row per energy, in 80 columns."""
    table = Table(
        title="per-job clocks on AFS's allocation, tuning windows:"
        " AFS's average JCT over the variant's at equal energy"
    )
    for column in ("variant", "energy"):
        table.add_column(column, no_wrap=True)
    for column in ("geomean", *(w.name for w in job_clocks.WINDOWS)):
        table.add_column(column, justify="right", no_wrap=True)
    per = len(ENERGIES)
    for v in scored:
        for k, energy in enumerate(ENERGIES.values()):
            cells = (v.geomean[k], *v.ratios[k::per])
            table.add_row(v.variant, energy, *("n/a" if r is None else f"{r:.3f}" for r in cells))
    return table


def _written(rows: list[dict[str, Any]], stem: Path, *, as_json: bool) -> bool:
    """A study's rows as ``stem``.csv and .json; with ``as_json`` also printed, and
    True: the command is done (no table)."""
    output.write_csv(rows, stem.with_suffix(".csv"))
    output.write_json(rows, stem.with_suffix(".json"))
    if as_json:
        print(output.to_json(rows))
    return as_json


def _with_window(outcome: RunOutcome) -> dict[str, Any]:
    """A run's row with the window it ran on first, so that the CSV says which."""
    return {"window": outcome.spec.trace.window, **outcome.row()}


def _job_clocks(args: argparse.Namespace, config: SimConfig, out: Path) -> int:
    hours = experiments.QUICK_HOURS if args.quick else None
    specs = job_clocks.specs(config, hours=hours)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    output.write_csv([_with_window(o) for o in outcomes], out / "runs.csv")
    scored = job_clocks.score(outcomes)
    if _written(job_clocks.rows(scored), out / "job_clocks", as_json=args.json):
        return 0
    console = output.stdout_console()
    console.print(job_clocks_table(scored))
    console.print(f"wrote 3 files to {out}/")
    return 0


def _plus_tuning(args: argparse.Namespace, config: SimConfig, out: Path) -> int:
    hours = experiments.QUICK_HOURS if args.quick else None
    grid = plus_tuning.grid_named(args.grid)
    specs = plus_tuning.specs(config, hours=hours, grid=grid, oracle=args.oracle)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    output.write_csv(
        [{**_with_window(o), "setting": Setting(o.spec.scheduler, o.spec.policy_options).label}
         for o in outcomes],
        out / "runs.csv",
    )  # fmt: skip
    scored = plus_tuning.score(outcomes, grid)
    if _written(plus_tuning.rows(scored), out / "plus_tuning", as_json=args.json):
        return 0
    console = output.stdout_console()
    label = f"{args.grid}{', oracle' if args.oracle else ''}"
    table = plus_tuning_table(label, scored)
    console.print(table)
    if scored and args.oracle:
        console.print(f"powerflow+ with the ground truth: best {scored[0].setting.label}")
    elif scored:
        console.print(f"powerflow+: chosen {scored[0].setting.label}")
    console.print(f"wrote 3 files to {out}/")
    return 0
