"""What searching power limits instead of locked clocks costs Zeus, per job of a trace.

For every job of the trace (default: the bundled ITP window), on the ground
truth, at its trace GPU count, consolidated (``min(n, GPUs per node)`` per
node) and its local batch: Zeus's cost at the clock of least cost
(``knob="clock"``) and at the clock its power-limit optimum runs
(``knob="power_limit"``, the comparison's Zeus). Prints how many jobs land on
another clock, the clock optima, and how much higher the power-limit cost is
(mean and maximum over the jobs). Then what the simulated profiling phase
costs against Zeus's real one: the simulator sweeps the profiling clocks
(``ZEUS_PROFILING.sweep``: the paper's ladder, 210-1410 MHz) for ``ZEUS_PROFILE_S``,
where Zeus sweeps its 13 power limits (clocks no lower than the lowest limit
allows); per job, the share of the phase's progress lost against the top
clock and the job's mean power, each sweep's points weighted equally.
docs/baselines.md ("Zeus") quotes it:

    .venv/bin/python scripts/zeus_knob_cost.py
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from powerflow.core.devices import Workload, capped_clock_mhz
from powerflow.lab.baselines.common import local_batch
from powerflow.lab.baselines.zeus import power_limits_w, zeus_cost, zeus_power_limit
from powerflow.lab.schedulers import ZEUS_ETA_KNOB, ZEUS_PROFILING
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.world import default_world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="trace CSV (default: the bundled ITP window)")
    parser.add_argument("--eta-knob", type=float, default=ZEUS_ETA_KNOB, help="Zeus's eta_knob")
    args = parser.parse_args()
    config, world = SimConfig(), default_world()
    jobs = load_jobs(TraceSpec(args.trace), config, world)
    spec = config.gpu
    clocks = list(spec.clocks_mhz)
    extra: list[float] = []
    optima: Counter[int] = Counter()
    moved = 0
    swept = np.asarray(ZEUS_PROFILING.sweep.clocks_mhz(spec), dtype=np.float64)
    lost: dict[str, list[float]] = {"clocks": [], "limits": []}
    watts: dict[str, list[float]] = {"clocks": [], "limits": []}
    for job in jobs:
        n = job.num_gpu
        r = min(n, config.gpus_per_node)
        bs = local_batch(job.global_batch_size, n)
        model = world.truth(job.model_name)
        cost = zeus_cost(model, n, r, bs, spec, args.eta_knob)
        best = int(np.argmin(cost))
        _, capped = zeus_power_limit(model, n, r, bs, spec, args.eta_knob)
        extra.append(float(cost[clocks.index(capped)] / cost[best] - 1.0))
        optima[clocks[best]] += 1
        moved += capped != clocks[best]
        work = Workload(job.model_name, n, r, bs)
        under = [
            capped_clock_mhz(model, work, clocks, clocks[-1], limit)
            for limit in power_limits_w(spec)
        ]
        top = float(model.step_time_s(n, r, bs, float(clocks[-1])))
        for name, f in (("clocks", swept), ("limits", np.asarray(under, dtype=np.float64))):
            t = np.asarray(model.step_time_s(n, r, bs, f), dtype=np.float64)
            e = np.asarray(model.energy_per_iter_j(n, r, bs, f), dtype=np.float64)
            lost[name].append(float(1.0 - np.mean(top / t)))
            watts[name].append(float(np.mean(e / t)))
    print(f"jobs: {len(jobs)}")
    print(f"power-limit optimum on another clock than the clock optimum: {moved}")
    print("clock optima (MHz: jobs): " + ", ".join(f"{f}: {k}" for f, k in sorted(optima.items())))
    print(
        f"Zeus cost of the power-limit optimum above the clock optimum: "
        f"mean {100 * np.mean(extra):.2f} %, max {100 * np.max(extra):.2f} %"
    )
    for name in ("clocks", "limits"):
        print(
            f"profiling sweep over the {name}: {100 * np.mean(lost[name]):.0f} % of the "
            f"phase's progress lost, job power {np.mean(watts[name]):.0f} W (means over jobs)"
        )


if __name__ == "__main__":
    main()
