"""``powerflow budget what-if``: what a range of budgets would cost the queue.

For each budget (``--etas`` or ``--watts``) it predicts the queue's average
JCT, total energy and completion time with the scheduler's current models
(``powerflow.lab.sim.whatif``: the simulator with those models as the truth), as a
table and, with ``--plot``, a figure. The queue is the live one
(``--kubeconfig``: the DLJobs not yet done, each with its remaining
iterations and its ``status.model`` parameters, else its prior; the cluster's
GPU nodes of the pool the operator plans, and their GPU type; the budget
ConfigMap's ``pMaxWatts`` and the budget in force, marked in the table) or a
built-in one (``--demo``: the default trace's first ``--jobs`` jobs, all
waiting now, with their priors). ``--validate`` measures how far to trust it:
the prediction against the full simulator (true performance, models fitted
online) on the default trace.

GPU type. The what-if simulates one pool of one GPU type, the operator's main
pool: the live queue is predicted on that pool's type as the operator plans
it (its agents' reports as recorded on the nodes, else the product label's
catalogue type), or on ``--gpu`` (a catalogue type); the priors are carried
over to it (``prior_on``) and fitted params of another type give way to them,
as in the operator. Nodes of other pools are left out and named (the operator
plans those of a known type too, under the same budget: ``nodes.fleet_nodes``).
A pool whose type is unknown (a label the catalogue lacks,
no report recorded) cannot be simulated, since its clocks and power are not
known: the what-if refuses it unless ``--gpu`` names a type.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from powerflow.commands import checks
from powerflow.commands.operator import OPERATED
from powerflow.core import contract
from powerflow.core.budget_schedule import describe_budget, stops_every_job
from powerflow.core.errors import BudgetError, PowerFlowError, SimulationError
from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec, gpu_spec, tunes
from powerflow.core.policy.snapshot import Budget
from powerflow.lab.schedulers import DEFAULT_ETAS
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.whatif import Prediction, QueuedJob, budget_label, predict

HOUR = 3600.0
KWH = 3.6e6
DEMO_JOBS = 40
DEMO_NODES = 8
"""The demo's 40 jobs on 8 x 8 GPUs: enough jobs that the budget binds."""


