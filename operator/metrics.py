"""Prometheus metrics of the operator, in a registry of its own (one per operator,
so tests may run several) served on the operator's metrics port."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.operator.allocation import read_allocation
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from powerflow.core.timefmt import parse_time

PHASES = ("Pending", "Profiling", "Running", "Rescaling", "Succeeded", "Failed")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge(
            "powerflow_operator_leader",
            "1 on the operator replica that holds the Lease (it plans and takes the agents' "
            "samples), 0 on the others: the alert that no replica leads, and the replica "
            "whose gauges the dashboard reads.",
            registry=r,
        )
        self.budget_watts = Gauge(
            "powerflow_power_budget_watts",
            "Cluster power limit the policy planned for.",
            registry=r,
        )
        self.predicted_w = Gauge(
            "powerflow_predicted_power_watts",
            "Predicted cluster GPU power of the plan.",
            registry=r,
        )
        self.allocated_gpus = Gauge(
            "powerflow_allocated_gpus", "GPUs allocated to running DLJobs.", registry=r
        )
        self.jobs = Gauge("powerflow_jobs", "DLJobs by phase.", ["phase"], registry=r)
        self.loop_seconds = Histogram(
            "powerflow_allocation_loop_seconds",
            "Duration of one allocation pass (read, plan, act).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.last_pass = Gauge(
            "powerflow_allocation_last_pass_timestamp_seconds",
            "Unix time when the last allocation pass went through (at start, and when "
            "this replica took the Lease: then): how long nothing was planned, failed "
            "passes and hung ones alike.",
            registry=r,
        )
        self.scheduling_interval = Gauge(
            "powerflow_scheduling_interval_seconds",
            "The budget's schedulingIntervalSeconds in force: the longest an idle cluster "
            "goes without a pass (the stalled-allocation alert allows for it).",
            registry=r,
        )
        self.pass_failures = Counter(
            "powerflow_allocation_pass_failures",
            "Allocation passes that failed; each is tried again after a back-off (0.5 s "
            "doubling to 30 s, 5 s at most after failed writes, or the API server's "
            "Retry-After): the log has the error.",
            registry=r,
        )
        self.invalid_budget = Counter(
            "powerflow_invalid_budget", "Budget ConfigMap updates refused as invalid.", registry=r
        )
        self.budget_valid = Gauge(
            "powerflow_budget_valid", "1 if the budget ConfigMap is valid, else 0.", registry=r
        )
        self.cluster_power_watts = Gauge(
            "powerflow_cluster_power_watts",
            "Measured GPU board power of the cluster: the latest reading of each node "
            "agent, summed (readings older than the staleness bound left out).",
            registry=r,
        )
        self.ingest_samples = Counter(
            "powerflow_ingest_samples",
            "Window samples the ingest endpoint accepted from node agents.",
            registry=r,
        )
        self.ingest_refused = Counter(
            "powerflow_ingest_refused",
            "Requests (or, for per-sample reasons, samples) the ingest endpoint refused, "
            "by reason.",
            ["reason"],
            registry=r,
        )
        self.ingest_sender_refused = Counter(
            "powerflow_ingest_samples_refused",
            "Samples the ingest endpoint refused, by the node whose agent sent them and "
            "reason (operator/sample_checks.py): a node that keeps sending impossible "
            "samples is broken or compromised.",
            ["sender_node", "reason"],
            registry=r,
        )
        self.nodes_unknown_gpu = Gauge(
            "powerflow_nodes_unknown_gpu",
            "Nodes with GPUs whose type neither their node agent reported nor the catalogue "
            "knows from their product label: planned for GPU counts only, no clock or power "
            "limit set on them.",
            registry=r,
        )
        self.gpu_reports = Counter(
            "powerflow_ingest_gpu_reports",
            "GPU reports (what a node agent read of its GPUs through NVML) the ingest took.",
            registry=r,
        )
        self.gpu_reports_refused = Counter(
            "powerflow_ingest_gpu_reports_refused",
            "GPU reports the ingest refused, by reason (operator/ingest.py).",
            ["reason"],
            registry=r,
        )
        self.power_outliers = Counter(
            "powerflow_power_outliers",
            "Jobs whose measured power was so far from the plan's (outside "
            "powerflow.core.policy.power_ratio.BELIEVED) that it was recorded instead of "
            "believed, counted once per job and configuration.",
            registry=r,
        )

        self.cluster_gpus = Gauge(
            "powerflow_cluster_gpus",
            "GPUs of the planned pool: total, powered (on nodes the plan keeps on) "
            "and allocated (to running DLJobs).",
            ["state"],
            registry=r,
        )
        # Not ``namespace``/``job``: Prometheus sets those on every scraped series (the
        # target's), and would rename ours to ``exported_*``.
        job = ["dljob_namespace", "dljob"]
        self.job_gpus = Gauge("powerflow_job_gpus", "GPUs allocated to a DLJob.", job, registry=r)
        self.job_frequency = Gauge(
            "powerflow_job_frequency_hertz", "GPU core clock of a DLJob's workers.", job, registry=r
        )
        self.job_iterations = Gauge(
            "powerflow_job_iterations",
            "Iterations a DLJob has done (reported, else estimated); its rate is the throughput.",
            job,
            registry=r,
        )
        self.job_fit_error = Gauge(
            "powerflow_job_fit_error_ratio",
            "The online-refitted model's error on the job's samples (MAPE, the larger of "
            "step time and energy), as a ratio.",
            job,
            registry=r,
        )
        self.job_completion = Histogram(
            "powerflow_job_completion_seconds",
            "Job completion time (creation to success) of DLJobs that finished.",
            buckets=(60, 300, 900, 1800, 3600, 7200, 14400, 28800, 57600, 86400, 172800, 604800),
            registry=r,
        )
        self._job_labels: set[tuple[str, str]] = set()

    def set_phases(self, phases: Mapping[str, int]) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(phases.get(phase, 0))

    def set_gpus(self, total: int, powered: int, allocated: int) -> None:
        for state, value in (("total", total), ("powered", powered), ("allocated", allocated)):
            self.cluster_gpus.labels(state=state).set(value)

    def set_jobs(self, series: Sequence[JobSeries]) -> None:
        """One series per DLJob that exists; a deleted job's series go with it."""
        per_job = (self.job_gpus, self.job_frequency, self.job_iterations, self.job_fit_error)
        seen = set()
        for s in series:
            labels = (s.namespace, s.name)
            seen.add(labels)
            self.job_gpus.labels(*labels).set(s.gpus)
            self.job_frequency.labels(*labels).set(s.frequency_mhz * 1e6)
            self.job_iterations.labels(*labels).set(s.iterations)
            if s.fit_error_percent is not None:
                self.job_fit_error.labels(*labels).set(s.fit_error_percent / 100.0)
            if s.completion_s is not None:
                self.job_completion.observe(s.completion_s)
        for labels in self._job_labels - seen:
            for metric in per_job:
                with contextlib.suppress(KeyError):  # never set (no fit yet)
                    metric.remove(*labels)
        self._job_labels = seen


