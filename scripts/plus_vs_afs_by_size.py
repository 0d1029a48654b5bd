"""Where AFS gains time over PowerFlow+: average JCT per job-size quartile on one window.

Runs AFS at some clocks and PowerFlow+ (optionally with policy options changed) at
some etas on one window of the whole trace, and prints per run its average JCT,
total and in-window energy, and the average JCT of each quarter of the jobs by
size (the job's duration at its requested GPU count at full clock,
``metrics.reference_durations_s``), its GPUs per job (GPU-seconds over JCT,
averaged over the jobs), its checkpoint-restarts and profilings.
docs/policy.md, section "Short first", shows the command and its table.

    .venv/bin/python scripts/plus_vs_afs_by_size.py --window d05
    .venv/bin/python scripts/plus_vs_afs_by_size.py --window d05 --clocks "" \\
        --option short_first=0.5
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.metrics import reference_durations_s, reference_work_gpu_s, summarise
from powerflow.lab.sim.runner import RunSpec, TraceSpec, load_jobs, simulate
from powerflow.lab.sim.world import default_world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", default="d05", help="a window of the whole trace")
    parser.add_argument("--clocks", default="1110,1305", help="AFS's clocks (MHz)")
    parser.add_argument("--etas", default="0.6,1.0", help="PowerFlow+'s budgets")
    parser.add_argument(
        "--option", action="append", default=[], help="a PowerFlow+ option, name=value (JSON)"
    )
    args = parser.parse_args()
    options = tuple((k, json.loads(v)) for k, v in (o.split("=", 1) for o in args.option))
    config = SimConfig()
    trace = TraceSpec(window=args.window)
    jobs = load_jobs(trace, config)
    truth = default_world().truth
    sizes = reference_durations_s(jobs, truth, gpus_per_node=config.gpus_per_node)
    work = reference_work_gpu_s(jobs, truth, gpus_per_node=config.gpus_per_node)
    quarters = np.array_split(np.argsort(sizes, kind="stable"), 4)
    specs = [RunSpec("afs", float(f), trace, config) for f in args.clocks.split(",") if f]
    specs += [
        RunSpec("powerflow+", float(e), trace, config, policy_options=options)
        for e in args.etas.split(",")
        if e
    ]
    bounds = [sizes[q].max() / 3600 for q in quarters]
    print(
        f"{args.window}: quarters of the jobs by size up to",
        ", ".join(f"{b:.2g} h" for b in bounds),
    )
    print("run | avg JCT h | total GJ | in-window GJ | JCT h per quarter | GPUs/job", end="")
    print(" | restarts | profilings")
    for spec in specs:
        result = simulate(spec)
        by_id = {r.job_id: r for r in result.jobs}
        jct = np.array([by_id[j.job_id].jct_s for j in jobs]) / 3600
        gpus = np.mean([r.attained_gpu_s / max(r.jct_s, 1e-9) for r in result.jobs])
        m = summarise(result, work_gpu_s=work)
        print(
            f"{spec.label} | {jct.mean():.3f} | {m['total_energy_j'] / 1e9:.2f}"
            f" | {m['window_energy_j'] / 1e9:.2f} | "
            + " / ".join(f"{jct[q].mean():.2f}" for q in quarters)
            + f" | {gpus:.2f} | {sum(r.restarts for r in result.jobs)}"
            + f" | {sum(r.profilings for r in result.jobs)}"
        )


if __name__ == "__main__":
    main()