class WhatIfError(PowerFlowError):
    """The what-if cannot run as asked (no queue, a bad budget list)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("budget", help="choose a power budget knowing its cost")
    sub = p.add_subparsers(dest="budget_command", metavar="SUBCOMMAND", required=True)
    w = sub.add_parser(
        "what-if",
        help="predict the queue's JCT, energy and completion time at a range of budgets",
        description=__doc__,
    )
    source = w.add_mutually_exclusive_group(required=True)
    source.add_argument("--kubeconfig", metavar="FILE", help="the live queue of this cluster")
    source.add_argument("--demo", action="store_true", help="the default trace's first jobs")
    source.add_argument(
        "--validate",
        action="store_true",
        help="the prediction against the full simulator on the default trace (how far to trust it)",
    )
    levels = w.add_mutually_exclusive_group()
    levels.add_argument("--etas", help=f"budgets as eta, comma-separated (default {DEFAULT_ETAS})")
    levels.add_argument("--watts", help="budgets as cluster power limits in W, comma-separated")
    w.add_argument("--pmax-watts", type=float, help="P_max for --etas (default: the ConfigMap's)")
    w.add_argument("--namespace", help="--kubeconfig: only this namespace's DLJobs")
    w.add_argument(
        "--budget-namespace",
        default="powerflow-system",
        help="--kubeconfig: namespace of the budget ConfigMap (default powerflow-system)",
    )
    w.add_argument(
        "--budget-configmap",
        default=contract.BUDGET_CONFIGMAP,
        help="--kubeconfig: the budget ConfigMap, for pMaxWatts and the budget in force "
        f"(default {contract.BUDGET_CONFIGMAP})",
    )
    w.add_argument("--jobs", type=int, default=DEMO_JOBS, help="--demo: how many jobs")
    w.add_argument("--hours", type=float, help="--validate: the trace's first H hours only")
    d = SimConfig()
    w.add_argument(
        "--nodes",
        type=int,
        help=f"--demo/--validate: nodes (default {DEMO_NODES} for --demo, {d.nodes} to validate)",
    )
    w.add_argument(
        "--gpus-per-node",
        type=int,
        default=d.gpus_per_node,
        help=f"--demo/--validate: GPUs per node (1 to {checks.MAX_GPUS_PER_NODE})",
    )
    w.add_argument(
        "--gpu",
        metavar="NAME",
        help="--kubeconfig/--demo: the GPU type to predict on, a catalogue type, short or "
        f"NVML name ({', '.join(sorted(GPU_SPECS))}; default: the type the operator plans "
        f"the cluster's pool as, {A100.name} for --demo)",
    )
    w.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw the predictions (--demo, --kubeconfig)",
    )
    w.add_argument(
        "--scheduler",
        choices=OPERATED,
        default="powerflow",
        help="the policy the operator runs (its --scheduler; default powerflow): the same "
        "eta costs very different energy under each",
    )
    w.add_argument("--json", action="store_true", help="print the predictions as JSON")
    w.add_argument("--workers", type=int, default=2, help="--validate: processes")
    w.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the options and the ``--plot`` file first: the what-if reads the cluster and
    simulates the queue at every budget before it draws."""
    checks.hours(args.hours)
    if args.hours is not None and not args.validate:
        raise WhatIfError("--hours cuts the trace of --validate; --demo takes --jobs")
    checks.cluster(args.nodes, args.gpus_per_node)
    if args.workers < 1:
        raise WhatIfError(f"--workers must be at least 1, got {args.workers}")
    if args.pmax_watts is not None and not (0 < args.pmax_watts < math.inf):
        raise WhatIfError(f"--pmax-watts must be a positive number, got {args.pmax_watts:g}")
    if args.plot is not None:
        if args.validate:
            raise WhatIfError("--plot draws the what-if's predictions; --validate draws none")
        check_plot_path(args.plot)
    if args.gpu is not None and args.validate:
        raise WhatIfError(
            "--validate compares with the simulator on the A100 evaluation trace; "
            "powerflow simulate --gpu runs another type"
        )
    chosen = gpu_spec(args.gpu) if args.gpu is not None else None  # a bad name: one line
    level_values(args)  # a bad --etas/--watts before the cluster is read
    if args.validate:
        return _validate(args)
    current: Budget | None = None
    if args.kubeconfig is not None:
        queue, config, current, p_max, notes = live_queue(args, chosen)
        title = f"the live queue ({len(queue)} DLJobs)"
    else:
        nodes = DEMO_NODES if args.nodes is None else args.nodes
        queue, config = demo_queue(args.jobs, nodes, args.gpus_per_node, chosen or A100)
        p_max, notes = None, []
        title = f"demo queue (first {len(queue)} jobs of the default trace)"
    for note in notes:
        print(f"powerflow budget what-if: {note}", file=sys.stderr)
    budgets = budget_levels(args, args.pmax_watts if args.pmax_watts is not None else p_max)
    if current is not None and stops_every_job(current):
        note = f"the budget in force ({describe_budget(current)}) stops every job: not predicted"
        print(f"powerflow budget what-if: {note}", file=sys.stderr)
        current = None  # the queue never finishes under it
    if current is not None and current not in budgets:
        budgets.append(current)
    predictions = predict_each(queue, budgets, config, args.scheduler)
    title += f" on {config.nodes} x {config.gpus_per_node} {config.gpu.name}, {args.scheduler}"
    if args.json:
        out = {
            "jobs": [q.job_id for q in queue],
            "nodes": config.nodes,
            "gpus_per_node": config.gpus_per_node,
            "gpu": config.gpu.name,
            "scheduler": args.scheduler,
            "predictions": [_row(p, current) for p in predictions],
        }
        print(json.dumps(out, indent=2))
    else:
        _console().print(prediction_table(predictions, title, current))
    if args.plot:
        plot(predictions, args.plot, f"What-if: {title}", current)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def predict_each(
    queue: Sequence[QueuedJob],
    budgets: Sequence[Budget],
    config: SimConfig,
    scheduler_name: str = "powerflow",
) -> list[Prediction]:
    """``predict`` at each budget; one under which the queue never finishes (below what
    any job draws: the simulator stops on a stalled queue) is named on stderr and left
    out, so that a range reaching too low still prices the rest."""
    out = []
    for budget in budgets:
        try:
            out += predict(queue, [budget], config, scheduler_name)
        except SimulationError as exc:
            print(
                f"powerflow budget what-if: {budget_label(budget)}: the queue never finishes "
                f"under it ({exc}): left out",
                file=sys.stderr,
            )
    if not out:
        raise WhatIfError("no budget lets the queue finish: raise them")
    return out


