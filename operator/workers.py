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
from typing import Any

from powerflow.operator.bodies import PodBody, ServiceBody
from powerflow.operator.jobs import JobRequest

from powerflow import contract


@dataclass(frozen=True)
class WorkerSet:
    """What one generation of a job's workers runs with."""

    generation: int
    gpus: int
    local_batch_size: int
    frequency_mhz: int
    power_cap: str | None = None
    """``contract.POWER_LIMIT_ANNOTATION``'s value (per-GPU watts), None: no cap."""
    planned: tuple[tuple[str, int], ...] = ()
    """The plan's GPUs for the gang (``contract.PLANNED_BLOCK_ANNOTATION``); empty: none."""


def planned_block_annotation(slots: Iterable[tuple[str, int]]) -> str:
    """``contract.PLANNED_BLOCK_ANNOTATION``'s value: the placement annotation's form."""
    return json.dumps({"block": [[node, index] for node, index in sorted(slots)]})


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
        "POWERFLOW_FREQUENCY_MHZ": ws.frequency_mhz,
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

_DOWNWARD_ENTRIES = tuple(
    {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
    for name, path in DOWNWARD_ENV
)


def worker_env(job: JobRequest, ws: WorkerSet, index: int) -> list[dict[str, Any]]:
    values = _env_values(job, ws)
    values["RANK"] = str(index)
    return [*({"name": k, "value": v} for k, v in values.items()), *_DOWNWARD_ENTRIES]


def _gpu_resources(resources: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(resources or {})
    for kind in ("limits", "requests"):
        out[kind] = {**(out.get(kind) or {}), contract.GPU_RESOURCE: "1"}
    return out


def worker_pods(
    job: JobRequest, ws: WorkerSet, indices: Iterable[int] | None = None
) -> list[PodBody]:
    """Workers ``indices`` (default all) of ``ws``: the template plus GPU, scheduler,
    contract and env (values, then ``DOWNWARD_ENV``).

    Built by copying only the path that changes (metadata, pod spec, the
    trainer container, its env and resources) and sharing the rest of the
    template: a deep copy per pod dominated an allocation pass at hundreds of
    pods. The bodies are sent to the API server and never mutated, so the
    shared parts are read-only; the template itself is never changed.
    """
    template = job.template
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    base_labels = {**(meta.get("labels") or {}), contract.JOB_LABEL: job.name}
    annotations = {
        **(meta.get("annotations") or {}),
        contract.WORKERS_ANNOTATION: str(ws.gpus),
        contract.FREQUENCY_ANNOTATION: str(ws.frequency_mhz),
        contract.GENERATION_ANNOTATION: str(ws.generation),
    }
    if job.model_name:
        annotations[contract.MODEL_ANNOTATION] = job.model_name
    if ws.power_cap is not None:
        annotations[contract.POWER_LIMIT_ANNOTATION] = ws.power_cap
    if ws.planned:
        annotations[contract.PLANNED_BLOCK_ANNOTATION] = planned_block_annotation(ws.planned)
    values = _env_values(job, ws)
    containers: list[dict[str, Any]] = spec.get("containers") or []
    trainer = next((c for c in containers if c.get("name") == job.trainer), None)
    ours = values.keys() | {name for name, _ in DOWNWARD_ENV}
    kept_env = [e for e in (trainer or {}).get("env") or [] if e.get("name") not in ours]
    resources = _gpu_resources((trainer or {}).get("resources"))
    owners = [owner_reference(job)]
    subdomain = service_name(job.name)
    # The env entries are the same for every worker but RANK: built once per call
    # and shared (read-only, like the rest of the template), only RANK's entry per pod.
    entries = [{"name": k, "value": v} for k, v in values.items()]
    rank = list(values).index("RANK")
    head, tail = kept_env + entries[:rank], [*entries[rank + 1 :], *_DOWNWARD_ENTRIES]
    # Per-pod dicts are copies of per-call prototypes with the per-worker keys
    # overwritten in place: same key order as building each one from scratch.
    at = next((i for i, c in enumerate(containers) if c is trainer), -1)
    trainer_proto = {**(trainer or {}), "env": None, "resources": resources}
    spec_proto = {
        **spec,
        "containers": None,
        "schedulerName": contract.SCHEDULER_NAME,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": job.grace_s,
        "hostname": None,
        "subdomain": subdomain,
    }
    pods: list[PodBody] = []
    for index in range(ws.gpus) if indices is None else indices:
        name = f"{job.name}-g{ws.generation}-w{index}"  # pod_name, inlined
        rank_s = str(index)
        pod_containers = list(containers)
        if at >= 0:
            pod_trainer = trainer_proto.copy()
            pod_trainer["env"] = [*head, {"name": "RANK", "value": rank_s}, *tail]
            pod_containers[at] = pod_trainer
        pod_spec = spec_proto.copy()
        pod_spec["containers"] = pod_containers
        pod_spec["hostname"] = name
        labels = base_labels.copy()
        labels[contract.WORKER_INDEX_LABEL] = rank_s
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": job.namespace,
                    "labels": labels,
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
