"""Windows of the whole ElasticFlow trace: the evaluation's and the tuning's.

The bundled default trace is one 24-hour window of the ElasticFlow traces
(Microsoft's ITP clusters, all ten merged): the jobs submitted from
2,473,200 s on. A result measured on one window, with knobs chosen while
looking at it, says little about the next day. So the whole trace
(``elasticflow-traces-all-clusters.tar.gz``: 69,351 jobs over 60 days) is cut
into named 24-hour windows, each starting at the same time of day as the
default one, in two disjoint sets:

- ``EVALUATION_WINDOWS``: the default window and three more days of other
  loads and cluster mixes, on which results are reported;
- ``TUNING_WINDOWS``: other days, on which a scheduler's knobs may be chosen;
  no tuning window overlaps an evaluation window (``tests/test_sim_windows.py``).

A window is written as a trace file in the bundled format (``job_id,
submit_time, num_gpu, duration, model_name, global_batch_size,
num_iteration, cluster``; ``submit_time`` from the window's start), so every
trace check applies to it; the default window written so equals the bundled
file row for row.
"""

from __future__ import annotations

import csv
import io
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from powerflow.core.errors import DataError
from powerflow.lab.sim.trace import bundled_trace

ALL_CLUSTERS = "elasticflow-traces-all-clusters.tar.gz"
DAY_S = 86_400
FIRST_START_S = 54_000
"""Every window starts at this time of day (15:00 of the trace's clock), as the
bundled one does (2,473,200 s is day 28 plus 54,000 s)."""
HEADER = (
    "job_id",
    "submit_time",
    "num_gpu",
    "duration",
    "model_name",
    "global_batch_size",
    "num_iteration",
    "cluster",
)


@dataclass(frozen=True)
class TraceWindow:
    """The jobs submitted in ``hours`` from day ``day`` of the whole trace (15:00)."""

    day: int
    hours: float = 24.0

    @property
    def name(self) -> str:
        return f"d{self.day:02d}"

    @property
    def start_s(self) -> int:
        return self.day * DAY_S + FIRST_START_S

    @property
    def end_s(self) -> float:
        return self.start_s + self.hours * 3600.0

    def overlaps(self, other: TraceWindow) -> bool:
        return self.start_s < other.end_s and other.start_s < self.end_s


DEFAULT_WINDOW = TraceWindow(28)
"""The bundled ``elasticflow-itp-24h-1901jobs.csv``: 1,901 jobs, 54,000 GPU-hours."""
EVALUATION_WINDOWS = (
    DEFAULT_WINDOW,
    TraceWindow(14),  # 1,567 jobs, 44,000 GPU-h, a third of them multi-GPU; clusters 04, 07
    TraceWindow(46),  # 2,168 jobs, 29,600 GPU-h; clusters 04, 09
    TraceWindow(37),  # 1,736 jobs, 18,200 GPU-h, a light day; clusters 02, 09
)
"""Where results are reported: different loads and cluster mixes (GPU-hours: each
job's GPUs times its duration in the original cluster)."""
TUNING_WINDOWS = (
    TraceWindow(5),  # 1,218 jobs, 38,900 GPU-h
    TraceWindow(10),  # 2,005 jobs, 17,900 GPU-h
    TraceWindow(20),  # 2,571 jobs, 27,800 GPU-h
    TraceWindow(34),  # 1,141 jobs, 60,400 GPU-h
)
"""Where knobs may be chosen; none overlaps an evaluation window."""
WINDOWS = {w.name: w for w in (*EVALUATION_WINDOWS, *TUNING_WINDOWS)}


def window_named(name: str) -> TraceWindow:
    """A named window, or a ``dNN`` day of the whole trace (``d00``..``d58``)."""
    if name in WINDOWS:
        return WINDOWS[name]
    day = name[1:] if name[:1] == "d" else ""
    if day.isdigit() and 0 <= int(day) <= 58:
        return TraceWindow(int(day))
    known = ", ".join(w.name for w in EVALUATION_WINDOWS)
    raise DataError(
        f"unknown trace window {name!r}: dNN for a day of the whole trace (d00-d58);"
        f" the evaluation's: {known}"
    )


def window_rows(window: TraceWindow, archive: Path | None = None) -> list[tuple[str, ...]]:
    """The window's jobs as rows of ``HEADER``, by submit time (then cluster, job id)."""
    path = archive or bundled_trace(ALL_CLUSTERS)
    rows: list[tuple[str, ...]] = []
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                name = Path(member.name).name
                if not (member.isfile() and name.startswith("cluster") and name.endswith(".csv")):
                    continue
                raw = tar.extractfile(member)
                if raw is None:
                    continue
                cluster = name.removesuffix(".csv")
                for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
                    submit = int(row["submission_time"])
                    if window.start_s <= submit < window.end_s:
                        rows.append(
                            (
                                row["job_id"],
                                str(submit - window.start_s),
                                row["num_gpu"],
                                row["duration"],
                                row["model_name"],
                                row["batch_size"],
                                row["num_iteration"],
                                cluster,
                            )
                        )
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise DataError(f"cannot read the whole trace {path}: {exc}") from exc
    if not rows:
        raise DataError(f"trace window {window.name}: no job is submitted in it")
    return sorted(rows, key=lambda r: (int(r[1]), r[7], r[0]))


def window_trace(window: TraceWindow, folder: Path | None = None) -> Path:
    """The window written as a trace file (made once per folder; by default the
    user's cache, ``$XDG_CACHE_HOME/powerflow/windows``), for ``TraceSpec.path``."""
    folder = folder or _cache()
    path = folder / f"elasticflow-{window.name}-{window.hours:g}h.csv"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(window_rows(window))
    # Written aside and renamed: runs in several processes may make it at once.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".part")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(buffer.getvalue())
    os.replace(tmp, path)
    return path


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "powerflow" / "windows"
