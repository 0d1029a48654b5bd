"""The core snapshot of a pass's runnable jobs (``build_snapshot``): each job's request,
model, placement, profiling state and measured power, as the policy sees them."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from powerflow.operator.bodies import (
    PodBody,
)
from powerflow.operator.budget import BudgetConfig
from powerflow.operator.job_view import _annotation, _bound_nodes, _placement, _View
from powerflow.operator.jobs import (
    JobRequest,
)
from powerflow.operator.learning import MeasuredPower
from powerflow.operator.pass_inputs import PassMemory, PassSettings
from powerflow.operator.profiled import (
    NodeTypes,
    ProfileWindow,
    node_types,
    profiled_everywhere,
    profiled_on,
)
from powerflow.operator.records import filled
from powerflow.operator.workers import pool_product_of

from powerflow.core import contract
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.buddy import is_aligned_block
from powerflow.core.policy.snapshot import GpuSlot, Job, Node, Snapshot

ModelFactory = Callable[[JobRequest], PerfModel]
ModelsOn = Callable[[JobRequest, GpuSpec], PerfModel]
"""A job's model on a given GPU type (``learning.SampleStore.model_on``): what a plan of
several pools reads for each type but the first node's (``Job.models_by_gpu``)."""


@dataclass(frozen=True)
class TypedModels:
    """A ``ModelFactory`` that also gives each job's model on other GPU types: ``main`` on
    the first planned node's type, ``on`` on each other planned type (``build_snapshot``).
    A plain ``ModelFactory`` gives its one model on every type."""

    main: ModelFactory
    on: ModelsOn

    def __call__(self, req: JobRequest) -> PerfModel:
        return self.main(req)


def pool_nodes(nodes: Sequence[Node]) -> dict[str, tuple[Node, ...]]:
    """Each node's pool: the nodes of its GPU type and size, in ``nodes``' order (the
    pools ``FleetPolicy`` plans: ``fleet.fleet_pools``)."""
    members: dict[tuple[str, int], list[Node]] = {}
    for node in nodes:
        members.setdefault((node.gpu.name, node.gpus), []).append(node)
    out: dict[str, tuple[Node, ...]] = {}
    for listed in members.values():
        pool = tuple(listed)
        out.update(dict.fromkeys((n.name for n in pool), pool))
    return out


def _profiled(
    v: _View, placement: Sequence[GpuSlot], running: bool, types: NodeTypes
) -> frozenset[int]:
    """``Job.profiled_gpus``: the counts the job profiled on the type its GPUs are of
    while it holds GPUs of a planned node; else (it waits, or its GPUs are not known
    yet) those it profiled on every planned type, since the plan may start it on any
    (``profiled``)."""
    model = v.status.get("model")
    if running:
        nodes = [node for node, _ in placement] or _bound_nodes(v.current)
        if any(node in types.of_node for node in nodes):
            return profiled_on(model, types.of(nodes))
    return profiled_everywhere(model, types.names)


def _committed_gpu(
    pods: Sequence[PodBody], types: NodeTypes, product_types: Mapping[str, str]
) -> str | None:
    """``Job.committed_gpu``: the type of the nodes the job's current workers are bound
    to, else the type their node affinity requires (``workers.pool_affinity``: the GPU
    product label of their planned block's pool, ``product_types`` mapping a planned
    pool's label to its type). The affinity is part of the pod's spec, which nobody can
    change once the pod exists, where an annotation (the planned block) a tenant who may
    patch its pods could rewrite. None where neither names a planned type."""
    for node in _bound_nodes(pods):
        found = types.of_node.get(node)
        if found is not None:
            return found
    for pod in pods:
        product = pool_product_of(pod)
        if product is not None:
            return product_types.get(product)
    return None


def _is_profiling(v: _View, now_s: float) -> bool:
    """The current allocation is profiling and its window has not ended."""
    if not v.current or v.status.get("phase") != "Profiling":
        return False
    until = v.allocation.profiling_until_s
    return until is None or now_s < until


def _core_job(
    v: _View,
    req: JobRequest,
    now_s: float,
    model: PerfModel,
    sizes: Mapping[str, int],
    measured: MeasuredPower | None = None,
    models_by_gpu: tuple[tuple[str, PerfModel], ...] = (),
    profile: ProfileWindow | None = None,
) -> Job:
    progress = int((v.status.get("progress") or {}).get("iterations", 0))
    remaining = req.iterations - progress
    elapsed = now_s - req.created_s  # both below: ``max(x, 0)``, without the builtin call
    running = bool(v.current) and not v.stopping
    frequency_mhz = (v.allocation.frequency_mhz or None) if running else None
    placement = _placement(v.current, sizes) if running else ()
    # Measured where it runs now (same GPUs per node and local batch), or not at all.
    if measured is not None and placement:
        nodes = Counter(node for node, _ in placement)
        here = (len(placement), max(nodes.values()), v.allocation.local_batch_size)
        if here != (measured.n, measured.gpus_per_node, measured.local_batch_size):
            measured = None
    else:
        measured = None
    return filled(  # ``Job(...)``, every field given (``records``)
        Job,
        {
            "id": v.key,
            "model": model,
            "remaining_iterations": float(0 if remaining < 0 else remaining),
            "global_batch_size": req.global_batch_size,
            "requested_gpus": req.requested_gpus,
            "arrival_s": req.created_s,
            "elapsed_s": 0.0 if elapsed < 0.0 else elapsed,
            "min_gpus": req.min_gpus,
            "max_gpus": req.max_gpus,
            "max_local_batch_size": req.max_local_batch_size,
            "placement": placement,
            "frequency_mhz": frequency_mhz,
            "attained_gpu_s": 0.0,
            "model_name": req.model_name,
            # The policy may only keep GPUs it knows: pinning needs the extender's placement.
            "pinned": bool(placement) and _is_profiling(v, now_s),
            "measured_power_w": measured.watts if measured is not None else None,
            "measured_frequency_mhz": measured.frequency_mhz if measured is not None else None,
            "profiled_gpus": (
                _profiled(v, placement, running, profile.types)
                if profile is not None and profile.seconds > 0
                else None
            ),
            "power_cap_w": _current_cap(v.current) if running else None,
            "models_by_gpu": models_by_gpu,
            "committed_gpu": None,  # set by ``build_snapshot`` where pools are planned
        },
    )


