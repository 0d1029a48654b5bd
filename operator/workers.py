"""A job's allocation -> its worker pods and rendezvous Service (pure builders).

One worker per GPU (one ``nvidia.com/gpu`` each): the extender places each
pod on one GPU of the gang's buddy block, the node agent locks one GPU's clock
per pod, and torchrun runs one process per pod (``--nnodes=WORLD_SIZE
--node-rank=RANK``), so the rank is the pod's index. Names are deterministic
(``<job>-g<generation>-w<index>``), so a restarted operator recreating a pod
gets ``AlreadyExists`` instead of a duplicate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from powerflow.operator.bodies import PodBody, ServiceBody
from powerflow.operator.jobs import JobRequest

from powerflow.core import contract
from powerflow.core.contract import (  # read per job and per pod by ``worker_pods``
    FREQUENCY_ANNOTATION,
    GENERATION_ANNOTATION,
    JOB_LABEL,
    MODEL_ANNOTATION,
    PLANNED_BLOCK_ANNOTATION,
    POWER_LIMIT_ANNOTATION,
    SCHEDULER_NAME,
    WORKER_INDEX_LABEL,
    WORKERS_ANNOTATION,
)


@dataclass(frozen=True)
class WorkerSet:
    """What one generation of a job's workers runs with."""

    generation: int
    gpus: int
    local_batch_size: int
    frequency_mhz: int | None
    """The planned clock (``contract.FREQUENCY_ANNOTATION``); None: none, the GPUs keep
    their defaults (a type PowerFlow does not know)."""
    power_cap: str | None = None
    """``contract.POWER_LIMIT_ANNOTATION``'s value (per-GPU watts), None: no cap."""
    planned: tuple[tuple[str, int], ...] = ()
    """The plan's GPUs for the gang (``contract.PLANNED_BLOCK_ANNOTATION``); empty: none."""
    pool_product: str | None = None
    """The GPU product label of the pool the gang is planned on, where the operator
    plans several pools: the workers may only run on nodes of that label
    (``pool_affinity``); None: no such constraint (one pool)."""


def pool_affinity(affinity: Any, product: str) -> dict[str, Any]:
    """The template's ``affinity`` with every required node selector term also asking for
    nodes of GPU product label ``product`` (none: nodes without the label).

    Required terms are ORed, so the expression goes into each (a template without
    terms gets one): the workers keep the template's own constraints and gain the
    pool's. A gang planned on one GPU type must never start on another: its clock
    is one of its type's clocks, and its model and power are its type's.
    """
    expression: dict[str, Any] = (
        {"key": contract.GPU_PRODUCT_LABEL, "operator": "In", "values": [product]}
        if product
        else {"key": contract.GPU_PRODUCT_LABEL, "operator": "DoesNotExist"}
    )
    out = dict(affinity) if isinstance(affinity, dict) else {}
    node = dict(out.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), expression]}
        for term in terms
        if isinstance(term, dict)
    ] or [{"matchExpressions": [expression]}]
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    out["nodeAffinity"] = node
    return out


def pool_product_of(pod: PodBody) -> str | None:
    """``pool_affinity`` read back: the GPU product label the pod's required node
    affinity asks for (the last such ``In`` expression of its first term:
    ``pool_affinity`` appends its own to each term), or None. Read as untrusted:
    anything not of the API's shape is no requirement."""
    node: object = (pod.get("spec") or {}).get("affinity")
    for key in ("nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        node = node.get(key) if isinstance(node, dict) else None
    terms = node.get("nodeSelectorTerms") if isinstance(node, dict) else None
    first = terms[0] if isinstance(terms, list) and terms else None
    found = None
    expressions = first.get("matchExpressions") if isinstance(first, dict) else None
    for expression in expressions if isinstance(expressions, list) else ():
        if not isinstance(expression, dict):
            continue
        values = expression.get("values")
        if (
            expression.get("key") == contract.GPU_PRODUCT_LABEL
            and expression.get("operator") == "In"
            and isinstance(values, list)
            and len(values) == 1
            and isinstance(values[0], str)
        ):
            found = values[0]
    return found


def planned_block_annotation(slots: Iterable[tuple[str, int]]) -> str:
    """``contract.PLANNED_BLOCK_ANNOTATION``'s value: the placement annotation's form.

    The text ``json.dumps`` writes for ``{"block": [[node, index], ...]}`` (sorted),
    put together directly when every node is a ``str`` and every index an ``int``
    (json's own string encoder for the names, once per node): ``json.dumps`` takes a
    fifth of ``worker_pods`` per job. Anything else goes through ``json.dumps``.
    """
    block = sorted(slots)
    items = []
    node_text = ""
    last: object = None
    for node, index in block:
        if type(node) is not str or type(index) is not int:
            return json.dumps({"block": [[n, i] for n, i in block]})
        if node is not last:  # a gang's slots are mostly on one node: encoded once
            last = node
            node_text = "[" + _json_str(node) + ", "
        items.append(node_text + str(index) + "]")
    return '{"block": [' + ", ".join(items) + "]}"


def pod_name(job: str, generation: int, index: int) -> str:
    return f"{job}-g{generation}-w{index}"


def service_name(job: str) -> str:
    return job


def master_addr(job: JobRequest, generation: int) -> str:
    """DNS name of worker 0 behind the headless Service (hostname.subdomain.ns.svc)."""
    return f"{pod_name(job.name, generation, 0)}.{service_name(job.name)}.{job.namespace}.svc"


def owner_reference(job: JobRequest) -> dict[str, Any]:
    """The DLJob as controller of a worker pod or the Service.

    No ``blockOwnerDeletion``: setting it needs ``update`` on
    ``dljobs/finalizers`` wherever the OwnerReferencesPermissionEnforcement
    admission plugin is on (OpenShift, hardened clusters), so pod creates would
    be refused there. It only matters for foreground deletion (the owner waits
    for its dependents); the garbage collector deletes the dependents of a
    deleted DLJob either way.
    """
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
    }


