"""Request bodies exactly as kube-scheduler serialises them for its extenders.

``ExtenderArgs`` and friends are Go structs without json tags, so their keys
are the Go field names (``Pod``, ``Nodes``, ``NodeNames``); the Kubernetes
objects inside are full ``v1.Pod`` and ``v1.NodeList`` values with their
usual lowercase keys, server-set metadata, defaulted spec fields and status,
as the scheduler's informer cache holds them. ``v1.NodeList`` built by the
scheduler has no TypeMeta and an empty ``metadata``.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from powerflow.core.contract import (
    API_VERSION,
    GENERATION_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    KIND,
    SCHEDULER_NAME,
    WORKER_INDEX_LABEL,
    WORKERS_ANNOTATION,
)

Body = dict[str, Any]


def _tag(text: str) -> str:
    """Four stable digits for a uid (stable across runs, unlike ``hash``)."""
    return f"{zlib.crc32(text.encode()) % 10**4:04d}"


def node(name: str, gpus: int = 8, product: str = "NVIDIA-A100-SXM4-40GB") -> Body:
    """A ``v1.Node`` as the scheduler's cache holds it (the kubelet's status included)."""
    resources = {
        "cpu": "96",
        "ephemeral-storage": "1967317632Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "1056482288Ki",
        "pods": "110",
    }
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "metadata": {
            "name": name,
            "uid": f"0d3c1f9a-{_tag(name)}-4c1e-9a57-5d2b8f0c6e1a",
            "resourceVersion": "48213",
            "creationTimestamp": "2025-11-20T08:14:02Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                GPU_PRODUCT_LABEL: product,
                "nvidia.com/gpu.count": str(gpus),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2025-11-20T08:14:02Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}},
                }
            ],
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2025-11-25T21:58:11Z",
                    "lastTransitionTime": "2025-11-20T08:14:33Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "172.18.0.3"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "4b2f0e0c7d3b4a3f9d0c2b1a0f9e8d7c",
                "systemUUID": "4b2f0e0c-7d3b-4a3f-9d0c-2b1a0f9e8d7c",
                "bootID": "b7b8c9d0-e1f2-4a3b-8c4d-5e6f7a8b9c0d",
                "kernelVersion": "6.8.0-45-generic",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.18",
                "kubeletVersion": "v1.31.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [],
        },
    }


def pod(
    name: str,
    *,
    job: str | None = None,
    workers: int | None = None,
    gpus: int = 1,
    namespace: str = "default",
    node_name: str | None = None,
    generation: str | None = None,
    index: int = 0,
    phase: str = "Pending",
    owner: Body | None = None,
) -> Body:
    """A ``v1.Pod`` as the scheduler sends it: created by the API server, defaulted, Pending.

    ``owner``: the DLJob (``dljob``) whose worker it is, as the operator creates its
    workers: that DLJob its controller, the generation of its current allocation annotated.
    """
    if owner is not None:
        generation = str(owner["status"]["allocation"]["generation"])
    labels: dict[str, str] = {"app.kubernetes.io/managed-by": "powerflow"} if job else {}
    annotations: dict[str, str] = {}
    if job is not None:
        labels[JOB_LABEL] = job
        labels[WORKER_INDEX_LABEL] = str(index)
    if workers is not None:
        annotations[WORKERS_ANNOTATION] = str(workers)
    if generation is not None:
        annotations[GENERATION_ANNOTATION] = generation
    limits = {GPU_RESOURCE: str(gpus)} if gpus else {}
    spec: Body = {
        "volumes": [
            {
                "name": "kube-api-access-7xq2d",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": [
            {
                "name": "worker",
                "image": "ghcr.io/powerflow/trainer:0.1.0",
                "args": ["--model", "resnet50"],
                "resources": {"limits": dict(limits), "requests": dict(limits)},
                "volumeMounts": [
                    {
                        "name": "kube-api-access-7xq2d",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": SCHEDULER_NAME,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if node_name:
        spec["nodeName"] = node_name
    meta: Body = {
        "name": name,
        "namespace": namespace,
        "uid": f"6f1d2c3b-{_tag(namespace + '/' + name)}-4e5f-8a9b-0c1d2e3f4a5b",
        "resourceVersion": "51877",
        "creationTimestamp": "2025-11-25T22:01:40Z",
        "labels": labels,
        "annotations": annotations,
    }
    if owner is not None:
        ref = {"apiVersion": API_VERSION, "kind": KIND, "controller": True}
        ref |= {"name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}
        meta["ownerReferences"] = [ref]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "qosClass": "BestEffort"}}


def dljob(name: str, *, gpus: int, generation: int = 1, namespace: str = "default") -> Body:
    """A ``DLJob`` as the API server stores it once the operator has allocated ``gpus`` GPUs
    to it in allocation ``generation`` (``status.allocation``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"9a8b7c6d-{_tag(namespace + '/' + name)}-4d3e-9f1a-2b3c4d5e6f7a",
            "resourceVersion": "50112",
            "generation": 1,
            "creationTimestamp": "2025-11-25T21:59:12Z",
        },
        "spec": {
            "model": "resnet50",
            "globalBatchSize": 256,
            "iterations": 100000,
            "gpus": {"requested": gpus},
            "template": {"spec": {"containers": [{"name": "worker", "image": "trainer"}]}},
        },
        "status": {"allocation": {"gpus": gpus, "frequencyMHz": 1410, "generation": generation}},
    }


def args(the_pod: Body, nodes: list[Body], *, cache_capable: bool) -> Body:
    """``ExtenderArgs``: names only when ``nodeCacheCapable``, else the full NodeList."""
    if cache_capable:
        return {"Pod": the_pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
    return {"Pod": the_pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def binding_args(the_pod: Body, node_name: str) -> Body:
    meta = the_pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node_name,
    }


def go_json(body: Any) -> bytes:
    """Compact JSON, as Go's encoding/json writes it."""
    return json.dumps(body, separators=(",", ":")).encode()
