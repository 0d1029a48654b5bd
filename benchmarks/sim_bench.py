"""Simulator speed: one PowerFlow run of the default ITP trace on one core.

Target: under 20 s with fitted models. Prints wall time, the share spent in
the policy and in model fitting, and events per second, for the fitted run,
the oracle run (no fitting) and one baseline, so a miss can be attributed.
``python -m benchmarks sim`` (the full trace takes minutes on a busy machine);
``python benchmarks/sim_bench.py --hours 2`` for a quick look.
"""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from powerflow.sim.config import SimConfig
from powerflow.sim.output import stdout_console
from powerflow.sim.runner import RunSpec, TraceSpec, run_one

TARGET_S = 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, help="only the first H hours of the trace")
    args = parser.parse_args()
    trace = TraceSpec(hours=args.hours)
    runs = (
        RunSpec("powerflow", 0.6, trace, SimConfig()),
        RunSpec("powerflow", 0.6, trace, SimConfig(), oracle=True),
        RunSpec("gandiva", 1410, trace, SimConfig()),
    )
    table = Table(title=f"simulator speed, {trace.describe()}, {SimConfig().total_gpus} GPUs")
    for col in (
        "run",
        "wall (s)",
        "policy (s)",
        "fitting (s)",
        "other (s)",
        "policy calls",
        "events",
        "events/s",
        "fits",
        "target",
    ):
        table.add_column(col, justify="right")
    for spec in runs:
        start = time.perf_counter()
        m = run_one(spec).metrics
        wall = time.perf_counter() - start
        target = f"< {TARGET_S:.0f} s: {'met' if wall < TARGET_S else 'MISSED'}"
        table.add_row(
            spec.label,
            f"{wall:.1f}",
            f"{m['policy_s']:.1f}",
            f"{m['fit_s']:.1f}",
            f"{wall - m['policy_s'] - m['fit_s']:.1f}",
            str(m["policy_calls"]),
            str(m["events"]),
            f"{m['events_per_s']:.0f}",
            str(m["model_fits"]),
            target if spec.scheduler == "powerflow" and not spec.oracle else "",
        )
    stdout_console().print(table)


if __name__ == "__main__":
    main()
