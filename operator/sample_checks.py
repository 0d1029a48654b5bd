"""What a node agent's window sample must be to be believed: the ingest's judgement.

A sample steers the whole cluster: its power becomes the job's measured
power (``learning.SampleStore.measured_power``) and, through the cluster's
power ratio, the limit every job is planned against. A node agent's token
is one compromised node, one buggy agent or one energy counter's glitch away
from lying, so a sample that passed ``telemetry.parse_batch`` (types and
ranges) is checked here against what the sender cannot make up:

- **the allocation the API server shows** (the leader's latest cluster view,
  no API call per sample): the DLJob exists (``unknown_job``), has worker
  pods of the sample's generation bound to the sender's node
  (``not_on_node``), at least ``gpus_measured`` of them there (one GPU per
  worker: ``too_many_gpus``); the sample's ``n`` is the generation's worker
  count (``contract.WORKERS_ANNOTATION`` on its pods), its GPUs per node at
  least the pods on the sender's node and at most ``n`` (exactly the most on
  one node once every worker is bound), and its local batch
  the one the pods were given (``LOCAL_BATCH_SIZE``): else
  ``wrong_allocation``;
- **physics**, from the node's GPU type (what its agent discovered, else the
  catalogue type of its ``nvidia.com/gpu.product`` label: ``nodes.known_gpu``;
  a node of a type in neither is not judged so, as nothing is known of its
  clocks and power): the
  clock is one the GPU has (``impossible_clock``); the power of the window,
  ``energy_j / step_time_s`` per measured GPU, is at most the board's power
  limit with ``POWER_SLACK`` (no GPU draws more for a whole window) and at
  least ``IDLE_FLOOR`` of its idle power (a powered GPU draws that much doing
  nothing): else ``impossible_power``;
- **time** (``Windows``, per sender, job and generation): a window cannot end
  more than ``ingest.MAX_AHEAD_S`` past the operator's clock (``clock_ahead``:
  taken, it would make the sender's honest windows look like replays until
  real time caught up); windows of one job on one node follow each other; a
  sample that ends no later than the last one taken from that sender is a
  replay (``duplicate``), and one that starts before it ended overlaps it
  (``overlap``, up to ``OVERLAP_SLACK`` of the window), so the windows one node
  reports cover at most real time. Samples of one batch are judged one after
  another (``Windows.batch``): a batch of copies is taken once.

Every refusal is counted by reason and sender (``Metrics.ingest_sender_refused``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from powerflow.operator.allocation import count as _count
from powerflow.operator.job_view import _annotation, _generation
from powerflow.operator.kube import ClusterState
from powerflow.operator.nodes import NO_DISCOVERY, known_gpu

from powerflow.core import contract
from powerflow.core.gpus import GpuSpec
from powerflow.core.telemetry import JobProgress, WindowSample

POWER_SLACK = 1.2
"""A window's power may exceed the board's limit by this factor: NVML's readings are
instantaneous and a limit is enforced over a short average, so a window of a second or
more cannot draw more than a few percent above it; 20 % leaves room for noise."""
IDLE_FLOOR = 0.5
"""A window's power per GPU is at least this fraction of the GPU type's idle power."""
OVERLAP_SLACK = 0.05
"""How much of a window may overlap the previous one (rounding of the step time): a
fraction of the window, so that the windows a sender reports cover at most real time
(20/19 of it)."""
REASONS = (
    "unknown_job",
    "not_on_node",
    "too_many_gpus",
    "wrong_allocation",
    "impossible_clock",
    "impossible_power",
    "clock_ahead",
    "duplicate",
    "overlap",
)
"""Every reason ``judge`` and ``Windows.check`` give (the refusal counters' labels)."""
_T = TypeVar("_T")


@dataclass(frozen=True)
class Generation:
    """One allocation generation of a DLJob as its worker pods show it."""

    workers: int | None
    """The gang size the pods carry (``contract.WORKERS_ANNOTATION``); None: unreadable."""
    local_batch: float | None
    """The pods' ``LOCAL_BATCH_SIZE``; None: unreadable."""
    nodes: Mapping[str, int] = field(default_factory=dict)
    """Bound worker pods per node."""


Index = Mapping[tuple[str, str], Mapping[int, Generation]]
"""(namespace, job) -> generation -> what its pods show."""


def index(state: ClusterState) -> Index:
    """Each DLJob's generations, from one cluster view (the operator's own pods only)."""
    out: dict[tuple[str, str], dict[int, Generation]] = {}
    for observed in state.jobs:
        meta = observed.body.get("metadata") or {}
        seen: dict[int, tuple[set[int | None], set[float | None], dict[str, int]]] = {}
        for pod in observed.pods:
            generation = _generation(pod)  # -1: unreadable
            if generation < 0:
                continue
            workers, batches, nodes = seen.setdefault(generation, (set(), set(), {}))
            workers.add(_count(_annotation(pod, contract.WORKERS_ANNOTATION)) or None)
            batches.add(_local_batch(pod))
            node = (pod.get("spec") or {}).get("nodeName")
            if isinstance(node, str) and node:
                nodes[node] = nodes.get(node, 0) + 1
        out[str(meta.get("namespace", "")), str(meta.get("name", ""))] = {
            g: Generation(_one(w), _one(b), nodes) for g, (w, b, nodes) in seen.items()
        }
    return out


def totals(state: ClusterState) -> dict[tuple[str, str], int]:
    """Each DLJob's ``spec.iterations`` where it is a count (a bad spec has none)."""
    out: dict[tuple[str, str], int] = {}
    for observed in state.jobs:
        meta = observed.body.get("metadata") or {}
        spec = observed.body.get("spec") or {}
        total = _count(spec.get("iterations") if isinstance(spec, dict) else None, -1)
        if total > 0:
            out[str(meta.get("namespace", "")), str(meta.get("name", ""))] = total
    return out


def node_gpus(
    state: ClusterState, discovered: Mapping[str, GpuSpec] = NO_DISCOVERY
) -> dict[str, GpuSpec]:
    """Each node's GPU type where it is known (``nodes.known_gpu``: ``discovered`` by its
    agent, else its label's catalogue type); a node of an unknown type is left out."""
    out: dict[str, GpuSpec] = {}
    for body in state.nodes:
        meta = body.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = meta.get("labels") or {}
        product = labels.get(contract.GPU_PRODUCT_LABEL)
        spec = known_gpu(product if isinstance(product, str) else None, discovered.get(name))
        if spec is not None:
            out[name] = spec
    return out


def judge(jobs: Index, node: str, gpu: GpuSpec | None, sample: WindowSample) -> str | None:
    """Why ``sample`` from ``node`` is refused, or None to accept it (module docstring);
    the time check is ``Windows``'. ``gpu``: the node's GPU type, None where it is not
    known (then nothing is judged by physics)."""
    job = jobs.get((sample.namespace, sample.job))
    if job is None:
        return "unknown_job"
    generation = job.get(sample.generation)
    pods = generation.nodes.get(node, 0) if generation is not None else 0
    if generation is None or pods == 0:
        return "not_on_node"
    if sample.gpus_measured > pods:
        return "too_many_gpus"
    bound = sum(generation.nodes.values())
    placed = max(generation.nodes.values()) if bound == generation.workers else None
    if (
        generation.workers is None
        or sample.n != generation.workers
        or not pods <= sample.gpus_per_node <= sample.n
        or (placed is not None and sample.gpus_per_node != placed)
        or generation.local_batch is None
        or not math.isclose(sample.local_batch_size, generation.local_batch, rel_tol=1e-9)
    ):
        return "wrong_allocation"
    if gpu is None:
        return None
    if not gpu.min_clock_mhz <= sample.frequency_mhz <= gpu.max_clock_mhz:
        return "impossible_clock"
    watts = sample.energy_j / sample.step_time_s / sample.gpus_measured
    if not IDLE_FLOOR * gpu.idle_power_w <= watts <= POWER_SLACK * gpu.max_power_w:
        return "impossible_power"
    return None


def judge_progress(jobs: Index, node: str, progress: JobProgress) -> str | None:
    """Why a job's reported progress from ``node`` is refused, or None: as for a sample,
    the job must exist and have a worker of that generation bound to the sender's node
    (the agent there sets its clocks; no other agent may speak for it)."""
    job = jobs.get((progress.namespace, progress.job))
    if job is None:
        return "unknown_job"
    generation = job.get(progress.generation)
    if generation is None or generation.nodes.get(node, 0) == 0:
        return "not_on_node"
    return None


class Windows:
    """The end of the last window taken per (sender, namespace, job, generation)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str, int], float] = {}

    def check(self, node: str, sample: WindowSample, latest_s: float) -> str | None:
        """``clock_ahead`` (it ends after ``latest_s``), ``duplicate``, ``overlap`` or
        None (module docstring); nothing is recorded."""
        if sample.end_s > latest_s:
            return "clock_ahead"
        last = self._last.get((node, sample.namespace, sample.job, sample.generation))
        if last is None:
            return None
        if sample.end_s <= last:
            return "duplicate"
        length = sample.iterations * sample.step_time_s
        if sample.end_s - length < last - OVERLAP_SLACK * length:
            return "overlap"
        return None

    def take(self, node: str, sample: WindowSample) -> None:
        """Record an accepted sample."""
        key = (node, sample.namespace, sample.job, sample.generation)
        self._last[key] = max(sample.end_s, self._last.get(key, sample.end_s))

    def batch(self) -> Windows:
        """A copy to judge one batch's samples one after another (each taken there), so
        that a batch cannot repeat one window; ``commit`` it when the batch is answered."""
        copy = Windows()
        copy._last = dict(self._last)
        return copy

    def commit(self, judged: Windows) -> None:
        self._last = judged._last

    def keep_only(self, jobs: Iterable[tuple[str, str]]) -> None:
        """Forget the jobs a new view no longer has (bounded by the cluster's jobs)."""
        alive = set(jobs)
        for key in [k for k in self._last if (k[1], k[2]) not in alive]:
            del self._last[key]


def _one(values: set[_T | None]) -> _T | None:
    """The one value all pods agree on; None when they differ or it is unreadable."""
    return next(iter(values)) if len(values) == 1 else None


def _local_batch(pod: Mapping[str, object]) -> float | None:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    for container in containers if isinstance(containers, list) else ():
        env = container.get("env") if isinstance(container, dict) else None
        for var in env if isinstance(env, list) else ():
            if isinstance(var, dict) and var.get("name") == "LOCAL_BATCH_SIZE":
                try:
                    value = float(str(var.get("value")))
                except ValueError:
                    return None
                return value if math.isfinite(value) and value > 0 else None
    return None