def level_values(args: argparse.Namespace) -> list[float]:
    """The numbers of ``--watts`` or ``--etas`` (default: the simulator's etas), each
    in its option's range."""
    text = args.watts if args.watts is not None else args.etas
    try:
        values = [float(x) for x in text.split(",") if x.strip()] if text else list(DEFAULT_ETAS)
    except ValueError:
        raise WhatIfError(f"budgets must be numbers separated by commas, not {text!r}") from None
    if not values:
        raise WhatIfError("no budget to predict")
    if args.watts is not None:
        if any(not 0 < v < math.inf for v in values):
            raise BudgetError("--watts: every limit must be a positive finite number")
    elif any(not 0 < v <= 1 for v in values):
        raise BudgetError("--etas: every eta must be in (0, 1]")
    return values


def budget_levels(args: argparse.Namespace, p_max: float | None) -> list[Budget]:
    values = level_values(args)
    if args.watts is not None:
        return [Budget(limit_w=v, p_max_w=p_max) for v in values]
    return [Budget(eta=v, p_max_w=p_max) for v in values]


# ------------------------------------------------------------------- queues


def live_cluster(nodes: int, gpus_per_node: int, gpu: GpuSpec = A100) -> SimConfig:
    """The simulated cluster of a what-if: PowerFlow's operator parks the nodes its
    plan leaves empty (docs/powered-down-nodes.md) and they take jobs again at once,
    so nodes are on unless the plan powers them down, and powering on is free (not
    the simulator's default, where every empty node is off and boots first)."""
    return SimConfig(
        nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, idle_nodes_off=False, power_on_s=0.0
    )


def demo_queue(
    jobs: int, nodes: int, gpus_per_node: int, gpu: GpuSpec = A100
) -> tuple[list[QueuedJob], SimConfig]:
    """The default trace's first ``jobs`` jobs that fit the cluster, all waiting now, with
    their priors on ``gpu``."""
    from powerflow.lab.sim.runner import TraceSpec, load_jobs

    if jobs < 1:
        raise WhatIfError("--jobs must be >= 1")
    config = live_cluster(nodes, gpus_per_node, gpu)
    fits = (j for j in load_jobs(TraceSpec(), SimConfig()) if j.num_gpu <= config.total_gpus)
    trace = list(itertools.islice(fits, jobs))
    queue = [replace(q, submit_s=0.0) for q in prior_queue(trace, gpu)]
    return queue, config


def prior_queue(trace: Iterable[TraceJob], gpu: GpuSpec = A100) -> list[QueuedJob]:
    """Trace jobs as a queue, each job's prior on ``gpu`` taken as its model (what the
    operator knows before any job has run: the prior carried over to the pool's type)."""
    from powerflow.core.models.fitted import FittedModel
    from powerflow.core.models.priors import load_prior, prior_on

    return [
        QueuedJob(
            j.job_id,
            FittedModel.on(prior_on(load_prior(j.model_name), gpu), gpu),
            j.num_gpu,
            j.global_batch_size,
            j.iterations,
            j.submit_s,
        )
        for j in trace
    ]


