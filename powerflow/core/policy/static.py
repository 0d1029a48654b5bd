"""What one decision derives from its snapshot apart from the jobs' progress.

The field checks (``validate.py``), the tables (``tables.py``), the power
correction (``power_loop.correction``) and the heaps' tie-break ranks read
every field of every job except its progress (``PROGRESS``: remaining
iterations, time and GPU-seconds held), and its model only as an object.
Between two events a job's other fields rarely change (the whole default
trace, fitted PowerFlow at eta 0.6: 19 of 177 jobs per decision on average,
none at all at 831 of its 2,314 decisions). So the policy's memo
(``memo.py``) keeps the last call's ``StaticPart``:

* when every job's other fields equal the last call's, job for job in the
  same order, with the very same model objects on the same cluster, the
  part is handed out again as it is, and only the progress fields are checked
  (``check_progress``: the same rules, first failure and message as
  ``validate_jobs``);
* otherwise each job whose fields and model are those of a job of that id in
  the last call (``JobFacts``) keeps what was derived for it alone: its field
  checks (only progress is checked), its table rows, its power correction
  factor and which of its rows would sweep the clocks; the rest is derived
  anew, and the stacked tables and the correction are built from both.

Exact: every input of what is kept is in what is compared (all of ``Job``'s
fields but ``PROGRESS`` and ``model``, read from the dataclass, so a field
added later is compared too; the model by identity; the cluster's GPU type,
node shape and names), and what is kept is a pure function of those inputs
and the policy's options, which are fixed for one memo
(``dataclasses.replace`` gives a copy with an empty one).
``tests/test_policy_memo.py`` plans sequences where only progress changes and
where fields change job by job, with one warm policy, and compares every plan
with a fresh policy's.
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
from powerflow.core.policy.power_loop import Correction, correction, job_scale, sweep_mask
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.tables import IntArray, JobRows, Tables
from powerflow.core.policy.validate import Cluster

PROGRESS = frozenset({"remaining_iterations", "elapsed_s", "attained_gpu_s"})
"""The fields of a job that change at every event while it runs."""

_FIELDS = (
    "id",
    *(f.name for f in dataclasses.fields(Job) if f.name not in {*PROGRESS, "model", "id"}),
)
_fields_of = operator.attrgetter(*_FIELDS)
_model_of = operator.attrgetter("model")
_remaining_of = operator.attrgetter("remaining_iterations")
_elapsed_of = operator.attrgetter("elapsed_s")

Fields = tuple[object, ...]
"""A job's fields other than progress and model, its id first (``_FIELDS``)."""


class JobFacts(NamedTuple):
    """What one decision derived for one job from its ``fields`` and ``model``.

    A named tuple rather than a frozen dataclass: one is built for every job
    whose fields changed, at every decision, and a tuple is built several
    times faster.
    """

    fields: Fields
    model: PerfModel
    rows: JobRows
    scale: float
    """Its power correction factor (``power_loop.job_scale``; 1 without correction)."""
    mask: FloatArray
    """Per row of it, whether a run there would sweep (``power_loop.sweep_mask``)."""


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
    facts: dict[str, JobFacts]
    """Per job id, what was derived for it alone."""

    def same_jobs(self, fields: list[Fields], models: list[PerfModel]) -> bool:
        """Whether jobs with these fields and models have exactly these parts (on the
        same cluster: the caller checks)."""
        return (
            self.fields == fields
            and len(self.models) == len(models)
            and all(map(operator.is_, self.models, models))
        )

    def known(self, fields: list[Fields], models: list[PerfModel]) -> list[JobFacts | None]:
        """Per job, its facts where its fields and model are those they came from."""
        get = self.facts.get
        out: list[JobFacts | None] = []
        for f, model in zip(fields, models, strict=True):
            facts = get(cast(str, f[0]))
            out.append(
                facts if facts is not None and facts.model is model and facts.fields == f else None
            )
        return out


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


def static_part(
    jobs: Sequence[Job],
    cluster: Cluster,
    inputs: tuple[list[Fields], list[PerfModel]],
    clocks: Sequence[int],
    tables: Tables,
    known: Sequence[JobFacts | None],
    correct: bool,
) -> StaticPart:
    """The part of ``jobs`` on ``cluster`` (``inputs``: their ``static_inputs``), from
    their ``tables`` and, where ``known``, what was derived for a job before."""
    fields, models = inputs
    entries = tables.job_rows
    column = {c: k for k, c in enumerate(clocks)}.get
    gpn = cluster.gpus_per_node
    facts: dict[str, JobFacts] = {}
    scales: list[float] = []
    masks: list[FloatArray] = []
    for j, (job, kept) in enumerate(zip(jobs, known, strict=True)):
        if kept is None:
            rows = entries[j]
            scale = job_scale(job, rows, gpn, column) if correct else 1.0
            kept = JobFacts(fields[j], models[j], rows, scale, sweep_mask(job, rows))
        facts[job.id] = kept
        scales.append(kept.scale)
        masks.append(kept.mask)
    scale_of = np.asarray(scales, dtype=np.float64).reshape(len(jobs))
    fix = correction(tables, jobs, gpn, clocks, correct, scale_of, masks)
    tie = tie_ranks([(j.arrival_s, j.id) for j in jobs])
    return StaticPart(cluster, fields, models, tuple(clocks), tables, fix, tie, facts)
