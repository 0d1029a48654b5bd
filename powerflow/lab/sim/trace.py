"""Job traces: load, validate and turn into the jobs the simulator replays.

Work is measured in iterations (the paper's termination condition). The ITP
trace carries ``num_iteration``; the Philly trace has only durations, so, as
the paper does for its Alibaba subset, each job gets a (model, global batch)
drawn at random (seeded) from the pool of measured settings and its iterations
are the duration times the ground-truth throughput at its requested GPU count.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.models.protocol import PerfModel

ITP_TRACE = "elasticflow-itp-24h-1901jobs.csv"
PHILLY_TRACE = "philly-24h-1903jobs.csv"

ITP_COLUMNS = ("job_id", "submit_time", "num_gpu", "model_name", "global_batch_size")
PHILLY_COLUMNS = ("job_id", "submit_time", "num_gpu", "duration")

TruthFn = Callable[[str], PerfModel]
"""Ground truth of one model name (``powerflow.lab.groundtruth.ground_truth``)."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace as the simulator replays it.

    ``duration_s`` is what the trace says the job took at ``num_gpu`` GPUs in
    its original cluster (``None`` for synthetic jobs); only used to check the
    ground truth, never to drive the simulation.
    """

    job_id: str
    submit_s: float
    num_gpu: int
    model_name: str
    global_batch_size: int
    iterations: float
    duration_s: float | None = None


def bundled_trace(name: str) -> Path:
    """Path of a trace shipped in ``powerflow/data/traces``."""
    ref = resources.files("powerflow") / "data" / "traces" / name
    return Path(str(ref))


Row = tuple[int, dict[str, str]]
"""A data row and its line in the file (1-based; the header is line 1)."""


def read_rows(path: Path) -> tuple[list[str], list[Row]]:
    """CSV header and rows with their line numbers, with a DataError for unreadable
    files and for a row whose field count differs from the header's.

    ``utf-8-sig`` reads a file saved with a byte-order mark (as spreadsheet tools
    write CSV) the same as one without: the mark is not part of the first column's
    name. Header names are stripped of surrounding blanks."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            rows: list[Row] = []
            for fields in reader:
                if not fields:  # a blank line
                    continue
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}:{reader.line_num}: {len(fields)} fields, the header has "
                        f"{len(header)}"
                    )
                rows.append((reader.line_num, dict(zip(header, fields, strict=True))))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"cannot read trace {path}: {exc}") from exc
    if not rows:
        raise DataError(f"trace {path} has no jobs")
    return header, rows


def _number(row: Mapping[str, str], col: str, line: int, path: Path) -> float:
    try:
        value = float(row[col])
    except (TypeError, ValueError):
        raise DataError(f"{path}:{line}: column {col!r} is not a number: {row[col]!r}") from None
    if not np.isfinite(value):
        raise DataError(f"{path}:{line}: column {col!r} is not finite")
    return value


def _whole(row: Mapping[str, str], col: str, line: int, path: Path) -> int:
    """A count (GPUs, a batch): a positive whole number, never silently truncated."""
    value = _number(row, col, line, path)
    if value < 1 or value != int(value):
        raise DataError(f"{path}:{line}: {col} must be a positive integer, got {row[col]!r}")
    return int(value)


def _require(header: Iterable[str], columns: Iterable[str], path: Path) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"trace {path} lacks column(s): {', '.join(missing)}")


def _submit(row: Mapping[str, str], line: int, path: Path) -> float:
    submit = _number(row, "submit_time", line, path)
    if submit < 0:
        raise DataError(f"{path}:{line}: negative submit time {submit}")
    return submit


Lined = list[tuple[int, TraceJob]]
"""Jobs with the line of the row each came from, in file order."""


def _parse_itp(path: Path, known_models: Iterable[str]) -> Lined:
    header, rows = read_rows(path)
    _require(header, (*ITP_COLUMNS, "num_iteration"), path)
    known = set(known_models)
    jobs = []
    for line, row in rows:
        submit = _submit(row, line, path)
        gpus = _whole(row, "num_gpu", line, path)
        model = row["model_name"].strip()
        if model not in known:
            raise DataError(f"{path}:{line}: unknown model {model!r}; known: {sorted(known)}")
        gbs = _whole(row, "global_batch_size", line, path)
        iters = _number(row, "num_iteration", line, path)
        if iters <= 0:
            raise DataError(
                f"{path}:{line}: num_iteration must be positive, got {row['num_iteration']!r}"
            )
        duration = _number(row, "duration", line, path) if "duration" in row else None
        if duration is not None and duration < 0:
            raise DataError(f"{path}:{line}: negative duration {duration}")
        jobs.append((line, TraceJob(row["job_id"], submit, gpus, model, gbs, iters, duration)))
    return jobs


