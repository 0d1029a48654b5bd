"""What the operator tells a worker through its environment (read once, never raises).

The operator sets these on every worker pod (``powerflow.operator.workers``):
``POWERFLOW_POD_NAME``, ``POWERFLOW_POD_NAMESPACE``, ``POWERFLOW_POD_UID``
(downward API ``metadata.*``), ``POWERFLOW_AGENT_HOST`` (downward API
``status.hostIP``: the node, where the agent's hostPort listens),
``POWERFLOW_AGENT_PORT``, ``POWERFLOW_GRACE_SECONDS`` (the pod's termination
grace period), ``RANK``, ``WORLD_SIZE``, ``POWERFLOW_JOB``,
``POWERFLOW_GENERATION`` and ``POWERFLOW_ITERATIONS``. The NVIDIA device
plugin sets ``NVIDIA_VISIBLE_DEVICES`` to the UUIDs of the container's GPUs.
Outside a PowerFlow pod (a laptop, a notebook) they are absent and the
library does nothing but count: training code runs unchanged anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from powerflow.core import contract

DEFAULT_GRACE_S = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""


@dataclass(frozen=True)
class WorkerEnv:
    pod: str | None
    namespace: str | None
    uid: str | None
    agent_host: str | None
    agent_port: int
    rank: int
    world_size: int
    job: str | None
    generation: int | None
    iterations_total: int | None
    grace_s: float
    gpu_uuids: tuple[str, ...]

    @property
    def in_pod(self) -> bool:
        """Whether the downward API named the pod (reports and progress need it)."""
        return bool(self.pod and self.namespace and self.uid)


def read_env(env: Mapping[str, str] | None = None) -> WorkerEnv:
    """The worker's environment (``os.environ`` by default); junk reads as absent."""
    e = os.environ if env is None else env
    port = _int(e.get("POWERFLOW_AGENT_PORT"))
    grace = _float(e.get("POWERFLOW_GRACE_SECONDS"))
    devices = e.get("NVIDIA_VISIBLE_DEVICES") or ""
    uuids = tuple(d.strip() for d in devices.split(",") if d.strip().startswith(("GPU-", "MIG-")))
    return WorkerEnv(
        pod=e.get("POWERFLOW_POD_NAME") or None,
        namespace=e.get("POWERFLOW_POD_NAMESPACE") or None,
        uid=e.get("POWERFLOW_POD_UID") or None,
        agent_host=e.get("POWERFLOW_AGENT_HOST") or None,
        agent_port=port if port is not None and 0 < port < 65536 else contract.AGENT_WORKER_PORT,
        rank=_int(e.get("RANK")) or 0,
        world_size=_int(e.get("WORLD_SIZE")) or 1,
        job=e.get("POWERFLOW_JOB") or None,
        generation=_int(e.get("POWERFLOW_GENERATION")),
        iterations_total=_int(e.get("POWERFLOW_ITERATIONS")),
        grace_s=grace if grace is not None and grace > 0 else DEFAULT_GRACE_S,
        gpu_uuids=uuids[:16],
    )


def _int(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _float(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value == value and value != float("inf") else None