@dataclass(frozen=True)
class JobSeries:
    """What the dashboard shows of one DLJob, as its status reads after a pass."""

    namespace: str
    name: str
    gpus: int
    frequency_mhz: int
    iterations: int
    fit_error_percent: float | None
    completion_s: float | None
    """Job completion time (creation to completion), set only in the pass that
    records the completion: the histogram counts each job once per operator."""


def job_series(
    bodies: Sequence[Mapping[str, Any]], patches: Sequence[tuple[str, str, Mapping[str, Any]]]
) -> list[JobSeries]:
    """Each job's series from its body's status merged with this pass's patches.

    Pure and forgiving: a field that is missing or not a number counts as 0 (or
    None), since a status written by someone else must not break the metrics.
    """
    patched: dict[tuple[str, str], dict[str, Any]] = {}
    for namespace, name, patch in patches:
        patched.setdefault((namespace, name), {}).update(patch)
    out = []
    for body in bodies:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        status = {**(body.get("status") or {}), **patched.get(key, {})}
        allocation = read_allocation(status.get("allocation"))
        progress = _mapping(status.get("progress"))
        model = _mapping(status.get("model"))
        completion_s = None
        new = patched.get(key, {})
        if new.get("phase") == "Succeeded" and new.get("completionTime"):
            created = parse_time(meta.get("creationTimestamp"))
            done = parse_time(new.get("completionTime"))
            if created is not None and done is not None and done >= created:
                completion_s = done - created
        error = _number(model.get("fitErrorPercent"))
        out.append(
            JobSeries(
                namespace=key[0],
                name=key[1],
                gpus=allocation.gpus,
                frequency_mhz=allocation.frequency_mhz,
                iterations=int(_number(progress.get("iterations")) or 0),
                fit_error_percent=error,
                completion_s=completion_s,
            )
        )
    return out


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
