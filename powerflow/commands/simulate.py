"""``powerflow simulate``: the trace-driven evaluation (paper §6), the main job.

Without ``--scheduler`` it runs the whole comparison on both cores, prints the
results and the JCT ratios at equal energy, and writes CSV, JSON and PNG files
to a results folder. With ``--scheduler`` it runs one configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from powerflow.commands import checks
from powerflow.commands.comparison_files import FiguresAhead, write_outputs
from powerflow.core.budget_schedule import BudgetSchedule, schedule_document, yaml_problem
from powerflow.core.errors import BudgetError, DataError, SimulationError
from powerflow.core.gpus import A100, GpuSpec, gpu_spec
from powerflow.core.policy.snapshot import Budget
from powerflow.lab.groundtruth.truth import THROUGHPUT_SOURCES
from powerflow.lab.schedulers import SCHEDULERS, ZEUS_ETA_KNOB, scheduler
from powerflow.lab.sim import experiments, headline, heldout, output
from powerflow.lab.sim.compare import WINDOW, jct_ratios, versus
from powerflow.lab.sim.config import NodePool, SimConfig
from powerflow.lab.sim.priors import HELD_OUT, PRIORS, RECURRING
from powerflow.lab.sim.report import setting_label, write_report
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec, load_jobs, run_many, run_one
from powerflow.lab.sim.windows import EVALUATION_WINDOWS, window_named

if TYPE_CHECKING:
    from rich.console import Console

# rich's console and progress bar only where the comparison draws them (``_stderr``,
# ``_run_with_progress``): one run prints a table (``output``) or, with ``--json``,
# no rich at all, and rich's modules are about 40 ms of start-up
# (``python -X importtime -c "import rich.console, rich.progress"``).


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run the trace-driven evaluation (default: the full comparison)",
        description=__doc__,
    )
    p.add_argument("--scheduler", choices=list(SCHEDULERS), help="run one scheduler only")
    knob = p.add_mutually_exclusive_group()
    knob.add_argument(
        "--eta",
        type=float,
        help=f"PowerFlow's {checks.ETA_HELP}",
    )
    knob.add_argument("--frequency", type=int, metavar="MHZ", help="a baseline's GPU clock")
    knob.add_argument(
        "--eta-knob",
        type=float,
        metavar="K",
        help=(
            "a Zeus variant's eta_knob, the weight of energy against time in its cost,"
            f" in [0, 1] (default {ZEUS_ETA_KNOB:g}, Zeus's own)"
        ),
    )
    p.add_argument(
        "--budget-schedule",
        type=Path,
        metavar="FILE",
        help=(
            "budgets for time windows (YAML or JSON, the budget ConfigMap's schedule "
            "format, docs/operator.md); --eta holds outside them; simulated t = 0 is 00:00 "
            "(UTC) of the trace's first day; needs an --eta scheduler"
        ),
    )
    add_cluster_args(p)
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help=(
            "the cluster's GPU type, short or NVML name, one with a ground truth: "
            f"{', '.join(THROUGHPUT_SOURCES)} (default {A100.name}; docs/simulator.md); "
            "a mixed cluster names its types in --nodes"
        ),
    )
    p.add_argument(
        "--window",
        metavar="dNN",
        help=(
            "a 24-hour window of the whole ElasticFlow trace instead of the bundled one"
            " (d28); the evaluation's: " + ", ".join(w.name for w in EVALUATION_WINDOWS)
        ),
    )
    p.add_argument(
        "--held-out",
        action="store_true",
        help="the comparison on every evaluation window, with the spread of each ratio",
    )
    p.add_argument(
        "--max-duration",
        type=float,
        metavar="HOURS",
        help=(
            "leave out the jobs that take longer than this at their requested GPUs and full"
            " clock (the comparison without the trace's long tail; the bound is printed)"
        ),
    )
    p.add_argument("--oracle", action="store_true", help="schedule with the ground truth")
    p.add_argument(
        "--priors",
        choices=PRIORS,
        default=HELD_OUT,
        help=(
            "what fitted models start from: held-out (default), the other models' priors,"
            " as for a model never run before; recurring, each job's own model's prior"
        ),
    )
    add_power_args(p)
    p.add_argument(
        "--quick", action="store_true", help="fewer points, first 2 h of the trace, 8 nodes"
    )
    p.add_argument(
        "--no-oracle-runs",
        action="store_true",
        help="skip the Fig. 10 runs (the ground truth's and the recurring-job priors')",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="results folder, created with its parents (default results/<timestamp>)",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE.md",
        help=(
            "also write a Markdown report to this file (its folder must exist, or be"
            " in the --out folder, which is made)"
        ),
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    p.set_defaults(func=run)


def add_power_args(p: argparse.ArgumentParser) -> None:
    """PowerFlow's budget-keeping options (``powerflow.core.policy.power_loop``); unset: its own."""
    g = p.add_argument_group("keeping the power budget (PowerFlow)")
    g.add_argument(
        "--strict-power",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check the limit on every allocation step (default); --no-strict-power: only "
        "at node boundaries, as the paper's Algorithm 1",
    )
    g.add_argument(
        "--power-correction",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="correct predicted power by measured power, per job and cluster-wide (default on)",
    )
    g.add_argument(
        "--power-caps",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-GPU power caps when the plan leaves little room (default on)",
    )
    g.add_argument(
        "--power-margin",
        type=float,
        metavar="FRACTION",
        help="fraction of the limit never planned, on top of the measured ratio (default 0)",
    )
    g.add_argument(
        "--cap-headroom",
        type=float,
        metavar="FRACTION",
        help="caps are set when the plan leaves less than this fraction free (default 0.1)",
    )


