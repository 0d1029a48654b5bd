"""DLJob body -> a validated job request: the checks the schema cannot express.

The CRD's schema already guarantees types and bounds (and the API server
applies its defaults); this module refuses what is well-typed but cannot run,
each with the reason that ends up on the DLJob's condition and event. Bodies
that bypassed the schema (older CRD, tests) are refused here too rather than
crashing the allocation loop: the same bounds (``BOUNDS``) and the shape of the
worker template (``template`` is schemaless in the CRD), so that nothing but
``ResourceError`` ever comes out of ``parse_dljob``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from powerflow.operator.bodies import DLJobBody
from powerflow.operator.records import filled

from powerflow.core.errors import ResourceError
from powerflow.core.timefmt import parse_time

# Worker pods are <job>-g<generation>-w<index> and double as DNS hostnames
# (a 63-character label); the job name is also the headless Service's name,
# which must be a DNS-1035 label (starts with a letter).
MAX_NAME = 45
DEFAULT_GRACE_S = 60
"""``spec.terminationGracePeriodSeconds``'s default (the CRD's): time to checkpoint."""
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


# Bounds of every integer field, the same as the CRD's schema (``crds/dljob.yaml``,
# pinned by tests/test_crd.py) so that bodies that bypassed the schema are refused
# alike. Generous but safe: every value fits a float64 exactly (progress, ETA and
# energy are floats), times stay within year 9999, and 2**restarts stays small.
BOUNDS: dict[str, tuple[int, int]] = {
    "globalBatchSize": (1, 1 << 24),
    # 10**12 iterations: a million times a long training run, yet far below 2**53,
    # so iteration counts stay exact as floats and in int64 status fields.
    "iterations": (1, 10**12),
    "gpus.requested": (1, 1 << 16),
    "gpus.min": (1, 1 << 16),
    "gpus.max": (1, 1 << 16),
    "maxLocalBatchSize": (1, 1 << 24),
    "masterPort": (1, 65535),
    # One day to write a checkpoint; the kubelet counts it in seconds (int64).
    "terminationGracePeriodSeconds": (0, 86400),
    "restart.limit": (0, 10_000),
    "restart.backoffSeconds": (0, 86400),
    "restart.maxBackoffSeconds": (0, 86400),
}


def _keys(path: str) -> tuple[str, str | None, int, int]:
    first, _, inner = path.partition(".")
    assert "." not in inner, path
    return (first, inner or None, *BOUNDS[path])


_PARTS = {path: _keys(path) for path in BOUNDS}
"""Each path's key, its key within that (None: none) and its bounds, looked up once per
field per job (``_int``)."""


def _int(spec: dict[str, Any], path: str, default: int | None = None) -> int:
    """``spec.<path>`` as an integer within ``BOUNDS``, or ``default`` when absent.

    A plain ``int`` within bounds, the common case, returns before the checks
    that explain a refusal: parsing is per job per cold pass.
    """
    first, inner, low, high = _PARTS[path]
    value: Any = spec.get(first)
    if inner is not None:
        value = value.get(inner) if isinstance(value, dict) else None
    # not bool, nor another subclass: those take the checks below
    if type(value) is int and low <= value <= high:
        return value
    if value is None:
        if default is None:
            raise ResourceError("MissingField", f"spec.{path} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError("InvalidField", f"spec.{path} must be an integer, got {_short(value)}")
    if not low <= value <= high:
        raise ResourceError(
            "InvalidField", f"spec.{path} must be in {low}..{high}, got {_short(value)}"
        )
    return value


_GLOBAL_BATCH, _ITERATIONS, _GPUS, _LOCAL_BATCH, _PORT, _GRACE, _RESTARTS, _SECONDS = (
    BOUNDS["globalBatchSize"], BOUNDS["iterations"], BOUNDS["gpus.requested"],
    BOUNDS["maxLocalBatchSize"], BOUNDS["masterPort"], BOUNDS["terminationGracePeriodSeconds"],
    BOUNDS["restart.limit"], BOUNDS["restart.backoffSeconds"],
)  # fmt: skip
assert (
    BOUNDS["gpus.min"] == BOUNDS["gpus.max"] == _GPUS
    and BOUNDS["restart.maxBackoffSeconds"] == _SECONDS
)
_NO_GROUP: dict[str, Any] = {}


def _plain_ints(
    spec: dict[str, Any],
) -> tuple[int, int, int, int, int, int | None, int, int, int, int, int] | None:
    """Every integer field of ``spec`` at once (``parse_dljob``'s order: global batch,
    iterations, GPUs requested, min and max, max local batch or None, master port,
    grace period, restart limit, backoff and max backoff), where each is a plain
    ``int`` within ``BOUNDS`` or absent where it has a default, the common DLJob;
    else None, and ``parse_dljob`` checks field by field (``_int``), in its order,
    so that a refusal names the same field. The same values as ``_int`` field by
    field (``tests/test_operator_parse_fast.py``), in one call instead of ten: about
    a fifth of parsing a DLJob."""
    gpus = spec.get("gpus")
    restart = spec.get("restart")
    if type(gpus) is not dict:
        return None
    if restart is None:
        restart = _NO_GROUP
    elif type(restart) is not dict:
        return None
    get, group = spec.get, restart.get
    batch, iterations, requested = get("globalBatchSize"), get("iterations"), gpus.get("requested")
    low, high, cap = gpus.get("min", 1), gpus.get("max"), get("maxLocalBatchSize")
    port, grace = get("masterPort", 29500), get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    limit = group("limit", 3)
    backoff, most = group("backoffSeconds", 10), group("maxBackoffSeconds", 300)
    if high is None and type(requested) is int and type(low) is int:
        high = max(requested, low)
    if not (
        type(batch) is int and _GLOBAL_BATCH[0] <= batch <= _GLOBAL_BATCH[1]
        and type(iterations) is int and _ITERATIONS[0] <= iterations <= _ITERATIONS[1]
        and type(requested) is int and _GPUS[0] <= requested <= _GPUS[1]
        and type(low) is int and _GPUS[0] <= low <= _GPUS[1]
        and type(high) is int and _GPUS[0] <= high <= _GPUS[1]
        and (cap is None or (type(cap) is int and _LOCAL_BATCH[0] <= cap <= _LOCAL_BATCH[1]))
        and type(port) is int and _PORT[0] <= port <= _PORT[1]
        and type(grace) is int and _GRACE[0] <= grace <= _GRACE[1]
        and type(limit) is int and _RESTARTS[0] <= limit <= _RESTARTS[1]
        and type(backoff) is int and _SECONDS[0] <= backoff <= _SECONDS[1]
        and type(most) is int and _SECONDS[0] <= most <= _SECONDS[1]
    ):  # fmt: skip
        return None
    return batch, iterations, requested, low, high, cap, port, grace, limit, backoff, most


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` for messages, cut short (a body may hold anything, of any size)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int of 4300+ digits, nesting too deep
        text = "an unprintable value"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _largest_power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ResourceError("InvalidTemplate", f"{where} must be a map of strings to strings")
    return value


def _optional_dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ResourceError("InvalidTemplate", f"{where} must be an object, got {_short(value)}")
    return value


def _check_template(template: Any, trainer_name: Any) -> str:
    """Refuse a template ``worker_pods`` cannot build from; return the trainer's name.

    Checks exactly the paths ``worker_pods`` reads or extends (metadata labels
    and annotations, the pod spec, the containers, the trainer's env and
    resources); the rest of the template passes through to the API server,
    which validates it (a refusal there is reported on the job, not fatal).
    """
    if not isinstance(template, dict):
        raise ResourceError("InvalidTemplate", "spec.template must be an object")
    meta = template.get("metadata")
    if meta is not None:  # most templates have none: no calls then
        meta = _optional_dict(meta, "spec.template.metadata")
        _string_map(meta.get("labels"), "spec.template.metadata.labels")
        _string_map(meta.get("annotations"), "spec.template.metadata.annotations")
    pod_spec = template.get("spec")
    if not isinstance(pod_spec, dict):
        raise ResourceError("InvalidTemplate", "spec.template.spec must be an object")
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ResourceError("NoTrainerContainer", "spec.template.spec.containers is empty")
    names: list[str] = []
    for i, container in enumerate(containers):
        name = container.get("name") if isinstance(container, dict) else None
        if not isinstance(name, str) or not name:
            raise ResourceError(
                "InvalidTemplate",
                f"spec.template.spec.containers[{i}] must be an object with a string name",
            )
        if name in names:
            raise ResourceError("InvalidTemplate", f"two containers are named {name!r}")
        names.append(name)
    trainer = trainer_name or names[0]  # absent or "": the first container
    if not isinstance(trainer, str) or trainer not in names:
        raise ResourceError(
            "NoTrainerContainer",
            f"trainer container {_short(trainer)} is not in the template (has {_short(names)})",
        )
    container = containers[names.index(trainer)]
    env = container.get("env")
    if env is not None and not (
        isinstance(env, list)
        and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in env)
    ):
        raise ResourceError(
            "InvalidTemplate", f"container {trainer!r}: env must be a list of {{name: ...}}"
        )
    # The messages' texts are built only for a refusal (``where`` is per job per cold pass).
    resources = container.get("resources")
    if resources is not None:
        _optional_dict(resources, f"container {trainer!r}: resources")
        for kind in ("limits", "requests"):
            value = resources.get(kind)
            if value is not None and not isinstance(value, dict):
                _optional_dict(value, f"container {trainer!r}: resources.{kind}")
    return trainer


def parse_dljob(body: DLJobBody) -> JobRequest:
    """Validate a DLJob; raise ``ResourceError`` with the reason if it cannot run.

    Never raises anything else, whatever the body holds (pinned by a property
    test): one bad DLJob must not stop the loop for the others.
    """
    meta: Any = body.get("metadata") if isinstance(body, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "default")
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME_RE.match(name):
        raise ResourceError(
            "InvalidName",
            f"name {_short(name)} must be a DNS-1035 label of at most {MAX_NAME} characters "
            "(it names the worker pods and the rendezvous Service)",
        )
    if not isinstance(namespace, str):
        raise ResourceError("InvalidName", f"namespace {_short(namespace)} is not a string")
    raw_spec: Any = body.get("spec")
    if raw_spec is not None and not isinstance(raw_spec, dict):
        raise ResourceError("InvalidField", "spec must be an object")
    spec: dict[str, Any] = raw_spec or {}  # only read
    for group in ("gpus", "restart"):
        value = spec.get(group)
        if value is not None and not isinstance(value, dict):
            _optional_dict(value, f"spec.{group}")
    plain = _plain_ints(spec)
    if plain is not None:
        global_batch, iterations, requested, low, high, cap, port, grace, limit, backoff, most = (
            plain
        )
    else:  # each field's checks, in order: the first refusal is the one reported
        global_batch = _int(spec, "globalBatchSize")
        iterations = _int(spec, "iterations")
        requested = _int(spec, "gpus.requested")
        low = _int(spec, "gpus.min", 1)
        high = _int(spec, "gpus.max", max(requested, low))
        cap = spec.get("maxLocalBatchSize")
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
        if plain is None:
            cap = _int(spec, "maxLocalBatchSize")
        if global_batch // top > cap:
            raise ResourceError(
                "BatchTooLarge",
                f"even on {top} GPUs the local batch {global_batch // top} exceeds "
                f"maxLocalBatchSize {cap}: raise gpus.max or lower globalBatchSize",
            )
    template: Any = spec.get("template")  # a dict once ``_check_template`` passed
    trainer = _check_template(template, spec.get("trainerContainer"))
    model = spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ResourceError("InvalidField", f"spec.model must be a string, got {_short(model)}")
    if plain is None:
        port = _int(spec, "masterPort", 29500)
        grace = _int(spec, "terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        limit = _int(spec, "restart.limit", 3)
        backoff = _int(spec, "restart.backoffSeconds", 10)
        most = _int(spec, "restart.maxBackoffSeconds", 300)
    return filled(  # ``JobRequest(...)``, every field given (``records``)
        JobRequest,
        {
            "namespace": namespace,
            "name": name,
            "uid": str(meta.get("uid", "")),
            "generation": object_generation(meta),
            "created_s": parse_time(meta.get("creationTimestamp")) or 0.0,
            "global_batch_size": global_batch,
            "iterations": iterations,
            "requested_gpus": requested,
            "min_gpus": low,
            "max_gpus": high,
            "max_local_batch_size": cap,
            "model_name": model or None,
            "trainer": trainer,
            "master_port": port,
            "grace_s": grace,
            "restart_limit": limit,
            "backoff_s": backoff,
            "max_backoff_s": most,
            "template": dict(template),
        },
    )


def object_generation(meta: Any) -> int:
    """``metadata.generation`` (1 when absent or not a sane integer).

    The API server always sets a positive int64; anything else came from a
    body that bypassed it and must not crash the pass.
    """
    value = meta.get("generation", 1) if isinstance(meta, dict) else 1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 63:
        return 1
    return value


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
        meta: Any = body.get("metadata")
        uid = meta.get("uid", "") if isinstance(meta, dict) else ""
        if not uid or not isinstance(meta, dict):
            return parse_dljob(body)
        key = (
            str(meta.get("namespace", "default")),
            str(meta.get("name", "")),
            str(uid),
            object_generation(meta),
            str(meta.get("creationTimestamp", "")),
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
