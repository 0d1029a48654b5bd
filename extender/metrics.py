"""Prometheus metrics of one extender app, in a registry of its own.

A registry per app (not the global one) so that tests and benchmarks can
create many apps in one process without duplicate-metric errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Filter and prioritize answer in microseconds to milliseconds; bind waits on the API.
_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


VERBS = ("filter", "prioritize", "bind")
BIND_RESULTS = ("bound", "already_bound", "refused", "failed")


class Metrics:
    """Request latency and outcomes per verb, bind results, and the cache's size."""

    def __init__(self, gauges: Callable[[], Mapping[str, float]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "powerflow_extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call.",
            ["verb"],
            buckets=_BUCKETS_S,
            registry=self.registry,
        )
        self.requests = Counter(
            "powerflow_extender_requests",
            "Extender calls by verb and outcome (ok, error: answered with Error set).",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.binds = Counter(
            "powerflow_extender_binds",
            "Bind calls by result (bound, already_bound, refused, failed).",
            ["result"],
            registry=self.registry,
        )
        # Every known series from the start, at 0: a rate over a series that does not
        # exist yet is no data, and the dashboard's errors and failed binds panels
        # would read "No data" on a healthy cluster instead of 0.
        for verb in VERBS:
            self.latency.labels(verb)  # else a first burst of calls is no rate at all
            for outcome in ("ok", "error"):
                self.requests.labels(verb, outcome)
        for result in BIND_RESULTS:
            self.binds.labels(result)
        self.expired = Counter(
            "powerflow_extender_reservations_expired",
            "Gang reservations that did not complete within the TTL.",
            registry=self.registry,
        )
        cache = Gauge(
            "powerflow_extender_cache_objects",
            "Objects in the extender's cache (nodes, pods, gangs, pending_gangs).",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("nodes", "pods", "gangs", "pending_gangs"):
            cache.labels(kind).set_function(_reader(gauges, kind))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _reader(gauges: Callable[[], Mapping[str, float]], kind: str) -> Callable[[], float]:
    return lambda: float(gauges().get(kind, 0.0))
