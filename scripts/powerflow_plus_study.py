"""PowerFlow+'s experiments: PowerFlow's eta sweep against variants of its options.

Each variant is ``PowerFlowPolicy`` with some options set (``--variant
"name:min_return=1,rescale_cost_s=30"``) and runs the same eta sweep as
``powerflow``; the table gives each run's total energy and average JCT, and
each variant's average JCT over ``powerflow``'s at equal energy over the
energies both sweeps cover (``powerflow.lab.sim.compare.versus``; below 1: the
variant is faster).
docs/policy.md, section "PowerFlow+", shows the commands and their tables.

    .venv/bin/python scripts/powerflow_plus_study.py --hours 6 \\
        --variant "floor1:min_return=1" --variant "plus:min_return=1,rescale_cost_s=30"

A variant's options may also set its profiling (otherwise PowerFlow's: the
paper's 240 s pre-run, then 240 s over 21 clocks per new GPU count):
``prerun_s``, ``profile_s``, ``sweep_stride`` and ``sweep_lowest`` (the
``powerflow.core.profiling.ClockSweep`` fields). ``--oracle-gap`` also runs each
variant with the ground truth and no profiling, and prints the fitted sweep's
JCT at each oracle run's energy over the oracle's (the report's rule).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.compare import Curve, versus
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.runner import PROFILING_OPTIONS, TraceSpec, load_jobs, with_options
from powerflow.lab.sim.world import default_world


def parse_variant(text: str) -> tuple[str, dict[str, float]]:
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        options[key.strip()] = float(value)
    return name, options


def run(
    options: dict[str, float], eta: float, trace: TraceSpec, config: SimConfig, oracle: bool
) -> dict[str, Any]:
    world = default_world()
    configured = scheduler("powerflow").configure(eta, oracle=oracle)
    policy = {k: v for k, v in options.items() if k not in PROFILING_OPTIONS}
    configured = replace(configured, policy=PowerFlowPolicy(**policy))  # type: ignore[arg-type]
    if not oracle:
        profiling = {k: v for k, v in options.items() if k in PROFILING_OPTIONS}
        configured = with_options(configured, profiling)
    jobs = load_jobs(trace, config, world)
    return summarise(Simulation(jobs, configured, config, world).run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", help="trace CSV (default: the bundled ITP window)")
    p.add_argument("--hours", type=float, help="only jobs submitted in the first H hours")
    p.add_argument("--etas", default="0.4,0.6,0.8,1.0")
    p.add_argument("--seed", type=int, default=0, help="seed of noise and model draws")
    p.add_argument("--variant", action="append", default=[], help="NAME:opt=value,...")
    p.add_argument("--oracle", action="store_true", help="schedule with the ground truth")
    p.add_argument(
        "--strict", action="store_true", help="strict_power for the reference and every variant"
    )
    p.add_argument(
        "--oracle-gap", action="store_true", help="also each variant's fitted-vs-oracle gap"
    )
    p.add_argument("--no-reference", action="store_true", help="skip plain powerflow")
    p.add_argument("--reference-json", type=Path, help="reuse/store the reference runs here")
    args = p.parse_args()
    trace = TraceSpec(args.trace, args.hours, seed=args.seed)
    config = SimConfig(seed=args.seed)
    etas = [float(x) for x in args.etas.split(",")]
    variants = [parse_variant(v) for v in args.variant]
    base: dict[str, float] = {"strict_power": True} if args.strict else {}
    variants = [(name, {**base, **options}) for name, options in variants]
    ref: list[dict[str, Any]] = []
    if not args.no_reference:
        if args.reference_json and args.reference_json.exists():
            ref = json.loads(args.reference_json.read_text())
        else:
            ref = [{"eta": e, **run(base, e, trace, config, args.oracle)} for e in etas]
            if args.reference_json:
                args.reference_json.write_text(json.dumps(ref))
    print(
        f"trace {trace.describe()}{' (oracle)' if args.oracle else ''}"
        f"{' (strict power checks)' if args.strict else ''}"
    )
    print(
        "| variant | eta | energy (GJ) | avg JCT (h) | makespan (h) | rescales | above limit (h) |"
    )
    print("|---|---|---|---|---|---|---|")
    summary = []
    gaps: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    for name, options in [("powerflow", None), *variants]:
        rows = (
            ref
            if options is None
            else [{"eta": e, **run(options, e, trace, config, args.oracle)} for e in etas]
        )
        for r in rows:
            print(
                f"| {name} | {r['eta']:g} | {r['total_energy_j'] / 1e9:.2f} |"
                f" {r['avg_jct_s'] / 3600:.3f} | {r['makespan_s'] / 3600:.1f} |"
                f" {r['rescales']} | {r['time_above_limit_s'] / 3600:.2f} |",
                flush=True,
            )
        if options is not None and ref:
            both = [{**r, "scheduler": "powerflow"} for r in ref]
            both += [{**r, "scheduler": name} for r in rows]
            summary.append((name, versus(both, name)))
        if options is not None and args.oracle_gap and not args.oracle:
            oracle = [{"eta": e, **run(options, e, trace, config, True)} for e in etas]
            gaps.append((name, rows, oracle))
    print("\nAvg JCT over powerflow's at equal energy (compare.versus; < 1: faster)\n")
    print("| variant | mean | best | worst | common energy range (GJ) |")
    print("|---|---|---|---|---|")
    for name, v in summary:
        if v is None:
            print(f"| {name} | n/a | n/a | n/a | none |")
        else:
            print(
                f"| {name} | {v['mean']:.3f} | {v['best']:.3f} | {v['worst']:.3f} |"
                f" {v['energy_lo_j'] / 1e9:.2f}-{v['energy_hi_j'] / 1e9:.2f} |"
            )
    if gaps:
        print("\nFitted against oracle (fitted JCT at the oracle run's energy / oracle JCT - 1)\n")
        print("| variant | eta | oracle energy (GJ) | oracle avg JCT (h) | fitted vs oracle |")
        print("|---|---|---|---|---|")
    for name, rows, oracle in gaps:
        curve = Curve.of((r["total_energy_j"], r["avg_jct_s"]) for r in rows)
        for o in oracle:
            jct = curve.at(o["total_energy_j"], 0.05)
            gap = "out of range" if jct is None else f"{jct / o['avg_jct_s'] - 1:+.1%}"
            print(
                f"| {name} | {o['eta']:g} | {o['total_energy_j'] / 1e9:.2f} |"
                f" {o['avg_jct_s'] / 3600:.3f} | {gap} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
