"""``powerflow plan``: run the PowerFlow policy once and show its decision.

``--demo`` plans a built-in cluster (4 nodes x 8 A100) and queue (six jobs of
the trace's networks, ground-truth models, two of them already running) so
that a person can see the policy work: GPUs, clock, local batch and exact GPUs
per job, nodes to power down, migrations, and the predicted power against the
limit. The budget is ``--eta`` (default 0.6) unless ``--limit-watts`` is given
(which wins, as in every snapshot). The ablation flags switch off one part
of the policy each.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from powerflow.commands import checks
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, GpuSlot, Job, Node, Plan, Snapshot

DEMO_NODES = 4
DEMO_GPUS_PER_NODE = 8
# (id, network, global batch, remaining iterations, requested GPUs, arrival s, running on)
DEMO_QUEUE: tuple[tuple[str, str, int, int, int, float, tuple[GpuSlot, ...]], ...] = (
    ("resnet50-a", "resnet50", 256, 60_000, 4, 0.0, tuple(("node-0", i) for i in range(4))),
    ("gpt2-b", "gpt2", 128, 40_000, 8, 300.0, tuple(("node-1", i) for i in range(8))),
    ("vgg16-c", "vgg16", 64, 25_000, 2, 1200.0, ()),
    ("bert-d", "bert", 64, 80_000, 4, 1800.0, ()),
    ("inception3-e", "inception3", 128, 30_000, 1, 2400.0, ()),
    ("deepspeech2-f", "deepspeech2", 32, 15_000, 2, 3000.0, ()),
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="run the PowerFlow policy once and print its plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--demo", action="store_true", help="plan the built-in cluster and queue")
    p.add_argument(
        "--eta",
        type=float,
        default=0.6,
        help=f"{checks.ETA_HELP} (default 0.6)",
    )
    p.add_argument("--limit-watts", type=float, metavar="W", help="absolute limit (wins)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument(
        "--strict-power",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check the limit on every allocation step (default); --no-strict-power: only at "
        "node boundaries, as the paper's Algorithm 1",
    )
    p.add_argument("--no-frequency-scaling", action="store_true", help="ablation: top clock")
    p.add_argument("--no-elastic", action="store_true", help="ablation: requested GPUs, FIFO")
    p.add_argument("--no-energy-aware", action="store_true", help="ablation: JCT-only priority")
    p.set_defaults(func=run)


def demo_snapshot(budget: Budget) -> Snapshot:
    """The built-in cluster and queue (ground-truth models), one hour into the day."""
    from powerflow.lab.groundtruth import ground_truth

    nodes = tuple(Node(f"node-{i}", DEMO_GPUS_PER_NODE, A100) for i in range(DEMO_NODES))
    jobs = tuple(
        Job(
            id=job_id,
            model=ground_truth(network),
            remaining_iterations=float(iterations),
            global_batch_size=batch,
            requested_gpus=requested,
            arrival_s=arrival,
            placement=placement,
            model_name=network,
        )
        for job_id, network, batch, iterations, requested, arrival, placement in DEMO_QUEUE
    )
    return Snapshot(nodes=nodes, jobs=jobs, budget=budget, now_s=3600.0)


def run(args: argparse.Namespace) -> int:
    if not args.demo:
        raise PowerFlowError("nothing to plan: pass --demo (the built-in cluster and queue)")
    checks.eta(args.eta)
    if args.limit_watts is not None and not 0 < args.limit_watts < math.inf:
        raise checks.ArgumentError(
            f"--limit-watts must be > 0 and finite, got {args.limit_watts:g}"
        )
    snapshot = demo_snapshot(Budget(eta=args.eta, limit_w=args.limit_watts))
    policy = PowerFlowPolicy(
        frequency_scaling=not args.no_frequency_scaling,
        elastic=not args.no_elastic,
        energy_aware=not args.no_energy_aware,
        strict_power=args.strict_power,
    )
    plan = policy.plan(snapshot)
    if args.json:
        json.dump(plan_json(snapshot, plan), sys.stdout, indent=2)
        print()
    else:
        print_plan(snapshot, plan, Console())
    return 0


def plan_json(snapshot: Snapshot, plan: Plan) -> dict[str, Any]:
    return {
        "limit_w": plan.limit_w,
        "predicted_w": plan.predicted_w,
        "cluster_gpus": sum(n.gpus for n in snapshot.nodes),
        "jobs": [
            {
                "id": jp.job_id,
                "gpus": jp.gpus,
                "frequency_mhz": jp.frequency_mhz,
                "local_batch_size": jp.local_batch_size,
                "placement": [[node, index] for node, index in jp.placement],
                "power_w": jp.power_w,
                "power_cap_w": jp.power_cap_w,
            }
            for jp in plan.jobs
        ],
        "powered_down_nodes": list(plan.powered_down_nodes),
        "migrations": [
            {
                "job_id": m.job_id,
                "source": [list(s) for s in m.source],
                "target": [list(s) for s in m.target],
            }
            for m in plan.migrations
        ],
        "notes": list(plan.notes),
    }


def _slots(slots: tuple[GpuSlot, ...]) -> str:
    """``node-0:0-3 node-1:0-7`` for contiguous runs; ``-`` when waiting."""
    by_node: dict[str, list[int]] = {}
    for node, index in slots:
        by_node.setdefault(node, []).append(index)
    parts = []
    for node, idx in by_node.items():
        idx.sort()
        contiguous = idx == list(range(idx[0], idx[-1] + 1))
        span = f"{idx[0]}-{idx[-1]}" if contiguous and len(idx) > 1 else ",".join(map(str, idx))
        parts.append(f"{node}:{span}")
    return " ".join(parts) or "-"


PLACEMENT_WIDTH = 10
"""The placement columns wrap at this width (one of the demo's nodes' blocks,
``node-3:0-7``; a longer one folds), so that the table fits 80 columns."""


def print_plan(snapshot: Snapshot, plan: Plan, console: Console) -> None:
    table = Table(
        title="PowerFlow plan",
        caption="batch: local batch per GPU; placement, ran on: node:GPUs, now and before",
    )
    for col, width in (("job", 13), ("model", 11)):  # the demo's longest; a longer one folds
        table.add_column(col, max_width=width, overflow="fold")
    for col in ("GPUs", "MHz", "batch"):
        table.add_column(col, justify="right", no_wrap=True)
    for col in ("placement", "ran on"):
        # A job on several nodes lists each: wrapped between nodes, never cut.
        table.add_column(col, max_width=PLACEMENT_WIDTH, overflow="fold")
    for job in snapshot.jobs:
        jp = plan.job(job.id)
        table.add_row(
            job.id,
            job.model_name or "",
            str(jp.gpus) if jp.gpus else "waits",
            str(jp.frequency_mhz) if jp.gpus else "-",
            str(jp.local_batch_size) if jp.gpus else "-",
            _slots(jp.placement),
            _slots(job.placement),
        )
    console.print(table)
    used = sum(jp.gpus for jp in plan.jobs)
    total = sum(n.gpus for n in snapshot.nodes)
    share = plan.predicted_w / plan.limit_w if plan.limit_w else float("inf")
    console.print(
        f"predicted power {plan.predicted_w:,.0f} W of limit {plan.limit_w:,.0f} W "
        f"({share:.0%}); {used}/{total} GPUs busy"
    )
    down = ", ".join(plan.powered_down_nodes) or "none"
    console.print(f"powered down: {down}; migrations: {len(plan.migrations)}")
    for m in plan.migrations:
        console.print(f"  {m.job_id}: {_slots(m.source)} -> {_slots(m.target)}")
    for note in plan.notes:
        console.print(f"  note: {note}")
