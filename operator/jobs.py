"""DLJob body -> a validated job request: the checks the schema cannot express.

The CRD's schema already guarantees types and minimums (and the API server
applies its defaults); this module refuses what is well-typed but cannot run,
each with the reason that ends up on the DLJob's condition and event. Bodies
that bypassed the schema (older CRD, tests) are refused here too rather than
crashing the allocation loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from powerflow.operator.bodies import DLJobBody
from powerflow.operator.timefmt import parse_time

from powerflow.errors import ResourceError

# Worker pods are <job>-g<generation>-w<index> and double as DNS hostnames
# (a 63-character label); the job name is also the headless Service's name,
# which must be a DNS-1035 label (starts with a letter).
MAX_NAME = 45
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class JobRequest:
    """One DLJob as the operator needs it: spec fields with defaults applied."""

    namespace: str
    name: str
    uid: str
    generation: int
    created_s: float
    global_batch_size: int
    iterations: int
    requested_gpus: int
    min_gpus: int
    max_gpus: int
    max_local_batch_size: int | None
    model_name: str | None
    trainer: str
    master_port: int
    grace_s: int
    restart_limit: int
    backoff_s: int
    max_backoff_s: int
    template: dict[str, Any] = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _int(spec: dict[str, Any], path: str, default: int | None = None) -> int:
    value: Any = spec
    if "." not in path:  # most fields: no split (parsing is per job per cold pass)
        value = spec.get(path) if isinstance(spec, dict) else None
    else:
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        if default is None:
            raise ResourceError("MissingField", f"spec.{path} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError("InvalidField", f"spec.{path} must be an integer, got {value!r}")
    return value


def _largest_power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def parse_dljob(body: DLJobBody) -> JobRequest:
    """Validate a DLJob; raise ``ResourceError`` with the reason if it cannot run."""
    meta = body.get("metadata", {})
    name, namespace = meta.get("name", ""), meta.get("namespace", "default")
    if len(name) > MAX_NAME or not NAME_RE.match(name):
        raise ResourceError(
            "InvalidName",
            f"name {name!r} must be a DNS-1035 label of at most {MAX_NAME} characters "
            "(it names the worker pods and the rendezvous Service)",
        )
    spec: dict[str, Any] = dict(body.get("spec") or {})
    global_batch = _int(spec, "globalBatchSize")
    iterations = _int(spec, "iterations")
    requested = _int(spec, "gpus.requested")
    low = _int(spec, "gpus.min", 1)
    high = _int(spec, "gpus.max", max(requested, low))
    cap = spec.get("maxLocalBatchSize")
    if min(global_batch, iterations, requested, low) < 1:
        raise ResourceError("InvalidField", "batch size, iterations and GPU counts must be >= 1")
    if not low <= requested <= high:
        raise ResourceError(
            "InvalidGPURange",
            f"need gpus.min <= gpus.requested <= gpus.max, got {low} <= {requested} <= {high}",
        )
    top = _largest_power_of_two_at_most(high)
    if top < low:
        raise ResourceError(
            "InvalidGPURange",
            f"gpus {low}..{high} contain no power of two; GPUs are given in power-of-two blocks",
        )
    if global_batch % top:
        raise ResourceError(
            "BatchNotDivisible",
            f"globalBatchSize {global_batch} is not divisible by {top} GPUs (the largest "
            f"power of two <= gpus.max): workers would train with unequal batches",
        )
    if cap is not None:
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ResourceError("InvalidField", f"maxLocalBatchSize must be >= 1, got {cap!r}")
        if global_batch // top > cap:
            raise ResourceError(
                "BatchTooLarge",
                f"even on {top} GPUs the local batch {global_batch // top} exceeds "
                f"maxLocalBatchSize {cap}: raise gpus.max or lower globalBatchSize",
            )
    template = spec.get("template")
    containers = (template or {}).get("spec", {}).get("containers") if template else None
    if not isinstance(containers, list) or not containers:
        raise ResourceError("NoTrainerContainer", "spec.template.spec.containers is empty")
    names = [c.get("name") for c in containers if isinstance(c, dict)]
    trainer = spec.get("trainerContainer") or names[0]
    if trainer not in names or not trainer:
        raise ResourceError(
            "NoTrainerContainer",
            f"trainer container {trainer!r} is not in the template (has {names})",
        )
    restart = spec.get("restart") or {}
    model = spec.get("model")
    return JobRequest(
        namespace=namespace,
        name=name,
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation", 1)),
        created_s=parse_time(meta.get("creationTimestamp")) or 0.0,
        global_batch_size=global_batch,
        iterations=iterations,
        requested_gpus=requested,
        min_gpus=low,
        max_gpus=high,
        max_local_batch_size=cap,
        model_name=str(model) if model else None,
        trainer=str(trainer),
        master_port=_int(spec, "masterPort", 29500),
        grace_s=_int(spec, "terminationGracePeriodSeconds", 60),
        restart_limit=_int(restart, "limit", 3),
        backoff_s=_int(restart, "backoffSeconds", 10),
        max_backoff_s=_int(restart, "maxBackoffSeconds", 300),
        template=dict(template or {}),
    )


def too_large(job: JobRequest, cluster_gpus: int) -> str | None:
    """Why the job cannot run on this cluster at all, or ``None``.

    Not a validation error: the cluster may grow, so the job waits with a
    condition instead of failing.
    """
    if job.min_gpus > cluster_gpus:
        return f"needs at least {job.min_gpus} GPUs, the cluster has {cluster_gpus}"
    return None


CacheKey = tuple[str, str, str, int, str]


class RequestCache:
    """``parse_dljob`` memoised across passes by (namespace, name, uid, generation).

    The API server bumps ``metadata.generation`` on every spec change (the
    status subresource keeps status writes out of it), so a DLJob whose
    generation is unchanged parses to the same request or the same refusal.
    Parsing every job on every pass cost more than the rest of a pass's
    bookkeeping at hundreds of jobs. Bodies without a ``uid`` (never from an
    API server) are not cached. ``retain`` drops the jobs a pass did not see.
    """

    def __init__(self) -> None:
        self._entries: dict[CacheKey, JobRequest | tuple[str, str]] = {}
        self._seen: set[CacheKey] = set()

    def parse(self, body: DLJobBody) -> JobRequest:
        meta = body.get("metadata", {})
        uid = meta.get("uid", "")
        if not uid:
            return parse_dljob(body)
        key = (
            meta.get("namespace", "default"),
            meta.get("name", ""),
            uid,
            int(meta.get("generation", 1)),
            meta.get("creationTimestamp", ""),
        )
        self._seen.add(key)
        entry = self._entries.get(key)
        if entry is None:
            try:
                entry = parse_dljob(body)
            except ResourceError as exc:
                entry = (exc.reason, str(exc))
            self._entries[key] = entry
        if isinstance(entry, tuple):  # a fresh error each time: no traceback piles up
            raise ResourceError(*entry)
        return entry

    def retain_seen(self) -> None:
        """Forget every job not parsed since the last call (deleted or changed)."""
        self._entries = {k: v for k, v in self._entries.items() if k in self._seen}
        self._seen = set()

    def __len__(self) -> int:
        return len(self._entries)
