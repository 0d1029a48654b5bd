"""What the node agent reads off a PowerFlow worker pod: one frozen view.

The operator writes everything the agent acts on as pod annotations and env
(``powerflow.core.contract``); this module turns a pod body from the watch into a
``PodView`` once, so the rest of the agent never digs in raw dicts. A pod
whose annotations cannot be read is still a view (its GPUs are still held):
the unreadable field becomes None and ``problems`` says why, so one bad
annotation never stops the agent from handling the node's other pods.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from powerflow.core import contract, untrusted
from powerflow.core.timefmt import parse_time

PodKey = tuple[str, str]
"""``(namespace, name)`` of a pod."""


@dataclass(frozen=True)
class ProfilePlan:
    """``contract.PROFILE_ANNOTATION``: clocks to sweep, each for ``slice_s``."""

    clocks_mhz: tuple[int, ...]
    slice_s: float
    until_s: float | None = None
    """When the operator ends the profiling window (Unix seconds); None: unknown."""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    job: str
    node: str | None
    phase: str
    ip: str | None
    worker_index: int | None
    generation: int | None
    n: int | None
    """GPUs of the whole job (``contract.WORKERS_ANNOTATION``: one GPU per worker)."""
    gpus_per_node: int | None
    """The job's placement: most GPUs of the job on one node, from the extender's
    ``contract.PLACEMENT_ANNOTATION`` (None until bound)."""
    local_batch_size: float | None
    frequency_mhz: int | None
    profile: ProfilePlan | None
    power_limit_w: float | None
    model_name: str | None
    gpus: int
    """GPUs the pod's containers request (``nvidia.com/gpu`` limits)."""
    problems: tuple[str, ...] = ()
    started_s: float | None = None
    """When the kubelet acknowledged the pod (``status.startTime``, Unix seconds; None
    before it has, or unreadable)."""
    strict: bool = False
    """Its clock or power-limit annotation is there but unreadable: its GPUs run at
    their lowest clock and power limit until the operator writes it again (a garbled
    value must never lift the budget's backstop)."""
    controlled: bool = True
    """Its controller is the DLJob its job label names (``controlled_by_its_job``): a
    PowerFlow worker. Anyone who may create pods can write the label."""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def job_key(self) -> tuple[str, str, int | None]:
        """``(namespace, job, generation)``: the pods one window sums over."""
        return (self.namespace, self.job, self.generation)

    @property
    def active(self) -> bool:
        """Whether the pod may hold GPUs now (bound, not finished)."""
        return self.node is not None and self.phase in ("Pending", "Running", "Unknown")


def pod_view(body: Mapping[str, Any]) -> PodView:
    """The view of a pod body (a watch event's object)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    problems: list[str] = []

    def parse(key: str, convert: Any) -> Any:
        raw = ann.get(key)
        if raw is None:
            return None
        try:
            return convert(raw)
        except Exception as e:  # hostile text: whatever it raises, the field is unreadable
            problems.append(f"annotation {key}={raw!r:.60}: {type(e).__name__}: {e!s:.200}")
            return None

    containers = spec.get("containers") or []
    frequency = parse(contract.FREQUENCY_ANNOTATION, _pos_int)
    power_limit = parse(contract.POWER_LIMIT_ANNOTATION, _pos_real)
    strict = (frequency is None and contract.FREQUENCY_ANNOTATION in ann) or (
        power_limit is None and contract.POWER_LIMIT_ANNOTATION in ann
    )
    return PodView(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        job=str(labels.get(contract.JOB_LABEL) or ""),
        node=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Pending"),
        ip=status.get("podIP") or None,
        worker_index=_int_or_none(labels.get(contract.WORKER_INDEX_LABEL)),
        generation=parse(contract.GENERATION_ANNOTATION, _nonneg_int),
        n=parse(contract.WORKERS_ANNOTATION, _pos_int),
        gpus_per_node=parse(contract.PLACEMENT_ANNOTATION, _gpus_per_node),
        local_batch_size=_env_batch(containers, problems),
        frequency_mhz=frequency,
        profile=parse(contract.PROFILE_ANNOTATION, parse_profile),
        power_limit_w=power_limit,
        model_name=ann.get(contract.MODEL_ANNOTATION) or None,
        gpus=sum(_gpu_limit(c) for c in containers),
        problems=tuple(problems),
        started_s=parse_time(status.get("startTime")),
        strict=strict,
        controlled=controlled_by_its_job(meta),
    )


def controlled_by_its_job(meta: Mapping[str, Any]) -> bool:
    """Whether the pod's controller (``contract.dljob_controller``) is the DLJob its job
    label names. The agent cannot read DLJobs, but the garbage collector keeps no pod
    whose owner is missing or in another namespace, so a pod that passes is a worker
    of a DLJob of its own namespace: a tenant can make one only for its own jobs."""
    job = (meta.get("labels") or {}).get(contract.JOB_LABEL)
    ref = contract.dljob_controller(meta)
    return (
        bool(job)
        and ref is not None
        and ref.get("apiVersion") == contract.API_VERSION
        and ref.get("name") == job
    )


def parse_profile(raw: str) -> ProfilePlan:
    """``contract.PROFILE_ANNOTATION``'s JSON; ValueError says what is wrong."""
    obj = untrusted.load_json(raw, "profile annotation")
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    clocks = obj.get("clocksMhz")
    if not isinstance(clocks, list) or not clocks:
        raise ValueError("clocksMhz: expected a non-empty list")
    slice_s = _pos_real(obj.get("sliceSeconds"))
    until = obj.get("untilS")
    until_s = None if until is None else _pos_real(until)
    return ProfilePlan(tuple(_pos_int(c) for c in clocks), slice_s, until_s)


def _gpus_per_node(raw: str) -> int:
    per_node: dict[str, int] = {}
    for node, _gpu in untrusted.parse_block(raw, "placement annotation"):
        per_node[node] = per_node.get(node, 0) + 1
    if not per_node:
        raise ValueError("empty block")
    return max(per_node.values())


def _env_batch(containers: list[dict[str, Any]], problems: list[str]) -> float | None:
    for c in containers:
        for e in c.get("env") or []:
            if e.get("name") == "LOCAL_BATCH_SIZE" and "value" in e:
                try:
                    return _pos_real(e["value"])
                except (ValueError, TypeError) as err:
                    problems.append(f"env LOCAL_BATCH_SIZE={e['value']!r:.40}: {err}")
                    return None
    return None


def _gpu_limit(container: Mapping[str, Any]) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    value = _int_or_none(limits.get(contract.GPU_RESOURCE))
    return value if value is not None and value > 0 else 0


def _int_or_none(raw: object) -> int | None:
    try:
        return int(str(raw)) if raw is not None else None
    except ValueError:
        return None


def _pos_int(raw: object) -> int:
    value = int(str(raw))
    if value <= 0:
        raise ValueError(f"{value} is not positive")
    return value


def _nonneg_int(raw: object) -> int:
    value = int(str(raw))
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _pos_real(raw: object) -> float:
    value = float(str(raw))
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{raw!r} is not a positive number")
    return value