def power_options(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """The policy options the power flags set, as ``RunSpec.policy_options``."""
    named = {
        "strict_power": args.strict_power,
        "power_correction": args.power_correction,
        "power_caps": args.power_caps,
        "power_margin": args.power_margin,
        "cap_headroom": args.cap_headroom,
    }
    return tuple((k, v) for k, v in named.items() if v is not None)


MAX_GPUS_PER_NODE = checks.MAX_GPUS_PER_NODE


def add_cluster_args(p: argparse.ArgumentParser, *, trace: bool = True) -> None:
    """The cluster's options; with ``trace`` also which jobs (``--trace``, ``--hours``)
    and how many nodes, which ``sweep`` sets itself and does not take."""
    d = SimConfig()
    if trace:
        p.add_argument("--trace", type=Path, help="trace CSV (default: the bundled ITP window)")
        p.add_argument(
            "--hours",
            type=float,
            metavar="H",
            help=(
                "only jobs submitted in the first H hours, H > 0 (default: all; "
                f"{experiments.QUICK_HOURS:g} with --quick)"
            ),
        )
        p.add_argument(
            "--nodes",
            metavar="NODES",
            help=(
                f"nodes (default {d.nodes}; {experiments.QUICK_NODES} for the comparison "
                "with --quick), or a mixed cluster as TYPE:COUNT pairs, each optionally "
                "xGPUS per node (default --gpus-per-node), e.g. A100:32,H100-SXM:16x4: "
                "each type runs on its own ground truth, planned as one pool per type "
                "and node size under one budget (one --scheduler at a time; "
                "docs/simulator.md)"
            ),
        )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=d.gpus_per_node,
        help=f"GPUs per node (1 to {MAX_GPUS_PER_NODE}; default {d.gpus_per_node})",
    )
    p.add_argument("--interval", type=float, default=d.interval_s, help="re-evaluation (s)")
    p.add_argument(
        "--restart-s",
        type=float,
        default=d.restart_s,
        help="checkpoint-restart (s), which PowerFlow+ also counts in its priorities",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of noise and model draws")
    p.add_argument(
        "--paper-baselines",
        action="store_true",
        help=(
            "the paper's setting: only PowerFlow switches off the nodes its plan leaves "
            "empty, the baselines keep every node on; a node PowerFlow switched off still "
            f"boots {d.power_on_s:g} s when reused (default: every scheduler's empty "
            f"nodes are off; a node boots {d.power_on_s:g} s before its first job runs)"
        ),
    )


def config_from(args: argparse.Namespace) -> SimConfig:
    """The cluster options as a ``SimConfig``, each refused by its own name when out of
    range (a negative seed would otherwise end in numpy's traceback)."""
    nodes, pools = cluster_nodes(getattr(args, "nodes", None), getattr(args, "gpu", None))
    checks.cluster(nodes, args.gpus_per_node)
    if not 0 < args.interval < math.inf:
        raise checks.ArgumentError(
            f"--interval must be a finite number > 0 seconds, got {args.interval:g}"
        )
    if not 0 <= args.restart_s < math.inf:
        raise checks.ArgumentError(
            f"--restart-s must be a finite number >= 0 seconds, got {args.restart_s:g}"
        )
    if args.seed < 0:
        raise checks.ArgumentError(f"--seed must be >= 0, got {args.seed}")
    common: dict[str, Any] = {
        "interval_s": args.interval,
        "restart_s": args.restart_s,
        "seed": args.seed,
        "idle_nodes_off": not args.paper_baselines,
    }
    if pools:
        return SimConfig(
            pools=tuple(
                NodePool(gpu, count, per_node or args.gpus_per_node)
                for gpu, count, per_node in pools
            ),
            **common,
        )
    if nodes is None:
        quick_comparison = getattr(args, "quick", False) and not getattr(args, "scheduler", None)
        nodes = experiments.QUICK_NODES if quick_comparison else SimConfig().nodes
    return SimConfig(
        nodes=nodes,
        gpus_per_node=args.gpus_per_node,
        gpu=simulated_gpu(getattr(args, "gpu", None)),
        **common,
    )


NODES_FORM = "TYPE:COUNT pairs, each optionally xGPUS per node, e.g. A100:32,H100-SXM:16x4"


def cluster_nodes(
    text: str | None, gpu: str | None
) -> tuple[int | None, tuple[tuple[GpuSpec, int, int | None], ...]]:
    """``--nodes``: a number of nodes (of ``--gpu``), or a mixed cluster's pools as
    (type, nodes, GPUs per node or None for ``--gpus-per-node``), each refused in
    one line: a malformed pair, a count or node size out of range, an unknown type
    (naming the known ones), a type without a ground truth (naming those with one),
    a pool given twice, ``--gpu`` beside typed pools."""
    if text is None:
        return None, ()
    text = text.strip()
    if text.isdigit():
        return int(text), ()
    if not text or text.lstrip("+-").isdigit():
        raise checks.ArgumentError(f"--nodes must be 1 to {checks.MAX_NODES}, got {text}")
    if gpu is not None:
        raise checks.ArgumentError(
            f"--nodes {text} names each pool's GPU type; --gpu is for a cluster of one "
            "type: drop --gpu"
        )
    pools: list[tuple[GpuSpec, int, int | None]] = []
    for item in text.split(","):
        name, colon, size = item.strip().rpartition(":")
        count, x, per_node = size.strip().lower().partition("x")
        if not colon or not name.strip() or not count.isdigit() or (x and not per_node.isdigit()):
            raise checks.ArgumentError(
                f"--nodes {text}: {item.strip()!r} is not one of {NODES_FORM}"
            )
        try:
            spec = gpu_spec(name)
        except DataError as exc:
            raise checks.ArgumentError(f"--nodes {text}: {exc}") from None
        with_truth(spec, f"--nodes {text}")
        if not 1 <= int(count) <= checks.MAX_NODES:
            raise checks.ArgumentError(
                f"--nodes {text}: {spec.name} nodes must be 1 to {checks.MAX_NODES}, got {count}"
            )
        gpus = int(per_node) if x else None
        if gpus is not None and not 1 <= gpus <= MAX_GPUS_PER_NODE:
            raise checks.ArgumentError(
                f"--nodes {text}: GPUs per node must be 1 to {MAX_GPUS_PER_NODE}, got {gpus}"
            )
        pools.append((spec, int(count), gpus))
    total = sum(count for _, count, _ in pools)
    if total > checks.MAX_NODES:
        raise checks.ArgumentError(f"--nodes must be 1 to {checks.MAX_NODES}, got {total}")
    return None, tuple(pools)


def simulated_gpu(name: str | None) -> GpuSpec:
    """The ``--gpu`` type (default the A100), refused in one line unless the
    simulator has a ground truth for it."""
    if name is None:
        return A100
    return with_truth(gpu_spec(name), f"--gpu {name}")


def with_truth(gpu: GpuSpec, option: str) -> GpuSpec:
    """``gpu``, refused (by ``option``) unless the simulator has a ground truth for it."""
    if gpu.name not in THROUGHPUT_SOURCES:
        raise checks.ArgumentError(
            f"{option}: no ground truth for {gpu.name}; the simulator has one for "
            f"{', '.join(THROUGHPUT_SOURCES)}"
        )
    return gpu


def trace_from(args: argparse.Namespace) -> TraceSpec:
    if args.trace is not None and not args.trace.is_file():
        raise SimulationError(f"no trace file {args.trace}")
    hours = checks.hours(args.hours)
    bound = checks.hours(getattr(args, "max_duration", None), "--max-duration")
    window = getattr(args, "window", None)
    if window is not None:
        if args.trace is not None:
            raise checks.ArgumentError("--window is a trace: give --window or --trace")
        window_named(window)
    return TraceSpec(
        str(args.trace) if args.trace else None,
        hours,
        seed=args.seed,
        max_duration_h=bound,
        window=window,
    )


def run(args: argparse.Namespace) -> int:
    """Check every option, the output paths and the trace, then simulate: nothing that
    can be refused is found after minutes of compute."""
    config, trace = config_from(args), trace_from(args)
    checks.eta(args.eta)
    checks.eta_knob(args.eta_knob)
    if args.workers < 1:
        raise checks.ArgumentError(f"--workers must be at least 1, got {args.workers}")
    if args.oracle and args.priors != HELD_OUT:
        raise checks.ArgumentError(
            f"--priors {args.priors} chooses where fitted models start; --oracle fits none"
        )
    if args.out is not None:
        checks.output_folder(args.out, "--out")
    if config.mixed and (args.held_out or not args.scheduler):
        raise checks.ArgumentError(
            f"--nodes {config.describe_nodes()}: a mixed cluster runs one --scheduler at a"
            " time; the comparison and --held-out run on one GPU type"
        )
    if args.held_out:
        return _held_out(args, config, trace)
    if args.scheduler:
        if args.priors != HELD_OUT and not scheduler(args.scheduler).profiling.fitted_models:
            raise checks.ArgumentError(
                f"{args.scheduler} fits no models; --priors is for powerflow and powerflow+"
            )
        if args.report is not None:
            raise SimulationError("--report writes the comparison's report: drop --scheduler")
        return _single(args, config, trace)
    if args.eta is not None or args.frequency is not None or args.eta_knob is not None:
        raise SimulationError("--eta/--frequency/--eta-knob need --scheduler")
    if power_options(args):
        raise SimulationError("the power budget options need --scheduler powerflow or powerflow+")
    if args.budget_schedule is not None:
        raise SimulationError("--budget-schedule needs --scheduler")
    if args.report is not None:
        if args.out is not None and args.report.resolve() == args.out.resolve():
            raise checks.ArgumentError(f"--report {args.report} is the --out folder; name a file")
        if args.out is not None and args.report.parent.resolve().is_relative_to(args.out.resolve()):
            # In the --out folder (or below): made with it, as the user asked for it.
            checks.output_folder(args.report.parent, "--report's folder")
            if args.report.is_dir():
                raise checks.ArgumentError(f"--report {args.report} is a folder; name a file")
        else:
            checks.output_file(args.report, "--report")
    return _comparison(args, config, trace)


def _held_out(args: argparse.Namespace, config: SimConfig, trace: TraceSpec) -> int:
    """The comparison on every evaluation window (``heldout``); one result file."""
    given = [
        flag
        for flag, value in (
            ("--scheduler", args.scheduler),
            ("--trace", args.trace),
            ("--window", args.window),
            ("--oracle", args.oracle),
            ("--report", args.report),
            ("--budget-schedule", args.budget_schedule),
        )
        if value
    ]
    if given or args.priors != HELD_OUT:
        flags = ", ".join(given or ["--priors"])
        raise checks.ArgumentError(
            f"--held-out runs the evaluation windows' comparison: drop {flags}"
        )
    specs = heldout.held_out_specs(trace, config, quick=args.quick)
    out = args.out or checks.output_folder(
        Path("results") / dt.datetime.now().strftime("held-out-%Y%m%d-%H%M%S"), "--out (default)"
    )
    for trace_spec, run_config in {(s.trace, s.config) for s in specs}:
        load_jobs(trace_spec, run_config)  # a bad window refused here, not in every worker
    outcomes = _run_with_progress(specs, args.workers, _stderr(), quiet=args.json)
    result = heldout.summary(outcomes)
    words = heldout.lines(result)
    rows = [{**o.row(), "window": o.spec.trace.window} for o in outcomes]
    output.write_csv(rows, out / "runs.csv")
    output.write_json({"runs": rows, **result, "headline": words}, out / "held_out.json")
    if args.json:
        print(output.to_json({"runs": rows, **result, "headline": words}))
        return 0
    stdout = output.stdout_console()
    stdout.print(f"wrote 2 files to {out}/")
    for line in words:
        stdout.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def _single(args: argparse.Namespace, config: SimConfig, trace: TraceSpec) -> int:
    spec = scheduler(args.scheduler)
    flag, value = _knob_value(args)
    if flag is not None and KNOB_FLAGS.get(spec.knob or "") != flag:
        takes = KNOB_FLAGS.get(spec.knob or "")
        raise SimulationError(
            f"{spec.name} takes {takes}, not {flag}" if takes else f"{spec.name} takes no {flag}"
        )
    if spec.knob == "frequency_mhz" and config.mixed:
        no_clock_on_mixed(value, config)
    elif spec.knob == "frequency_mhz":
        value = baseline_clock(value, config.gpu)
    elif value is None:
        value = spec.default_value
    options = power_options(args)
    if options and spec.is_baseline:
        raise SimulationError(f"{spec.name} has no power budget options; they are PowerFlow's")
    schedule = None
    if args.budget_schedule is not None:
        if spec.knob != "eta":
            raise SimulationError(f"{spec.name} has no power budget; --budget-schedule needs one")
        schedule = read_schedule(args.budget_schedule, Budget(eta=value), args.eta is not None)
    outcome = run_one(
        RunSpec(
            spec.name,
            value,
            trace,
            config,
            oracle=args.oracle,
            budget_schedule=schedule,
            policy_options=options,
            priors=args.priors,
        )
    )
    row = outcome.row()
    if args.json:
        print(output.to_json(row))
    else:
        output.stdout_console().print(
            output.results_table([row], f"{outcome.spec.label} on {trace.describe()}")
        )
    if args.out:
        output.write_json(row, args.out / "run.json")
    return 0


def baseline_clock(value: float | None, gpu: GpuSpec) -> float:
    """A baseline's ``--frequency`` checked against ``gpu``'s clocks; none given:
    the top clock (the A100's sweep ends at it, as ``clocks_on`` does on any type)."""
    if value is None:
        return gpu.max_clock_mhz
    if value not in gpu.clocks_mhz:
        raise checks.ArgumentError(
            f"--frequency {value:g} is not a {gpu.name} clock: {gpu.min_clock_mhz}"
            f"-{gpu.max_clock_mhz} MHz in {gpu.clocks_mhz[1] - gpu.clocks_mhz[0]} MHz steps"
        )
    return value


def no_clock_on_mixed(value: float | None, config: SimConfig) -> None:
    """A baseline on a mixed cluster runs each type at its top clock: one ``--frequency``
    would be one type's clock only."""
    if value is not None:
        raise checks.ArgumentError(
            f"--frequency {value:g} is one type's clock; on a mixed cluster"
            f" ({config.describe_nodes()}) each type runs its top clock: drop --frequency"
        )


KNOB_FLAGS = {"eta": "--eta", "frequency_mhz": "--frequency", "eta_knob": "--eta-knob"}
"""The option that sets each scheduler knob (``SchedulerSpec.knob``)."""


def _knob_value(args: argparse.Namespace) -> tuple[str | None, float | None]:
    """The knob option given (argparse lets only one through) and its value."""
    for flag in KNOB_FLAGS.values():
        value: float | None = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            return flag, value
    return None, None


def read_schedule(path: Path, default: Budget, eta_given: bool) -> BudgetSchedule:
    """The schedule file; its plain keys and ``--eta`` are the same budget: one of them."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise BudgetError(f"--budget-schedule {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise BudgetError(
            f"--budget-schedule {path}: not YAML or JSON: {yaml_problem(exc)}"
        ) from None
    if doc is None:
        raise BudgetError(
            f"--budget-schedule {path} is empty; write a list of windows "
            "(docs/operator.md), or [] for none"
        )
    plain = isinstance(doc, dict) and ("eta" in doc or "powerLimitWatts" in doc)
    if plain and eta_given:
        raise BudgetError(
            f"--budget-schedule {path} sets the budget outside its windows; drop --eta"
        )
    try:
        return schedule_document(doc, default)
    except BudgetError as exc:
        raise BudgetError(f"--budget-schedule {path}: {exc}") from None


def _comparison(args: argparse.Namespace, config: SimConfig, trace: TraceSpec) -> int:
    specs = experiments.comparison(
        trace,
        config,
        quick=args.quick,
        oracle=not args.no_oracle_runs and not args.oracle and args.priors == HELD_OUT,
    )
    if args.oracle:
        specs = [replace(s, oracle=True) for s in specs]
    elif args.priors != HELD_OUT:
        specs = [replace(s, priors=args.priors) for s in specs]
    out = args.out or checks.output_folder(
        Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S"), "--out (default)"
    )
    for trace_spec, run_config in {(s.trace, s.config) for s in specs}:
        load_jobs(trace_spec, run_config)  # a bad row refused here, not in every worker
    console = _stderr()
    title = (
        f"{specs[0].trace.describe()} on {config.nodes} x {config.gpus_per_node}"
        f" {config.gpu.name},"
        f" {setting_label(config)}"
    )
    with contextlib.ExitStack() as stack:
        ahead = None
        if args.workers > 1:
            ahead = stack.enter_context(FiguresAhead(specs, out, title))
        outcomes = _run_with_progress(
            specs,
            args.workers,
            console,
            quiet=args.json,
            on_done=None if ahead is None else ahead.done,
            order=None if ahead is None else ahead.order(),
        )
        _finish(args, specs, config, out, outcomes, title, ahead)
    return 0


def _finish(
    args: argparse.Namespace,
    specs: list[RunSpec],
    config: SimConfig,
    out: Path,
    outcomes: list[RunOutcome],
    title: str,
    ahead: FiguresAhead | None,
) -> None:
    """The comparison's files, tables and closing lines, from its runs' outcomes."""
    rows = [o.row() for o in outcomes]
    ratios = jct_ratios(rows)
    plus = {"jct_ratio_at_equal_window_energy": jct_ratios(rows, WINDOW), **plus_versus(rows)}
    lines = headline.closing_lines(rows, ratios, specs[0].trace)
    files = write_outputs(
        out,
        outcomes,
        ratios,
        title,
        {**plus, "headline": lines},
        workers=args.workers,
        ahead=ahead,
    )
    if args.report:
        write_report(args.report, outcomes, ratios, config, specs[0].trace, out, args)
        files.append(args.report)
    if args.json:
        print(
            output.to_json(
                {"runs": rows, "jct_ratio_at_equal_energy": ratios, **plus, "headline": lines}
            )
        )
    else:
        stdout = output.stdout_console()
        output.print_tables(
            stdout,
            output.results_table(rows, title),
            output.ratio_table(ratios),
            output.versus_table(plus),
        )
        stdout.print(f"wrote {len(files)} files to {out}/")
        stdout.print()
        for line in lines:
            stdout.print(line, markup=False, highlight=False, soft_wrap=True)


def _stderr() -> Console:
    """The console the comparison's progress bar draws on."""
    from rich.console import Console

    return Console(stderr=True)


def _run_with_progress(
    specs: list[RunSpec],
    workers: int,
    console: Console,
    *,
    quiet: bool,
    on_done: Callable[[int, RunOutcome], None] | None = None,
    order: Sequence[int] | None = None,
) -> list[RunOutcome]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("[bold]simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=quiet,
        transient=False,
    ) as progress:
        task = progress.add_task("", total=len(specs))

        def done(index: int, o: RunOutcome) -> None:
            progress.update(task, advance=1, description=f"last: {o.spec.label}")
            if on_done is not None:
                on_done(index, o)

        return run_many(specs, workers=workers, on_done=done, order=order)


def plus_versus(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """PowerFlow+ against PowerFlow at equal energy, fitted and oracle (``compare.versus``)."""
    return {
        "powerflow+_vs_powerflow": versus(rows, "powerflow+"),
        "powerflow+_vs_powerflow_recurring": versus(rows, "powerflow+", priors=RECURRING),
        "powerflow+_vs_powerflow_oracle": versus(rows, "powerflow+", oracle=True),
        "powerflow+_vs_powerflow_window": versus(rows, "powerflow+", energy=WINDOW),
    }