def _env_values(job: JobRequest, ws: WorkerSet) -> dict[str, str]:
    """The rendezvous environment of every worker of ``ws`` (``RANK`` set per pod)."""
    values = {
        "WORLD_SIZE": ws.gpus,
        "RANK": 0,
        "MASTER_ADDR": master_addr(job, ws.generation),
        "MASTER_PORT": job.master_port,
        "LOCAL_BATCH_SIZE": ws.local_batch_size,
        "GLOBAL_BATCH_SIZE": job.global_batch_size,
        "POWERFLOW_ITERATIONS": job.iterations,
        "POWERFLOW_FREQUENCY_MHZ": "" if ws.frequency_mhz is None else ws.frequency_mhz,
        "POWERFLOW_JOB": job.name,
        "POWERFLOW_GENERATION": ws.generation,
        "POWERFLOW_AGENT_PORT": contract.AGENT_WORKER_PORT,
        "POWERFLOW_GRACE_SECONDS": job.grace_s,
    }
    return {k: str(v) for k, v in values.items()}


DOWNWARD_ENV = (
    ("POWERFLOW_POD_NAME", "metadata.name"),
    ("POWERFLOW_POD_NAMESPACE", "metadata.namespace"),
    ("POWERFLOW_POD_UID", "metadata.uid"),
    ("POWERFLOW_AGENT_HOST", "status.hostIP"),
)
"""What the worker library (``powerflow.worker``) learns from the downward API:
which pod it is (the node agent accepts its iteration reports only with the
pod's UID, and progress goes to the pod's annotation) and the node's IP, where
the agent's hostPort listens. Written with ``apiVersion`` as the API server
defaults it, so the stored pod reads back the same."""

