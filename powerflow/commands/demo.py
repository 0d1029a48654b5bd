"""``powerflow demo``: the whole system at work on this machine, in a live terminal view.

It starts the twin (``docs/twin.md``): an emulated API server, the operator and the
extender as their own processes, a kube-scheduler loop, node agents on simulated A100s,
and workers that train at the ground truth's speed; then it applies the first
``--jobs`` jobs of the default trace as DLJobs at their trace times, shrunk by
``--speed``. The view shows each job's phase, GPUs, clock and progress (its DLJob's
status), every GPU, the cluster's power against the budget, and the operator's
Events. When every job has ended it prints the summary ``powerflow simulate``
prints, for the twin and for ``simulate`` on the same jobs, and how far they agree.

No cluster, GPU or network is needed; the emulated API server needs the ``lab``
extra (``pip install 'powerflow[lab]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from rich.console import Console, RenderableType
from rich.live import Live

from powerflow.commands import checks
from powerflow.commands.demo_view import Frame, NodeRow, event_line, job_rows, new_events, render
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import A100
from powerflow.lab.sim import output

if TYPE_CHECKING:
    from powerflow.lab.sim.result import RunResult
    from powerflow.lab.twin.gpus import TwinGpus
    from powerflow.lab.twin.harness import Twin, TwinResult
    from powerflow.lab.twin.trace import MiniJob

DEFAULT_SPEED = 50.0
MAX_SPEED = 1000.0
"""Above this the profiling window (240 s / speed) is shorter than the software's own
latency for one pod (a bind: 0.15 to 0.5 s here): the twin would show its latency,
not the schedule."""
MAX_JOBS = 50
"""The most jobs a demo runs: their rows must fit a terminal."""
MAX_NODES = 8
"""Each node is a node agent and a kubelet's share in this process, on a machine
that also runs the operator and the API server."""
GPUS_PER_NODE = 8
POLL_S = 0.25
"""Between two reads of the DLJobs and Events (and two pictures): a job's end is
seen within this, small next to the JCTs at the default speed."""
TAIL_READS = 4
"""Reads after the last job ended, for the Events its end brings (posted after the
status that says it ended)."""
INSTALL = "pip install 'powerflow[lab]'"

SUMMARY_COLUMNS = (
    ("avg_jct_s", "JCT s", 1.0),
    ("p90_jct_s", "p90 s", 1.0),
    ("total_energy_j", "MJ", 1e-6),
    ("restarts", "restarts", 1.0),
    ("wall_s", "wall s", 1.0),
)
"""``simulate``'s columns (``output.TABLE_COLUMNS``) in the mini trace's units
(seconds and megajoules, not hours and gigajoules), less the ones the twin cannot
measure the same way (GPU utilisation, energy per GPU-hour of work), and few enough
that the table fits 80 columns: the budget, the same for both runs, is said above it."""
SUMMARY_CAPTION = "JCT: average; p90: its 90th percentile; MJ: energy; wall: how long the run took"


class DemoError(PowerFlowError):
    """The demo cannot start (its extra is missing)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run every component together on simulated GPUs, in a live view",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--speed",
        type=float,
        default=DEFAULT_SPEED,
        metavar="N",
        help=(
            "the time scale: the trace is made N times smaller, every duration the "
            "simulator also has divided by N (iterations, so training time; submission "
            "times; the profiling window; the scheduling interval; the restart cost), "
            "while the clock stays real and the software's own latency (API calls, "
            f"binds) does not shrink; 1 to {MAX_SPEED:g} (default {DEFAULT_SPEED:g}: "
            "a 2-hour job trains for about 2.4 minutes)"
        ),
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=5,
        metavar="N",
        help=f"how many jobs of the default trace, the first N submitted (1 to {MAX_JOBS}; "
        "default 5)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=2,
        help=f"simulated nodes of {GPUS_PER_NODE} A100s (1 to {MAX_NODES}; default 2)",
    )
    p.add_argument("--eta", type=float, default=1.0, help=f"{checks.ETA_HELP} (default 1)")
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> None:
    """Every option, before anything starts (one line, exit 2)."""
    if not 1 <= args.speed <= MAX_SPEED:  # NaN fails too
        raise checks.ArgumentError(f"--speed must be 1 to {MAX_SPEED:g}, got {args.speed:g}")
    if not 1 <= args.jobs <= MAX_JOBS:
        raise checks.ArgumentError(f"--jobs must be 1 to {MAX_JOBS}, got {args.jobs}")
    if not 1 <= args.nodes <= MAX_NODES:
        raise checks.ArgumentError(f"--nodes must be 1 to {MAX_NODES}, got {args.nodes}")
    checks.eta(args.eta)
    try:
        import kmock  # noqa: F401  (the twin's API server)
    except ImportError:
        raise DemoError(
            f"the demo's API server needs kmock, which is not installed: {INSTALL}"
        ) from None


