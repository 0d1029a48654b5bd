"""What one decision derives from its snapshot apart from the jobs' progress.

The field checks (``validate.py``), the tables (``tables.py``), the power
correction (``power_loop``: each job's factor, which rows would sweep) and
the heaps' tie-break ranks read every field of every job except its progress
(``PROGRESS``: remaining iterations, time and GPU-seconds held) and its clock
and power cap (``UNREAD``), and its model only as an object. Between two
events a job's other fields rarely change: over the whole default trace
(fitted PowerFlow at eta 0.6) 11 of 177 jobs per decision on average (19 with
the clock and cap), and the decisions with many jobs (up to 795) carry nearly
all the work. So the policy's memo (``memo.py``) keeps the last
call's ``StaticPart``:

* when every job's other fields equal the last call's, job for job in the
  same order, with the very same model objects on the same cluster, the
  part is handed out again as it is, and only the progress fields are checked
  (``check_progress``: the same rules, first failure and message as
  ``validate_jobs``);
* otherwise each job whose fields and model are those of the job of its id
  in the last call (``StaticPart.matches``) keeps what was derived for it
  alone: its checks (only progress is checked, for all jobs at once), its
  table rows and their stacked vectors, its correction factor and its sweep
  rows, all taken from the last part's arrays in one gather per array
  (``tables.row_moves``), and the GPUs it holds, which only the other jobs'
  are checked against (``kept_owners``); the other jobs are derived as without
  a memo.

Exact: every input of what is kept is in what is compared (all of ``Job``'s
fields but ``PROGRESS``, ``UNREAD`` and ``model``, read from the dataclass, so a
field added later is compared too; the model by identity; the cluster's GPU
type, node shape and names), what is kept is a pure function of those inputs and
the policy's options, which are fixed for one memo (``dataclasses.replace``
gives a copy with an empty one), and the arrays are copied value for value.
``tests/test_policy_memo.py`` plans sequences where only progress changes,
where fields change job by job and where jobs come and go, with one warm
policy, and compares every plan and error with a fresh policy's.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np

from powerflow.core.models.protocol import FloatArray, PerfModel
from powerflow.core.policy import validate
from powerflow.core.policy.curves import tie_ranks
from powerflow.core.policy.power_loop import Correction, job_scale, sweep_values
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.tables import IntArray, Tables, row_moves
from powerflow.core.policy.validate import Cluster, Owners

PROGRESS = frozenset({"remaining_iterations", "elapsed_s", "attained_gpu_s"})
"""The fields of a job that change at every event while it runs."""

UNREAD = frozenset({"frequency_mhz", "power_cap_w"})
"""Fields no part of a ``StaticPart`` reads: the clock a job runs now (the policy reads
it nowhere) and its power cap (read from the jobs at every call, where the caps are set:
``powerflow._Decision._place``). A plan that moves the caps moves them on many jobs at
once, and with them their clocks; compared, each such job would have its part derived
again."""

_FIELDS = (
    "id",
    *(f.name for f in dataclasses.fields(Job) if f.name not in {*PROGRESS, *UNREAD, "model", "id"}),
)
_fields_of = operator.attrgetter(*_FIELDS)
_model_of = operator.attrgetter("model")
_remaining_of = operator.attrgetter("remaining_iterations")
_elapsed_of = operator.attrgetter("elapsed_s")

_tie_key = operator.itemgetter(_FIELDS.index("arrival_s"), 0)
"""A job's (arrival, id) from its fields: the heaps' tie-break."""
_id_of = operator.itemgetter(0)
_arrival_of = operator.itemgetter(_FIELDS.index("arrival_s"))
_pinned_of = operator.itemgetter(_FIELDS.index("pinned"))
_placement_of = operator.itemgetter(_FIELDS.index("placement"))

Fields = tuple[object, ...]
"""A job's fields other than progress and model, its id first (``_FIELDS``)."""


@dataclass(frozen=True)
class StaticPart:
    """A decision's parts that depend on its jobs but not on their progress."""

    cluster: Cluster
    fields: list[Fields]
    models: list[PerfModel]
    clocks: tuple[int, ...]
    tables: Tables
    fix: Correction
    tie_rank: IntArray
    index: dict[str, int]
    """Each job's position by id."""
    scales: FloatArray
    """Per job, its power correction factor (``power_loop.job_scale``; 1 without
    correction)."""
    masks: FloatArray
    """Per table row, whether a run there would sweep (``power_loop.sweep_mask``)."""
    arrival_s: FloatArray
    """Per job, its arrival as float64."""
    pinned: list[int]
    """The pinned jobs' positions."""
    held: IntArray
    """Per job, the GPUs it holds."""
    owners: Owners | None
    """Each GPU held and its job's id (``validate.validate_jobs``; None: not known).
    Never changed: a later call changes a copy (``kept_owners``)."""

    def same_jobs(self, fields: list[Fields], models: list[PerfModel]) -> bool:
        """Whether jobs with these fields and models have exactly these parts (on the
        same cluster: the caller checks)."""
        return (
            self.fields == fields
            and len(self.models) == len(models)
            and all(map(operator.is_, self.models, models))
        )

    def matches(self, fields: list[Fields], models: list[PerfModel]) -> IntArray:
        """Per job, the position of the job of its id here when its fields and model
        are those it had here (what was derived for it alone holds), else -1."""
        get = self.index.get
        mine, theirs = self.fields, self.models
        out = [
            p
            if (p := get(cast(str, f[0]), -1)) >= 0 and theirs[p] is model and mine[p] == f
            else -1
            for f, model in zip(fields, models, strict=True)
        ]
        return np.asarray(out, dtype=np.int64).reshape(len(out))


