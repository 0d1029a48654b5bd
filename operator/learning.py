"""The operator's online refit: samples from the node agents in, each job's fitted model out.

``SampleStore`` is the sink the ingest endpoint hands validated samples to
(``add``), the model factory the allocation pass asks (``model``), and the
source of the ``status.model`` fields the pass writes (``status_fields``).

Rows. One ``telemetry.WindowSample`` (one window of one job on one node)
becomes one row of ``models.samples.Samples``: ``n``, ``r`` = the job's GPUs
per node, ``bs`` = local batch, ``f`` = the clock locked over the window,
the step time, and the energy per iteration scaled from the node's
``gpus_measured`` GPUs to the job's ``n``: ``energy_j * n / gpus_measured``.
The models' energy is per iteration of the whole job (all ``n`` GPUs), and
data-parallel workers are symmetric (same step, same batch, same clock), so
one node's share times ``n / gpus_measured`` estimates the whole; summing
the nodes' windows instead would need windows that start and end together on
every node, which independent agents never give. Each node's window is thus
its own row of the job's samples (aggregated across nodes by the job's key).

Keys. Samples name their job by namespace and name (the agent reads them off
the pod), not by UID, so the store keys jobs by ``namespace/name`` and
remembers the UID it saw in the pass: a DLJob deleted and re-created under
the same name is a new job whose samples and model start afresh. Samples for
a job the last pass did not see (deleted, never existed, or beyond
``max_jobs``) are dropped and counted, never stored.

Bounds. A job keeps at most ``max_rows`` rows: when more arrive, every other
row is dropped (old and new alike, so the profile's clocks stay covered and
older evidence weighs less), and what the learner counted as fitted is
thinned the same way, so its "doubled samples" rule refits again after
another ``max_rows / 2`` rows. Between two passes a job queues at most
``max_pending`` rows and all jobs together ``max_queued``; more are dropped
and counted. In total the store holds at most ``max_jobs * max_rows`` rows
(48 bytes each: 98 MB at the defaults, were 2,000 jobs each past a thousand
windows) plus ``max_queued`` queued ones (about 15 MB).

Refit. The core's learner (``powerflow.core.learning.FittedLearner``), which the
simulator uses too:
the first ``MIN_SAMPLES`` rows fit the job's prior (``initial``), later rows
refit warm-started (``update``) only when a placement is new or has doubled
its rows, and not when the model already predicts the new rows within their
noise. A job starts from the prior of its ``model`` hint
(``models.priors.load_prior``), or, after an operator restart, from the
parameters the previous operator wrote in ``status.model.params``; bad
parameters there (edited by hand) fall back to the prior with a Warning
(``Note``) and are removed from status.

GPU type. Models are of the type the pass plans the main pool as (``refresh``'s
``gpu``), and, where several pools are planned, of each other pool's type
(``refresh``'s ``others``, ``model_on``): a window is of the type of the node that
sent it, fitted apart (``_Entry.others``; in ``status.model.otherGpuTypes``, below).
The prior carried over to it (``prior_on``: the shipped priors are
the A100's, and the clock enters the step time in absolute MHz), refits with
``FittedLearner`` on it. Knowledge of another type, fitted before the pool
changed or restored from status, restarts from the prior on the pool's type
with a ``ModelGpuChanged`` Warning, its params removed from status; when the
pool's type changes every job's rows go, as their clocks mean another board,
unless the job has knowledge of the new type from its other pool: then the two
types' knowledge trade places (``_swap``), no Warning; the same at a restart
whose main pool is of the type of one of the fits in ``otherGpuTypes``.
Until a pass names a type (no pool yet) restored params are kept unjudged;
those of a type the catalogue lacks (one the agents' reports gave) have no spec
to predict with until then, so they are held as status has them (written back
unchanged, neither predicted with nor refitted; the job plans on its prior) and
taken on the pool's type once it is told, if they are of it. A
pool of unknown type (``gpus.tunes`` false: a label the catalogue lacks and no
agent's report or record of it yet, as after a restart whose records are gone)
names none: the type last named stays and every job keeps what it knows. Its
placeholder plans one clock and writes none, so its GPUs run at clocks no plan
chose: no job is fitted meanwhile, and their rows serve the measured power
only.

Threads. ``add`` only queues rows under a lock (microseconds; the ingest
calls it on its event loop). ``refresh`` does the rest (sync with the pass's
DLJobs, thin, fit) and runs in a worker thread of the pass (the compiled
fitting kernels release the GIL); one refit costs 0.6-4 ms (40-1,000 rows,
``python -m benchmarks refit``), and a pass spends at most
``refit_budget_s`` on fits (the rest wait for the next pass). The very first
fit of a process with a cold numba cache compiles the kernels (seconds, once).

``status.model`` (written by ``reconcile`` in the job's one status patch):
``prior`` (the prior's name), ``samples`` (windows received, over restarts),
``params`` (the fitted ``ModelParams.to_dict()``, absent until a fit),
``fits`` (refits so far), ``fitErrorPercent``: the fitted model's mean
absolute percentage error on the rows it holds, the larger of step time's and
energy's, so one number says how far either prediction is off (it includes
the samples' own noise, a few percent), and ``measuredPower``: the job's power
over its latest windows and the configuration it was measured at
(``measured_power``). A restarted operator reads ``measuredPower`` back, so its
first passes correct the job's predicted power (``policy.power_loop``) as the
previous operator did instead of planning uncorrected until new windows
arrive; windows that arrive replace it. ``otherGpuTypes``: the fit on each
other type, ``{"gpu", "params", "fits"}`` by type name, written at once when one
changes (``reconcile._learned_model``). A restarted operator holds each entry
(``_Fit.held``) and takes it as that type's knowledge, with no refit, at the first
pass that plans the type, so its first plan is the previous operator's; a type not
planned keeps its entry as status has it. Read as untrusted
(``_restored_others``): at most ``MAX_TYPES`` entries, of types the catalogue has or
a planned pool is of, each once, with params of that type; the rest is dropped with
one ``InvalidModelParams`` Warning.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from powerflow.operator.bodies import DLJobBody
from powerflow.operator.jobs import JobRequest
from prometheus_client import CollectorRegistry, Counter, Histogram

from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import GPU_SPECS, GpuSpec, gpu_spec, tunes
from powerflow.core.learning import FittedLearner, Knowledge, placement_counts
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.fitting import MIN_SAMPLES
from powerflow.core.models.metrics import mape
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import GENERIC, load_prior, prior_on
from powerflow.core.models.samples import Samples
from powerflow.core.telemetry import WindowSample

log = logging.getLogger(__name__)

MAX_ROWS = 1024
"""Rows a job keeps (a 240 s profile on 8 nodes is about 400 windows)."""
MAX_PENDING = 1024
"""Rows a job may queue between two passes (64 nodes at a 5 s window for a minute: 768)."""
MAX_QUEUED = 65536
"""Rows all jobs together may queue between two passes (a Python tuple each, ~230 bytes)."""
MAX_JOBS = 2000
REFIT_BUDGET_S = 2.0
"""Most seconds of fitting one pass spends; jobs left over fit at the next pass."""

Row = tuple[float, float, float, float, float, float]
"""``n, r, bs, f, step_time_s, energy_j`` (whole job, per iteration)."""


DROP_REASONS = ("unknown_job", "invalid", "backlog")
"""Every reason ``powerflow_model_samples_dropped_total`` counts (``add``)."""
MEASURED_ROWS = 20
"""Windows averaged into a job's measured power (``SampleStore.measured_power``)."""
OTHER_TYPES = "otherGpuTypes"
"""The ``status.model`` field of a job's fits on the other planned pools' types."""
MAX_TYPES = 16
"""Entries of ``status.model.otherGpuTypes`` read back (the CRD's ``maxItems``; the
catalogue has 14 types, and a planned pool of another type is one of them or one the
agents reported)."""