def run(args: argparse.Namespace) -> int:
    check(args)
    return demo(args, output.stdout_console())


def demo(args: argparse.Namespace, console: Console) -> int:
    """Start the twin, run the jobs under the live view, print the summary."""
    from powerflow.lab.twin.compare import agreement, simulate_mini
    from powerflow.lab.twin.harness import Twin
    from powerflow.lab.twin.timescale import TimeScale
    from powerflow.lab.twin.trace import mini_trace

    scale = TimeScale(1.0 / args.speed)
    jobs = mini_trace(args.jobs, scale)
    cluster = f"{args.nodes} x {GPUS_PER_NODE} simulated A100"
    what = f"{len(jobs)} job{'s' if len(jobs) > 1 else ''} of the default trace"
    title = f"PowerFlow twin: {what} at 1/{args.speed:g} size, {cluster}"
    with tempfile.TemporaryDirectory(prefix="powerflow-demo-") as folder:
        twin = Twin(
            Path(folder), nodes=args.nodes, gpus_per_node=GPUS_PER_NODE, scale=scale, eta=args.eta
        )
        console.print(f"starting the twin ({cluster}): API server, operator, extender, agents")
        log = Path(folder) / "demo.log"
        try:
            with logs_to(log), twin:
                result, wall_s = drive(twin, jobs, console, title, budget_w(args.eta, args.nodes))
        except KeyboardInterrupt:
            console.print("interrupted: the twin is stopped")
            return 130
        except RuntimeError as exc:  # a component did not start or died
            print(f"powerflow demo: the twin failed: {exc}", file=sys.stderr)
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr, end="")
            return 1
    console.print(f"simulating the same {what} with powerflow simulate ...")
    sim = simulate_mini(
        jobs, nodes=args.nodes, gpus_per_node=GPUS_PER_NODE, scale=scale, eta=args.eta
    )
    rows = summary_rows(result, wall_s, sim, eta=args.eta, limit_w=budget_w(args.eta, args.nodes))
    # The title on a line of its own: over a table of 80 columns it would wrap.
    budget = f"{title}; budget {budget_w(args.eta, args.nodes):,.0f} W"
    console.print(budget, markup=False, highlight=False, soft_wrap=True)
    console.print(output.results_table(rows, "", columns=SUMMARY_COLUMNS, caption=SUMMARY_CAPTION))
    console.print(f"agreement with simulate: {agreement(result, sim).describe()}")
    console.print(
        "the twin is slower by the software's latency (binds, passes, restarts), "
        "which the simulator does not have and which does not shrink with --speed "
        "(docs/twin.md)"
    )
    return 0


