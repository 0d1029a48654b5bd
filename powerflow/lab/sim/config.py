"""The simulated cluster and the simulator's own knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
class NodePool:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of type ``gpu``: one pool of a mixed
    cluster (a job runs in one pool at a time, ``powerflow.core.policy.fleet``)."""

    gpu: GpuSpec
    nodes: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise SimulationError(f"pool {self.describe()}: needs at least one node with one GPU")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        """``TYPE:NODESxGPUS``, as ``powerflow simulate --nodes`` takes it."""
        return f"{self.gpu.name}:{self.nodes}x{self.gpus_per_node}"


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

    ``pools``: a mixed cluster, one ``NodePool`` per GPU type and node size, in
    the order given (the first pool's type runs the offline pre-runs and is
    ``gpu``). ``nodes``, ``gpus_per_node`` and ``gpu`` are then derived from them
    (all nodes; the first pool's node size and type); a value given for one that
    is neither its default nor the derived value is refused. One pool is the
    plain cluster of one type: it is stored as ``nodes``, ``gpus_per_node`` and
    ``gpu`` with no pools, so it is the very configuration (and the same run) as
    giving those three. Empty (default): a cluster of one type.
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
    pools: tuple[NodePool, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.pools:
            self._derive_from_pools()
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise SimulationError("the cluster needs at least one node with one GPU")
        if self.interval_s <= 0 or self.restart_s < 0 or self.noise < 0 or self.batch_s < 0:
            raise SimulationError("interval must be positive, restart cost and noise >= 0")
        if not 0 < self.sample_window_s < math.inf:
            raise SimulationError("the sample window must be a positive number of seconds")
        if not 0 <= self.power_on_s < math.inf:
            raise SimulationError("power-on time must be a finite number of seconds >= 0")

    def _derive_from_pools(self) -> None:
        keys = [(p.gpu.name, p.gpus_per_node) for p in self.pools]
        twice = sorted({f"{k[0]}:x{k[1]}" for k in keys if keys.count(k) > 1})
        if twice:
            raise SimulationError(
                f"pool {twice[0]} is given twice; give each GPU type and node size once"
            )
        first = self.pools[0]
        derived = {
            "nodes": sum(p.nodes for p in self.pools),
            "gpus_per_node": first.gpus_per_node,
            "gpu": first.gpu,
        }
        defaults = {"nodes": DEFAULT_NODES, "gpus_per_node": DEFAULT_GPUS_PER_NODE, "gpu": A100}
        for name, value in derived.items():
            given = getattr(self, name)
            if given != value and given != defaults[name]:
                raise SimulationError(
                    f"{name}={given} contradicts the pools {self.describe_nodes()}"
                )
            object.__setattr__(self, name, value)
        if len(self.pools) == 1:
            object.__setattr__(self, "pools", ())

    @property
    def mixed(self) -> bool:
        """Whether the cluster has more than one pool (GPU type or node size)."""
        return len(self.pools) > 1

    @property
    def node_pools(self) -> tuple[NodePool, ...]:
        """The cluster's pools: ``pools``, or the one pool of a one-type cluster."""
        return self.pools or (NodePool(self.gpu, self.nodes, self.gpus_per_node),)

    def describe_nodes(self) -> str:
        """The pools as ``powerflow simulate --nodes`` takes them: ``A100:2x8,H100-SXM:2x8``."""
        return ",".join(p.describe() for p in self.node_pools)

    @property
    def total_gpus(self) -> int:
        if self.pools:
            return sum(p.gpus for p in self.pools)
        return self.nodes * self.gpus_per_node

    @property
    def max_job_gpus(self) -> int:
        """The most GPUs one job can hold: the cluster's, or its largest pool's (a job
        runs in one pool at a time)."""
        return max(p.gpus for p in self.node_pools)

    def node_names(self) -> tuple[str, ...]:
        width = len(str(self.nodes - 1))
        return tuple(f"node-{i:0{width}d}" for i in range(self.nodes))

    def node_types(self) -> tuple[tuple[str, int, GpuSpec], ...]:
        """Each node's (name, GPUs, type), pools in order."""
        names = iter(self.node_names())
        return tuple(
            (next(names), pool.gpus_per_node, pool.gpu)
            for pool in self.node_pools
            for _ in range(pool.nodes)
        )

    def make_nodes(self, powered_down: frozenset[str] = frozenset()) -> tuple[Node, ...]:
        if self.pools:
            return tuple(
                Node(name, gpus, gpu, name not in powered_down)
                for name, gpus, gpu in self.node_types()
            )
        return tuple(
            Node(name, self.gpus_per_node, self.gpu, name not in powered_down)
            for name in self.node_names()
        )