@dataclass(frozen=True)
class MeasuredPower:
    """A job's power as its latest windows measured it: all ``n`` GPUs together, at
    ``gpus_per_node`` per node, local batch ``local_batch_size`` and clock ``frequency_mhz``
    (the clock the GPUs ran, which a power cap may hold below the planned one)."""

    n: int
    gpus_per_node: int
    local_batch_size: int
    frequency_mhz: int
    watts: float


@dataclass(frozen=True)
class Note:
    """A Warning for the controller to post on a DLJob (and log)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str


def model_row(sample: WindowSample) -> Row | None:
    """The model row of one window (module docstring), None when it cannot be one.

    ``telemetry.parse_batch`` already refuses such samples; the store checks
    again because a sink must not trust its caller with its memory.
    """
    n, measured = sample.n, sample.gpus_measured
    if not 0 < sample.gpus_per_node <= n or not 0 < measured <= n:
        return None
    row = (
        float(n),
        float(sample.gpus_per_node),
        float(sample.local_batch_size),
        float(sample.frequency_mhz),
        float(sample.step_time_s),
        float(sample.energy_j) * n / measured,
    )
    if not all(math.isfinite(x) and x > 0 for x in row):
        return None
    return row


def _samples(rows: np.ndarray) -> Samples:
    return Samples(*(np.ascontiguousarray(rows[:, j]) for j in range(6)))


def thin(rows: np.ndarray, known: Knowledge, max_rows: int) -> tuple[np.ndarray, Knowledge]:
    """Halve ``rows`` (every other one) until at most ``max_rows`` remain.

    The learner's ``seen`` counts the rows it was fitted on, which come first
    (``FittedLearner.update`` relies on that order); it is recounted on the
    kept part of that prefix, so "doubled" means doubled since the thinning.
    """
    while len(rows) > max_rows:
        fitted = sum(c for *_, c in known.seen)
        rows = rows[::2]
        kept = (fitted + 1) // 2  # the even indices below ``fitted``
        seen = placement_counts(_samples(rows[:kept])) if kept else ()
        known = replace(known, seen=seen)
    return rows, known


def fit_error_percent(model: FittedModel, rows: np.ndarray) -> float:
    """``status.model.fitErrorPercent`` of ``model`` on ``rows`` (module docstring)."""
    t, e = model.predict_columns(*(np.ascontiguousarray(rows[:, j]) for j in range(4)))
    worst = max(mape(t, rows[:, 4]), mape(e, rows[:, 5]))
    return round(100.0 * worst, 2)


def _count(value: Any) -> int:
    """A non-negative count written by someone else; 0 for anything else."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53
    return int(value) if ok else 0


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _percent(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


class _Entry:
    """One job: its samples and what the learner knows."""

    __slots__ = (
        "bad_params",
        "error_percent",
        "fresh",
        "held",
        "key",
        "knowledge",
        "last_try",
        "latest",
        "model_name",
        "others",
        "others_written",
        "pending",
        "received",
        "restored_power",
        "rows",
        "uid",
    )

    def __init__(self, key: str, uid: str, model_name: str | None, knowledge: Knowledge) -> None:
        self.key = key
        self.uid = uid
        self.model_name = model_name
        self.knowledge = knowledge
        self.rows = np.empty((0, 6))
        self.pending: list[Row] = []
        self.received = 0
        self.error_percent: float | None = None
        self.bad_params = False
        self.restored_power: MeasuredPower | None = None
        """What ``status.model.measuredPower`` said at a restart, until windows arrive."""
        self.fresh = False
        """Rows arrived that the learner has not been shown yet."""
        self.last_try = -1
        self.held: tuple[ModelParams, int] | None = None
        """Params (and fits) restored from status, of a type the catalogue lacks, before a
        pool type was told: kept as they are, unjudged and unused, until one is
        (``SampleStore._check_type``)."""
        self.others: dict[str, _Fit] = {}
        """What the job learnt on each GPU type of the other planned pools, by type name
        (``SampleStore.model_on``); the fields above are the main pool's type's."""
        self.latest: str | None = None
        """The type of the job's latest window when another pool's (None: the main
        pool's): its measured power is that type's (``_measured``)."""
        self.others_written = False
        """``status.model.otherGpuTypes`` is (or may be) in status: an empty list is
        written as its removal (``status_fields``)."""


class _Fit:
    """One job's samples and knowledge on a GPU type of another planned pool than the
    main one (``_Entry.others``)."""

    __slots__ = ("fresh", "held", "knowledge", "pending", "rows")

    def __init__(self, held: tuple[ModelParams, int] | None = None) -> None:
        self.rows = np.empty((0, 6))
        self.pending: list[Row] = []
        self.fresh = False
        self.knowledge: Knowledge | None = None
        """None until a pass plans the type (``SampleStore.refresh``)."""
        self.held = held
        """Params (and fits) of this type restored from ``status.model.otherGpuTypes``,
        until a pass plans the type: then they are its knowledge, with no refit
        (``take_held``); written back as they are meanwhile."""

    def take_held(self, spec: GpuSpec) -> None:
        """The held params as the knowledge on ``spec`` (their type, planned now)."""
        if self.held is None or self.knowledge is not None:
            return
        params, fits = self.held
        self.held = None
        self.knowledge = Knowledge(FittedModel.on(params, spec), params, fits=fits)


class SampleStore:
    """Samples per job, refitted models, and their ``status.model`` fields.

    Satisfies the ingest's ``SampleSink`` (``add``); ``model`` is a
    ``pass_snapshot.ModelFactory``. See the module docstring for the rules.
    """

    def __init__(
        self,
        *,
        prior: Callable[[str | None], ModelParams] = load_prior,
        max_rows: int = MAX_ROWS,
        max_pending: int = MAX_PENDING,
        max_queued: int = MAX_QUEUED,
        max_jobs: int = MAX_JOBS,
        refit_budget_s: float = REFIT_BUDGET_S,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if max_rows < 2 * MIN_SAMPLES or min(max_pending, max_queued, max_jobs) < 1:
            raise ValueError(
                f"need max_rows >= {2 * MIN_SAMPLES}, max_pending, max_queued and max_jobs >= 1"
            )
        self._prior = prior
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.max_queued = max_queued
        self._queued = 0
        """Rows queued by all jobs since the last ``refresh``."""
        self.max_jobs = max_jobs
        self.refit_budget_s = refit_budget_s
        self._jobs: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        """Guards ``_jobs`` membership and each entry's ``pending`` (``add`` vs ``refresh``)."""
        self._refreshing = threading.Lock()
        """One ``refresh`` at a time: only it touches rows and knowledge."""
        self._learners: dict[GpuSpec, FittedLearner] = {}
        self._pool: GpuSpec | None = None
        """The type the main pool was last planned as (``refresh``); None until told. A
        pool of unknown type tells none: the last told stays (``_untuned``)."""
        self._untuned = False
        """Whether this pass plans a pool of unknown type (no fits: its GPUs run at
        their defaults)."""
        self._others: dict[str, GpuSpec] = {}
        """The types of the other planned pools by name (``refresh``'s ``others``)."""
        self._node_types: dict[str, str] = {}
        """Their nodes' types: a window from one of these nodes is of that type (``add``)."""
        self._priors_on: dict[tuple[str | None, GpuSpec], FittedModel] = {}
        """Each hint's prior on each of those types (``_prior_on``)."""
        self._priors: dict[str | None, FittedModel] = {}
        """Each hint's prior on the models' type: one object each (the policy memoises
        per model object); emptied, as ``_learners``, when the pool's spec changes."""
        self._passes = 0
        registry = registry if registry is not None else CollectorRegistry()
        self.dropped = Counter(
            "powerflow_model_samples_dropped_total",
            "Samples the online refit did not keep, by reason: unknown_job (no such "
            "DLJob in the last pass, or more than the store tracks), invalid, backlog "
            "(the job's, or all jobs', queue between two passes was full).",
            ["reason"],
            registry=registry,
        )
        for reason in DROP_REASONS:  # at 0 from the start: a panel of none reads 0
            self.dropped.labels(reason)
        self.accepted = Counter(
            "powerflow_model_samples_total",
            "Samples queued for the online refit.",
            registry=registry,
        )
        self.refit_seconds = Histogram(
            "powerflow_model_refit_seconds",
            "Wall time of one call of the learner (initial fit or refit, skipped or not).",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=registry,
        )

    # --- the ingest's side --------------------------------------------------------

    def add(self, node: str, samples: Sequence[WindowSample], now_s: float) -> None:
        """Queue validated samples from ``node``'s agent (cheap: no fitting here).

        ``node`` tells the windows' GPU type: a node of another planned pool than the
        main one (``refresh``'s ``others``) gives rows of its type (``_Entry.others``),
        any other node rows of the main pool's. ``now_s`` is not needed by the refit
        (rows are ordered by arrival); it is part of the sink's interface for the ingest.
        """
        dropped: dict[str, int] = {}
        accepted = 0
        with self._lock:
            other = self._node_types.get(node)
            for sample in samples:
                entry = self._jobs.get(f"{sample.namespace}/{sample.job}")
                row = None if entry is None else model_row(sample)
                if entry is None or row is None:
                    reason = DROP_REASONS[0] if entry is None else DROP_REASONS[1]
                    dropped[reason] = dropped.get(reason, 0) + 1
                    continue
                queue = entry.pending
                if other is not None:
                    fit = entry.others.get(other)
                    if fit is None:
                        fit = entry.others[other] = _Fit()
                    queue = fit.pending
                if len(queue) >= self.max_pending or self._queued >= self.max_queued:
                    reason = DROP_REASONS[2]
                else:
                    queue.append(row)
                    entry.latest = other
                    entry.received += 1
                    self._queued += 1
                    accepted += 1
                    continue
                dropped[reason] = dropped.get(reason, 0) + 1
        self.accepted.inc(accepted)
        for reason, count in dropped.items():
            self.dropped.labels(reason).inc(count)

    # --- the allocation pass's side -----------------------------------------------

    def model(self, req: JobRequest) -> FittedModel:
        """The job's model: fitted if the store has one, else its prior (a ``ModelFactory``).

        The same object until a refit replaces it, so the policy's per-model
        memos stay valid across passes.
        """
        entry = self._jobs.get(req.key)
        if entry is not None and entry.uid == req.uid:
            model = entry.knowledge.model
            assert isinstance(model, FittedModel)
            return model
        return self._prior_model(req.model_name)

    def model_on(self, req: JobRequest, gpu: GpuSpec) -> FittedModel:
        """The job's model on ``gpu``, a type of another planned pool than the main one
        (a ``pass_snapshot.ModelsOn``): fitted on that type's windows when the store has
        one, else its prior carried over to the type (``prior_on``). The main pool's type
        (or no type told yet): ``model``. One object until a refit replaces it."""
        if self._pool is None or gpu.name == self._pool.name or not tunes(gpu):
            return self.model(req)
        entry = self._jobs.get(req.key)
        if entry is not None and entry.uid == req.uid:
            fit = entry.others.get(gpu.name)
            if fit is not None and fit.knowledge is not None:
                model = fit.knowledge.model
                assert isinstance(model, FittedModel)
                if model.gpu == gpu:
                    return model
        return self._prior_on(req.model_name, gpu)

    def refresh(
        self,
        bodies: Sequence[DLJobBody],
        gpu: GpuSpec | None = None,
        others: Mapping[str, GpuSpec] | None = None,
    ) -> list[Note]:
        """Sync with the pass's DLJobs and the main pool's type ``gpu`` (None: no pool
        this pass, the type last told stays), then thin and refit; Warnings to post.
        ``others``: the type of each node of the other planned pools (a plan of several
        pools, ``nodes.fleet_nodes``): windows from those nodes are of that type, and each
        job's knowledge on each such type is refitted on them (``model_on``).

        Runs in a worker thread of the pass (module docstring); blocking.
        """
        with self._refreshing:
            self._passes += 1
            notes: list[Note] = []
            with self._lock:
                if gpu is not None:
                    # A pool of unknown type (no report yet after a restart, say) says
                    # nothing of what the jobs' models are of: knowledge is kept.
                    self._untuned = not tunes(gpu)
                    gpu = None if self._untuned else gpu
                old = self._pool
                retyped = gpu is not None and old is not None and gpu.name != old.name
                if gpu is not None and gpu != self._pool:
                    self._pool = gpu
                    self._priors.clear()
                    self._learners.clear()
                self._tell_others(others or {})
                work = self._sync(bodies, notes)
                for entry in work:
                    if retyped:
                        assert old is not None and gpu is not None
                        if not self._swap(entry, old.name, gpu):
                            _forget_rows(entry)
                    self._check_type(entry, notes)
                batches = [(entry, entry.pending) for entry in work]
                other_batches = [
                    (entry, name, fit, fit.pending)
                    for entry in work
                    for name, fit in entry.others.items()
                ]
                for entry in work:
                    entry.pending = []
                    for fit in entry.others.values():
                        fit.pending = []
                self._queued = 0
            deadline = time.perf_counter() + self.refit_budget_s
            # Jobs that waited longest for a fit go first (``refit_budget_s``).
            for entry, pending in sorted(batches, key=lambda b: b[0].last_try):
                try:
                    self._update(entry, pending, deadline)
                except Exception:  # a bug must not stop the others' fits, nor the pass
                    log.exception("online refit of a job failed; it keeps its model")
                    entry.fresh = False  # retried when new samples arrive
            for entry, name, fit, pending in other_batches:
                try:
                    self._update_other(entry, name, fit, pending, deadline)
                except Exception:
                    log.exception("online refit of a job on %s failed; it keeps its model", name)
                    fit.fresh = False
            return notes

    def _tell_others(self, others: Mapping[str, GpuSpec]) -> None:
        """The other planned pools' types and their nodes (``refresh``), under the lock.
        Only types PowerFlow tunes, other than the main pool's, count."""
        main = self._pool.name if self._pool is not None else None
        kept = {node: spec for node, spec in others.items() if tunes(spec) and spec.name != main}
        self._node_types = {node: spec.name for node, spec in kept.items()}
        self._others = {spec.name: spec for spec in kept.values()}

    def _swap(self, entry: _Entry, old: str, new: GpuSpec) -> bool:
        """The main knowledge is of type ``old`` and the main pool's type is ``new`` (the
        pool changed type while both are planned, several pools): what the job learnt on
        ``new`` becomes its main knowledge and what it learnt on ``old`` is kept as another
        type's if ``old`` is planned. False (nothing moved) unless the job has knowledge
        of ``new`` (held ones included); the main rows go with the main knowledge."""
        fit = entry.others.get(new.name)
        if fit is not None:
            fit.take_held(new)
        if fit is None or fit.knowledge is None:
            return False
        if old in self._others:
            kept = _Fit()
            kept.rows, kept.pending, kept.knowledge = entry.rows, entry.pending, entry.knowledge
            entry.others[old] = kept
        del entry.others[new.name]
        entry.rows, entry.knowledge = fit.rows, fit.knowledge
        entry.pending = fit.pending
        entry.fresh, entry.error_percent, entry.restored_power = fit.fresh, None, None
        entry.latest = old if entry.latest is None else entry.latest
        if entry.latest == new.name:
            entry.latest = None
        return True

    def _update_other(
        self, entry: _Entry, name: str, fit: _Fit, pending: list[Row], deadline: float
    ) -> None:
        """``_update`` for the job's knowledge on another planned pool's type: its rows
        thinned alike and fitted by that type's learner (its prior carried over to it). A
        type not planned this pass keeps what it has, unfitted."""
        spec = self._others.get(name)
        if spec is None:  # the rows are kept (thinned), for when the type is planned again
            if pending:
                rows = np.concatenate([fit.rows, np.asarray(pending, dtype=np.float64)])
                if fit.knowledge is None:
                    fit.rows = rows[-self.max_rows :]
                else:
                    fit.rows, fit.knowledge = thin(rows, fit.knowledge, self.max_rows)
                fit.fresh = True
            return
        fit.take_held(spec)  # restored from status: the type's knowledge, no refit
        known = fit.knowledge
        prior = self._prior_on(entry.model_name, spec)
        if known is None or (known.fits == 0 and known.model is not prior):
            known = Knowledge(prior, prior.params, seen=known.seen if known else ())
        rows = fit.rows
        if pending:
            rows = np.concatenate([rows, np.asarray(pending, dtype=np.float64)])
        rows, known = thin(rows, known, self.max_rows)
        fit.rows = rows
        fit.fresh = fit.fresh or bool(pending)
        if fit.fresh and len(rows) >= MIN_SAMPLES and time.perf_counter() < deadline:
            fit.fresh = False
            known = self._fit(self._learner_on(spec), entry, known, rows)
        fit.knowledge = known

    def _update(self, entry: _Entry, pending: list[Row], deadline: float) -> None:
        """Add the queued rows, thin, and ask the learner if the budget allows."""
        rows = entry.rows
        if pending:
            rows = np.concatenate([rows, np.asarray(pending, dtype=np.float64)])
        rows, known = thin(rows, entry.knowledge, self.max_rows)
        entry.rows = rows
        entry.fresh = entry.fresh or bool(pending)
        if entry.fresh and time.perf_counter() < deadline:
            entry.last_try = self._passes
            entry.fresh = False
            known = self._learn(entry, known, rows)
        changed = pending or known.model is not entry.knowledge.model
        if changed and len(rows) and entry.held is None:  # held: status's own error stays
            model = known.model
            assert isinstance(model, FittedModel)
            entry.error_percent = fit_error_percent(model, rows)
        entry.knowledge = known

    def status_fields(self) -> dict[str, dict[str, Any]]:
        """``status.model`` fields per job key, for ``reconcile`` (module docstring)."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            entries = list(self._jobs.items())
        for key, entry in entries:
            known = entry.knowledge
            prior = self._prior_model(entry.model_name).params
            fields: dict[str, Any] = {"prior": prior.model or GENERIC, "samples": entry.received}
            if entry.held is not None:  # as status has them: nothing to write
                fields["params"] = params_status(entry.held[0])
                fields["fits"] = entry.held[1]
            elif known.fits > 0 and known.params is not None:
                fields["params"] = params_status(known.params)
                fields["fits"] = known.fits
            elif entry.bad_params:
                fields["params"] = None  # a merge patch removes the bad ones
            if entry.error_percent is not None:
                fields["fitErrorPercent"] = entry.error_percent
            measured = _measured(entry)
            if measured is not None:
                fields["measuredPower"] = measured_status(measured)
            others = self._others_status(entry)
            if others or entry.others_written:
                fields[OTHER_TYPES] = others or None  # None: a merge patch removes the list
                entry.others_written = True
            out[key] = fields
        return out

    def _others_status(self, entry: _Entry) -> list[dict[str, Any]]:
        """``status.model.otherGpuTypes``: the job's fit on each other type it has one
        of (held ones as status had them), by type name; the main type's never."""
        main = self._pool.name if self._pool is not None else None
        out = []
        for gpu in sorted(entry.others):
            fit = entry.others[gpu]
            known = fit.knowledge
            if gpu == main:
                continue
            if fit.held is not None:
                params, fits = fit.held
            elif known is not None and known.fits > 0 and known.params is not None:
                params, fits = known.params, known.fits
            else:
                continue
            out.append({"gpu": gpu, "params": params_status(params), "fits": fits})
        return out

    def measured_power(self) -> dict[str, MeasuredPower]:
        """Per job key, its power over its latest windows at the configuration of the
        latest one (up to ``MEASURED_ROWS`` of them, energy over time): what the
        policy's power loop corrects its predictions by (``Job.measured_power_w``).
        A job without windows since a restart has what the previous operator wrote
        in ``status.model.measuredPower``, so a restart does not plan uncorrected
        (module docstring). A job whose windows' power is not a finite number is
        left out."""
        out: dict[str, MeasuredPower] = {}
        with self._lock:
            entries = list(self._jobs.items())
        for key, entry in entries:
            measured = _measured(entry)
            if measured is not None:
                out[key] = measured
        return out

    # --- internals ------------------------------------------------------------------

    def _sync(self, bodies: Sequence[DLJobBody], notes: list[Note]) -> list[_Entry]:
        """Track the pass's DLJobs (new, re-created, renamed hint), forget the rest."""
        present: set[str] = set()
        for body in bodies:
            try:
                self._track(body, present, notes)
            except Exception:  # one odd body never stops the others
                log.exception("online refit: cannot track a DLJob")
        for key in set(self._jobs) - present:
            del self._jobs[key]
        return list(self._jobs.values())

    def _track(self, body: DLJobBody, present: set[str], notes: list[Note]) -> None:
        meta: Mapping[str, Any] = _dict(body.get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        namespace = str(meta.get("namespace") or "default")
        key = f"{namespace}/{name}"
        uid = str(meta.get("uid") or "")
        hint = _dict(body.get("spec")).get("model")
        model_name = hint if isinstance(hint, str) and hint else None
        present.add(key)
        entry = self._jobs.get(key)
        if entry is None or entry.uid != uid:
            if entry is None and len(self._jobs) >= self.max_jobs:
                return
            model_status = _dict(_dict(body.get("status")).get("model"))
            self._jobs[key] = self._restore(namespace, name, uid, model_name, model_status, notes)
        elif entry.model_name != model_name:
            entry.model_name = model_name
            if entry.knowledge.fits == 0:  # nothing learnt yet: start from the new prior
                entry.knowledge = self._prior_knowledge(model_name)

    def _restore(
        self,
        namespace: str,
        name: str,
        uid: str,
        model_name: str | None,
        model_status: Mapping[str, Any],
        notes: list[Note],
    ) -> _Entry:
        """A job the store has not tracked yet, from what its status says (a restart)."""
        entry = _Entry(f"{namespace}/{name}", uid, model_name, self._prior_knowledge(model_name))
        entry.received = _count(model_status.get("samples"))
        entry.error_percent = _percent(model_status.get("fitErrorPercent"))
        entry.restored_power = _restored_power(model_status.get("measuredPower"))
        entry.others_written = OTHER_TYPES in model_status
        others = self._restored_others(entry, model_status.get(OTHER_TYPES), notes)
        raw = model_status.get("params")
        pool = self._model_gpu()
        main: tuple[ModelParams, int] | None = None
        if raw is not None:
            try:
                main = (ModelParams.from_dict(raw), max(_count(model_status.get("fits")), 1))
            except PowerFlowError as exc:
                entry.bad_params = True
                entry.error_percent = None
                message = f"status.model.params ignored, starting from the prior: {exc}"
                notes.append(Note(namespace, name, uid, "InvalidModelParams", message[:500]))
        if pool is not None and pool.name in others and (main is None or main[0].gpu != pool.name):
            # The main pool's type changed while no operator ran, and the job has a fit
            # of the new one: the two trade places, as a running operator's ``_swap``.
            if main is not None and self._known_type(main[0].gpu):
                others[main[0].gpu] = main
            main = others.pop(pool.name)
            entry.error_percent, entry.restored_power = None, None
        elif main is not None:
            others.pop(main[0].gpu, None)  # the main fit's type is no other type
        entry.others = {gpu: _Fit(held) for gpu, held in others.items()}
        if main is None:
            return entry
        params, fits = main
        if pool is not None and params.gpu == pool.name:
            model = FittedModel.on(params, pool)
        elif params.gpu in GPU_SPECS:
            model = FittedModel(params)  # of another type than the pool's: ``_check_type``
        else:
            # A type only the agents' reports give (the catalogue has no spec to predict
            # with), or a name no board has: judged by the pool's type once one is told.
            entry.held = (params, fits)
            return entry
        entry.knowledge = Knowledge(model, params, fits=fits)
        return entry

    def _restored_others(
        self, entry: _Entry, raw: Any, notes: list[Note]
    ) -> dict[str, tuple[ModelParams, int]]:
        """``status.model.otherGpuTypes`` read back (a restart), as untrusted input: at
        most ``MAX_TYPES`` entries, each of a type the catalogue has or a planned pool is
        of (``_known_type``), once, with params that parse and are of that type. The
        rest is dropped with one ``InvalidModelParams`` Warning, and leaves status."""
        out: dict[str, tuple[ModelParams, int]] = {}
        if raw is None:
            return out
        if not isinstance(raw, list):
            raw, ignored = [], ["not a list"]
        else:
            past = len(raw) - MAX_TYPES
            ignored = [f"{past} entries past the first {MAX_TYPES}"] if past > 0 else []
        items = raw[:MAX_TYPES]
        for item in items:
            gpu = item.get("gpu") if isinstance(item, dict) else None
            if not isinstance(gpu, str) or not self._known_type(gpu):
                ignored.append(f"type {str(gpu)[:63]!r}")
                continue
            if gpu in out:
                ignored.append(f"{gpu} named again")
                continue
            try:
                params = ModelParams.from_dict(item.get("params"))
            except PowerFlowError as exc:
                ignored.append(f"{gpu}: {exc}")
                continue
            if params.gpu != gpu:
                ignored.append(f"{gpu}: params of {params.gpu[:63]!r}")
                continue
            out[gpu] = (params, max(_count(item.get("fits")), 1))
        if ignored:
            namespace, _, name = entry.key.partition("/")
            message = f"status.model.otherGpuTypes ignored in part: {'; '.join(ignored)}"
            notes.append(Note(namespace, name, entry.uid, "InvalidModelParams", message[:500]))
        return out

    def _known_type(self, gpu: str) -> bool:
        """A type whose fit a status may carry: the catalogue's, or a planned pool's
        (one the agents reported)."""
        pool = self._pool
        return gpu in GPU_SPECS or gpu in self._others or (pool is not None and gpu == pool.name)

    def _learn(self, entry: _Entry, known: Knowledge, rows: np.ndarray) -> Knowledge:
        """One call of the simulator's learner on the job's rows.

        No fit on a pool of unknown type: its GPUs run at their defaults, whose clocks
        the placeholder's one planned clock does not describe. None either for
        knowledge of another type than the models' (restored before any pool type
        was told): its type is checked first (``_check_type``).
        """
        if len(rows) < MIN_SAMPLES or self._untuned or entry.held is not None:
            return known
        if known.params is not None and known.params.gpu != self._type_name(entry.model_name):
            return known
        return self._fit(self._learner(entry.model_name), entry, known, rows)

    def _fit(
        self, learner: FittedLearner, entry: _Entry, known: Knowledge, rows: np.ndarray
    ) -> Knowledge:
        """The learner's first fit of ``known`` on ``rows`` or its update, timed into
        ``refit_seconds``."""
        samples = _samples(rows)
        name = entry.model_name or GENERIC  # the learner's prior lookup wants a name
        t0 = time.perf_counter()
        if known.fits == 0 and known.failed_fits == 0 and not known.seen:
            out = learner.initial(name, known.model, samples)
        else:
            out = learner.update(name, known.model, known, samples)
        self.refit_seconds.observe(time.perf_counter() - t0)
        return out

    def _model_gpu(self) -> GpuSpec | None:
        """The type the jobs' models are of: the pool's, or None for the priors' own
        (the A100's) until a type is told and on a pool of unknown type, whose one
        planned clock is the A100's top clock (``gpus.UNKNOWN_CLOCK_MHZ``)."""
        return self._pool

    def _type_name(self, model_name: str | None) -> str:
        """The GPU type a job's knowledge must be of to be kept (``_check_type``)."""
        return self._prior_model(model_name).params.gpu

    def _check_type(self, entry: _Entry, notes: list[Note]) -> None:
        """A fit of another type than the models' restarts from the prior on the models'
        type, with a Warning; its rows go with it (their clocks mean another board). A job
        with only its prior gets the prior on the pool's spec now. Nothing is checked
        until a pool type is told; then params held unjudged (``_Entry.held``) are the
        job's knowledge if they are of the pool's type, else they go as another type's."""
        if self._pool is not None and entry.held is not None:
            params, fits = entry.held
            entry.held = None
            model = (  # of another type: any model, replaced by the prior just below
                FittedModel.on(params, self._pool)
                if params.gpu == self._pool.name
                else self._prior_model(entry.model_name)
            )
            entry.knowledge = Knowledge(model, params, fits=fits)
        known = entry.knowledge
        if self._pool is None or known.params is None:
            return
        prior = self._prior_model(entry.model_name)
        if known.fits == 0:  # the prior on the pool's spec now (its clocks may differ)
            if known.model is not prior:
                entry.knowledge = replace(known, model=prior, params=prior.params)
            return
        wanted = prior.params.gpu
        if known.params.gpu == wanted or self._swap(entry, known.params.gpu, self._pool):
            return
        entry.knowledge = self._prior_knowledge(entry.model_name)
        _forget_rows(entry)
        entry.bad_params = True  # the old type's params leave status
        entry.error_percent = None
        namespace, _, name = entry.key.partition("/")
        message = (
            f"model fitted on {known.params.gpu} GPUs, the pool is now {wanted}: "
            f"starting from the prior on {wanted}"
        )
        notes.append(Note(namespace, name, entry.uid, "ModelGpuChanged", message[:500]))

    def _learner(self, model_name: str | None) -> FittedLearner:
        gpu = self._model_gpu()
        return self._learner_on(gpu if gpu is not None else gpu_spec(self._type_name(model_name)))

    def _learner_on(self, spec: GpuSpec) -> FittedLearner:
        learner = self._learners.get(spec)
        if learner is None:
            learner = self._learners[spec] = FittedLearner(spec, prior=self._prior)
        return learner

    def _prior_on(self, model_name: str | None, gpu: GpuSpec) -> FittedModel:
        """The job's prior carried over to ``gpu`` (another planned pool's type), one
        object per hint and type (the policy memoises per model object)."""
        key = (model_name, gpu)
        model = self._priors_on.get(key)
        if model is None:
            if len(self._priors_on) >= 4 * self.max_jobs:  # a bound: types come and go
                self._priors_on.clear()
            model = FittedModel.on(prior_on(self._prior(model_name), gpu), gpu)
            self._priors_on[key] = model
        return model

    def _prior_knowledge(self, model_name: str | None) -> Knowledge:
        """What ``FittedLearner.initial`` knows without samples, sharing one model object
        per prior and type (the policy memoises per model object)."""
        model = self._prior_model(model_name)
        return Knowledge(model, model.params)

    def _prior_model(self, model_name: str | None) -> FittedModel:
        """The job's prior on the models' type (``_model_gpu``), one object per hint."""
        model = self._priors.get(model_name)
        if model is None:
            prior, gpu = self._prior(model_name), self._model_gpu()
            model = FittedModel(prior) if gpu is None else FittedModel.on(prior_on(prior, gpu), gpu)
            self._priors[model_name] = model
        return model


def _forget_rows(entry: _Entry) -> None:
    """Drop the job's rows, queued ones and restored power: they were measured on
    another GPU type than the pool's now (``SampleStore.refresh``)."""
    entry.rows = np.empty((0, 6))
    entry.pending = []
    entry.restored_power = None
    entry.fresh = False
    entry.knowledge = replace(entry.knowledge, seen=())


def _measured(entry: _Entry) -> MeasuredPower | None:
    """The job's measured power (``SampleStore.measured_power``), None without one: of
    the type of its latest window (``_Entry.latest``)."""
    rows = entry.rows
    fit = entry.others.get(entry.latest) if entry.latest is not None else None
    if fit is not None and len(fit.rows):
        rows = fit.rows
    if not len(rows):
        return entry.restored_power
    last = rows[-1, :4]
    same = rows[np.all(rows[:, :4] == last, axis=1)][-MEASURED_ROWS:]
    with np.errstate(over="ignore"):
        watts = float(same[:, 5].sum() / same[:, 4].sum())
    if not math.isfinite(watts):
        # Each window is in telemetry's range, yet energy over time can
        # overflow: no measurement, rather than one the policy refuses
        # (which would stop the pass for every job).
        return None
    n, r, bs, f = (int(x) for x in last)
    return MeasuredPower(n, r, bs, f, watts)


def measured_status(measured: MeasuredPower) -> dict[str, Any]:
    """``status.model.measuredPower``: the job's measured power and where it was measured."""
    return {
        "gpus": measured.n,
        "gpusPerNode": measured.gpus_per_node,
        "localBatchSize": measured.local_batch_size,
        "frequencyMHz": measured.frequency_mhz,
        "watts": round(measured.watts, 2),
    }


def _restored_power(raw: Any) -> MeasuredPower | None:
    """``status.model.measuredPower`` read back after a restart; None unless every field is
    there and sane (the schema checks them, but status may predate it or be edited)."""
    if not isinstance(raw, dict):
        return None
    counts = [_count(raw.get(k)) for k in ("gpus", "gpusPerNode", "localBatchSize", "frequencyMHz")]
    watts = _percent(raw.get("watts"))
    if min(counts) < 1 or counts[1] > counts[0] or not watts:
        return None
    n, r, bs, f = counts
    return MeasuredPower(n, r, bs, f, watts)


def params_status(params: ModelParams) -> dict[str, Any]:
    """``ModelParams.to_dict()`` without null fields (the CRD's schema has none)."""
    return {k: v for k, v in params.to_dict().items() if v is not None}