@contextlib.contextmanager
def logs_to(path: Path) -> Iterator[None]:
    """The warnings of the parts that run in this process (node agents, workers, the
    twin's kubelet and scheduler) to ``path``, not over the live view; the operator and
    the extender write their own logs (``components``)."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def budget_w(eta: float, nodes: int) -> float:
    """The operator's limit for the budget ConfigMap's ``eta`` (``policy.budget``)."""
    from powerflow.core.policy.budget import resolve_limit_w
    from powerflow.core.policy.snapshot import Budget

    return resolve_limit_w(Budget(eta=eta), nodes * GPUS_PER_NODE, A100.p_max_w)


def node_rows(gpus: Mapping[str, TwinGpus]) -> tuple[NodeRow, ...]:
    rows = []
    for name, node in gpus.items():
        count = len(node.gpus())
        rows.append(
            NodeRow(
                name,
                tuple(node.workload(i) is not None for i in range(count)),
                tuple(node.sm_clock_mhz(i) for i in range(count)),
                sum(node.power_mw(i) for i in range(count)) / 1000.0,
            )
        )
    return tuple(rows)


def drive(
    twin: Twin,
    jobs: tuple[MiniJob, ...],
    console: Console,
    title: str,
    budget: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[TwinResult, float]:
    """What ``Twin.run`` does (apply each DLJob at its trace time, wait until every one
    ended; a job's JCT from its submission to the read that saw it end), with the
    view redrawn at every read; and the run's wall-clock seconds."""
    from powerflow.lab.twin.gpus import totals
    from powerflow.lab.twin.harness import DLJOBS, JobOutcome, TwinResult, job_state
    from powerflow.lab.twin.trace import NAMESPACE

    assert twin.client is not None
    events_path = f"/api/v1/namespaces/{NAMESPACE}/events"
    start = clock() - min(j.job.submit_s for j in jobs)
    began = clock()
    active0, idle0 = totals(twin.gpus)
    pending = sorted(jobs, key=lambda j: j.job.submit_s)
    finish: dict[str, tuple[float, str, int]] = {}
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    lines: list[str] = []

    height = console.size.height if console.is_terminal else None

    def frame(now: float) -> RenderableType:
        rows, nodes = job_rows(items), node_rows(twin.gpus)
        return render(Frame(title, now, rows, len(pending), nodes, budget, tuple(lines)), height)

    def read(now: float) -> list[dict[str, Any]]:
        """The DLJobs (the last ones read if the API server does not answer), and the
        new Events into the view's lines."""
        assert twin.client is not None
        try:
            got = twin.client.get(DLJOBS).json()["items"]
            events = twin.client.get(events_path).json()["items"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:  # a slow moment: next read
            lines.append(f"{now:7.1f} s  (reading the API server: {exc})")
            return items
        lines.extend(event_line(event, now) for event in new_events(events, seen))
        return list(got)

    with Live(frame(0.0), console=console, auto_refresh=False) as live:
        while len(finish) < len(jobs):
            now = clock() - start
            while pending and pending[0].job.submit_s <= now:
                job = pending.pop(0)
                twin.submit(job)
                lines.append(f"{now:7.1f} s  {job.name}  applied ({job.job.model_name})")
            items = read(now)
            for body in items:
                name = body["metadata"]["name"]
                phase, generation = job_state(body)
                if phase in ("Succeeded", "Failed") and name not in finish:
                    finish[name] = (clock() - start, phase, generation)
            live.update(frame(clock() - start), refresh=True)
            if len(finish) < len(jobs):
                time.sleep(POLL_S)
        active, idle = totals(twin.gpus)
        wall_s = clock() - began
        for _ in range(TAIL_READS):  # the operator posts a pass's Events after its writes
            time.sleep(POLL_S)
            items = read(clock() - start)
            live.update(frame(clock() - start), refresh=True)
    outcomes = tuple(JobOutcome(j.name, j.job.submit_s, *finish[j.name]) for j in jobs)
    makespan = max(o.finish_s for o in outcomes) - min(o.submit_s for o in outcomes)
    return TwinResult(outcomes, active - active0, idle - idle0, makespan), wall_s


def summary_rows(
    twin: TwinResult, wall_s: float, sim: RunResult, *, eta: float, limit_w: float
) -> list[dict[str, Any]]:
    """The twin's run and ``simulate``'s as ``simulate``'s rows (``metrics.summarise``'s
    keys): for the twin what it measures the same way (JCTs; energy of every GPU,
    training and idle; the budget), the rest blank."""
    from powerflow.lab.sim.metrics import summarise

    jct = np.array([j.jct_s for j in twin.jobs])
    measured = {
        "jobs": len(twin.jobs),
        "avg_jct_s": float(jct.mean()),
        "median_jct_s": float(np.median(jct)),
        "p90_jct_s": float(np.percentile(jct, 90)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "makespan_s": twin.makespan_s,
        "total_energy_j": twin.active_energy_j + twin.idle_energy_j,
        "active_energy_j": twin.active_energy_j,
        "idle_energy_j": twin.idle_energy_j,
        "limit_w": limit_w if math.isfinite(limit_w) else None,
        "restarts": twin.restarts,
        "wall_s": wall_s,
    }
    simulated = summarise(sim)
    return [
        {"scheduler": "powerflow (twin)", "eta": eta, **measured},
        {**simulated, "scheduler": "powerflow (simulate)", "eta": eta},
    ]
