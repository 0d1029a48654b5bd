"""A simulated node for the telemetry tests: pods, GPUs, a clock, and the part of
the control loop that telemetry leans on (locking each pod's clock).

The GPUs are ``SimulatedGpus`` on a fake clock, so the energy the windows
measure is the ground truth's with its noise; workers report whenever their
GPU completes an iteration (checked every ``dt`` of simulated time), as the
worker library does at iteration boundaries.
"""

from __future__ import annotations

import json
from typing import Any

from powerflow.nodeagent.iterations import IterationReport
from powerflow.nodeagent.pods import PodKey, PodView, pod_view
from powerflow.nodeagent.sender import Batching, IngestConnection, SampleSender
from powerflow.nodeagent.telemetry import Telemetry

from powerflow.core import contract
from powerflow.core.devices import Workload
from powerflow.core.telemetry import WindowSample
from powerflow.lab.groundtruth import ground_truth
from powerflow.lab.simulated_gpus import SimulatedGpus

EPOCH_S = 1.8e9
"""Unix time at the simulated node's time 0 (samples carry Unix time)."""
NODE = "node-a"
MODEL = "resnet50"
START_S = 1_700_000_000.0


def worker(
    job: str,
    index: int,
    *,
    n: int = 4,
    per_node: int = 2,
    generation: int = 1,
    batch: int = 64,
    frequency: int = 1200,
    profile: dict[str, Any] | None = None,
    node: str = NODE,
    phase: str = "Running",
) -> PodView:
    """The view of worker ``index`` of ``job`` as the operator and extender write it."""
    block = [[node if i < per_node else "node-z", i % per_node] for i in range(n)]
    annotations = {
        contract.WORKERS_ANNOTATION: str(n),
        contract.FREQUENCY_ANNOTATION: str(frequency),
        contract.GENERATION_ANNOTATION: str(generation),
        contract.PLACEMENT_ANNOTATION: json.dumps({"node": node, "block": block}),
        contract.MODEL_ANNOTATION: MODEL,
    }
    if profile is not None:
        annotations[contract.PROFILE_ANNOTATION] = json.dumps(profile)
    name = f"{job}-g{generation}-w{index}"
    return pod_view(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{name}",
                "labels": {contract.JOB_LABEL: job, contract.WORKER_INDEX_LABEL: str(index)},
                "annotations": annotations,
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "trainer",
                        "env": [{"name": "LOCAL_BATCH_SIZE", "value": str(batch)}],
                        "resources": {"limits": {contract.GPU_RESOURCE: "1"}},
                    }
                ],
            },
            "status": {"phase": phase},
        }
    )


def truth_per_gpu(view: PodView, frequency_mhz: int) -> tuple[float, float]:
    """Ground-truth step time (s) and energy per iteration of ONE of the job's GPUs (J)."""
    assert view.n and view.gpus_per_node and view.local_batch_size
    t = ground_truth(MODEL)
    args = (view.n, view.gpus_per_node, view.local_batch_size, frequency_mhz)
    return float(t.step_time_s(*args)), float(t.energy_per_iter_j(*args)) / view.n


class SimNode:
    """One node: simulated GPUs, the node's pods, telemetry, and clock locking."""

    def __init__(self, *, window_s: float = 5.0, seed: int = 0, gpus: int = 4) -> None:
        self.now_s = START_S
        self.gpus = SimulatedGpus(gpus, node=NODE, seed=seed, clock=lambda: self.now_s)
        self.locked: dict[int, int] = {}
        self.sender = SampleSender(
            IngestConnection("http://127.0.0.1:9"), NODE, batching=Batching(queue_max=100_000)
        )
        self.telemetry = Telemetry(
            node=NODE,
            devices=self.gpus,
            clock=lambda: self.now_s,
            window_s=window_s,
            sender=self.sender,
            locked_clock_of=self.locked.get,
            wall=lambda: EPOCH_S + self.now_s,
        )
        self.telemetry.on_clock_change = self.apply_clocks
        self.pods: dict[PodKey, PodView] = {}
        self.gpus_of: dict[PodKey, tuple[int, ...]] = {}
        self.reported: dict[PodKey, int] = {}
        self.clock_changes = 0
        self.lock = True

    def place(self, view: PodView, gpu: int) -> None:
        """The pod starts on ``gpu`` (its worker's iterations count from zero)."""
        assert view.n and view.gpus_per_node and view.local_batch_size
        self.pods[view.key] = view
        self.gpus_of[view.key] = (gpu,)
        workload = Workload(MODEL, view.n, view.gpus_per_node, view.local_batch_size)
        self.gpus.assign(gpu, workload)
        self.reported.pop(view.key, None)
        self.sync()

    def update(self, view: PodView) -> None:
        """The pod's annotations changed (the watch saw it)."""
        self.pods[view.key] = view
        self.sync()

    def remove(self, key: PodKey) -> None:
        self.pods.pop(key)
        for g in self.gpus_of.pop(key):
            self.gpus.clear(g)
        self.sync()

    def sync(self) -> None:
        self.telemetry.sync(self.pods, self.gpus_of)
        self.apply_clocks()

    def apply_clocks(self) -> None:
        """What the control loop does: each pod's GPUs at the sweep's clock or its own."""
        self.clock_changes += 1
        if not self.lock:
            return
        for key, view in self.pods.items():
            clock = self.telemetry.clock_for(key) or view.frequency_mhz
            assert clock is not None
            for g in self.gpus_of[key]:
                if self.locked.get(g) != clock:
                    self.gpus.lock_clocks_mhz(g, clock, clock)
                    self.locked[g] = clock

    def report(self, key: PodKey, iterations: int) -> str | None:
        view = self.pods[key]
        r = IterationReport(view.namespace, view.name, view.uid, iterations, (), self.now_s)
        return self.telemetry.report(r)

    def run(self, seconds: float, dt: float = 0.01) -> list[tuple[float, PodKey]]:
        """Let ``seconds`` pass; every worker reports each iteration it completes.
        Returns when each report happened."""
        reports = []
        end = self.now_s + seconds
        while self.now_s < end - 1e-9:
            self.now_s += dt
            for key in sorted(self.pods):
                done = self.gpus.iterations_completed(self.gpus_of[key][0])
                if done > self.reported.get(key, -1):
                    self.reported[key] = done
                    assert self.report(key, done) is None
                    reports.append((self.now_s, key))
        return reports

    def samples(self) -> list[WindowSample]:
        return list(self.sender.queued())
