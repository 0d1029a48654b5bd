"""The collector's time over cycles of an allocation pass and its writes.

What ``gc_pause.paused`` does at the end of a pass decides what the pass's
output costs the collector: a young collection walks every body it built
(all alive until written) and promotes them to be walked again, while moving
every tracked object to the oldest generation (``gc.freeze`` then
``gc.unfreeze``, what ``paused`` does) walks nothing. Each cycle here is one
cold pass (1,024 new jobs on 4,096 GPUs, as ``operator_bench``) under each
ending, then its writes as the Kubernetes client makes them (every created
body and status patch through ``ApiClient.sanitize_for_serialization`` and
``json.dumps``); the table gives, per cycle, the thread's CPU time of the
cycle and of the pass, and the collector's time (``gc.callbacks``, all
generations, inside the pass or not), so a collection moved out of the pass
shows in the cycle's figures.

    python -m benchmarks.operator_gc_bench [--cycles 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from kubernetes.client import ApiClient
from powerflow.operator.actions import Actions
from powerflow.operator.jobs import JobRequest, RequestCache
from powerflow.operator.pass_inputs import PassMemory
from powerflow.operator.reconcile import reconcile
from rich.console import Console
from rich.table import Table

from benchmarks.operator_bench import scenario
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.lab.synthetic import SyntheticModel


def _young() -> None:
    gc.collect(0)


def _promote() -> None:
    gc.freeze()
    gc.unfreeze()


ENDINGS: dict[str, Callable[[], None]] = {
    "young collection": _young,
    "promotion (gc_pause)": _promote,
}


@contextmanager
def _paused(ending: Callable[[], None]) -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        ending()
        gc.enable()


class _CollectorTime:
    """The thread CPU time spent in collections (``gc.callbacks``) while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._start


def cycles(count: int, jobs: int = 1024, node_count: int = 512) -> dict[str, np.ndarray]:
    """Per ending: (cycle CPU, pass CPU, collector) seconds of each cycle."""
    nodes, observed, models, budget = scenario(jobs, node_count)
    policy = PowerFlowPolicy()
    api = ApiClient()

    def model(job: JobRequest) -> SyntheticModel:
        return models[job.name]

    def cold() -> Actions:
        return reconcile(
            observed, nodes, budget, 1e6, policy, model, PassMemory(requests=RequestCache())
        )

    out: dict[str, np.ndarray] = {}
    for label, ending in ENDINGS.items():
        for _ in range(2):  # warm: compiled kernels loaded, caches filled
            with _paused(ending):
                cold()
        gc.collect()
        rows = []
        for _ in range(count):
            collector = _CollectorTime()
            gc.callbacks.append(collector)
            try:
                c0 = time.thread_time()
                with _paused(ending):
                    actions = cold()
                c1 = time.thread_time()
                for body in actions.create:
                    json.dumps(api.sanitize_for_serialization(body))
                for _, _, patch in actions.status_first + actions.status:
                    json.dumps(api.sanitize_for_serialization(patch))
                del actions
                c2 = time.thread_time()
            finally:
                gc.callbacks.remove(collector)
            rows.append((c2 - c0, c1 - c0, collector.seconds))
        out[label] = np.asarray(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=10)
    args = parser.parse_args(argv)
    table = Table(
        title="operator: a cold pass of 1,024 jobs / 4,096 GPUs and its writes, "
        "median ms per cycle (thread CPU time)"
    )
    for col in ("end of the pass", "n", "cycle", "pass", "collector"):
        table.add_column(col, justify="left" if col == "end of the pass" else "right")
    for label, rows in cycles(args.cycles).items():
        cycle, pass_, collector = np.median(rows, axis=0) * 1e3
        table.add_row(label, str(len(rows)), f"{cycle:.1f}", f"{pass_:.1f}", f"{collector:.1f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