def live_queue(
    args: argparse.Namespace, chosen: GpuSpec | None = None
) -> tuple[list[QueuedJob], SimConfig, Budget | None, float | None, list[str]]:
    """The cluster's DLJobs not yet done, its GPU nodes and their type (``chosen``, else
    the operator's: module docstring), and the budget ConfigMap's budget in force and
    ``pMaxWatts``; notes on what was left out."""
    import kubernetes
    import urllib3

    from powerflow.kubeapi.client import TimedApiClient
    from powerflow.kubeapi.config import load_configuration, resolve_source
    from powerflow.operator.bodies import DLJobBody
    from powerflow.operator.budget import parse_budget
    from powerflow.operator.discovered import recorded_specs
    from powerflow.operator.jobs import parse_dljob
    from powerflow.operator.kube import call_json
    from powerflow.operator.learning import SampleStore
    from powerflow.operator.nodes import cluster_nodes

    api = TimedApiClient(load_configuration(resolve_source(args.kubeconfig)))  # no hang
    try:
        bodies: list[DLJobBody] = _list_dljobs(api, args.namespace)
        core = kubernetes.client.CoreV1Api(api)
        nodes_raw = call_json(core.list_node)["items"]
        budget_cm = _read_config_map(core, args.budget_namespace, args.budget_configmap)
    except kubernetes.client.ApiException as exc:
        raise WhatIfError(f"the API server refused: {exc.status} {exc.reason}") from None
    except urllib3.exceptions.HTTPError as exc:  # no answer at all (after the retries)
        reason = getattr(exc, "reason", None) or exc
        raise WhatIfError(
            f"cannot reach the API server at {api.configuration.host}: {reason}"
        ) from None
    finally:
        api.close()
    notes: list[str] = []
    discovered = recorded_specs(nodes_raw, time.time())
    nodes, left_out = cluster_nodes(nodes_raw, discovered=discovered)
    if left_out:
        products = _products(nodes_raw)
        named = ", ".join(f"{n} ({products.get(n) or 'no product label'})" for n in left_out)
        notes.append(
            f"nodes of other pools left out (the what-if simulates the main pool, of one "
            f"GPU type): {named}"
        )
    if not nodes:
        raise WhatIfError("the cluster has no GPU nodes PowerFlow schedules on")
    per_node = max(n.gpus for n in nodes)
    total = sum(n.gpus for n in nodes)
    if any(n.gpus != per_node for n in nodes):
        notes.append(f"nodes differ in GPUs: simulated as {len(nodes)} x {per_node}")
    planned = nodes[0].gpu  # one pool: one type (``nodes.pool_gpu``)
    # --gpu naming the pool's own type keeps what its agents reported of it
    gpu = planned if chosen is None or chosen.name == planned.name else chosen
    if not tunes(gpu):
        label = _products(nodes_raw).get(nodes[0].name) or "none"
        raise WhatIfError(
            f"the pool's GPU type is unknown (product label {label!r}, no GPU report "
            "recorded on its nodes): the simulator needs its clocks and power; "
            f"name a catalogue type with --gpu ({', '.join(sorted(GPU_SPECS))})"
        )
    if gpu != planned:
        was = planned.name if tunes(planned) else "of unknown type"
        notes.append(f"the pool's GPUs are {was}: predicted as {gpu.name} (--gpu)")
    config = live_cluster(len(nodes), per_node, gpu)
    store = SampleStore()
    for note in store.refresh(bodies, gpu):
        notes.append(f"{note.namespace}/{note.name}: {note.message}")
    queue = []
    for body in bodies:
        status = body.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            req = parse_dljob(body)
        except PowerFlowError as exc:
            notes.append(f"{_key(body)} left out: {exc}")
            continue
        if req.requested_gpus > total:
            notes.append(f"{req.key} left out: asks for more GPUs than the cluster's {total}")
            continue
        done = (status.get("progress") or {}).get("iterations", 0)
        left = req.iterations - (done if isinstance(done, int) else 0)
        queue.append(
            QueuedJob(req.key, store.model(req), req.requested_gpus, req.global_batch_size, left)
        )
    if not queue:
        raise WhatIfError("no DLJob waits or runs: nothing to predict")
    current = p_max = None
    if budget_cm is not None:
        try:
            budget = parse_budget(budget_cm.get("data") or {})
        except PowerFlowError as exc:
            notes.append(f"the budget ConfigMap is invalid ({exc}): no budget in force shown")
        else:
            current = budget.at(time.time()).budget
            p_max = budget.budget.p_max_w
    return queue, config, current, p_max, notes


