"""The job controller: one job's pods converged to its status allocation.

``converge`` is a pure function of the job (its parsed spec), the allocation its
status holds (``allocation.JobAllocation``, the allocator's output) and the pods
of that allocation's generation: which workers to create and which annotations to
write on the pods there are. It never reads the plan: whatever the allocator
decides reaches the pods through the status, so the pods follow the status, and a
restarted operator, reading the same status and pods, writes nothing the pods
already carry.

What it converges:

* the workers of the generation: each one missing is created (with the
  rendezvous Service) until the generation is complete, unless it is stopped or
  holds no GPUs; a complete gang that lost a worker is restarted by the allocator
  instead (``lifecycle``: torchrun's rendezvous is static);
* ``contract.POWER_LIMIT_ANNOTATION``: the allocation's cap, or none;
* ``contract.FREQUENCY_ANNOTATION``: the allocation's clock, also where someone
  edited it on a pod; none on GPUs of a type PowerFlow does not know
  (``tuned=False``: ``nodes``), whose agent then leaves them at their defaults;
* ``contract.PROFILE_ANNOTATION``: the sweep plan while the allocation's
  profiling window runs, for the node agent (``profile_plan``), else none;
* where several pools are planned, new workers' node affinity: the GPU product of
  the allocation's block (``workers.pool_affinity``), so a gang runs on the type its
  clock and model are of.

Each annotation is its own patch, written only where it differs, so the pass can
send the ones that only lower power first (``Actions.writes``). Deleting the
workers of a stopped or finished generation is the allocator's, with the status
that says why (``lifecycle``), since which grace period applies depends on why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from powerflow.operator.allocation import JobAllocation
from powerflow.operator.bodies import PodBody, ServiceBody
from powerflow.operator.job_view import _annotation
from powerflow.operator.jobs import JobRequest
from powerflow.operator.power_order import cap_annotation
from powerflow.operator.profile_plan import plan_annotation
from powerflow.operator.records import filled
from powerflow.operator.workers import WorkerSet, pod_name, rendezvous_service, worker_pods

from powerflow.core import contract
from powerflow.core.gpus import GpuSpec
from powerflow.core.profiling import ClockSweep

CAP = contract.POWER_LIMIT_ANNOTATION
CLOCK = contract.FREQUENCY_ANNOTATION
PROFILE = contract.PROFILE_ANNOTATION


@dataclass(frozen=True)
class Profiling:
    """What a profiling sweep plan needs besides the allocation: the operator's
    window and clocks, and each node's GPU type (the sweep's clocks are the GPU's)."""

    window_s: float
    sweep: ClockSweep
    gpus_of: Mapping[str, GpuSpec]
    default_gpu: GpuSpec


class PodWrites(NamedTuple):
    """One job's pod writes: objects to create, then per-pod annotation patches
    (``None`` removes the annotation). A tuple: one is made per job per pass."""

    create: tuple[PodBody | ServiceBody, ...] = ()
    annotate: tuple[tuple[PodBody, dict[str, str | None]], ...] = ()


_new_tuple = tuple.__new__
"""A named tuple from a tuple of every field in order, as its generated ``__new__``
builds it, without that Python frame (a ``PodWrites`` per job per pass)."""


def converge(
    job: JobRequest,
    allocation: JobAllocation,
    pods: Sequence[PodBody],
    now_s: float,
    profiling: Profiling | None = None,
    *,
    tuned: bool = True,
    pools: Mapping[str, str] | None = None,
) -> PodWrites:
    """The writes that bring ``pods`` (the live pods of ``allocation``'s generation)
    to ``allocation`` (see the module docstring); none when they already are.
    ``tuned`` False: no clock, cap or sweep plan on the pods (an unknown GPU type).
    ``pools``: each planned node's GPU product label where the operator plans several
    pools: new workers may only run on nodes of their block's label
    (``workers.pool_affinity``)."""
    if allocation.gpus <= 0 or allocation.stopped:
        return PodWrites()
    cap = cap_annotation(allocation.power_cap_w) if tuned else None
    create: tuple[PodBody | ServiceBody, ...] = ()
    if not allocation.complete:
        create = _missing(job, allocation, pods, cap, tuned, pools)
    if not pods:  # a new generation: nothing to annotate
        return _new_tuple(PodWrites, (create, ()))  # ``PodWrites(create)``, no frame
    # By key, then by pod: the order the patches are written in within each phase.
    clock = str(allocation.frequency_mhz) if tuned else None
    annotate: list[tuple[PodBody, dict[str, str | None]]] = [
        (p, {CAP: cap}) for p in pods if _annotation(p, CAP) != cap
    ]
    annotate += [(p, {CLOCK: clock}) for p in pods if _annotation(p, CLOCK) != clock]
    until = allocation.profiling_until_s
    sweeping = tuned and profiling is not None and until is not None and now_s < until
    for pod in pods:
        plan = None
        if sweeping:
            assert profiling is not None and until is not None
            node = pod.get("spec", {}).get("nodeName")
            gpu = profiling.default_gpu
            if isinstance(node, str):
                gpu = profiling.gpus_of.get(node, gpu)
            plan = plan_annotation(gpu, profiling.window_s, until, profiling.sweep)
        if _annotation(pod, PROFILE) != plan:
            annotate.append((pod, {PROFILE: plan}))
    return PodWrites(create, tuple(annotate))


def _missing(
    job: JobRequest,
    allocation: JobAllocation,
    pods: Sequence[PodBody],
    cap: str | None,
    tuned: bool = True,
    pools: Mapping[str, str] | None = None,
) -> tuple[PodBody | ServiceBody, ...]:
    """The rendezvous Service and the workers of ``allocation`` that ``pods`` lack
    (none: nothing); all of them, built at once, for a new generation."""
    indices: list[int] | None = None
    if pods:
        have = {p["metadata"]["name"] for p in pods}
        generation = allocation.generation
        indices = [
            i for i in range(allocation.gpus) if pod_name(job.name, generation, i) not in have
        ]
        if not indices:
            return ()
    block = allocation.block
    ws = filled(  # ``WorkerSet(...)``, every field given (``records``)
        WorkerSet,
        {
            "generation": allocation.generation,
            "gpus": allocation.gpus,
            "local_batch_size": allocation.local_batch_size,
            "frequency_mhz": allocation.frequency_mhz if tuned else None,
            "power_cap": cap,
            "planned": block,
            "pool_product": pools.get(block[0][0]) if pools and block else None,
        },
    )
    return (rendezvous_service(job), *worker_pods(job, ws, indices))
