"""``powerflow sweep sensitivity``: the three sensitivity studies of paper §6.4.

100-job synthetic traces (Gavel's generator) along the mean arrival interval,
the cluster size and the job size; average JCT per scheduler at one
operating point each. Writes CSV, JSON and one PNG with three panels.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from powerflow.commands import checks
from powerflow.commands.simulate import _run_with_progress, add_cluster_args, config_from
from powerflow.lab.sim import experiments, output


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sweep", help="parameter studies (sensitivity, paper Fig. 11)")
    p.add_argument("study", choices=["sensitivity"], help="which study")
    add_cluster_args(p, trace=False)  # each study sets its own traces and cluster sizes
    p.add_argument("--quick", action="store_true", help="every other point of each axis")
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
    default_out = Path("results") / dt.datetime.now().strftime("sensitivity-%Y%m%d-%H%M%S")
    out = checks.output_folder(args.out or default_out, "--out" if args.out else "--out (default)")
    specs = experiments.sensitivity(config, quick=args.quick)
    outcomes = _run_with_progress(specs, args.workers, Console(stderr=True), quiet=args.json)
    studies = experiments.sensitivity_rows(outcomes)
    rows = [row for study in studies.values() for row in study]
    output.write_csv(rows, out / "sensitivity.csv")
    output.write_json(studies, out / "sensitivity.json")
    labels = {s.name: s.label for s in experiments.STUDIES}
    from powerflow.lab.sim import plots  # matplotlib only where a plot is drawn

    plots.sensitivity(studies, labels, out / "sensitivity.png")
    if args.json:
        print(output.to_json(studies))
    else:
        console = output.stdout_console()
        for name, study_rows in studies.items():
            console.print(
                output.results_table(
                    study_rows, f"sensitivity: {labels[name]}", value=("x", labels[name])
                )
            )
        console.print(f"wrote 3 files to {out}/")
    return 0
