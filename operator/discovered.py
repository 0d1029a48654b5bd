"""The GPU types the node agents discovered, per node, as the operator plans with them.

Each agent reports its GPUs (``powerflow.core.gpu_facts``) to the ingest at start
and every few minutes; the ingest records the spec a report gives here, and the
allocation pass (``nodes.cluster_nodes``) and the ingest's physics checks
(``sample_checks.node_gpus``) read it: discovered facts beat the catalogue.
Nothing is written to the API server, so the agents need no right to write
nodes; a restarted operator learns every node again from the next reports, and
plans from the labels until then.

A node's entry goes when the node leaves the cluster (``keep_only``) or when its
agent stops reporting for ``STALE_S`` (a node whose agent was replaced by one
that cannot read NVML must not keep an old type for ever). A node reports at
most once per ``MIN_INTERVAL_S``: more is refused (``too_often``), so a sender
cannot make the ingest rebuild specs in a loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from powerflow.core.gpus import GpuSpec

MIN_INTERVAL_S = 10.0
"""Least time between two accepted reports of one node (an agent sends one every 300 s)."""
STALE_S = 3600.0
"""A node's discovered type is forgotten this long after its last report."""


class DiscoveredGpus:
    """Node name -> (its discovered spec, when it was reported)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._specs: dict[str, tuple[GpuSpec, float]] = {}

    def too_soon(self, node: str) -> bool:
        """Whether ``node`` reported less than ``MIN_INTERVAL_S`` ago."""
        kept = self._specs.get(node)
        return kept is not None and self._clock() - kept[1] < MIN_INTERVAL_S

    def record(self, node: str, spec: GpuSpec) -> None:
        self._specs[node] = (spec, self._clock())

    def specs(self) -> dict[str, GpuSpec]:
        """The fresh entries (stale ones are dropped here)."""
        now = self._clock()
        for node in [n for n, (_, at) in self._specs.items() if now - at > STALE_S]:
            del self._specs[node]
        return {node: spec for node, (spec, _) in self._specs.items()}

    def keep_only(self, nodes: Iterable[str]) -> None:
        """Forget the nodes that left the cluster."""
        keep = set(nodes)
        for node in [n for n in self._specs if n not in keep]:
            del self._specs[node]
