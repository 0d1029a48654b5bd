"""The allocation loop: one for the whole cluster, single-flight and debounced.

Every scheduling event (a DLJob, worker pod, Node or the budget ConfigMap
changing in a way a pass decides on: ``triggers``) calls ``trigger``; the
loop waits ``debounce_s`` so that a burst of events makes one pass, and never
runs two passes at once. It also wakes on the budget's
``schedulingIntervalSeconds``, when a backoff or profiling window ends, and
at each edge of the budget's schedule (a window starting or ending changes
the budget in force: the pass comes at the edge, not at the next interval).
Each pass re-reads the cluster (level-triggered: nothing is trusted from
memory except the budget in force, which is also recorded in the
cluster: ``budget``), calls ``reconcile`` and carries out its
actions. Progress and energy are written at most every
``progress_interval_s`` per job, so an idle cluster costs no writes. Writes
the API server refused go into the next pass (at once), which records them on
their jobs.

With a ``LeaderElector`` the loop runs passes only while this replica holds
the Lease; losing it cancels the pass in flight (``leader``).

With a ``SampleStore`` (``learning``), each pass first hands it the DLJobs
it read, the main pool's GPU type (the models' type) and the type of each node
of the other planned pools (``models_on``: each job's model there), in a worker thread
(syncing, thinning and refitting must not block the event loop), posts its
Warnings (bad ``status.model.params``, a model of another type) on their
jobs, and passes its ``status.model`` fields to ``reconcile``; the models
factory is then the store's (``learned_models``), which prefers a job's
fitted model to its prior. Samples arrive between passes (the ingest calls
the store's ``add``) and are fitted at the next pass, which comes at least
every ``schedulingIntervalSeconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerflow.operator import gc_pause
from powerflow.operator.actions import Actions
from powerflow.operator.bodies import ConfigMapBody
from powerflow.operator.budget import (
    DEFAULT,
    IN_FORCE_CONFIGMAP,
    RECORDED_AT_ANNOTATION,
    SOURCE_VERSION_ANNOTATION,
    BudgetConfig,
    budget_warnings,
    describe,
    describe_in_force,
    parse_budget,
)
from powerflow.operator.discovered import DiscoveredGpus, read_records
from powerflow.operator.jobs import RequestCache
from powerflow.operator.kube import ClusterState, Kube, WritesFailed
from powerflow.operator.leader import LeaderElector
from powerflow.operator.learning import MeasuredPower, SampleStore
from powerflow.operator.metrics import Metrics, job_series
from powerflow.operator.nodes import fleet_nodes, unknown_gpu_nodes
from powerflow.operator.parking import busy_nodes, node_marks
from powerflow.operator.pass_inputs import DEFAULT_PROFILING_WINDOW_S, PassMemory, PassSettings
from powerflow.operator.pass_progress import DEFAULT_PROGRESS_INTERVAL_S
from powerflow.operator.pass_snapshot import ModelFactory, ModelsOn, TypedModels
from powerflow.operator.reconcile import reconcile
from powerflow.operator.refusals import Refusal, by_job
from powerflow.operator.reported_progress import ReportedProgress

from powerflow.core import contract
from powerflow.core.errors import ResourceError
from powerflow.core.gpus import GpuSpec, unknown_gpu
from powerflow.core.policy.fleet import FleetPolicy
from powerflow.core.policy.power_ratio import BELIEVED, RatioWindow
from powerflow.core.policy.snapshot import JobPlan, Node, Policy
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep
from powerflow.core.schedulers import scheduler
from powerflow.core.taints import GPU_TOLERATIONS
from powerflow.core.timefmt import format_time
from powerflow.kubeapi.backoff import Backoff, asked_wait_s

log = logging.getLogger(__name__)

_UNSEEN = object()


def learned_models(store: SampleStore) -> ModelFactory:
    """Each job's model: its fitted one when the store has one (refitted online, or
    restored from ``status.model.params``), else the shipped prior of its ``model``
    hint (generic if unknown)."""
    return store.model


def default_policy(name: str = "powerflow") -> Policy:
    """The policy of scheduler ``name`` (``powerflow.lab.schedulers``; the operator's
    ``--scheduler`` offers PowerFlow's own)."""
    return scheduler(name).build_policy(None)


def fleet_of(policy: Policy) -> Policy:
    """``policy`` planning every pool of the cluster under one budget (``FleetPolicy``):
    ``policy`` itself for the first pool planned (with one pool, the plan is its own),
    a replica for each other (``dataclasses.replace``: the same settings, its own memo
    for its pool's shape; a policy that is no dataclass is shared, ``copy.copy``)."""
    if isinstance(policy, FleetPolicy):
        return policy
    given = [policy]

    def make() -> Policy:
        if given:
            return given.pop()
        if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
            replica: Policy = dataclasses.replace(policy)
            return replica
        return copy.copy(policy)

    return FleetPolicy(make)


@dataclass
class OperatorConfig:
    namespace: str | None = None  # None: cluster-wide
    budget_namespace: str = "powerflow-system"
    budget_name: str = contract.BUDGET_CONFIGMAP
    debounce_s: float = 0.02
    """Wait after an event so that a burst makes one pass (a new DLJob skips it)."""
    profiling_window_s: float = DEFAULT_PROFILING_WINDOW_S
    """How long a job profiles a GPU count it has not run on (paper: 240 s)."""
    profile_sweep: ClockSweep = PAPER_SWEEP
    """The clocks a profiling window sweeps (the scheduler's ``Profiling.sweep``)."""
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    """At most one progress/energy status write per job in this time (unless its
    status changes anyway)."""
    pool_tolerations: tuple[dict[str, str], ...] = GPU_TOLERATIONS
    """The node taints PowerFlow's pools accept (``--tolerate``; ``nodes.cluster_nodes``)."""


def as_planned(
    planned: Mapping[str, JobPlan], measured: Mapping[str, MeasuredPower]
) -> list[tuple[str, float, float]]:
    """(job key, measured, planned) power of each job measured on the GPUs, local batch
    and clock its plan gave it: a job a cap holds lower, or one measured on an earlier
    configuration, says nothing about how far the plan's predictions are off."""
    out = []
    for key, m in measured.items():
        jp = planned.get(key)
        if (
            jp is not None
            and jp.power_w is not None
            and (jp.gpus, jp.local_batch_size, jp.frequency_mhz)
            == (m.n, m.local_batch_size, m.frequency_mhz)
        ):
            out.append((key, m.watts, jp.power_w))
    return out


def _pool_labels(bodies: Sequence[Any], nodes: Sequence[Node]) -> dict[str, str] | None:
    """Each planned node's GPU product label (empty: none) where the plan spans several
    pools, which new workers are pinned to (``reconcile``'s ``pools``); None with one."""
    if len({(n.gpu.name, n.gpus) for n in nodes}) < 2:
        return None
    planned = {n.name for n in nodes}
    out = {}
    for body in bodies:
        meta = body.get("metadata", {}) if isinstance(body, dict) else {}
        name = meta.get("name")
        if name in planned:
            label = (meta.get("labels") or {}).get(contract.GPU_PRODUCT_LABEL)
            out[name] = label if isinstance(label, str) else ""
    return out


def _failure_of(exc: Exception) -> tuple[str, str]:
    """What a failed pass's error is, as a key that is the same for the same failure, and
    in one line for the log. An ``ApiException``'s own text spans lines and carries the
    answer's ``Date`` header, and a connection error names the URL of whichever list
    failed first, so the key is the error's type and HTTP status (``WritesFailed``:
    those of its first error)."""
    errors = getattr(exc, "errors", None)
    inner = errors[0] if isinstance(errors, list) and errors else exc
    status = getattr(inner, "status", None)
    if isinstance(status, int):
        reason = str(getattr(inner, "reason", "") or "").splitlines()
        key = f"{type(inner).__name__} {status}"
        line = f"{key} {reason[0] if reason else ''}".rstrip()
    else:
        key = type(inner).__name__
        text = str(inner).splitlines()
        line = f"{key}: {text[0] if text else ''}"
    if inner is not exc:
        key, line = f"{type(exc).__name__}: {key}", f"{type(exc).__name__}: the first {line}"
    return key, line


WRITES_RETRY_MAX_S = 5.0
"""The longest wait after a pass that read the cluster and failed only in some of its
writes (``WritesFailed``), unless a ``Retry-After`` asks for more: such a pass is one
object's bad write as often as a server's (a webhook that fails one job's status), and
the other jobs' new work should not wait ``Controller.retry``'s 30 s for it; a
server that fails every write (etcd over its quota) is still asked only every 5 s.
A pass some of whose writes the server answered without an error (``WritesFailed.written``)
finds it up: its back-off starts over."""


def _job_ref(state: ClusterState, key: str) -> dict[str, Any] | None:
    """The DLJob of job key ``namespace/name`` in ``state``, as an Event's object."""
    for observed in state.jobs:
        meta = observed.body.get("metadata") or {}
        if f"{meta.get('namespace')}/{meta.get('name')}" == key:
            return {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND,
                "metadata": {k: meta.get(k) for k in ("namespace", "name", "uid")},
            }
    return None


@dataclass
class Controller:
    kube: Kube
    config: OperatorConfig
    policy: Policy
    models: ModelFactory
    metrics: Metrics = field(default_factory=Metrics)
    clock: Callable[[], float] = time.time
    post_events: bool = True
    leader: LeaderElector | None = None
    """``None``: no leader election, this replica always acts."""
    learning: SampleStore | None = None
    """The online refit (module docstring); ``None``: no ``status.model`` fields."""
    models_on: ModelsOn | None = None
    """Each job's model on the types of the other planned pools (the store's
    ``model_on``); None: ``models`` on every type."""
    progress: ReportedProgress = field(default_factory=ReportedProgress)
    """The jobs' progress the agents reported (the ingest's, shared)."""
    discovered: DiscoveredGpus = field(default_factory=DiscoveredGpus)
    """The GPU types the agents reported (the ingest's, shared): they beat the labels.
    Each pass first reads back the records of nodes it has none for, and after its
    writes records the new reports on their nodes (``discovered``)."""

    budget: BudgetConfig = DEFAULT
    passes: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _immediate: bool = False
    _anchors: dict[str, float] = field(default_factory=dict)
    _refused: dict[str, list[Refusal]] = field(default_factory=dict)
    """The previous pass's refused writes, for the next pass to report (``refusals``)."""
    _requests: RequestCache = field(default_factory=RequestCache)
    _bad_budget_version: str | None = None
    _parsed: tuple[tuple[str | None, dict[str, str]], BudgetConfig | ResourceError] | None = None
    """The last budget ConfigMap parsed (version and data) and what it gave
    (``_parse_budget``)."""
    _window: object = field(default_factory=lambda: _UNSEEN)
    """The schedule's window in force at the last pass (None: outside any; ``_UNSEEN``
    before the first pass): a change is logged and posted on the budget ConfigMap."""
    _recorded: tuple[str | None, dict[str, str]] | None = None
    """The (source version, data) of the budget in force as recorded; None: not yet known."""
    _in_force_source: tuple[str | None, dict[str, str]] | None = None
    """The (source version, data) of the budget in force, recorded or not."""
    _ratio: RatioWindow = field(default_factory=RatioWindow)
    """Measured over planned power of the jobs running as planned (``_power_ratio``)."""
    _outliers: dict[str, tuple[int, int, int, int] | None] = field(default_factory=dict)
    """The jobs whose measured power was an outlier at the last pass, and where
    (recorded once per job and configuration)."""
    _planned: dict[str, JobPlan] = field(default_factory=dict)
    """The previous pass's job plans by job key (what ``_power_ratio`` compares with)."""
    _decided: bool = False
    """A budget was put in force in this process (valid, the default, or the record):
    the record is read at most once, at start, and never replaces a budget in force
    (one whose record could not be written is newer than the record)."""
    _record_failure: str | None = None
    """Why the last write of the record failed (logged once per distinct failure)."""
    _task: asyncio.Task[None] | None = None
    _leader_task: asyncio.Task[None] | None = None
    _progress_written: dict[str, float] = field(default_factory=dict)
    _events: list[tuple[dict[str, Any], str, str, str]] = field(default_factory=list)
    _unknown_told: set[str] = field(default_factory=set)
    """The nodes of unknown GPU type already told (one ``UnknownGpu`` Event per node)."""
    state: ClusterState | None = None
    """The cluster as the last pass read it (the ingest judges samples by it)."""
    _fleet: Policy | None = None
    """``policy`` over every planned pool (``fleet_of``), made at the first pass."""
    state_read_s: float = 0.0
    """Unix time (``time.time``, the agents' samples' clock, not ``clock``) when the
    read of ``state`` began: the ingest defers a sample that ended after it."""
    retry: Backoff = field(default_factory=lambda: Backoff(first_s=0.5, max_s=30.0))
    """When a failed pass is tried again: 0.5 s, doubling to 30 s for failures in a row
    (``WRITES_RETRY_MAX_S`` for a pass that failed in its writes), or the API server's
    ``Retry-After`` if longer (``run``). Half a second first: one failure is often one
    request's bad luck, and one operator coming back soon loads no server; the node
    agents' watches, a thousand of them, start at 1 s (``powerflow.kubeapi.watch``)."""
    _failures: set[str] = field(default_factory=set)
    """The keys of the failed passes' errors (``_failure_of``) since the last pass that
    went through."""
    _hold: bool = False
    """No event starts the next pass before its retry time (``run``)."""
    _in_a_row: int = 0
    """Passes failed since the last one that went through (the log's count)."""

    def trigger(self, reason: str = "", *, immediate: bool = False) -> None:
        """A scheduling event; ``immediate`` skips the debounce (a new DLJob waits
        for nothing but a pass already in flight)."""
        self._immediate = self._immediate or immediate
        self._wake.set()

    def start(self) -> None:
        self.metrics.last_pass.set(time.time())  # the time without a pass counts from here
        leader = self.leader  # read at every scrape: never a stale 1 after the Lease is lost
        self.metrics.leader.set_function(lambda: 1.0 if leader is None or leader.is_leader else 0.0)
        self.kube.watch_foreign(self.trigger)
        if self.leader is not None:
            self._leader_task = asyncio.create_task(self.leader.run(), name="powerflow-lease")
        self._task = asyncio.create_task(self.run(), name="powerflow-allocation-loop")

    async def stop(self) -> None:
        """Stop the loop, then the election (a leader releases its Lease)."""
        self.kube.stop()
        for task in (self._task, self._leader_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """Passes, each when an event or its wake-up time comes (module docstring).

        A pass that fails is tried again after ``retry``'s back-off. After the first
        failure the next event may start it sooner (one failure is often one
        request's bad luck); from the second in a row, or when the API server asked
        for a wait (``Retry-After``), no event does: every pass lists the cluster,
        and with the 20 ms debounce a failing pass would run again at every event
        of a busy cluster.
        """
        wake_at: float | None = None
        while True:
            if self.leader is not None and not self.leader.is_leader:
                await self.leader.wait_leading()
                # A follower's passes went nowhere: the time without one counts from here.
                self.metrics.last_pass.set(time.time())
                self.trigger("became leader", immediate=True)
            if self._hold and wake_at is not None:
                await asyncio.sleep(max(wake_at - self.clock(), 0.0))
            else:
                timeout = self.budget.interval_s
                if wake_at is not None:
                    timeout = min(timeout, max(wake_at - self.clock(), 0.0))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):  # not wait_for: see pyproject's ruff
                        await self._wake.wait()
                if not self._immediate:
                    await asyncio.sleep(self.config.debounce_s)
            self._wake.clear()
            self._immediate = False
            try:
                wake_at = await self._pass()
            except Exception as exc:  # keep serving: retried after the back-off
                try:
                    wait = self._pass_failed(exc)
                except Exception:  # never lose the loop to its own error handling
                    log.exception("allocation pass failed, and so did handling it")
                    wait, self._hold = self.retry.max_s, True
                wake_at = self.clock() + wait
            else:
                self.retry.succeeded()
                self._failures.clear()
                self._hold, self._in_a_row = False, 0

    def _pass_failed(self, exc: Exception) -> float:
        """Count and log a failed pass; the seconds until the next try.

        The log has the traceback of each error not seen since the last pass that
        went through, and a failure seen before as one line at the 2nd, 4th, 8th...
        failure in a row (a failure that lasts a day logs about a dozen lines, not
        one a second; two that alternate, two tracebacks).
        """
        asked = asked_wait_s(exc)
        if isinstance(exc, WritesFailed) and exc.written:
            self.retry.succeeded()  # the server answered some writes: it is up, no back-off
        wait = self.retry.failed()
        if isinstance(exc, WritesFailed):
            wait = min(wait, WRITES_RETRY_MAX_S)
        if asked is not None:
            wait = max(wait, float(asked))
        self._hold = self.retry.failures > 1 or asked is not None
        self.metrics.pass_failures.inc()
        key, line = _failure_of(exc)
        self._in_a_row += 1
        count = self._in_a_row
        if key not in self._failures:
            log.error("allocation pass failed; next try in %.1f s", wait, exc_info=exc)
        elif count & (count - 1) == 0:  # a power of two
            log.warning(
                "allocation pass failed again (%d in a row): %s; next try in %.1f s",
                count,
                line,
                wait,
            )
        self._failures.add(key)
        return wait

    async def _pass(self) -> float | None:
        """``run_once``, cancelled the moment leadership is lost."""
        if self.leader is None:
            return await self.run_once()
        if not self.leader.is_leader:
            return None
        work = asyncio.ensure_future(self.run_once())
        lost = asyncio.ensure_future(self.leader.wait_lost())
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the loop itself is cancelled (stop): no orphan pass
            lost.cancel()
            if not work.done():
                work.cancel()
        await asyncio.gather(work, lost, return_exceptions=True)
        if work.cancelled():
            log.warning("lost the lease: allocation pass cancelled")
            return None
        return work.result()

    async def _budget(self, state: ClusterState) -> None:
        """The budget in force for this pass (``budget`` module docstring)."""
        cm = state.budget
        if cm is None:
            self.metrics.budget_valid.set(1)
            self._bad_budget_version = None
            await self._in_force(DEFAULT, {}, None, "no budget ConfigMap: the default budget")
            return
        version = cm.get("metadata", {}).get("resourceVersion")
        data = cm.get("data") or {}
        try:
            config = await self._parse_budget(version, data)
        except ResourceError as exc:
            self.metrics.budget_valid.set(0)
            if not self._decided:  # just started: the last good one is the recorded one
                await self._recall()
            if version != self._bad_budget_version:
                self._bad_budget_version = version
                self.metrics.invalid_budget.inc()
                kept = describe(self.budget)
                log.warning("invalid budget ConfigMap, keeping %s: %s", kept, exc)
                self._event(cm, "Warning", "InvalidBudget", f"{exc}; keeping {kept}")
            return
        self.metrics.budget_valid.set(1)
        self._bad_budget_version = None
        if await self._in_force(config, data, version, f"from ConfigMap version {version}"):
            for reason, message in budget_warnings(config):
                log.warning("budget: %s", message)
                self._event(cm, "Warning", reason, message)

    async def _parse_budget(self, version: str | None, data: dict[str, str]) -> BudgetConfig:
        """``parse_budget`` once per ConfigMap version, in a worker thread: a schedule is
        up to ``MAX_SCHEDULE_BYTES`` of YAML, and the event loop also answers the
        liveness probe and the ingest. The answer (or the refusal) is kept for the
        passes that see the same version and data."""
        key = (version, data)
        if self._parsed is None or self._parsed[0] != key:
            try:
                outcome: BudgetConfig | ResourceError = await asyncio.to_thread(parse_budget, data)
            except ResourceError as exc:
                outcome = exc
            self._parsed = (key, outcome)
        outcome = self._parsed[1]
        if isinstance(outcome, ResourceError):
            raise outcome.with_traceback(None)  # kept: not a traceback longer every pass
        return outcome

    async def _in_force(
        self, config: BudgetConfig, data: dict[str, str], version: str | None, source: str
    ) -> bool:
        """Put ``config`` in force and record it; True when the budget in force changed
        (recorded or not: a failed write is retried on every pass)."""
        self.budget = config
        self._decided = True
        self.metrics.scheduling_interval.set(config.interval_s)
        record = (version, dict(data))
        changed = record != self._in_force_source
        self._in_force_source = record
        message = f"budget in force: {describe(config)} ({source})"
        if changed:
            log.info(message)
        if record == self._recorded:
            return changed
        ns = self.config.budget_namespace
        body: ConfigMapBody = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": IN_FORCE_CONFIGMAP,
                "namespace": ns,
                "labels": {"app.kubernetes.io/managed-by": "powerflow-operator"},
                "annotations": {
                    SOURCE_VERSION_ANNOTATION: version or "",
                    RECORDED_AT_ANNOTATION: format_time(self.clock()),
                },
            },
            "data": dict(data),
        }
        saved = await self.kube.save_config_map(body)
        if isinstance(saved, str):  # not recorded: the next pass tries again
            if saved != self._record_failure:
                self._record_failure = saved
                log.warning("%s not recorded, retrying each pass: %s", message, saved)
            return changed
        self._record_failure = None
        self._recorded = record
        self._event(saved, "Normal", "BudgetInForce", message)
        return changed

    async def _recall(self) -> None:
        """Start from the recorded budget in force (the ConfigMap is invalid at start)."""
        self._decided = True
        ns = self.config.budget_namespace
        saved = await self.kube.read_config_map(ns, IN_FORCE_CONFIGMAP)
        if saved is None:
            log.warning("invalid budget ConfigMap and no budget in force recorded: the default")
            self._recorded = self._in_force_source = (None, {})
            return
        meta = saved.get("metadata", {})
        version = (meta.get("annotations") or {}).get(SOURCE_VERSION_ANNOTATION) or None
        data = saved.get("data") or {}
        try:
            self.budget = await asyncio.to_thread(parse_budget, data) if data else DEFAULT
        except ResourceError as exc:  # edited by hand: nothing better to start from
            log.warning("recorded budget in force is invalid, using the default: %s", exc)
            self.budget = DEFAULT
        self._recorded = self._in_force_source = (version, dict(data))
        log.warning("budget ConfigMap invalid at start: %s recorded", describe(self.budget))

    def _event(self, body: Any, type_: str, reason: str, message: str) -> None:
        if self.post_events:
            self._events.append((body, type_, reason, message))

    def _node_ref(self, node: str) -> dict[str, Any]:
        """``node`` as an Event's object (its UID from the last pass's view)."""
        nodes = self.state.nodes if self.state is not None else ()
        uid = next(
            (
                n.get("metadata", {}).get("uid")
                for n in nodes
                if n.get("metadata", {}).get("name") == node
            ),
            None,
        )
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid}}

    def note_refused_sender(self, node: str, reason: str, count: int) -> None:
        """A Warning Event on ``node`` (posted with the next pass's Events): its agent's
        samples were refused for ``reason`` (the ingest tells each pair once)."""
        ref = self._node_ref(node)
        message = (
            f"{count} sample(s) from this node's agent refused: {reason} (a broken or "
            "compromised node agent, or energy counter; later ones are counted in "
            "powerflow_ingest_samples_refused_total)"
        )
        self._event(ref, "Warning", "SamplesRefused", message)

    def _note_unknown(self, state: ClusterState, discovered: Mapping[str, GpuSpec]) -> None:
        """The gauge of nodes whose GPU type is unknown, and a Warning Event on each the
        first time it is (again after it was known): their jobs run at the GPUs' defaults."""
        unknown = unknown_gpu_nodes(state.nodes, discovered)
        self.metrics.nodes_unknown_gpu.set(len(unknown))
        for body in state.nodes:
            meta = body.get("metadata", {})
            name = meta.get("name")
            if name not in unknown or name in self._unknown_told:
                continue
            product = (meta.get("labels") or {}).get(contract.GPU_PRODUCT_LABEL)
            message = (
                f"GPU type unknown (product label {product!r}, no report from the node "
                "agent): its jobs run, but PowerFlow sets no clock or power limit on its "
                "GPUs, and the budget counts each at "
                f"{unknown_gpu().max_power_w:g} W (the catalogue's largest board limit)"
            )
            log.warning("node %s: %s", name, message)
            self._event(self._node_ref(name), "Warning", "UnknownGpu", message)
        self._unknown_told = set(unknown)

    def _power_ratio(
        self, measured: Mapping[str, MeasuredPower] | None, now: float, state: ClusterState
    ) -> float:
        """The snapshot's ``power_ratio``: the largest measured / planned power of the
        jobs running as the previous plan said over the last hour, as the simulator
        computes it (``powerflow.core.policy.power_ratio``, which bounds it and leaves
        outliers out: each is recorded once per job and configuration)."""
        rows = as_planned(self._planned, measured or {})
        outliers = self._ratio.add(now, [(m, p) for _, m, p in rows])
        noted = {}
        for key, m, p in (rows[i] for i in outliers):
            seen = measured[key] if measured is not None else None
            where = (
                None
                if seen is None
                else (seen.n, seen.gpus_per_node, seen.local_batch_size, seen.frequency_mhz)
            )
            noted[key] = where
            if seen is None or self._outliers.get(key) == where:
                continue
            self.metrics.power_outliers.inc()
            lo, hi = BELIEVED
            message = (
                f"measured {m:.4g} W on {seen.n} GPUs at {seen.frequency_mhz} MHz where the "
                f"plan counted {p:.4g} W: outside {lo:g}-{hi:g}x, not believed (the cluster's "
                "power ratio leaves it out; a broken or lying node agent, or a broken model)"
            )
            log.warning("%s: %s", key, message)
            ref = _job_ref(state, key)
            if ref is not None:
                self._event(ref, "Warning", "PowerOutlier", message)
        self._outliers = noted
        return self._ratio.ratio(now)

    async def run_once(self) -> float | None:
        """One pass: read, decide, act. Returns when the loop must wake at the latest."""
        started = time.perf_counter()
        read_s = time.time()
        state = await self.kube.read(self.config.budget_namespace, self.config.budget_name)
        self.discovered.keep_only(str(n.get("metadata", {}).get("name")) for n in state.nodes)
        unread = self.discovered.unread(state.nodes)
        if unread:  # ~0.3 ms a record (``discovered``): off the event loop
            now_s = self.discovered.now()
            self.discovered.take(await asyncio.to_thread(read_records, unread, now_s))
        self.state, self.state_read_s = state, read_s  # the ingest judges by the records too
        await self._budget(state)
        discovered = self.discovered.specs()
        nodes, left_out = fleet_nodes(
            state.nodes, state.foreign_gpu_pods, self.config.pool_tolerations, discovered
        )
        self._note_unknown(state, discovered)
        if left_out:
            log.warning("nodes of other pools left out: %s", ", ".join(left_out))
        main = nodes[0].gpu if nodes else None
        others = {n.name: n.gpu for n in nodes if main is not None and n.gpu.name != main.name}
        learned = await self._learn(state, main, others)
        now = self.clock()
        self._note_window(state, now)
        measured = self.learning.measured_power() if self.learning is not None else None
        self.progress.keep_only(
            f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            for meta in (observed.body.get("metadata") or {} for observed in state.jobs)
        )
        power_ratio = self._power_ratio(measured, now, state)
        agent_progress = self.progress.snapshot()
        with gc_pause.paused():  # the pass makes no garbage cycles (gc_pause)
            actions = reconcile(
                state.jobs,
                nodes,
                self.budget.at(now),
                now,
                self._planner(),
                self.models if self.models_on is None else TypedModels(self.models, self.models_on),
                PassMemory(
                    anchors=self._anchors,
                    requests=self._requests,
                    refused=self._refused,
                    progress_written=self._progress_written,
                    learned=learned,
                    measured=measured,
                    power_ratio=power_ratio,
                    agent_progress=agent_progress,
                ),
                PassSettings(
                    profiling_window_s=self.config.profiling_window_s,
                    profile_sweep=self.config.profile_sweep,
                    progress_interval_s=self.config.progress_interval_s,
                    pool_labels=_pool_labels(state.nodes, nodes),
                ),
            )
        if actions.plan is not None:
            self._planned = {jp.job_id: jp for jp in actions.plan.jobs}
        workers = (pod for observed in state.jobs for pod in observed.pods)
        busy = busy_nodes(workers, state.foreign_gpu_pods)
        actions.node_marks = node_marks(state.nodes, nodes, actions.plan, busy, format_time(now))
        self._anchors = actions.anchors
        self._refused = {}
        try:
            refused = await self.kube.apply(actions)
        except WritesFailed as exc:  # the pass fails (retried); its refusals still count
            self._refused = by_job(exc.refusals)
            raise
        self._refused = by_job(refused)
        await self.kube.record_gpus(self.discovered.unrecorded(state.nodes))
        self._note_progress(actions, now, state)
        self._after(actions)
        self._publish(state, nodes, actions)
        events, self._events = self._events, []
        await self.kube.post_events(events)
        self.metrics.loop_seconds.observe(time.perf_counter() - started)
        self.metrics.last_pass.set(time.time())
        self.passes += 1
        if any(r.verb == "create" for r in refused):
            return now  # report the refusals and start the backoff at once
        edge = self.budget.next_edge_s(now)
        if edge is None or (actions.wake_at_s is not None and actions.wake_at_s < edge):
            return actions.wake_at_s
        return edge

    def _planner(self) -> Policy:
        """The policy each pass plans with: ``policy`` over every planned pool."""
        if self._fleet is None:
            self._fleet = fleet_of(self.policy)
        return self._fleet

    def _note_window(self, state: ClusterState, now: float) -> None:
        """Log and post (on the budget ConfigMap) a change of the schedule's window in
        force since the last pass; the first pass only logs it."""
        window = self.budget.window_at(now)
        if window == self._window:
            return
        first = self._window is _UNSEEN
        self._window = window
        if self.budget.schedule is None:
            return
        message = describe_in_force(self.budget, now)
        log.info("budget schedule: %s", message)
        if not first and state.budget is not None:
            self._event(state.budget, "Normal", "BudgetWindow", message)

    async def _learn(
        self, state: ClusterState, gpu: GpuSpec | None, others: Mapping[str, GpuSpec]
    ) -> dict[str, dict[str, Any]] | None:
        """Sync and refit the store in a worker thread, its models of the main pool's
        type ``gpu`` (None: no pool) and of the type of each node of the other planned
        pools (``others``); its Warnings; its status fields."""
        if self.learning is None:
            return None
        bodies = [o.body for o in state.jobs]
        try:
            notes = await asyncio.to_thread(self.learning.refresh, bodies, gpu, others)
        except Exception:  # scheduling goes on with the models the store had
            log.exception("online refit failed")
            notes = []
        for note in notes:
            log.warning("%s/%s: %s", note.namespace, note.name, note.message)
            ref = {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND,
                "metadata": {"namespace": note.namespace, "name": note.name, "uid": note.uid},
            }
            self._event(ref, "Warning", note.reason, note.message)
        return self.learning.status_fields()

    def _note_progress(self, actions: Actions, now: float, state: ClusterState) -> None:
        """Remember when each job's progress was written (for the rate limit)."""
        for namespace, name, patch in actions.status:
            if "progress" in patch or "energy" in patch:
                self._progress_written[f"{namespace}/{name}"] = now
        if len(self._progress_written) > len(state.jobs):
            keys = {
                f"{o.body.get('metadata', {}).get('namespace')}/"
                f"{o.body.get('metadata', {}).get('name')}"
                for o in state.jobs
            }
            for key in set(self._progress_written) - keys:
                del self._progress_written[key]

    def _publish(self, state: ClusterState, nodes: Sequence[Node], actions: Actions) -> None:
        """The dashboard's gauges: the pool's GPUs and each job's, after the pass."""
        total = sum(n.gpus for n in nodes)
        down = set(actions.plan.powered_down_nodes) if actions.plan is not None else set()
        powered = sum(n.gpus for n in nodes if n.name not in down)
        self.metrics.set_gpus(total, powered, actions.allocated_gpus)
        self.metrics.set_jobs(
            job_series([o.body for o in state.jobs], [*actions.status_first, *actions.status])
        )

    def _after(self, actions: Actions) -> None:
        for note in actions.notes:
            log.warning(note)
        for ev in actions.events:
            ref = {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND,
                "metadata": {"namespace": ev.namespace, "name": ev.name, "uid": ev.uid},
            }
            self._event(ref, ev.type, ev.reason, ev.message)
        if actions.plan is not None:
            self.metrics.budget_watts.set(actions.plan.limit_w)
            self.metrics.predicted_w.set(actions.plan.predicted_w)
        self.metrics.allocated_gpus.set(actions.allocated_gpus)
        self.metrics.set_phases(actions.phases)
