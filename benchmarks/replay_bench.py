"""Replay a scheduler's decisions of the default trace: the policy's CPU alone, repeatably.

One run of the whole default trace (64 x 8 A100, a baseline at 1410 MHz or
its Zeus setting, PowerFlow and PowerFlow+ at eta 0.6 with fitted models)
records every snapshot the engine hands the policy and the plan it got
back; then a fresh policy object (empty memos, as a run starts) plans the
recorded snapshots again, ``--repeat`` times, and the least CPU time
(``time.process_time``) of those replays is reported, with the plans checked
equal to the run's. The engine, the trace and start-up are left out, so the
figure moves only with the policy's code: the number to compare before and
after a change to a policy on a shared machine (``sim_bench`` splits a whole
run instead, and ``main_job_bench`` times it as a user runs it).

``--window A:B`` replays decisions A to B-1 only (the default trace's busiest
are about 200:800, some 700 jobs each for Gandiva); the replay starts from
empty memos at A, as a run does at its first decision.

    python benchmarks/replay_bench.py --runs gandiva,gandiva+zeus --repeat 5
    python benchmarks/replay_bench.py --runs powerflow,powerflow+ --repeat 5
    python -m benchmarks replay
"""

from __future__ import annotations

import argparse
import time

from rich.table import Table

import powerflow.lab.sim.engine as engine
from powerflow.core.policy.snapshot import Plan, Policy, Snapshot
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.output import stdout_console
from powerflow.lab.sim.runner import RunSpec, run_one

BASELINES = ("gandiva", "tiresias", "afs", "gandiva+zeus", "tiresias+zeus")
KNOB_VALUES = {"frequency_mhz": 1410.0, "eta": 0.6}
"""The knob's value a replayed run uses (a Zeus baseline has no knob: its own setting)."""


def record(name: str, lo: int, hi: int) -> tuple[list[Snapshot], list[Plan], RunSpec]:
    """Run ``name`` on the default trace; the snapshots and plans of decisions lo..hi-1."""
    spec = RunSpec(name, KNOB_VALUES.get(scheduler(name).knob or ""))
    snapshots: list[Snapshot] = []
    plans: list[Plan] = []
    count = 0
    seam = engine.schedule_once

    def recorded(policy: Policy, backend: engine.Simulation) -> Plan:
        nonlocal count
        snapshot = backend.snapshot()
        plan = policy.plan(snapshot)
        backend.apply(plan)
        if lo <= count < hi:
            snapshots.append(snapshot)
            plans.append(plan)
        count += 1
        return plan

    engine.schedule_once = recorded  # type: ignore[assignment]
    try:
        run_one(spec)
    finally:
        engine.schedule_once = seam
    return snapshots, plans, spec


def replay(
    name: str, spec: RunSpec, snapshots: list[Snapshot], plans: list[Plan], repeat: int
) -> float:
    """Least CPU seconds of ``repeat`` replays, each by a fresh policy object."""
    best = float("inf")
    for _ in range(repeat):
        policy = scheduler(name).configure(spec.knob_value, oracle=False).policy
        t0 = time.process_time()
        got = [policy.plan(s) for s in snapshots]
        best = min(best, time.process_time() - t0)
        if got != plans:
            raise SystemExit(f"{name}: the replayed plans differ from the run's")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        default=",".join(BASELINES),
        help="comma-separated schedulers (default: the baselines; also powerflow, powerflow+)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="replays; the least CPU is kept")
    parser.add_argument("--window", default=":", help="decisions A:B (default: all)")
    args = parser.parse_args()
    first, _, last = args.window.partition(":")
    lo, hi = int(first or 0), int(last or 10**9)
    table = Table(title=f"decisions replayed (least CPU of {args.repeat})")
    for col in ("scheduler", "decisions", "jobs a decision", "policy CPU (s)", "µs a decision"):
        table.add_column(col, justify="right" if col != "scheduler" else "left")
    for name in args.runs.split(","):
        snapshots, plans, spec = record(name.strip(), lo, hi)
        cpu = replay(name.strip(), spec, snapshots, plans, args.repeat)
        n = max(len(snapshots), 1)
        table.add_row(
            name,
            f"{len(snapshots):,}",
            f"{sum(len(s.jobs) for s in snapshots) / n:.0f}",
            f"{cpu:.2f}",
            f"{cpu / n * 1e6:.0f}",
        )
    stdout_console().print(table)


if __name__ == "__main__":
    main()
