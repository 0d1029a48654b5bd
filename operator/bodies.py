"""Kubernetes bodies as TypedDicts (as kopf's ``_cogs/structs/bodies.py`` does).

Only the fields the operator reads or writes; everything else passes through
untyped. ``total=False`` because the API server omits empty fields.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Meta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    generation: int
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]


class GpuRange(TypedDict, total=False):
    requested: int
    min: int
    max: int


class RestartSpec(TypedDict, total=False):
    limit: int
    backoffSeconds: int
    maxBackoffSeconds: int


class DLJobSpec(TypedDict, total=False):
    globalBatchSize: int
    iterations: int
    gpus: GpuRange
    maxLocalBatchSize: int
    model: str
    trainerContainer: str
    masterPort: int
    terminationGracePeriodSeconds: int
    restart: RestartSpec
    template: dict[str, Any]


class Allocation(TypedDict, total=False):
    """``status.allocation``'s wire form; read through ``allocation.read_allocation``."""

    gpus: int
    frequencyMHz: int
    powerCapWatts: float
    block: list[dict[str, Any]]
    localBatchSize: int
    generation: int
    nodes: list[str]
    profilingUntil: str | None
    complete: bool
    stopped: bool


class Progress(TypedDict, total=False):
    iterations: int
    throughput: float
    estimatedCompletion: str
    summary: str


class Energy(TypedDict, total=False):
    joules: float
    watts: float


class ModelStatus(TypedDict, total=False):
    """``status.model``: profiling (``reconcile``) and the online refit (``learning``)."""

    prior: str
    samples: int
    params: dict[str, Any]
    fits: int
    fitErrorPercent: float
    measuredPower: dict[str, Any]
    otherGpuTypes: list[dict[str, Any]]
    profiledGpuCounts: list[int]
    profiledGpuCountsByType: list[dict[str, Any]]


class Condition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    observedGeneration: int


class DLJobStatus(TypedDict, total=False):
    phase: str
    message: str
    observedGeneration: int
    restarts: int
    lastFailureTime: str
    startTime: str
    completionTime: str
    allocation: Allocation
    progress: Progress
    energy: Energy
    model: ModelStatus
    conditions: list[Condition]


class DLJobBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Meta
    spec: DLJobSpec
    status: DLJobStatus


class PodBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Meta
    spec: dict[str, Any]
    status: dict[str, Any]


class ServiceBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Meta
    spec: dict[str, Any]


class NodeBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Meta
    spec: dict[str, Any]
    status: dict[str, Any]


class ConfigMapBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Meta
    data: dict[str, str]
