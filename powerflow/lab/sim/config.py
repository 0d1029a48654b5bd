"""The simulated cluster and the simulator's own knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.policy.snapshot import Node

DEFAULT_NODES = 64
DEFAULT_GPUS_PER_NODE = 8

RESTART_S = 30.0
"""Checkpoint-restart cost of a rescale, migration or resume. Published
measurements put a stop-checkpoint-restart of a PyTorch data-parallel job at
tens of seconds: Pollux (OSDI'21) reports 15-120 s per re-allocation, mostly
container start and model load, and models it as a fixed delay; ElasticFlow
and AFS assume similar fixed costs. 30 s is the lower-middle of that range,
neither flattering elastic schedulers (which rescale often) nor punishing
them."""

BATCH_S = 60.0
"""Scheduling events closer than this to the previous decision wait for one
joint decision at this distance from it, as an operator reconciling in batches
does. With ~8,000 events in the busy first day of the ITP trace (arrivals,
pre-run and profiling ends, completions) this cuts policy calls severalfold;
a job waits at most a minute longer for its first GPUs."""


SAMPLE_WINDOW_S = 5.0
"""The node agent's sample window (``powerflow nodeagent --window``): a profiling
slice of ``s`` seconds reports ``floor(s / 5)`` samples (at least one). The agent
also closes a short window at each clock change; the simulator leaves that
shorter, noisier tail out, so the paper's 11.4 s slices give two rows each, not
three. Each row carries the profiler's full noise, as one slice's did."""

POWER_ON_S = 300.0
"""Seconds from powering a node on until a job can run on it (firmware
self-test, OS, kubelet, GPU driver). The model is that of Gandhi,
Harchol-Balter and Adan ("Server farms with setup costs", Performance
Evaluation 67, 2010): a server is on, off or in setup, and setup costs time
and, in data centers, power. The same group's work on switching servers off
uses a 200 s setup delay for a commodity server; an 8-GPU server trains far
more memory and brings up its GPUs and NVSwitches before the driver is up,
so 300 s is taken here. The cost falls on every scheduler alike;
``power_on_s=0`` makes powering on free."""

INTERVAL_S = 600.0
"""Periodic re-evaluation, besides arrivals, completions and profiling ends:
short next to jobs lasting hours (median 2.3 h in the ITP window), long enough
that the multi-day tail of the trace does not become thousands of calls."""


@dataclass(frozen=True)
class SimConfig:
    """How the simulator runs: cluster shape, costs, noise and seed.

    ``noise`` is the relative (log-normal) noise of profiling measurements.
    ``horizon_s`` stops a run that has not drained (a SimulationError).

    ``idle_nodes_off`` (default): a node that holds no job after a scheduling
    decision is switched off and draws nothing, whatever the scheduler: any
    operator can switch an empty node off, so no scheduler is charged idle
    power for nodes it leaves empty. False is the paper's setting: only the
    nodes a plan lists in ``powered_down_nodes`` (PowerFlow's) are off, and
    every other node draws idle power for the whole run. In both settings a
    node that is off and gets a job first boots for ``power_on_s`` (see
    ``POWER_ON_S``): its GPUs draw idle power meanwhile (the power-on energy)
    and the job starts when the boot ends.
    """

    nodes: int = DEFAULT_NODES
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    gpu: GpuSpec = A100
    interval_s: float = INTERVAL_S
    batch_s: float = BATCH_S
    restart_s: float = RESTART_S
    noise: float = 0.03
    seed: int = 0
    horizon_s: float = 120 * 86400.0
    idle_nodes_off: bool = True
    power_on_s: float = POWER_ON_S
    sample_window_s: float = SAMPLE_WINDOW_S

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise SimulationError("the cluster needs at least one node with one GPU")
        if self.interval_s <= 0 or self.restart_s < 0 or self.noise < 0 or self.batch_s < 0:
            raise SimulationError("interval must be positive, restart cost and noise >= 0")
        if not 0 < self.sample_window_s < math.inf:
            raise SimulationError("the sample window must be a positive number of seconds")
        if not 0 <= self.power_on_s < math.inf:
            raise SimulationError("power-on time must be a finite number of seconds >= 0")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> tuple[str, ...]:
        width = len(str(self.nodes - 1))
        return tuple(f"node-{i:0{width}d}" for i in range(self.nodes))

    def make_nodes(self, powered_down: frozenset[str] = frozenset()) -> tuple[Node, ...]:
        return tuple(
            Node(name, self.gpus_per_node, self.gpu, name not in powered_down)
            for name in self.node_names()
        )
