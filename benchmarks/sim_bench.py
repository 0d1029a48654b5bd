"""Simulator speed split: where one run of the default ITP trace spends its CPU.

The targets (a whole run as a user starts it) are ``main_job_bench``'s; this
one attributes a run's time. For the fitted run, the oracle run (no fitting)
and one baseline it prints wall and CPU time and splits the CPU time three
ways: the policy's ``plan`` calls, model
fitting (the learner), and the engine (everything else: snapshots, applying
plans, event handling, accounting, ground-truth measurement). CPU time
(``time.process_time``) is the number to compare on a shared machine; wall
time counts whatever else the machine runs. ``python -m benchmarks sim`` (the
full trace takes minutes on a busy machine); ``python benchmarks/sim_bench.py
--hours 2`` for a quick look, ``--nodes 16`` for a smaller cluster, ``--runs
gandiva`` for a subset (``--runs gandiva,tiresias,afs,gandiva+zeus,tiresias+zeus``: the
baselines); ``--forget`` plans every decision with a fresh policy and ``--clear
static`` (or ``placement``) empties that part of PowerFlow's memo before each one.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from powerflow.core.learning import FittedLearner, Knowledge, Learner, OracleLearner
from powerflow.core.models.priors import held_out_prior
from powerflow.core.models.protocol import PerfModel
from powerflow.core.models.samples import Samples
from powerflow.core.policy.snapshot import Plan, Policy, Snapshot
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.output import stdout_console
from powerflow.lab.sim.runner import RunSpec, TraceSpec, _world, load_jobs


@dataclass
class _TimedPolicy:
    """Adds the CPU time of every ``plan`` call to ``cpu_s``; with ``forget``, every
    call plans with a fresh copy of the policy (nothing kept from earlier calls:
    what the policy's memo saves)."""

    inner: Policy
    cpu_s: float = 0.0
    forget: bool = False
    clear: tuple[str, ...] = ()
    """Parts of the policy's memo (``memo.py``: ``static``, ``placement``) emptied before
    every call: what each of them saves."""

    def plan(self, snapshot: Snapshot) -> Plan:
        memo = getattr(self.inner, "memo", None)
        for part in self.clear:
            setattr(memo, part, None)
        t0 = time.process_time()
        try:
            fresh = dataclasses.replace(self.inner) if self.forget else self.inner  # type: ignore[type-var]
            return fresh.plan(snapshot)
        finally:
            self.cpu_s += time.process_time() - t0


@dataclass
class _TimedLearner:
    """Adds the CPU time of every fit to ``cpu_s``."""

    inner: Learner
    cpu_s: float = 0.0

    def initial(self, model_name: str, truth: PerfModel, samples: Samples | None) -> Knowledge:
        t0 = time.process_time()
        try:
            return self.inner.initial(model_name, truth, samples)
        finally:
            self.cpu_s += time.process_time() - t0

    def update(
        self, model_name: str, truth: PerfModel, known: Knowledge, samples: Samples
    ) -> Knowledge:
        t0 = time.process_time()
        try:
            return self.inner.update(model_name, truth, known, samples)
        finally:
            self.cpu_s += time.process_time() - t0


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float
    policy_cpu_s: float
    fit_cpu_s: float

    @property
    def engine_cpu_s(self) -> float:
        return self.cpu_s - self.policy_cpu_s - self.fit_cpu_s


def timed_run(
    spec: RunSpec, forget: bool = False, clear: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Timing]:
    """One run as ``runner.simulate`` does it, with the policy and the learner
    timed in CPU seconds (loading the trace and the ground truth is not counted)."""
    configured = scheduler(spec.scheduler).configure(spec.value, oracle=spec.oracle)
    jobs = load_jobs(spec.trace, spec.config)
    policy = _TimedPolicy(configured.policy, forget=forget, clear=clear)
    inner: Learner = (
        FittedLearner(spec.config.gpu, prior=held_out_prior)
        if configured.profiling.fitted_models
        else OracleLearner()
    )
    learner = _TimedLearner(inner)
    sim = Simulation(
        jobs, dataclasses.replace(configured, policy=policy), spec.config, _world(), learner
    )
    c0, w0 = time.process_time(), time.perf_counter()
    result = sim.run()
    timing = Timing(time.perf_counter() - w0, time.process_time() - c0, policy.cpu_s, learner.cpu_s)
    return summarise(result), timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, help="only the first H hours of the trace")
    parser.add_argument("--nodes", type=int, help="cluster size (default: SimConfig's)")
    parser.add_argument(
        "--runs",
        default="fitted,oracle,gandiva",
        help="comma-separated subset of fitted, oracle, gandiva, tiresias, afs, "
        "gandiva+zeus, tiresias+zeus (the baselines at 1410 MHz or their Zeus setting)",
    )
    parser.add_argument(
        "--forget",
        action="store_true",
        help="plan every decision with a fresh policy (nothing kept between calls)",
    )
    parser.add_argument(
        "--clear",
        default="",
        help="comma-separated parts of PowerFlow's memo to empty before every decision "
        "(static, placement): what each saves",
    )
    args = parser.parse_args()
    clear = tuple(part.strip() for part in args.clear.split(",") if part.strip())
    unknown = set(clear) - {"static", "placement"}
    if unknown:
        parser.error(f"--clear: unknown part(s) {', '.join(sorted(unknown))}")
    trace = TraceSpec(hours=args.hours)
    config = SimConfig() if args.nodes is None else SimConfig(nodes=args.nodes)
    every = {
        "fitted": RunSpec("powerflow", 0.6, trace, config),
        "oracle": RunSpec("powerflow", 0.6, trace, config, oracle=True),
        "gandiva": RunSpec("gandiva", 1410, trace, config),
        "tiresias": RunSpec("tiresias", 1410, trace, config),
        "afs": RunSpec("afs", 1410, trace, config),
        "gandiva+zeus": RunSpec("gandiva+zeus", None, trace, config),
        "tiresias+zeus": RunSpec("tiresias+zeus", None, trace, config),
    }
    runs = [every[name.strip()] for name in args.runs.split(",")]
    table = Table(title=f"simulator speed, {trace.describe()}, {config.total_gpus} GPUs")
    for col in (
        "run",
        "wall (s)",
        "CPU (s)",
        "policy CPU (s)",
        "fitting CPU (s)",
        "engine CPU (s)",
        "policy calls",
        "events",
        "events/CPU s",
        "fits",
    ):
        table.add_column(col, justify="right")
    for spec in runs:
        m, t = timed_run(spec, forget=args.forget, clear=clear)
        table.add_row(
            spec.label,
            f"{t.wall_s:.1f}",
            f"{t.cpu_s:.1f}",
            f"{t.policy_cpu_s:.1f}",
            f"{t.fit_cpu_s:.1f}",
            f"{t.engine_cpu_s:.1f}",
            str(m["policy_calls"]),
            str(m["events"]),
            f"{m['events'] / t.cpu_s:.0f}" if t.cpu_s > 0 else "",
            str(m["model_fits"]),
        )
    stdout_console().print(table)


if __name__ == "__main__":
    main()
