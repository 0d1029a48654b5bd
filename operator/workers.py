"""A job's allocation -> its worker pods and rendezvous Service (pure builders).

One worker per GPU (one ``nvidia.com/gpu`` each): the extender places each
pod on one GPU of the gang's buddy block, the node agent locks one GPU's clock
per pod, and torchrun runs one process per pod (``--nnodes=WORLD_SIZE
--node-rank=RANK``), so the rank is the pod's index. Names are deterministic
(``<job>-g<generation>-w<index>``), so a restarted operator recreating a pod
gets ``AlreadyExists`` instead of a duplicate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from powerflow.operator.bodies import PodBody
from powerflow.operator.jobs import JobRequest

from powerflow import contract


@dataclass(frozen=True)
class WorkerSet:
    """What one generation of a job's workers runs with."""

    generation: int
    gpus: int
    local_batch_size: int
    frequency_mhz: int


def pod_name(job: str, generation: int, index: int) -> str:
    return f"{job}-g{generation}-w{index}"


def service_name(job: str) -> str:
    return job


def master_addr(job: JobRequest, generation: int) -> str:
    """DNS name of worker 0 behind the headless Service (hostname.subdomain.ns.svc)."""
    return f"{pod_name(job.name, generation, 0)}.{service_name(job.name)}.{job.namespace}.svc"


def owner_reference(job: JobRequest) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def worker_env(job: JobRequest, ws: WorkerSet, index: int) -> list[dict[str, str]]:
    values = {
        "WORLD_SIZE": ws.gpus,
        "RANK": index,
        "MASTER_ADDR": master_addr(job, ws.generation),
        "MASTER_PORT": job.master_port,
        "LOCAL_BATCH_SIZE": ws.local_batch_size,
        "GLOBAL_BATCH_SIZE": job.global_batch_size,
        "POWERFLOW_ITERATIONS": job.iterations,
        "POWERFLOW_FREQUENCY_MHZ": ws.frequency_mhz,
        "POWERFLOW_JOB": job.name,
        "POWERFLOW_GENERATION": ws.generation,
    }
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def worker_pod(job: JobRequest, ws: WorkerSet, index: int) -> PodBody:
    """Worker ``index`` of ``ws``: the template plus GPU, scheduler, contract and env."""
    template = copy.deepcopy(job.template)
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    name = pod_name(job.name, ws.generation, index)
    labels = dict(meta.get("labels") or {})
    labels.update({contract.JOB_LABEL: job.name, contract.WORKER_INDEX_LABEL: str(index)})
    annotations = dict(meta.get("annotations") or {})
    annotations.update(
        {
            contract.WORKERS_ANNOTATION: str(ws.gpus),
            contract.FREQUENCY_ANNOTATION: str(ws.frequency_mhz),
            contract.GENERATION_ANNOTATION: str(ws.generation),
        }
    )
    ours = worker_env(job, ws, index)
    taken = {e["name"] for e in ours}
    for container in spec.get("containers", []):
        if container.get("name") != job.trainer:
            continue
        env = [e for e in container.get("env") or [] if e.get("name") not in taken]
        container["env"] = env + ours
        resources = container.setdefault("resources", {})
        for kind in ("limits", "requests"):
            resources.setdefault(kind, {})[contract.GPU_RESOURCE] = "1"
    spec.update(
        schedulerName=contract.SCHEDULER_NAME,
        restartPolicy="Never",
        terminationGracePeriodSeconds=job.grace_s,
        hostname=name,
        subdomain=service_name(job.name),
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def worker_pods(job: JobRequest, ws: WorkerSet) -> list[PodBody]:
    return [worker_pod(job, ws, i) for i in range(ws.gpus)]


def rendezvous_service(job: JobRequest) -> dict[str, Any]:
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