def _current_cap(pods: Sequence[PodBody]) -> float | None:
    """The per-GPU cap the job's workers hold now (their ``power-limit-watts``), for
    the policy to keep it steady (``Job.power_cap_w``): the highest of them (the
    policy keeps a current cap only where it is no higher than the new one, so
    the highest is the safe reading of workers caught mid-update); ``None`` when
    a worker has none or an unreadable one (the agent holds no cap there)."""
    caps = []
    for pod in pods:
        raw = _annotation(pod, contract.POWER_LIMIT_ANNOTATION)
        try:
            cap = float(raw) if raw is not None else math.nan
        except ValueError:
            cap = math.nan
        if not (math.isfinite(cap) and cap > 0):
            return None
        caps.append(cap)
    return max(caps, default=None)


def build_snapshot(
    views: Sequence[_View],
    nodes: tuple[Node, ...],
    budget: BudgetConfig,
    now_s: float,
    models: ModelFactory,
    memory: PassMemory,
    settings: PassSettings,
    failed: Callable[[_View, Exception], None] | None = None,
) -> Snapshot:
    """The core's snapshot of ``views``; with ``failed``, a job whose conversion
    raises is reported there and left out instead of failing the snapshot.

    ``memory.measured``: each job's latest measured power (``learning.SampleStore.
    measured_power``), passed to the policy where the job still runs as measured;
    ``settings.profiling_window_s`` > 0: jobs profile GPU counts new on a type
    (``Job.profiled_gpus``, ``_profiled``); ``memory.power_ratio`` goes to the snapshot.
    ``nodes`` of several GPU types (pools ``FleetPolicy`` plans): each job's model is
    ``models(req)`` on the first node's type and, where ``models`` is ``TypedModels``,
    ``models.on(req, type)`` on each other (``Job.models_by_gpu``; else ``models(req)``
    on all), and a job with workers the type they can only run on
    (``Job.committed_gpu``, ``_committed_gpu``; ``settings.pool_labels`` gives each
    pool's product label).
    """
    models_on = models.on if isinstance(models, TypedModels) else None
    measured = memory.measured or {}
    sizes = {n.name: n.gpus for n in nodes}
    profile = ProfileWindow(settings.profiling_window_s, node_types(nodes))
    types: dict[str, GpuSpec] = {}
    for node in nodes[1:] if models_on is not None else ():
        if node.gpu.name != nodes[0].gpu.name:
            types.setdefault(node.gpu.name, node.gpu)
    pools = pool_nodes(nodes) if len({(n.gpu.name, n.gpus) for n in nodes}) > 1 else None
    labels = settings.pool_labels
    of_node = profile.types.of_node
    product_types = (
        {label: of_node[node] for node, label in labels.items() if node in of_node}
        if labels and len(profile.types.names) > 1
        else None
    )
    jobs: list[Job] = []
    held: set[GpuSlot] = set()
    for v in views:
        assert v.req is not None
        try:
            model = models(v.req)
            by_gpu: tuple[tuple[str, PerfModel], ...] = ()
            if types and models_on is not None:
                main = (nodes[0].gpu.name, model)
                by_gpu = (main, *((g.name, models_on(v.req, g)) for g in types.values()))
            job = _core_job(v, v.req, now_s, model, sizes, measured.get(v.key), by_gpu, profile)
            if product_types is not None and v.current and not v.stopping:
                committed = _committed_gpu(v.current, profile.types, product_types)
                if committed is not None:
                    job = replace(job, committed_gpu=committed)
        except Exception as exc:
            if failed is None:
                raise
            failed(v, exc)
            continue
        if not held.isdisjoint(job.placement):  # two gangs claim a GPU: trust neither's
            job = replace(job, placement=(), pinned=False)
        elif pools is not None and len({pools[node][0].name for node, _ in job.placement}) > 1:
            # A gang on two pools (the extender places within one): the policy refuses a
            # job holding GPUs of two types, which would stop the pass for every job.
            job = replace(job, placement=(), pinned=False)
        elif job.pinned and not is_aligned_block(
            nodes if pools is None else pools[job.placement[0][0]], job.placement
        ):
            # The policy keeps a pinned job's GPUs only as an aligned block of these
            # nodes, and refuses the whole pass otherwise; the gang's nodes can be
            # unaligned here (the plan's nodes change as other pods come and go).
            job = replace(job, pinned=False)
        held.update(job.placement)
        jobs.append(job)
    return Snapshot(
        nodes=nodes,
        jobs=tuple(jobs),
        budget=budget.budget,
        now_s=now_s,
        power_ratio=memory.power_ratio,
    )
