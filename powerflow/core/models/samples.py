"""Measured (or simulated) profile samples: what a profiler sees.

One row per measurement: a configuration ``(n, r, bs, f)`` and the observed
step time and energy per iteration (summed over the job's ``n`` GPUs). Both the
ground truth's measurement API and ``powerflow fit --samples`` produce this,
and every fitting routine consumes it.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import FloatArray


@dataclass(frozen=True)
class Samples:
    """Columns of equal length; ``r`` is GPUs used per node."""

    n: FloatArray
    r: FloatArray
    bs: FloatArray
    f: FloatArray
    step_time_s: FloatArray
    energy_j: FloatArray

    def __post_init__(self) -> None:
        cols = (self.n, self.r, self.bs, self.f, self.step_time_s, self.energy_j)
        if len({len(c) for c in cols}) != 1:
            raise DataError("sample columns differ in length")
        # One array, two checks: the simulator builds tens of thousands of
        # one-row samples a run, where a check per column cost more than the rest.
        values = np.array(cols, dtype=np.float64)
        if not np.isfinite(values).all():
            raise DataError("samples contain NaN or infinite values")
        if not (values > 0).all():
            raise DataError("samples must be positive")
        if np.any(self.r > self.n):
            raise DataError("GPUs per node cannot exceed the GPUs of the job")

    def __len__(self) -> int:
        return len(self.n)

    @functools.cached_property
    def configurations(self) -> FloatArray:
        """Rows ``n, r, bs, f`` as one C-contiguous float64 array (4, len):
        what the compiled fits and predictions take, built once per samples
        (``cached_property`` writes the instance's ``__dict__``, which a
        frozen dataclass allows)."""
        return np.array((self.n, self.r, self.bs, self.f), dtype=np.float64)

    @classmethod
    def _trusted(cls, *cols: FloatArray) -> Samples:
        """Rows already validated (a subset or union of valid samples):
        the simulator slices and joins samples thousands of times per run,
        and re-checking them cost as much as fitting them."""
        out = object.__new__(cls)
        for name, col in zip(_FIELDS, cols, strict=True):
            object.__setattr__(out, name, col)
        return out

    def take(self, index: FloatArray | np.ndarray | slice) -> Samples:
        """A subset of the rows (boolean mask, index array or slice)."""
        cols = tuple(getattr(self, name)[index] for name in _FIELDS)
        if np.ndim(cols[0]) != 1:  # a scalar or 2-D index: not rows
            raise DataError("take needs a 1-D index (mask, indices or slice)")
        return Samples._trusted(*cols)

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        return Samples._trusted(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in _FIELDS)
        )


_FIELDS = ("n", "r", "bs", "f", "step_time_s", "energy_j")


CSV_COLUMNS: tuple[str, ...] = (
    "n",
    "gpus_per_node",
    "local_batch_size",
    "frequency_mhz",
    "step_time_s",
    "energy_j",
)
"""Columns of a samples CSV, in ``Samples`` field order (extra columns are ignored)."""


def read_samples_csv(path: Path, *, min_rows: int = 1, gpu: GpuSpec | None = None) -> Samples:
    """Load measured samples, refusing anything a fit would silently misread.

    Every problem is one ``DataError`` naming the file and, where there is
    one, the row (its line in the file, the header being line 1) and the
    column. A byte-order mark (``utf-8-sig``, as spreadsheet tools write CSV)
    is not part of the first column's name. GPU counts are whole numbers; with
    ``gpu``, clocks are within its range; and what the fits derive from a row
    (global batch, GPU-seconds, power per GPU) must be finite too: a row of
    finite values such as ``1e308`` can still overflow them.
    """
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in CSV_COLUMNS if c not in header]
            if missing:
                raise DataError(f"{path}: missing column(s) {', '.join(missing)}")
            rows: list[tuple[int, dict[str, str]]] = []
            for fields in reader:
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}: row {reader.line_num}: {len(fields)} fields, "
                        f"the header has {len(header)}"
                    )
                rows.append((reader.line_num, dict(zip(header, fields, strict=True))))
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a CSV file ({exc})") from exc
    if len(rows) < min_rows:
        raise DataError(f"{path}: {len(rows)} sample row(s); at least {min_rows} are needed")
    values = np.empty((len(rows), len(CSV_COLUMNS)), dtype=np.float64)
    for i, (line, row) in enumerate(rows):
        for j, col in enumerate(CSV_COLUMNS):
            values[i, j] = _cell(path, line, col, row[col].strip(), whole=j < 2)
    lines = np.array([line for line, _ in rows])
    bad = np.flatnonzero(values[:, 1] > values[:, 0])
    if bad.size:
        raise DataError(
            f"{path}: row {lines[bad[0]]}: gpus_per_node {values[bad[0], 1]:g} exceeds "
            f"n {values[bad[0], 0]:g} (the GPUs of the job)"
        )
    if gpu is not None:
        lo, hi = gpu.clocks_mhz[0], gpu.clocks_mhz[-1]
        bad = np.flatnonzero((values[:, 3] < lo) | (values[:, 3] > hi))
        if bad.size:
            raise DataError(
                f"{path}: row {lines[bad[0]]}, column frequency_mhz: {values[bad[0], 3]:g} "
                f"is outside the {gpu.name}'s clocks ({lo}-{hi} MHz)"
            )
    n, bs, step, energy = values[:, 0], values[:, 2], values[:, 4], values[:, 5]
    with np.errstate(all="ignore"):  # what the fits compute from a row
        derived = {
            "n x local_batch_size (the global batch)": n * bs,
            "n x step_time_s (GPU-seconds per iteration)": n * step,
            "energy_j / (n x step_time_s) (power per GPU)": energy / (n * step),
        }
    for name, column in derived.items():
        bad = np.flatnonzero(~(np.isfinite(column) & (column > 0)))
        if bad.size:
            raise DataError(
                f"{path}: row {lines[bad[0]]}: {name} is not a positive finite number: "
                "a value far out of range"
            )
    return Samples(*(values[:, j].copy() for j in range(len(CSV_COLUMNS))))


def _cell(path: Path, line: int, col: str, cell: str, *, whole: bool) -> float:
    try:
        v = float(cell)
    except ValueError:
        raise DataError(f"{path}: row {line}, column {col}: {cell!r} is not a number") from None
    if not np.isfinite(v) or v <= 0:
        raise DataError(
            f"{path}: row {line}, column {col}: {cell!r} must be a positive finite number"
        )
    if whole and v != int(v):
        raise DataError(f"{path}: row {line}, column {col}: {cell!r} must be a whole number")
    return v


def write_samples_csv(samples: Samples, path: Path) -> None:
    """The inverse of ``read_samples_csv`` (for tools and tests)."""
    cols = (samples.n, samples.r, samples.bs, samples.f, samples.step_time_s, samples.energy_j)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for row in zip(*cols, strict=True):
            writer.writerow([repr(float(v)) for v in row])
