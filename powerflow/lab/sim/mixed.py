"""The simulator's GPU types: what a job's type decides, and a mixed cluster's state.

Every job runs on one GPU type at a time (``OnType``, the job's ``on``): that
type's ground truth gives its progress, power and measurements, its clocks
bound the plan, its board's power-limit range clamps caps, its profiling
ladder is what a sweep runs, and its learner fits what the job shows there.
On a cluster of one type every job's ``on`` is that type's, set once.

On a mixed cluster (``SimConfig.pools``: A100 and H100 nodes, or two node
sizes) ``MixedCluster`` keeps the rest, beside the engine:

* per node, its type and size (idle power, boots, the GPUs a plan may name);
* per (job, type), what was learned there: a job's fitted model on a type it
  has not run on is that type's prior (fitted runs) or that type's ground
  truth (the oracle and the baselines), as the operator's learner keeps one
  per pool type; the pre-run's samples belong to the first pool's type, where
  the offline pre-run runs. A job that moves to another type takes up what it
  learned there (its samples, the GPU counts it profiled there) and leaves the
  rest for when it comes back: the move is a checkpoint-restart like any
  rescale, and a first run on a GPU count of the new type profiles it;
* what the snapshot shows: each job's models on every type of the cluster
  (``Job.models_by_gpu``), so that ``FleetPolicy`` ranks the pools by each
  type's own model;
* per type, the GPU-seconds and energy, for the run's totals
  (``result.GpuTypeTotals``).

The scheduler's policy plans each pool alone inside ``FleetPolicy``
(``fleet_policy``): PowerFlow per pool under one budget, and the baselines too,
each pool's own FIFO or LAS queue over the jobs the fleet sends it, a fixed
clock taken to each pool's type (``ClockOnType``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np

from powerflow.core.errors import SimulationError
from powerflow.core.gpus import GpuSpec
from powerflow.core.learning import FittedLearner, Knowledge, Learner, OracleLearner
from powerflow.core.models.protocol import PerfModel
from powerflow.core.models.samples import Samples
from powerflow.core.policy.fleet import FleetPolicy
from powerflow.core.policy.snapshot import GpuSlot, Job, Plan, Policy, Snapshot
from powerflow.core.profiling import ClockSweep
from powerflow.core.schedulers import Configured
from powerflow.lab.schedulers import clocks_on
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.jobs import SimJob
from powerflow.lab.sim.on_type import OnType
from powerflow.lab.sim.rates import TruthRates
from powerflow.lab.sim.result import GpuTypeTotals
from powerflow.lab.sim.world import World, default_world


def on_type(
    gpu: GpuSpec,
    world: World,
    learner: Learner,
    sweep: ClockSweep,
    rates: TruthRates | None = None,
) -> OnType:
    """``gpu``'s ``OnType``: its ground truth's rates (``rates``, else new ones)."""
    return OnType(
        gpu,
        world,
        rates if rates is not None else TruthRates(world.truth, gpu.clocks_mhz),
        learner,
        frozenset(gpu.clocks_mhz),
        sweep.clocks_mhz(gpu),
    )


def learner_on(learner: Learner, gpu: GpuSpec) -> Learner:
    """``learner`` for jobs on ``gpu``: a fitted learner with the same priors carried
    over to ``gpu`` (``FittedLearner.on``), the oracle as it is (it is handed each
    type's ground truth); another kind cannot say what it knows per type."""
    if isinstance(learner, FittedLearner):
        return learner.on(gpu)
    if isinstance(learner, OracleLearner):
        return learner
    raise SimulationError(
        f"a mixed cluster learns per GPU type; {type(learner).__name__} cannot"
        " (use FittedLearner or OracleLearner)"
    )


def fleet_policy(policy: Policy, frequency_mhz: int | None = None) -> Policy:
    """``policy`` for a mixed cluster: ``FleetPolicy`` with one copy of it per pool
    (copied before any plan, so no pool shares another's memo). A fixed-clock
    policy's ``frequency_mhz`` is an A100 clock, each pool's copy runs its type's clock
    at the same fraction of the top clock (``ClockOnType``). A ``FleetPolicy`` is
    kept as it is."""
    if isinstance(policy, FleetPolicy):
        return policy
    if frequency_mhz is not None:
        return FleetPolicy(lambda: ClockOnType(policy, frequency_mhz))
    return FleetPolicy(lambda: copy.deepcopy(policy))


class ClockOnType:
    """A fixed-clock baseline in one pool: its A100 clock taken to the pool's type.

    The baselines' clock knob (``frequency_mhz``) names one clock of one type; on
    a mixed cluster it is read as an A100 clock, as the evaluation's sweep is
    written (``DEFAULT_FREQUENCIES_MHZ``), and each pool runs the clock at the
    same fraction of its type's top clock (``clocks_on``): the A100's top clock
    is every type's top clock.
    """

    def __init__(self, policy: Policy, frequency_mhz: int) -> None:
        if not (is_dataclass(policy) and "frequency_mhz" in {f.name for f in fields(policy)}):
            raise SimulationError(f"{type(policy).__name__} has no clock to set per GPU type")
        self._policy: Policy = policy
        self._clock: int = frequency_mhz
        self._inner: Policy | None = None

    def plan(self, snapshot: Snapshot) -> Plan:
        if self._inner is None:  # a pool is one type: the first plan says which
            clock = clocks_on(snapshot.nodes[0].gpu, (self._clock,))[0]
            own: Any = copy.deepcopy(self._policy)  # a dataclass with the field (above)
            self._inner = replace(own, frequency_mhz=clock)
        return self._inner.plan(snapshot)


def for_cluster(configured: Configured, config: SimConfig) -> Configured:
    """The scheduler as it runs on ``config``: its policy inside ``FleetPolicy`` on a
    mixed cluster, itself on a cluster of one type."""
    if not config.mixed:
        return configured
    clock = configured.value if configured.knob == "frequency_mhz" else None
    policy = fleet_policy(configured.policy, None if clock is None else int(clock))
    return replace(configured, policy=policy)


_World = Callable[[GpuSpec], World]

_default_world: _World = functools.cache(default_world)
"""Each type's ground truth, built once per process (as the runner's)."""


@dataclass
class _Learned:
    """What a job learned on one type while it runs on another."""

    knowledge: Knowledge | None
    samples: list[Samples]
    profiled: set[int]


class MixedCluster:
    """A mixed cluster's per-node and per-(job, type) state (module doc).

    ``first`` is the first pool's type, which every job starts on (its pre-run
    runs there); ``world_on`` gives the ground truth of each other type.
    """

    def __init__(
        self,
        config: SimConfig,
        first: OnType,
        sweep: ClockSweep,
        world_on: _World = _default_world,
    ) -> None:
        types: dict[str, OnType] = {first.gpu.name: first}
        for pool in config.node_pools:
            if pool.gpu.name not in types:
                types[pool.gpu.name] = on_type(
                    pool.gpu, world_on(pool.gpu), learner_on(first.learner, pool.gpu), sweep
                )
        self.types = types
        self._order = tuple(types.values())
        self._index = {name: i for i, name in enumerate(types)}
        layout = config.node_types()
        self._node_type = {name: types[gpu.name] for name, _, gpu in layout}
        self._node_gpus = {name: gpus for name, gpus, _ in layout}
        self._node_kind = {name: self._index[gpu.name] for name, _, gpu in layout}
        k = len(self._order)
        self._all_gpus = np.zeros(k)
        for _, gpus, gpu in layout:
            self._all_gpus[self._index[gpu.name]] += gpus
        self._idle = np.array([t.gpu.idle_power_w for t in self._order])
        self._learned: dict[tuple[int, str], _Learned] = {}
        # per type, as of the last ``draw``: computing watts, busy and held GPUs
        self._active_w = np.zeros(k)
        self._busy = np.zeros(k)
        self._held = np.zeros(k)
        # per type, summed over the run
        self._busy_s = np.zeros(k)
        self._held_s = np.zeros(k)
        self._active_j = np.zeros(k)
        self._idle_j = np.zeros(k)

    # ------------------------------------------------------------ jobs and types

    def visible(self, job: SimJob) -> None:
        """The job's knowledge on every type but the one it is on (its prior there,
        or that type's ground truth), when it becomes schedulable."""
        name = job.trace.model_name
        for on in self._order:
            if on is not job.on:
                known = on.learner.initial(name, on.rates.model(name), None)
                self._learned[job.index, on.gpu.name] = _Learned(known, [], set())

    def type_of(self, job_id: str, placement: Sequence[GpuSlot]) -> OnType:
        """The one type of a plan's ``placement`` for job ``job_id``, every GPU on a
        node of the cluster (a job runs on one type at a time)."""
        kinds = set()
        for node, index in placement:
            gpus = self._node_gpus.get(node)
            if gpus is None or not 0 <= index < gpus:
                raise SimulationError(f"plan places job {job_id} on no GPU {node}/{index}")
            kinds.add(self._node_kind[node])
        if len(kinds) != 1:
            names = sorted(self._order[k].gpu.name for k in kinds)
            raise SimulationError(
                f"plan places job {job_id} on GPU types {', '.join(names)}: a job runs on one"
            )
        return self._order[kinds.pop()]

    def move(self, job: SimJob, placement: Sequence[GpuSlot]) -> None:
        """Put the job on its new placement's type: what it learned on the type it
        leaves is kept, what it learned on the new one taken up."""
        on = self._node_type[placement[0][0]]
        if on is job.on:
            return
        self._learned[job.index, job.on.gpu.name] = _Learned(
            job.knowledge, job.samples, job.profiled
        )
        kept = self._learned.pop((job.index, on.gpu.name))
        job.knowledge, job.samples, job.profiled = kept.knowledge, kept.samples, kept.profiled
        job.on = on
        job.truth = on.rates.model(job.trace.model_name)

    def on_every_type(self, view: Job, job: SimJob, model: PerfModel) -> None:
        """Set the fields of a fresh ``view`` that span the types: the job's model on
        each (``models_by_gpu``), and for a waiting job of a scheduler that profiles,
        the GPU counts profiled on every type: ``FleetPolicy`` may plan it on any of
        them, and a count its new type has not profiled sweeps the clocks there, so
        it is counted at the sweep's peak (``power_loop.sweeping_rows``); a job
        holding GPUs shows its own type's counts."""
        fields = view.__dict__
        fields["models_by_gpu"] = self.models_by_gpu(job, model)
        if fields["profiled_gpus"] is not None and not job.holding:
            fields["profiled_gpus"] = self.profiled_everywhere(job)

    def profiled_everywhere(self, job: SimJob) -> frozenset[int]:
        """The GPU counts the job has profiled on every type of the cluster."""
        counts = set(job.profiled)
        for on in self._order:
            if on is not job.on:
                counts &= self._learned[job.index, on.gpu.name].profiled
        return frozenset(counts)

    def models_by_gpu(self, job: SimJob, model: PerfModel) -> tuple[tuple[str, PerfModel], ...]:
        """The job's model on every type (``model`` on the one it is on)."""
        out = []
        for on in self._order:
            if on is job.on:
                out.append((on.gpu.name, model))
                continue
            known = self._learned[job.index, on.gpu.name].knowledge
            assert known is not None
            out.append((on.gpu.name, known.model))
        return tuple(out)

    def fits(self, job: SimJob) -> int:
        """The job's model fits on every type."""
        count = job.knowledge.fits if job.knowledge else 0
        for on in self._order:
            kept = self._learned.get((job.index, on.gpu.name))
            if kept is not None and kept.knowledge is not None:
                count += kept.knowledge.fits
        return count

    # ------------------------------------------------------------- nodes and power

    def node_gpus(self, node: str) -> int:
        return self._node_gpus[node]

    def boot_w(self, node: str) -> float:
        """What a booting node draws: its GPUs at their type's idle power."""
        return self._node_gpus[node] * self._node_type[node].gpu.idle_power_w

    def powered(self, off: set[str]) -> np.ndarray:
        """GPUs on, per type."""
        powered = self._all_gpus.copy()
        for node in off:
            powered[self._node_kind[node]] -= self._node_gpus[node]
        return powered

    def idle_w(self, powered: np.ndarray) -> float:
        """Idle watts: every GPU on and not computing at its type's idle power."""
        return float(np.dot(powered - self._busy, self._idle))

    def draw(
        self, jobs: Sequence[SimJob], computing: np.ndarray, load: Mapping[GpuSlot, int]
    ) -> None:
        """Per type, as of now: the computing jobs' watts and busy GPUs (each job's
        share of its GPUs), and the GPUs held."""
        k = len(self._order)
        active, busy, held = np.zeros(k), np.zeros(k), np.zeros(k)
        for i in computing.tolist():
            job = jobs[i]
            kind = self._index[job.on.gpu.name]
            active[kind] += job.share * job.power_w
            busy[kind] += job.share * job.n
        for node, _ in load:
            held[self._node_kind[node]] += 1
        self._active_w, self._busy, self._held = active, busy, held

    def account(self, dt: float, powered: np.ndarray) -> None:
        """``dt`` seconds at the rates of the last ``draw``."""
        self._busy_s += dt * self._busy
        self._held_s += dt * self._held
        self._active_j += dt * self._active_w
        self._idle_j += dt * (powered - self._busy) * self._idle

    def totals(self) -> tuple[GpuTypeTotals, ...]:
        """The run's GPU-seconds and energy per type."""
        return tuple(
            GpuTypeTotals(
                gpu=on.gpu.name,
                gpus=int(self._all_gpus[k]),
                busy_gpu_s=float(self._busy_s[k]),
                held_gpu_s=float(self._held_s[k]),
                active_energy_j=float(self._active_j[k]),
                idle_energy_j=float(self._idle_j[k]),
            )
            for k, on in enumerate(self._order)
        )