def load_itp(
    path: Path, known_models: Iterable[str], *, max_gpus: int | None = None
) -> tuple[TraceJob, ...]:
    """An ITP-format trace (with models, batch sizes and iteration counts)."""
    jobs = _unique(path, _parse_itp(path, known_models))
    return _sorted(_admit(path, jobs, max_gpus=max_gpus))


def _parse_philly(
    path: Path,
    pool: Iterable[tuple[str, int]],
    truth: TruthFn,
    *,
    seed: int,
    gpus_per_node: int,
) -> Lined:
    header, rows = read_rows(path)
    _require(header, PHILLY_COLUMNS, path)
    choices = sorted(set(pool))
    if not choices:
        raise DataError("empty model pool")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(choices), size=len(rows))
    parsed = []
    for (line, row), pick in zip(rows, picks, strict=True):
        submit = _submit(row, line, path)
        gpus = _whole(row, "num_gpu", line, path)
        duration = _number(row, "duration", line, path)
        if duration <= 0:
            raise DataError(f"{path}:{line}: duration must be positive, got {duration}")
        model, gbs = choices[int(pick)]
        parsed.append((line, row["job_id"], submit, gpus, model, gbs, duration))
    steps = step_times([(m, n, gbs) for _, _, _, n, m, gbs, _ in parsed], truth, gpus_per_node)
    with np.errstate(over="ignore"):  # a duration of 1e308: infinite work, refused by _admit
        return [
            (line, TraceJob(job_id, submit, n, model, gbs, float(duration / step), duration))
            for (line, job_id, submit, n, model, gbs, duration), step in zip(
                parsed, steps, strict=True
            )
        ]


def load_philly(
    path: Path,
    pool: Iterable[tuple[str, int]],
    truth: TruthFn,
    *,
    seed: int,
    gpus_per_node: int,
    max_gpus: int | None = None,
) -> tuple[TraceJob, ...]:
    """A Philly-format trace; models and batches drawn from ``pool`` (seeded).

    Iterations = duration x ground-truth throughput at the requested GPU count,
    packed on as few nodes as possible, at the highest clock (how the trace's
    jobs ran).
    """
    jobs = _parse_philly(path, pool, truth, seed=seed, gpus_per_node=gpus_per_node)
    return _sorted(_admit(path, _unique(path, jobs), max_gpus=max_gpus))


def step_times(
    configs: list[tuple[str, int, int]], truth: TruthFn, gpus_per_node: int
) -> np.ndarray:
    """Full-clock step time of (model, GPUs, global batch), packed; one call per model."""
    out = np.empty(len(configs))
    for name in sorted({m for m, _, _ in configs}):
        idx = np.array([i for i, (m, _, _) in enumerate(configs) if m == name])
        n = np.array([configs[i][1] for i in idx], dtype=np.float64)
        gbs = np.array([configs[i][2] for i in idx], dtype=np.float64)
        bs = np.maximum(gbs / n, 1.0)
        out[idx] = truth(name).step_time_s(n, np.minimum(n, gpus_per_node), bs, _FMAX)
    return out


# Clock at which trace durations were measured (A100 default); the loaders
# take no GPU spec to keep this module free of cluster configuration.
_FMAX = 1410


def _admit(
    path: Path,
    jobs: Lined,
    *,
    max_gpus: int | None,
    horizon_s: float | None = None,
    truth: TruthFn | None = None,
    gpus_per_node: int = 1,
) -> Lined:
    """The jobs a cluster of ``max_gpus`` GPUs can run, each within ``horizon_s``
    (the simulator's; with ``truth``): a job that asks for more GPUs, or that alone
    on its requested GPUs at the top clock would end after the horizon (a submit
    time or a batch far out of range), is refused naming its row, before a run
    spends minutes and ends at the horizon."""
    for line, job in jobs:
        if max_gpus is not None and job.num_gpu > max_gpus:
            raise DataError(
                f"{path}:{line}: job asks for {job.num_gpu} GPUs, the cluster has {max_gpus}"
            )
    if horizon_s is None or truth is None or not jobs:
        return jobs
    with np.errstate(all="ignore"):  # a batch of 1e30 may overflow: then it is beyond
        steps = step_times(
            [(j.model_name, j.num_gpu, j.global_batch_size) for _, j in jobs], truth, gpus_per_node
        )
        runs = np.array([j.iterations for _, j in jobs]) * steps
        ends = np.array([j.submit_s for _, j in jobs]) + runs
    late = np.flatnonzero(~(ends <= horizon_s))
    if late.size:
        line, job = jobs[int(late[0])]
        day = 86400.0
        raise DataError(
            f"{path}:{line}: job {job.job_id} cannot finish within the simulated "
            f"{horizon_s / day:g} days: submitted at day {job.submit_s / day:.3g}, it runs "
            f"{runs[late[0]] / day:.3g} days alone on its {job.num_gpu} "
            "GPU(s) at the top clock"
        )
    return jobs


