"""Prometheus metrics of the operator, in a registry of its own (one per operator,
so tests may run several) served on the operator's metrics port."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("Pending", "Profiling", "Running", "Rescaling", "Succeeded", "Failed")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.budget_watts = Gauge(
            "powerflow_power_budget_watts",
            "Cluster power limit the policy planned for.",
            registry=r,
        )
        self.predicted_watts = Gauge(
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

    def set_phases(self, phases: Mapping[str, int]) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(phases.get(phase, 0))