_AGENT_PORT = str(contract.AGENT_WORKER_PORT)
_DOWNWARD_ENTRIES = tuple(
    {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
    for name, path in DOWNWARD_ENV
)
_AGENT_PORT_ENTRY = {"name": "POWERFLOW_AGENT_PORT", "value": _AGENT_PORT}
_GPU_ONLY: dict[str, Any] = {
    "limits": {contract.GPU_RESOURCE: "1"},
    "requests": {contract.GPU_RESOURCE: "1"},
}
"""Like ``_DOWNWARD_ENTRIES``, an env entry and the trainer's resources (where the
template gives none) that every worker of every job gets alike: built once and read
by every pod (``worker_pods``: bodies are never mutated)."""


def worker_env(job: JobRequest, ws: WorkerSet, index: int) -> list[dict[str, Any]]:
    values = _env_values(job, ws)
    values["RANK"] = str(index)
    return [*({"name": k, "value": v} for k, v in values.items()), *_DOWNWARD_ENTRIES]


def _gpu_resources(resources: dict[str, Any] | None) -> dict[str, Any]:
    if not resources:  # the common template: no resources of its own
        return _GPU_ONLY
    out = dict(resources)
    for kind in ("limits", "requests"):
        out[kind] = {**(out.get(kind) or {}), contract.GPU_RESOURCE: "1"}
    return out


_OURS = frozenset(
    (
        "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_BATCH_SIZE",
        "GLOBAL_BATCH_SIZE", "POWERFLOW_ITERATIONS", "POWERFLOW_FREQUENCY_MHZ", "POWERFLOW_JOB",
        "POWERFLOW_GENERATION", "POWERFLOW_AGENT_PORT", "POWERFLOW_GRACE_SECONDS",
        *(name for name, _ in DOWNWARD_ENV),
    )
)  # fmt: skip
"""The env names the operator sets (``_env_values``' keys, then ``DOWNWARD_ENV``'s): a
template's own entries of these names are dropped."""


def worker_pods(
    job: JobRequest, ws: WorkerSet, indices: Iterable[int] | None = None
) -> list[PodBody]:
    """Workers ``indices`` (default all) of ``ws``: the template plus GPU, scheduler,
    contract and env (values, then ``DOWNWARD_ENV``).

    Everything but the worker's name, hostname, index label and ``RANK`` is the
    same for every worker: it is put together once per call (the labels and
    annotations, prototypes of the pod spec and trainer container, the env
    entries before and after ``RANK``) and each pod is shallow copies of the
    prototypes with those fields set, in the key order a fresh build has
    (``tests/test_operator_workers.py`` compares each pod, as dicts and as
    JSON, with a deep-copy reference build). The rest of the template and the
    shared env entries are not copied: the bodies are sent to the API server
    and never mutated, so the shared parts are read-only; the template itself
    is never changed.
    """
    template = job.template
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    name = job.name
    generation = str(ws.generation)
    labels = meta.get("labels")
    base_labels = {**labels, JOB_LABEL: name} if labels else {JOB_LABEL: name}
    annotations = {
        **(meta.get("annotations") or {}),
        WORKERS_ANNOTATION: str(ws.gpus),
    }
    clock = "" if ws.frequency_mhz is None else str(ws.frequency_mhz)
    if clock:
        annotations[FREQUENCY_ANNOTATION] = clock
    annotations[GENERATION_ANNOTATION] = generation
    if job.model_name:
        annotations[MODEL_ANNOTATION] = job.model_name
    if ws.power_cap is not None:
        annotations[POWER_LIMIT_ANNOTATION] = ws.power_cap
    if ws.planned:
        annotations[PLANNED_BLOCK_ANNOTATION] = planned_block_annotation(ws.planned)
    prefix = f"{name}-g{generation}-w"  # pod_name's, less the index
    containers: list[dict[str, Any]] = spec.get("containers") or []
    trainer_name = job.trainer
    at = -1  # the trainer's position (the first container of that name)
    for i, container in enumerate(containers):
        if container.get("name") == trainer_name:
            at = i
            break
    trainer_proto: dict[str, Any] = {}
    head: list[dict[str, Any]] = []
    tail: list[dict[str, Any]] = []
    if at >= 0:
        trainer = containers[at]
        own_env = trainer.get("env")
        head = [e for e in own_env if e.get("name") not in _OURS] if own_env else []
        # _env_values' entries, RANK (per pod) left out: the same for every worker.
        head.append({"name": "WORLD_SIZE", "value": str(ws.gpus)})
        tail = [
            {"name": "MASTER_ADDR", "value": f"{prefix}0.{name}.{job.namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(job.master_port)},
            {"name": "LOCAL_BATCH_SIZE", "value": str(ws.local_batch_size)},
            {"name": "GLOBAL_BATCH_SIZE", "value": str(job.global_batch_size)},
            {"name": "POWERFLOW_ITERATIONS", "value": str(job.iterations)},
            {"name": "POWERFLOW_FREQUENCY_MHZ", "value": clock},
            {"name": "POWERFLOW_JOB", "value": name},
            {"name": "POWERFLOW_GENERATION", "value": generation},
            _AGENT_PORT_ENTRY,
            {"name": "POWERFLOW_GRACE_SECONDS", "value": str(job.grace_s)},
            *_DOWNWARD_ENTRIES,
        ]
        resources = _gpu_resources(trainer.get("resources"))
        trainer_proto = {**trainer, "env": None, "resources": resources}
    spec_proto = {
        **spec,
        "containers": None,
        "schedulerName": SCHEDULER_NAME,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": job.grace_s,
        "hostname": None,
        "subdomain": service_name(name),
    }
    if ws.pool_product is not None:
        spec_proto["affinity"] = pool_affinity(spec.get("affinity"), ws.pool_product)
    owners = [owner_reference(job)]
    namespace = job.namespace
    pods: list[PodBody] = []
    for index in range(ws.gpus) if indices is None else indices:
        rank = str(index)
        pod = prefix + rank
        pod_containers = list(containers)
        if at >= 0:
            pod_trainer = trainer_proto.copy()
            pod_trainer["env"] = [*head, {"name": "RANK", "value": rank}, *tail]
            pod_containers[at] = pod_trainer
        pod_spec = spec_proto.copy()
        pod_spec["containers"] = pod_containers
        pod_spec["hostname"] = pod
        pod_labels = base_labels.copy()
        pod_labels[WORKER_INDEX_LABEL] = rank
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": namespace,
                    "labels": pod_labels,
                    "annotations": annotations.copy(),
                    "ownerReferences": owners,
                },
                "spec": pod_spec,
            }
        )
    return pods


def worker_pod(job: JobRequest, ws: WorkerSet, index: int) -> PodBody:
    """Worker ``index`` of ``ws`` alone (see ``worker_pods``)."""
    return worker_pods(job, ws, (index,))[0]


def rendezvous_service(job: JobRequest) -> ServiceBody:
    """Headless Service giving each worker a DNS name, ready or not (rendezvous
    happens before any readiness probe could pass)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.name),
            "namespace": job.namespace,
            "labels": {contract.JOB_LABEL: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {contract.JOB_LABEL: job.name},
            "ports": [{"name": "rendezvous", "port": job.master_port}],
        },
    }
