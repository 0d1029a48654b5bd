"""Tiresias's knobs on the comparison's trace: run the grid, print its table and the best.

The comparison (``powerflow simulate``) runs Tiresias with the defaults of
``powerflow.lab.baselines.tiresias``; this grid is where they come from. It
crosses the queue thresholds (attained GPU-seconds) with the starvation
guard's PROMOTE_KNOB, starting from the Tiresias simulator's own settings
(``dlas-gpu``: thresholds 3,250 and 7,200 GPU-seconds, three queues, no
promotion), at the comparison's top clock, on the whole default trace with
idle nodes off for every scheduler (the comparison's default; add
``--paper-baselines`` for the paper's setting). The best setting is the one
with the lowest average JCT, the objective Tiresias minimises; the knobs
change when jobs run, not how fast or at which clock, so they are tuned once
and used at every clock of the comparison's sweep.

Stage two runs four neighbours of stage one's best (thresholds a third and
three times as large, one queue fewer, one more) at its PROMOTE_KNOB. One
whole-trace run takes about a minute of CPU; the 16 runs take about 10-15
minutes on two shared cores (use ``nice``; ``--hours 2`` to try it quickly):

    nice -n 10 .venv/bin/python scripts/tune_baselines.py
    nice -n 10 .venv/bin/python scripts/tune_baselines.py --hours 2 --workers 1

docs/baselines.md, section "Tiresias at its best", holds the table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec, run_many

CLOCK_MHZ = 1410
"""The comparison's top clock for Tiresias (``experiments.DEFAULT_FREQUENCIES``)."""

THRESHOLDS: tuple[tuple[float, ...], ...] = (
    (3250.0, 7200.0),  # Tiresias's simulator (dlas-gpu): three queues
    (3600.0,),  # the previous default: two queues at one GPU-hour
    (32500.0, 72000.0),  # the simulator's, ten times: this trace's jobs are long
    (325000.0, 720000.0),  # a hundred times: hardly any demotion
)
PROMOTE_KNOBS: tuple[float | None, ...] = (None, 2.0, 8.0)
"""None: no promotion (the simulator's ``dlas-gpu``); it sweeps 0.5 to 1000."""


def grid(trace: TraceSpec, config: SimConfig) -> list[RunSpec]:
    return [
        RunSpec(
            "tiresias",
            float(CLOCK_MHZ),
            trace,
            config,
            tag=f"tune thresholds={list(th)} promote_knob={knob}",
            policy_options=(("queue_thresholds_gpu_s", th), ("promote_knob", knob)),
        )
        for th in THRESHOLDS
        for knob in PROMOTE_KNOBS
    ]


def neighbours(
    thresholds: tuple[float, ...], knob: float | None, trace: TraceSpec, config: SimConfig
) -> list[RunSpec]:
    """Stage two, around stage one's best: its thresholds a third and three times as
    large, one queue fewer and one more (the last threshold 2.5 times the one before),
    at its PROMOTE_KNOB."""
    variants = [
        tuple(t / 3 for t in thresholds),
        tuple(t * 3 for t in thresholds),
        thresholds[:-1],
        (*thresholds, thresholds[-1] * 2.5),
    ]
    return [
        RunSpec(
            "tiresias",
            float(CLOCK_MHZ),
            trace,
            config,
            tag=f"tune thresholds={list(th)} promote_knob={knob}",
            policy_options=(("queue_thresholds_gpu_s", th), ("promote_knob", knob)),
        )
        for th in variants
        if th  # one threshold less than one is no queue at all
    ]


def rows(outcomes: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    out = []
    for o in outcomes:
        options = dict(o.spec.policy_options)
        m = o.metrics
        out.append(
            {
                "queue_thresholds_gpu_s": list(options["queue_thresholds_gpu_s"]),
                "promote_knob": options["promote_knob"],
                "avg_jct_h": m["avg_jct_s"] / 3600,
                "median_jct_h": m["median_jct_s"] / 3600,
                "p95_jct_h": m["p95_jct_s"] / 3600,
                "energy_gj": m["total_energy_j"] / 1e9,
                "preemptions": m["preemptions"],
                "restarts": m["restarts"],
            }
        )
    return out


def table(table_rows: Sequence[dict[str, Any]]) -> str:
    best = min(range(len(table_rows)), key=lambda i: table_rows[i]["avg_jct_h"])
    lines = [
        "| thresholds (GPU-s) | PROMOTE_KNOB | avg JCT h | median h | p95 h | energy GJ "
        "| preemptions |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(table_rows):
        th = ", ".join(f"{t:,.0f}" for t in r["queue_thresholds_gpu_s"])
        knob = "off" if r["promote_knob"] is None else f"{r['promote_knob']:g}"
        mark = " **best**" if i == best else ""
        lines.append(
            f"| {th}{mark} | {knob} | {r['avg_jct_h']:.2f} | {r['median_jct_h']:.2f} "
            f"| {r['p95_jct_h']:.2f} | {r['energy_gj']:.2f} | {r['preemptions']} |"
        )
    return "\n".join(lines)


def stage_one(saved: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stage one's rows of an earlier ``--json``, which holds both stages (each row
    tagged with its ``stage``; a row without a tag is stage one's): fed back whole,
    stage two's rows would join the grid and move its best."""
    return [{k: v for k, v in r.items() if k != "stage"} for r in saved if r.get("stage", 1) == 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hours", type=float, help="only jobs submitted in the first H hours")
    p.add_argument(
        "--paper-baselines",
        action="store_true",
        help="the paper's setting: the baselines keep every node on",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    p.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    p.add_argument(
        "--stage1",
        type=Path,
        metavar="JSON",
        help="take stage one's rows from this file (an earlier --json: its stage one rows) "
        "instead of running it",
    )
    args = p.parse_args()
    if args.hours is not None and not args.hours > 0:
        p.error("--hours must be > 0")
    config = SimConfig(idle_nodes_off=not args.paper_baselines)
    trace = TraceSpec(hours=args.hours)
    if args.stage1:
        first = stage_one(json.loads(args.stage1.read_text()))
    else:
        first = rows(run_many(grid(trace, config), workers=args.workers))
    best = min(first, key=lambda r: r["avg_jct_h"])
    around = tuple(float(t) for t in best["queue_thresholds_gpu_s"])
    second = rows(
        run_many(neighbours(around, best["promote_knob"], trace, config), workers=args.workers)
    )
    setting = "paper setting" if args.paper_baselines else "idle nodes off for all"
    print(f"Tiresias at {CLOCK_MHZ} MHz on {trace.describe()}, {setting}\n")
    print("Stage one: the grid\n")
    print(table(first))
    print("\nStage two: around stage one's best\n")
    print(table(second))
    overall = min([*first, *second], key=lambda r: r["avg_jct_h"])
    knob = overall["promote_knob"]
    print(
        f"\nbest: queue_thresholds_gpu_s={tuple(overall['queue_thresholds_gpu_s'])} "
        f"promote_knob={knob}, average JCT {overall['avg_jct_h']:.2f} h, "
        f"{overall['preemptions']} preemptions"
    )
    if args.json:
        tagged = [{**r, "stage": 1} for r in first] + [{**r, "stage": 2} for r in second]
        args.json.write_text(json.dumps(tagged, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
