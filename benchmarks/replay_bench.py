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

``--by-size`` adds one more replay, each decision's CPU summed by the size of its
snapshot (jobs): where a policy's time goes, the many small decisions or the few
large ones (``by_size``).

    python benchmarks/replay_bench.py --runs gandiva,gandiva+zeus --repeat 5
    python benchmarks/replay_bench.py --runs powerflow,powerflow+ --repeat 5
    python benchmarks/replay_bench.py --runs powerflow --repeat 1 --by-size
    python -m benchmarks replay
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

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


def fresh_policy(name: str, spec: RunSpec) -> Policy:
    """The run's policy as a run starts it: a new object, empty memos."""
    return scheduler(name).configure(spec.knob_value, oracle=False).policy


def replay(
    name: str, spec: RunSpec, snapshots: list[Snapshot], plans: list[Plan], repeat: int
) -> float:
    """Least CPU seconds of ``repeat`` replays, each by a fresh policy object."""
    best = float("inf")
    for _ in range(repeat):
        policy = fresh_policy(name, spec)
        t0 = time.process_time()
        got = [policy.plan(s) for s in snapshots]
        best = min(best, time.process_time() - t0)
        if got != plans:
            raise SystemExit(f"{name}: the replayed plans differ from the run's")
    return best


SIZES = (50, 100, 200, 400)
"""Where ``--by-size`` splits snapshot sizes (jobs)."""


def timed(name: str, spec: RunSpec, snapshots: list[Snapshot]) -> list[float]:
    """Each decision's CPU seconds in one replay by a fresh policy object."""
    policy = fresh_policy(name, spec)
    spent = []
    for snapshot in snapshots:
        t0 = time.process_time()
        policy.plan(snapshot)
        spent.append(time.process_time() - t0)
    return spent


def by_size(
    spent: Sequence[float],
    jobs: Sequence[int],
    running: Sequence[int],
    bounds: Sequence[int] = SIZES,
) -> list[tuple[str, int, float, float, float]]:
    """Per range of snapshot sizes (``jobs``, split at ``bounds``): its label, its
    decisions, their mean CPU seconds, their mean jobs holding GPUs (``running``) and
    their CPU seconds in all; ranges without a decision are left out."""
    highs: list[int | None] = [*bounds, None]
    rows = []
    for lo, hi in zip([0, *bounds], highs, strict=True):
        picked = [k for k, n in enumerate(jobs) if n >= lo and (hi is None or n < hi)]
        if not picked:
            continue
        label = f"under {hi}" if lo == 0 else f"{lo} and more" if hi is None else f"{lo}-{hi - 1}"
        total = sum(spent[k] for k in picked)
        mean_running = sum(running[k] for k in picked) / len(picked)
        rows.append((label, len(picked), total / len(picked), mean_running, total))
    return rows


def size_table(name: str, spec: RunSpec, snapshots: list[Snapshot]) -> Table:
    spent = timed(name, spec, snapshots)
    jobs = [len(s.jobs) for s in snapshots]
    running = [sum(1 for job in s.jobs if job.placement) for s in snapshots]
    total_s = sum(spent)
    table = Table(title=f"{name}: one replay's CPU by snapshot size ({total_s:.2f} s)")
    for col in ("jobs", "decisions", "ms a decision", "jobs holding GPUs", "CPU (s)", "share"):
        table.add_column(col, justify="right" if col != "jobs" else "left")
    for label, count, mean, held, total in by_size(spent, jobs, running):
        table.add_row(
            label,
            f"{count:,}",
            f"{mean * 1e3:.2f}",
            f"{held:.0f}",
            f"{total:.2f}",
            f"{total / max(total_s, 1e-12):.0%}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        default=",".join(BASELINES),
        help="comma-separated schedulers (default: the baselines; also powerflow, powerflow+)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="replays; the least CPU is kept")
    parser.add_argument("--window", default=":", help="decisions A:B (default: all)")
    parser.add_argument(
        "--by-size",
        action="store_true",
        help="also one replay's CPU by snapshot size (jobs), per scheduler",
    )
    args = parser.parse_args()
    first, _, last = args.window.partition(":")
    lo, hi = int(first or 0), int(last or 10**9)
    table = Table(title=f"decisions replayed (least CPU of {args.repeat})")
    for col in ("scheduler", "decisions", "jobs a decision", "policy CPU (s)", "µs a decision"):
        table.add_column(col, justify="right" if col != "scheduler" else "left")
    sizes = []
    for name in args.runs.split(","):
        snapshots, plans, spec = record(name.strip(), lo, hi)
        cpu = replay(name.strip(), spec, snapshots, plans, args.repeat)
        if args.by_size:
            sizes.append(size_table(name.strip(), spec, snapshots))
        n = max(len(snapshots), 1)
        table.add_row(
            name,
            f"{len(snapshots):,}",
            f"{sum(len(s.jobs) for s in snapshots) / n:.0f}",
            f"{cpu:.2f}",
            f"{cpu / n * 1e6:.0f}",
        )
    stdout_console().print(table)
    for part in sizes:
        stdout_console().print(part)


if __name__ == "__main__":
    main()
