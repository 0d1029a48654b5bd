"""The twin of a mixed cluster: one A100 node and one H100 node of 8 GPUs each, every
component as a process, a few jobs of the mini trace to completion
(``powerflow.lab.twin``, ``Twin(nodes=(A100, H100))``).

The operator plans both pools under one budget (``FleetPolicy``) and the extender places
each gang in the pool its plan names: every worker's clock is one of its node's type's
clocks, both nodes train, and the power the GPUs themselves draw (their energy counters,
one-second means) keeps the budget of both types, ``eta x 8 x (P_max(A100) +
P_max(H100))``, once a scheduling interval has passed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.twin_budget import TOLERANCE, PowerLog

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS
from powerflow.lab.twin.harness import Timing, Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import NAMESPACE, mini_trace

H100 = GPU_SPECS["H100-SXM"]
SCALE = TimeScale(0.007)
ETA = 0.5
JOBS = 10
TIMEOUT_S = 300


class ClockLog:
    """Every bound worker's node and clock annotation, polled every 0.2 s."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.seen: dict[tuple[str, str], str] = {}
        """(pod, node) -> its ``frequency-mhz`` annotation ("" without one)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="clock-log", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        assert self.twin.client is not None
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        while not self._stop.wait(0.2):
            try:
                pods = self.twin.client.get(path).json()["items"]
            except Exception:  # the API server under load: the next poll
                continue
            for pod in pods:
                node = pod.get("spec", {}).get("nodeName")
                if not node:
                    continue
                annotations = pod["metadata"].get("annotations") or {}
                clock = annotations.get(contract.FREQUENCY_ANNOTATION, "")
                self.seen[pod["metadata"]["name"], node] = clock

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.timeout(TIMEOUT_S + 120)
def test_a_mixed_twin_runs_each_gang_at_its_types_clocks_within_one_budget(
    tmp_path: Path,
) -> None:
    jobs = mini_trace(JOBS, SCALE, max_duration_s=3000)
    timing = Timing()
    interval = SCALE(timing.interval_s)
    limit = ETA * 8 * (A100.p_max_w + H100.p_max_w)
    with Twin(tmp_path, nodes=(A100, H100), gpus_per_node=8, scale=SCALE, eta=ETA) as twin:
        types = twin.gpu_types
        clocks = ClockLog(twin)
        power = PowerLog(twin)
        began = time.monotonic()
        try:
            result = twin.run(jobs, timeout_s=TIMEOUT_S)
        finally:
            ended = time.monotonic()
            power.close()
            clocks.close()
    on = {node: sum(1 for _, n in clocks.seen if n == node) for node in types}
    print(f"workers seen by node: {on}")
    assert sorted(j.phase for j in result.jobs) == ["Succeeded"] * JOBS
    assert clocks.seen, "no bound worker was ever seen"
    wrong = {
        (pod, node, clock)
        for (pod, node), clock in clocks.seen.items()
        if clock and int(clock) not in types[node].clocks_mhz
    }
    assert wrong == set(), "clocks of another type than the node's"
    assert {node for _, node in clocks.seen} == set(types), "both pools train"
    means = power.between(began + interval, ended)
    over = [w for w in means if w > limit * (1 + TOLERANCE)]
    peak = max(means, default=0.0)
    print(f"limit {limit:.0f} W, peak one-second mean {peak:.0f} W, run {ended - began:.0f} s")
    assert over == [], f"over the limit {limit:.0f} W: max {max(over):.0f} W"