def _unique(path: Path, jobs: Lined) -> Lined:
    """Every job id once in the file (in or out of a window): the simulator keys on it."""
    first: dict[str, int] = {}
    for line, job in jobs:
        seen = first.setdefault(job.job_id, line)
        if seen != line:
            raise DataError(
                f"{path}:{line}: duplicate job id {job.job_id!r} (first on line {seen})"
            )
    return jobs


def _sorted(jobs: Lined) -> tuple[TraceJob, ...]:
    return tuple(sorted((j for _, j in jobs), key=lambda j: (j.submit_s, j.job_id)))


@dataclass(frozen=True)
class ReplayCluster:
    """What loading a trace needs of the cluster it is replayed on: jobs are packed on
    nodes of ``gpus_per_node`` GPUs (a Philly job's iterations, the horizon check),
    none may ask for more than ``max_gpus``, and each must end within ``horizon_s``
    alone on its GPUs (None: no such bound)."""

    gpus_per_node: int
    max_gpus: int | None = None
    horizon_s: float | None = None


def load_trace(
    path: Path,
    known_models: Iterable[str],
    pool: Iterable[tuple[str, int]],
    truth: TruthFn,
    *,
    seed: int,
    cluster: ReplayCluster,
    hours: float | None = None,
) -> tuple[TraceJob, ...]:
    """Any trace file: ITP format if it names models, else Philly format.

    Every row is checked; with ``hours`` only the jobs submitted in the first
    ``hours`` are returned, and only they must fit the ``cluster`` and end within
    its horizon: a job the run never sees cannot stop it."""
    if hours is not None and not hours > 0:
        raise DataError(f"the trace window must be a positive number of hours, got {hours:g}")
    header, _ = read_rows(path)
    if "model_name" in header:
        jobs = _parse_itp(path, known_models)
    else:
        jobs = _parse_philly(path, pool, truth, seed=seed, gpus_per_node=cluster.gpus_per_node)
    _unique(path, jobs)
    if hours is not None:
        jobs = [(line, j) for line, j in jobs if j.submit_s < hours * 3600.0]
        if not jobs:
            raise DataError(f"trace {path}: no job is submitted in the first {hours:g} h")
    admitted = _admit(
        path,
        jobs,
        max_gpus=cluster.max_gpus,
        horizon_s=cluster.horizon_s,
        truth=truth,
        gpus_per_node=cluster.gpus_per_node,
    )
    return _sorted(admitted)


@dataclass(frozen=True)
class DurationCheck:
    """How well the ground truth reproduces a trace's measured durations."""

    jobs: int
    mean_abs_rel_error: float
    median_abs_rel_error: float
    max_abs_rel_error: float


def check_durations(
    jobs: Iterable[TraceJob], truth: TruthFn, *, gpus_per_node: int, f_mhz: int = _FMAX
) -> DurationCheck:
    """Relative error of ``iterations x step time`` against the trace duration."""
    by_model: dict[str, list[TraceJob]] = {}
    for job in jobs:
        if job.duration_s is not None and job.duration_s > 0:
            by_model.setdefault(job.model_name, []).append(job)
    errors: list[float] = []
    for name, group in sorted(by_model.items()):
        n = np.array([j.num_gpu for j in group], dtype=np.float64)
        bs = np.maximum(np.array([j.global_batch_size for j in group]) / n, 1.0)
        step = truth(name).step_time_s(n, np.minimum(n, gpus_per_node), bs, f_mhz)
        work = np.array([j.iterations for j in group]) * step
        took = np.array([j.duration_s for j in group], dtype=np.float64)
        errors.extend(np.abs(work - took) / took)
    if not errors:
        raise DataError("no job with a duration to check")
    arr = np.asarray(errors)
    return DurationCheck(len(arr), float(arr.mean()), float(np.median(arr)), float(arr.max()))


def window(jobs: Iterable[TraceJob], hours: float) -> tuple[TraceJob, ...]:
    """The jobs submitted in the first ``hours`` of the trace."""
    return tuple(j for j in jobs if j.submit_s < hours * 3600.0)
