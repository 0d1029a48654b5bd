"""The allocation loop: one for the whole cluster, single-flight and debounced.

Every scheduling event (a DLJob, worker pod, Node or the budget ConfigMap
changing) calls ``trigger``; the loop waits ``debounce_s`` so that a burst of
events makes one pass, and never runs two passes at once. It also wakes on
the budget's ``schedulingIntervalSeconds`` and when a backoff ends. Each pass
re-reads the cluster (level-triggered: nothing is trusted from memory except
the last good budget), calls ``reconcile`` and carries out its actions. Writes
the API server refused go into the next pass (at once), which records them on
their jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerflow.operator.budget import DEFAULT, BudgetConfig, parse_budget
from powerflow.operator.jobs import JobRequest, RequestCache
from powerflow.operator.kube import ClusterState, Kube, WritesFailed
from powerflow.operator.metrics import Metrics
from powerflow.operator.nodes import cluster_nodes
from powerflow.operator.reconcile import (
    DEFAULT_PROFILING_WINDOW_S,
    Actions,
    ModelFactory,
    reconcile,
)
from powerflow.operator.refusals import Refusal, by_job

from powerflow import contract
from powerflow.errors import ResourceError
from powerflow.models.protocol import PerfModel
from powerflow.policy.snapshot import Policy

log = logging.getLogger(__name__)


def prior_models() -> ModelFactory:
    """Each job's model: the shipped prior of its ``model`` hint (generic if unknown)."""
    from powerflow.models.fitted import FittedModel
    from powerflow.models.priors import load_prior

    @functools.cache
    def by_name(name: str | None) -> PerfModel:
        return FittedModel(load_prior(name))

    def factory(job: JobRequest) -> PerfModel:
        return by_name(job.model_name)

    return factory


def default_policy() -> Policy:
    from powerflow.policy.powerflow import PowerFlowPolicy

    policy: Policy = PowerFlowPolicy()
    return policy


@dataclass
class OperatorConfig:
    namespace: str | None = None  # None: cluster-wide
    budget_namespace: str = "powerflow-system"
    budget_name: str = contract.BUDGET_CONFIGMAP
    debounce_s: float = 0.02
    """Wait after an event so that a burst makes one pass (a new DLJob skips it)."""
    profiling_window_s: float = DEFAULT_PROFILING_WINDOW_S
    """How long a job profiles a GPU count it has not run on (paper: 240 s)."""


@dataclass
class Controller:
    kube: Kube
    config: OperatorConfig
    policy: Policy
    models: ModelFactory
    metrics: Metrics = field(default_factory=Metrics)
    clock: Callable[[], float] = time.time
    post_events: bool = True

    budget: BudgetConfig = DEFAULT
    passes: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _immediate: bool = False
    _anchors: dict[str, float] = field(default_factory=dict)
    _refused: dict[str, list[Refusal]] = field(default_factory=dict)
    """The previous pass's refused writes, for the next pass to report (``refusals``)."""
    _requests: RequestCache = field(default_factory=RequestCache)
    _bad_budget_version: str | None = None
    _task: asyncio.Task[None] | None = None
    _events: list[tuple[dict[str, Any], str, str, str]] = field(default_factory=list)

    def trigger(self, reason: str = "", *, immediate: bool = False) -> None:
        """A scheduling event; ``immediate`` skips the debounce (a new DLJob waits
        for nothing but a pass already in flight)."""
        self._immediate = self._immediate or immediate
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="powerflow-allocation-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        wake_at: float | None = None
        while True:
            timeout = self.budget.interval_s
            if wake_at is not None:
                timeout = min(timeout, max(wake_at - self.clock(), 0.0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            if not self._immediate:
                await asyncio.sleep(self.config.debounce_s)
            self._wake.clear()
            self._immediate = False
            try:
                wake_at = await self.run_once()
            except Exception:  # keep serving: the next event or tick retries
                log.exception("allocation pass failed")
                wake_at = self.clock() + 1.0

    def _budget(self, state: ClusterState) -> None:
        cm = state.budget
        if cm is None:
            self.metrics.budget_valid.set(1)
            return
        try:
            self.budget = parse_budget(cm.get("data"))
            self.metrics.budget_valid.set(1)
            self._bad_budget_version = None
        except ResourceError as exc:
            self.metrics.budget_valid.set(0)
            version = cm.get("metadata", {}).get("resourceVersion")
            if version != self._bad_budget_version:
                self._bad_budget_version = version
                self.metrics.invalid_budget.inc()
                log.warning("invalid budget ConfigMap, keeping the last good one: %s", exc)
                self._event(cm, "Warning", "InvalidBudget", f"{exc}; keeping the last good budget")

    def _event(self, body: Any, type_: str, reason: str, message: str) -> None:
        if self.post_events:
            self._events.append((body, type_, reason, message))

    async def run_once(self) -> float | None:
        """One pass: read, decide, act. Returns when the loop must wake at the latest."""
        started = time.perf_counter()
        state = await self.kube.read(self.config.budget_namespace, self.config.budget_name)
        self._budget(state)
        nodes, left_out = cluster_nodes(state.nodes)
        if left_out:
            log.warning("nodes of another shape left out: %s", ", ".join(left_out))
        now = self.clock()
        actions = reconcile(
            state.jobs,
            nodes,
            self.budget,
            now,
            self.policy,
            self.models,
            self._anchors,
            profiling_window_s=self.config.profiling_window_s,
            requests=self._requests,
            refused=self._refused,
        )
        self._anchors = actions.anchors
        self._refused = {}
        try:
            refused = await self.kube.apply(actions)
        except WritesFailed as exc:  # the pass fails (retried); its refusals still count
            self._refused = by_job(exc.refusals)
            raise
        self._refused = by_job(refused)
        self._after(actions)
        events, self._events = self._events, []
        await self.kube.post_events(events)
        self.metrics.loop_seconds.observe(time.perf_counter() - started)
        self.passes += 1
        if any(r.verb == "create" for r in refused):
            return now  # report the refusals and start the backoff at once
        return actions.wake_at_s

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
            self.metrics.budget_watts.set(actions.plan.limit_watts)
            self.metrics.predicted_watts.set(actions.plan.predicted_watts)
        self.metrics.allocated_gpus.set(actions.allocated_gpus)
        self.metrics.set_phases(actions.phases)