def _products(nodes: Iterable[Any]) -> dict[str, str]:
    """Each node's GPU product label (empty when it has none)."""
    out = {}
    for body in nodes:
        meta = body.get("metadata") or {}
        label = (meta.get("labels") or {}).get(contract.GPU_PRODUCT_LABEL)
        out[str(meta.get("name"))] = label if isinstance(label, str) else ""
    return out


def _list_dljobs(api: Any, namespace: str | None) -> list[Any]:
    import kubernetes

    from powerflow.operator.kube import call_json

    custom = kubernetes.client.CustomObjectsApi(api)
    where = (contract.GROUP, contract.VERSION)
    if namespace:
        found = call_json(custom.list_namespaced_custom_object, *where, namespace, contract.PLURAL)
    else:
        found = call_json(custom.list_cluster_custom_object, *where, contract.PLURAL)
    items: list[Any] = found["items"]
    return items


def _read_config_map(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    import kubernetes

    from powerflow.operator.kube import call_json

    try:
        body: dict[str, Any] = call_json(core.read_namespaced_config_map, name, namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return body


def _key(body: Any) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


# ------------------------------------------------------------------- output


def check_plot_path(path: Path) -> None:
    """Refuse a ``--plot`` file that cannot be written before the prediction runs, not
    after its table: a type matplotlib writes (without a suffix it would write
    ``FILE.png``, not ``FILE``), in a folder that exists (a file's folder is not
    created: a typo would leave a stray folder)."""
    from matplotlib.backend_bases import FigureCanvasBase

    kind = path.suffix.lower().removeprefix(".")
    known = FigureCanvasBase.get_supported_filetypes()
    if not kind:
        raise WhatIfError(f"--plot {path} has no file type; name it FILE.png (or .svg, .pdf)")
    if kind not in known:
        raise WhatIfError(
            f"--plot {path}: '.{kind}' is not a figure type matplotlib writes "
            f"({', '.join(sorted(known))})"
        )
    checks.output_file(path, "--plot")


def _row(p: Prediction, current: Budget | None) -> dict[str, Any]:
    return {
        "budget": p.label,
        "eta": p.budget.eta,
        "power_limit_w": p.budget.limit_w,
        "limit_w": p.limit_w,
        "avg_jct_s": p.avg_jct_s,
        "total_energy_j": p.total_energy_j,
        "completion_s": p.completion_s,
        "in_force": p.budget == current,
    }


def prediction_table(
    predictions: Sequence[Prediction], title: str, current: Budget | None = None
) -> Table:
    """One row per budget; JCT and energy also relative to the most generous budget."""
    base = max(predictions, key=lambda p: p.limit_w)
    table = Table(
        title=title,
        caption="kW: the limit; JCT: average; kWh: energy; done: the queue's last job;"
        " vs top: against the most generous budget",
    )
    table.add_column("budget", justify="right", max_width=12)
    for name in ("kW", "JCT h", "vs top", "kWh", "vs top", "done h"):
        table.add_column(name, justify="right", no_wrap=True)
    for p in sorted(predictions, key=lambda p: p.limit_w):
        label = p.label + (" (in force)" if p.budget == current else "")
        table.add_row(
            label,
            f"{p.limit_w / 1e3:,.1f}",
            f"{p.avg_jct_s / HOUR:.2f}",
            f"{(p.avg_jct_s / base.avg_jct_s - 1) * 100:+.1f}%",
            f"{p.total_energy_j / KWH:,.0f}",
            f"{(p.total_energy_j / base.total_energy_j - 1) * 100:+.1f}%",
            f"{p.completion_s / HOUR:.2f}",
        )
    return table


def plot(
    predictions: Sequence[Prediction], path: Path, title: str, current: Budget | None = None
) -> Path:
    """Average JCT, energy and completion time against the budget's limit in kW."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(predictions, key=lambda p: p.limit_w)
    x = [p.limit_w / 1e3 for p in ordered]
    panels = (
        ("average JCT (h)", [p.avg_jct_s / HOUR for p in ordered], "tab:red"),
        ("total energy (kWh)", [p.total_energy_j / KWH for p in ordered], "tab:blue"),
        ("queue done in (h)", [p.completion_s / HOUR for p in ordered], "tab:green"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, (label, y, color) in zip(axes, panels, strict=True):
        ax.plot(x, y, marker="o", color=color)
        for p, xi, yi in zip(ordered, x, y, strict=True):
            ax.annotate(p.label, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
            if p.budget == current:
                ax.scatter([xi], [yi], s=140, facecolors="none", edgecolors="black")
        ax.set_xlabel("cluster power limit (kW)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.margins(x=0.12)
    fig.suptitle(title + ("  (circled: the budget in force)" if current is not None else ""))
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise WhatIfError(f"--plot {path}: {exc}") from None
    finally:
        plt.close(fig)
    return path


def _console() -> Any:
    from powerflow.lab.sim.output import stdout_console

    return stdout_console()


# ----------------------------------------------------------------- validation


def _validate(args: argparse.Namespace) -> int:
    """The what-if (priors as the truth) against the full simulator (ground truth,
    models fitted online) on the default trace, at each eta."""
    from powerflow.lab.sim.runner import RunSpec, TraceSpec, load_jobs, run_many

    if args.watts is not None:
        raise WhatIfError("--validate compares etas (--etas), as the simulator's sweep does")
    nodes = SimConfig().nodes if args.nodes is None else args.nodes
    # the simulator's own setting: the run is `powerflow simulate`'s (anyone can repeat it)
    config = SimConfig(nodes=nodes, gpus_per_node=args.gpus_per_node)
    spec = TraceSpec(hours=args.hours)
    trace = load_jobs(spec, config)
    queue = prior_queue(trace)
    budgets = budget_levels(args, args.pmax_watts)
    predicted = predict(queue, budgets, config, args.scheduler)
    truths = run_many(
        [RunSpec(args.scheduler, b.eta, spec, config) for b in budgets], workers=args.workers
    )
    rows = []
    for p, t in zip(predicted, truths, strict=True):
        m = t.metrics
        rows.append(
            {
                "eta": p.budget.eta,
                "predicted_avg_jct_s": p.avg_jct_s,
                "simulated_avg_jct_s": m["avg_jct_s"],
                "predicted_energy_j": p.total_energy_j,
                "simulated_energy_j": m["total_energy_j"],
                "predicted_completion_s": p.completion_s,
                "simulated_completion_s": m["makespan_s"],
            }
        )
    title = f"what-if vs simulator on {spec.describe()}, {config.nodes} x {config.gpus_per_node}"
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _console().print(validation_table(rows, title))
    return 0


def validation_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for name in ("eta", "JCT h", "err", "kWh", "err", "done h", "err"):
        table.add_column(name, justify="right", no_wrap=True)

    def pair(r: dict[str, Any], what: str, unit: float, fmt: str) -> tuple[str, str]:
        p, s = r[f"predicted_{what}"], r[f"simulated_{what}"]
        return f"{p / unit:{fmt}}\n{s / unit:{fmt}}", f"{(p / s - 1) * 100:+.1f}%"

    for r in rows:
        cells = [f"{r['eta']:g}"]
        cells += pair(r, "avg_jct_s", HOUR, ".2f")
        cells += pair(r, "energy_j", KWH, ",.0f")
        cells += pair(r, "completion_s", HOUR, ".1f")
        table.add_row(*cells, end_section=True)
    table.caption = (
        "each cell: predicted above simulated (ground truth, fitted models); err: relative;"
        " JCT: average; kWh: energy; done: the queue's last job"
    )
    return table
