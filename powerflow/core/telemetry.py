"""Per-iteration samples the node agents send the operator: the wire format.

The agent and the operator never import each other, so the batch they
exchange (``contract.SAMPLES_PATH``) is defined here, in the core, as frozen
dataclasses with one encoder and one validating parser. The parser is the
operator's first line of defence against a confused or hostile sender: every
field is type- and range-checked, NaN and infinities are refused, and the
first problem is reported as one ``TelemetryError`` line naming the field
(the ingest endpoint turns it into a 400).

A sample covers one *window* of iterations of one job on one node: the
iterations the job completed between two iteration boundaries at one clock,
and the energy the job's GPUs on that node (``gpus_measured`` of them) drew
over the window. ``energy_j`` is per iteration, summed over those GPUs; the
operator scales it to the job's ``n`` GPUs (data-parallel workers are
symmetric) before fitting, because the performance models' energy is per
iteration of the whole job (``powerflow.core.models.samples``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

from powerflow.core.errors import PowerFlowError

MAX_SAMPLES_PER_BATCH: Final = 2000
"""Most samples one batch may carry: an agent at one window per second on 8
GPUs sends a few per second, so a full batch means minutes of backlog."""
MAX_BODY_BYTES: Final = 1 << 20
"""Largest batch body the operator reads (1 MiB: 2,000 samples of ~300 bytes)."""
MAX_PROGRESS_PER_BATCH: Final = 256
"""Most jobs one batch may report progress of: one per job with workers on the node."""
MAX_ITERATIONS: Final = 1 << 53
"""Iteration counts stay exact in a JSON double (what any sender's JSON library keeps)."""
MAX_GPUS: Final = 65536
MAX_GPUS_PER_NODE: Final = 64

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
"""A Kubernetes object name (DNS-1123 subdomain), as namespaces, jobs and nodes are."""


class TelemetryError(PowerFlowError):
    """A sample batch that cannot be accepted as sent."""


@dataclass(frozen=True)
class WindowSample:
    """One window of one job on one node (see the module docstring)."""

    namespace: str
    job: str
    generation: int
    n: int
    """GPUs of the whole job."""
    gpus_per_node: int
    """The job's placement: GPUs it uses per node (the models' ``r``)."""
    local_batch_size: float
    frequency_mhz: int
    """The SM clock locked over the whole window."""
    gpus_measured: int
    """The job's GPUs on the sender's node, whose energy ``energy_j`` sums."""
    iterations: int
    step_time_s: float
    energy_j: float
    """Energy per iteration of the ``gpus_measured`` GPUs (J)."""
    end_s: float
    """When the window closed (Unix seconds: the agent converts from its monotonic clock)."""


@dataclass(frozen=True)
class NodePower:
    """The board power of all the sender's GPUs at one moment."""

    watts: float
    at_s: float


@dataclass(frozen=True)
class JobProgress:
    """The most iterations a job's workers on the sender's node have reported.

    The worker library reports its cumulative count (from the checkpoint it
    resumed at) to its node's agent, which passes the latest on with every post:
    the operator's count of a job's progress, and how it knows a job finished,
    without any pod writing to the API server.
    """

    namespace: str
    job: str
    generation: int
    iterations: int


@dataclass(frozen=True)
class SampleBatch:
    node: str
    samples: tuple[WindowSample, ...]
    power: NodePower | None = None
    progress: tuple[JobProgress, ...] = ()


_SAMPLE_FIELDS: Final = {
    "namespace": "namespace",
    "job": "job",
    "generation": "generation",
    "n": "n",
    "gpus_per_node": "gpusPerNode",
    "local_batch_size": "localBatchSize",
    "frequency_mhz": "frequencyMhz",
    "gpus_measured": "gpusMeasured",
    "iterations": "iterations",
    "step_time_s": "stepTimeS",
    "energy_j": "energyJ",
    "end_s": "endS",
}


def encode_batch(batch: SampleBatch) -> dict[str, Any]:
    """The JSON object the agent posts."""
    out: dict[str, Any] = {
        "node": batch.node,
        "samples": [
            {wire: getattr(s, attr) for attr, wire in _SAMPLE_FIELDS.items()} for s in batch.samples
        ],
    }
    if batch.power is not None:
        out["power"] = {"watts": batch.power.watts, "atS": batch.power.at_s}
    if batch.progress:
        out["progress"] = [_encode_progress(p) for p in batch.progress]
    return out


def _encode_progress(p: JobProgress) -> dict[str, Any]:
    return {"namespace": p.namespace, "job": p.job, "generation": p.generation,
            "iterations": p.iterations}  # fmt: skip


def sendable(progress: JobProgress) -> bool:
    """Whether ``parse_batch`` takes this entry: the agent leaves out one it would
    refuse (a job label that is not an object name, a generation out of range), which
    would otherwise get every batch of its node refused, samples and all."""
    try:
        _progress(_encode_progress(progress), "progress")
    except TelemetryError:
        return False
    return True


def parse_batch(obj: object) -> SampleBatch:
    """Validate a decoded JSON body; ``TelemetryError`` names the first bad field."""
    body = _object(obj, "body")
    _only(body, {"node", "samples", "power", "progress"}, "body")
    node = _name(body.get("node"), "node")
    raw = body.get("samples")
    if not isinstance(raw, list):
        raise TelemetryError("samples: expected a list")
    if len(raw) > MAX_SAMPLES_PER_BATCH:
        raise TelemetryError(f"samples: {len(raw)} samples, at most {MAX_SAMPLES_PER_BATCH}")
    samples = tuple(_sample(s, f"samples[{i}]") for i, s in enumerate(raw))
    power = None
    if body.get("power") is not None:
        p = _object(body["power"], "power")
        _only(p, {"watts", "atS"}, "power")
        power = NodePower(
            watts=_real(p.get("watts"), "power.watts", 0.0, 1e6, open_low=False),
            at_s=_real(p.get("atS"), "power.atS", 0.0, 1e11),
        )
    raw_progress = body.get("progress", [])
    if not isinstance(raw_progress, list):
        raise TelemetryError("progress: expected a list")
    if len(raw_progress) > MAX_PROGRESS_PER_BATCH:
        raise TelemetryError(
            f"progress: {len(raw_progress)} jobs, at most {MAX_PROGRESS_PER_BATCH}"
        )
    progress = tuple(_progress(p, f"progress[{i}]") for i, p in enumerate(raw_progress))
    return SampleBatch(node=node, samples=samples, power=power, progress=progress)


def _progress(obj: object, where: str) -> JobProgress:
    p = _object(obj, where)
    _only(p, {"namespace", "job", "generation", "iterations"}, where)
    return JobProgress(
        namespace=_name(p.get("namespace"), f"{where}.namespace"),
        job=_name(p.get("job"), f"{where}.job"),
        generation=_int(p.get("generation"), f"{where}.generation", 0, 1 << 31),
        iterations=_int(p.get("iterations"), f"{where}.iterations", 0, MAX_ITERATIONS),
    )


def _sample(obj: object, where: str) -> WindowSample:
    s = _object(obj, where)
    _only(s, set(_SAMPLE_FIELDS.values()), where)
    n = _int(s.get("n"), f"{where}.n", 1, MAX_GPUS)
    r = _int(s.get("gpusPerNode"), f"{where}.gpusPerNode", 1, MAX_GPUS_PER_NODE)
    if r > n:
        raise TelemetryError(f"{where}.gpusPerNode: {r} exceeds n = {n}")
    measured = _int(s.get("gpusMeasured"), f"{where}.gpusMeasured", 1, MAX_GPUS_PER_NODE)
    if measured > n:
        raise TelemetryError(f"{where}.gpusMeasured: {measured} exceeds n = {n}")
    return WindowSample(
        namespace=_name(s.get("namespace"), f"{where}.namespace"),
        job=_name(s.get("job"), f"{where}.job"),
        generation=_int(s.get("generation"), f"{where}.generation", 0, 1 << 31),
        n=n,
        gpus_per_node=r,
        local_batch_size=_real(s.get("localBatchSize"), f"{where}.localBatchSize", 0.0, 1e7),
        frequency_mhz=_int(s.get("frequencyMhz"), f"{where}.frequencyMhz", 1, 100_000),
        gpus_measured=measured,
        iterations=_int(s.get("iterations"), f"{where}.iterations", 1, 1 << 40),
        step_time_s=_real(s.get("stepTimeS"), f"{where}.stepTimeS", 0.0, 1e6),
        energy_j=_real(s.get("energyJ"), f"{where}.energyJ", 0.0, 1e12),
        end_s=_real(s.get("endS"), f"{where}.endS", 0.0, 1e11),
    )


def _object(obj: object, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TelemetryError(f"{where}: expected an object")
    return obj


def _only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise TelemetryError(f"{where}: unknown field(s) {', '.join(unknown)}")


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise TelemetryError(f"{where}: expected a Kubernetes object name, got {value!r:.80}")
    return value


def _int(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TelemetryError(f"{where}: expected an integer, got {value!r:.40}")
    if not lo <= value <= hi:
        raise TelemetryError(f"{where}: {value} outside [{lo}, {hi}]")
    return value


def _real(value: object, where: str, lo: float, hi: float, *, open_low: bool = True) -> float:
    """A finite number in ``(lo, hi]`` (``[lo, hi]`` when not ``open_low``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TelemetryError(f"{where}: expected a number, got {value!r:.40}")
    x = float(value)
    if not math.isfinite(x) or x > hi or x < lo or (open_low and x == lo):
        bound = "(" if open_low else "["
        raise TelemetryError(f"{where}: {value!r:.40} outside {bound}{lo:g}, {hi:g}]")
    return x