def static_inputs(jobs: Sequence[Job]) -> tuple[list[Fields], list[PerfModel]]:
    """What ``StaticPart`` compares: per job its fields, and its model."""
    return list(map(_fields_of, jobs)), list(map(_model_of, jobs))


def check_progress(jobs: Sequence[Job]) -> None:
    """``validate_jobs``' rules on the progress fields, for jobs whose other fields
    passed them before: the same first failure and message."""
    isfinite = math.isfinite
    remaining = list(map(_remaining_of, jobs))
    if (
        all(map(isfinite, remaining))
        and min(remaining, default=0.0) >= 0
        and all(map(isfinite, map(_elapsed_of, jobs)))
    ):
        return
    for job in jobs:
        validate.check_progress(job)


class Checked(NamedTuple):
    """What a call finds before its part: each job's position by id (``index_of``) and
    each GPU held and its owner (``validate.validate_jobs``)."""

    positions: dict[str, int]
    owners: Owners | None


def kept_owners(last: StaticPart, index: IntArray) -> Owners | None:
    """The GPUs the jobs with an ``index`` (>= 0: unchanged since ``last``) hold, by
    owner: ``last``'s, less those of its jobs that are gone or changed (a copy).

    What ``validate_jobs`` checks the changed jobs' GPUs against, instead of all
    GPUs held: about 11 changed jobs a decision against 177 (a fitted run).
    """
    if last.owners is None:
        return None
    owners = last.owners.copy()
    left = np.ones(len(last.fields), dtype=bool)
    left[index[index >= 0]] = False
    fields = last.fields
    for p in np.flatnonzero(left).tolist():
        for slot in _placement_of(fields[p]):
            del owners[slot]
    return owners


@dataclass(frozen=True, eq=False)
class Carried:
    """The last call's part and, per job now, its position there (-1: new or changed;
    ``StaticPart.matches``)."""

    part: StaticPart
    index: IntArray


def static_part(
    jobs: Sequence[Job],
    cluster: Cluster,
    inputs: tuple[list[Fields], list[PerfModel]],
    clocks: Sequence[int],
    tables: Tables,
    carried: Carried | None,
    correct: bool,
    checked: Checked,
) -> StaticPart:
    """The part of ``jobs`` on ``cluster`` (``inputs``: their ``static_inputs``;
    ``checked``: what the call found before) from their ``tables``; a job with an index
    (>= 0) in ``carried`` takes its correction factor and sweep rows from the last
    part, the others are derived."""
    fields, models = inputs
    count = len(jobs)
    entries = tables.job_rows
    start = tables.start.tolist()
    sizes = tables.sizes.tolist()
    scales = np.ones(count)
    masks = np.empty(len(tables.row_job))
    fresh: Sequence[int] = range(count)
    if carried is not None:
        last, index = carried.part, carried.index
        hit = index >= 0
        scales[hit] = last.scales[index[hit]]
        moved = tables.moved
        if moved is None:
            moved = row_moves(tables.start, tables.sizes, last.tables.start, index)
        masks[moved[0]] = last.masks[moved[1]]
        fresh = np.flatnonzero(~hit).tolist()
    column = {c: k for k, c in enumerate(clocks)}.get
    gpn = cluster.gpus_per_node
    swept: list[int] = []
    sweeps: list[float] = []
    for j in fresh:
        job, rows = jobs[j], entries[j]
        if correct:
            scales[j] = job_scale(job, rows, gpn, column)
        swept.extend(range(start[j], start[j] + sizes[j]))
        sweeps.extend(sweep_values(job, rows))
    masks[swept] = sweeps
    row_scale = scales[tables.row_job]
    fix = Correction(row_scale=row_scale, peak_w=tables.peak_w * masks * row_scale)
    arrival = np.fromiter(map(_arrival_of, fields), dtype=np.float64, count=count)
    tie = _tie_ranks(fields, arrival)
    pinned = [k for k, on in enumerate(map(_pinned_of, fields)) if on]
    held = np.fromiter(map(len, map(_placement_of, fields)), dtype=np.int64, count=count)
    return StaticPart(
        cluster,
        fields,
        models,
        tuple(clocks),
        tables,
        fix,
        tie,
        checked.positions,
        scales,
        masks,
        arrival,
        pinned,
        held,
        checked.owners,
    )


def _tie_ranks(fields: list[Fields], arrival: FloatArray) -> IntArray:
    """``curves.tie_ranks`` of the jobs' (arrival, id) (``arrival``: as float64), from
    the arrivals where they are increasing: then the ranks are the positions, and
    only the pairs of equal arrivals need their keys compared: 12 µs against 25 µs a
    decision over the 2,314 snapshots of a fitted run (177 jobs on average, 28 pairs
    of equal arrivals; ``time.process_time`` around each, 3 runs). Exact:
    float64 conversion keeps the order of numbers, so a later arrival as float64 is a
    later arrival; equal ones take the tuples' own comparison."""
    later = arrival[1:] > arrival[:-1]
    if not later.all():
        ties = np.flatnonzero(~later).tolist()
        key = _tie_key
        if not all(key(fields[i]) < key(fields[i + 1]) for i in ties):
            return tie_ranks(list(map(_tie_key, fields)))
    return np.arange(len(fields), dtype=np.int64)


def index_of(fields: list[Fields]) -> dict[str, int]:
    """Each job's position by id (fewer entries than jobs: an id repeats)."""
    return dict(zip(map(_id_of, fields), range(len(fields)), strict=True))
