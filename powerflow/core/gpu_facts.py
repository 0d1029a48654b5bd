"""What a node agent reads of its GPUs through NVML: the wire format, and the spec it gives.

The agent reads each GPU's product name, supported graphics clocks and
power-limit constraints once at start and posts them to the operator's ingest
(``contract.GPUS_PATH``) at start and every few minutes
(``nodeagent.sender``), so a restarted operator learns them again. The report
has a path of its own rather than a field of the sample batch: the batch
parser refuses unknown fields (``telemetry.parse_batch``), so an operator that
predates reports would refuse every batch that carried one, while a report to
it only earns a 404 on its own path, which the agent shrugs off.

A report is untrusted input: any process with the node agent's token can
send one. ``parse_report`` bounds it by physics, and a report past a bound is
refused whole (``GpuFactsError`` names the first bad field):

- at most ``MAX_GPUS_PER_NODE`` GPUs, each index once, in ``[0, 64)``;
- a product name of printable characters, at most ``MAX_NAME_CHARS``;
- graphics clocks strictly increasing, each within ``CLOCK_RANGE_MHZ``, at
  most ``MAX_CLOCKS`` of them (NVML lists about a hundred);
- power limits within ``POWER_RANGE_W`` (wider than any board's: the
  catalogue's run from 70 W, the T4's, to 700 W, the H100 SXM's), with
  ``min <= default <= max``; all three absent on a board without power
  management.

``node_spec`` turns an accepted report into the node's ``GpuSpec``: the
catalogue's type where the name is one of its NVML names, with the discovered
clocks and limits in place of the catalogue's, else a type estimated from the
discovered clocks and board limit by ``gpus.estimated_spec``'s rules. It never
goes past the catalogue's bounds: the board limit is capped at the catalogue's
largest (``gpus.LARGEST_P_MAX_W``), so a lying report cannot raise the budget
the policy counts per GPU beyond what any known board draws.

A *record* (``encode_record``) is an accepted report with the time it was
accepted, as the operator keeps it on the node (``contract.GPU_REPORT_ANNOTATION``)
so that a restarted operator plans the node's type at once. Whoever may patch
the node may edit it, so ``parse_record`` trusts it no more than a report: the
report inside goes through ``parse_report``'s bounds, it must be the node's own,
and its time is never later than now.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from powerflow.core.errors import DataError, PowerFlowError
from powerflow.core.gpus import LARGEST_P_MAX_W, GpuSpec, estimated_spec, gpu_spec, knee_clock
from powerflow.core.telemetry import MAX_GPUS_PER_NODE, TelemetryError, _name, _object, _only
from powerflow.core.timefmt import format_time, parse_time

MAX_NAME_CHARS: Final = 96
"""NVML's product names are at most 96 bytes (``NVML_DEVICE_NAME_V2_BUFFER_SIZE``)."""
MAX_CLOCKS: Final = 512
CLOCK_RANGE_MHZ: Final = (100, 3000)
POWER_RANGE_W: Final = (20.0, 1500.0)
MAX_RECORD_CHARS: Final = 256 * 1024
"""The API server's bound on all of an object's annotations together: no longer record
can be on a node, so a longer text is refused before it is parsed."""


class GpuFactsError(PowerFlowError):
    """A GPU report that cannot be accepted as sent."""


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML describes it (power limits None: no power management)."""

    index: int
    name: str
    clocks_mhz: tuple[int, ...]
    default_limit_w: float | None = None
    min_limit_w: float | None = None
    max_limit_w: float | None = None


@dataclass(frozen=True)
class GpuReport:
    node: str
    gpus: tuple[GpuFacts, ...]


def encode_report(report: GpuReport) -> dict[str, Any]:
    """The JSON object the agent posts."""
    return {
        "node": report.node,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "clocksMhz": list(g.clocks_mhz),
                "defaultLimitW": g.default_limit_w,
                "minLimitW": g.min_limit_w,
                "maxLimitW": g.max_limit_w,
            }
            for g in report.gpus
        ],
    }


def parse_report(obj: object) -> GpuReport:
    """Validate a decoded JSON body by the module's bounds."""
    try:
        body = _object(obj, "body")
        _only(body, {"node", "gpus"}, "body")
        node = _name(body.get("node"), "node")
    except TelemetryError as exc:
        raise GpuFactsError(str(exc)) from exc
    raw = body.get("gpus")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_GPUS_PER_NODE:
        raise GpuFactsError(f"gpus: expected a list of 1 to {MAX_GPUS_PER_NODE} GPUs")
    gpus = tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(raw))
    if len({g.index for g in gpus}) != len(gpus):
        raise GpuFactsError("gpus: an index given twice")
    return GpuReport(node, gpus)


def _gpu(obj: object, where: str) -> GpuFacts:
    if not isinstance(obj, dict):
        raise GpuFactsError(f"{where}: expected an object")
    fields = {"index", "name", "clocksMhz", "defaultLimitW", "minLimitW", "maxLimitW"}
    unknown = sorted(str(k) for k in obj if k not in fields)
    if unknown:
        raise GpuFactsError(f"{where}: unknown field(s) {', '.join(unknown)}")
    index = obj.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_GPUS_PER_NODE:
        raise GpuFactsError(f"{where}.index: expected an integer in [0, {MAX_GPUS_PER_NODE})")
    name = obj.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise GpuFactsError(f"{where}.name: expected 1 to {MAX_NAME_CHARS} printable characters")
    clocks = obj.get("clocksMhz")
    lo, hi = CLOCK_RANGE_MHZ
    if (
        not isinstance(clocks, list)
        or not 1 <= len(clocks) <= MAX_CLOCKS
        or any(isinstance(c, bool) or not isinstance(c, int) or not lo <= c <= hi for c in clocks)
        or any(a >= b for a, b in itertools.pairwise(clocks))
    ):
        raise GpuFactsError(
            f"{where}.clocksMhz: expected 1 to {MAX_CLOCKS} strictly increasing integers "
            f"in [{lo}, {hi}] MHz"
        )
    limits = [
        _watts(obj.get(k), f"{where}.{k}") for k in ("minLimitW", "defaultLimitW", "maxLimitW")
    ]
    low, default, high = limits
    if any(v is None for v in limits) and any(v is not None for v in limits):
        raise GpuFactsError(f"{where}: power limits are all given or none")
    if low is not None and default is not None and high is not None and not low <= default <= high:
        raise GpuFactsError(f"{where}: need minLimitW <= defaultLimitW <= maxLimitW")
    return GpuFacts(index, name, tuple(clocks), default, low, high)


def _watts(value: object, where: str) -> float | None:
    if value is None:
        return None
    lo, hi = POWER_RANGE_W
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GpuFactsError(f"{where}: expected a number of watts")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise GpuFactsError(f"{where}: {value!r:.40} outside [{lo:g}, {hi:g}] W")
    return float(value)


def encode_record(report: GpuReport, at_s: float) -> str:
    """The record of ``report``, accepted at Unix time ``at_s`` (module docstring)."""
    body = {"reportedAt": format_time(at_s), "report": encode_report(report)}
    return json.dumps(body, separators=(",", ":"))


def parse_record(text: str, node: str, now_s: float) -> tuple[GpuReport, float]:
    """A record read back from ``node``: its report and when it was accepted (at most
    ``now_s``); ``GpuFactsError`` when it is not one ``parse_report`` would accept of
    that node."""
    if len(text) > MAX_RECORD_CHARS:
        raise GpuFactsError(f"record: longer than {MAX_RECORD_CHARS} characters")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser
        raise GpuFactsError(f"record: not JSON ({type(exc).__name__})") from None
    if not isinstance(body, dict) or set(body) != {"reportedAt", "report"}:
        raise GpuFactsError("record: expected an object of reportedAt and report")
    at = parse_time(body["reportedAt"])
    if at is None:
        raise GpuFactsError("record: reportedAt is not an RFC 3339 time")
    report = parse_report(body["report"])
    if report.node != node:
        raise GpuFactsError(f"record: a report of node {report.node}, found on {node}")
    return report, min(at, now_s)


def node_spec(gpus: Sequence[GpuFacts]) -> GpuSpec:
    """The spec the node's GPUs give (module docstring); ``DataError`` when they
    disagree on their product or give no consistent spec.

    The GPUs of one node are one product (the device plugin advertises one
    resource); their common clocks and the tightest power range are the node's.
    """
    names = {g.name for g in gpus}
    if len(names) != 1:
        raise DataError(f"GPUs of several products on one node: {', '.join(sorted(names))}")
    (name,) = names
    clocks = sorted(set.intersection(*(set(g.clocks_mhz) for g in gpus)))
    if not clocks:
        raise DataError("the node's GPUs share no clock")
    managed = [g for g in gpus if g.default_limit_w is not None]
    board = min((g.default_limit_w or 0.0 for g in managed), default=None)
    low = max((g.min_limit_w or 0.0 for g in managed), default=None)
    if board is not None:
        board = min(board, LARGEST_P_MAX_W)
    if low is not None and board is not None:
        low = min(low, board)
    try:
        known: GpuSpec | None = gpu_spec(name)
    except DataError:
        known = None
    if known is None:
        if board is None:
            raise DataError(f"{name}: not in the catalogue and no board limit to plan power by")
        return estimated_spec(name, clocks, board, min_power_limit_w=low, nvml_names=(name,))
    # A catalogue type's own ranges bound what its report may say: its clocks within
    # the type's, its limits within the type's allowed range (an admin may lower the
    # default limit; no report may claim a floor below the board's own, where caps
    # would plan watts the GPU cannot go down to).
    top = known.clocks_mhz
    clocks = [c for c in clocks if top[0] <= c <= top[-1]] or list(top)
    floor = known.min_power_limit_w or 0.0
    board = known.max_power_w if board is None else min(max(board, floor), known.max_power_w)
    if low is not None:
        low = min(max(low, floor), board)
    f0 = _knee_within(known.f0_mhz, clocks)
    ref = known.reference_power_w
    return dataclasses.replace(
        known,
        clocks_mhz=tuple(clocks),
        default_clock_mhz=clocks[-1],
        f0_mhz=f0,
        max_power_w=board,
        idle_power_w=min(known.idle_power_w, board / 2),
        min_power_limit_w=low if managed else known.min_power_limit_w,
        reference_power_w=None if ref is None else min(ref, board),
    )


def merged_spec(specs: Sequence[GpuSpec]) -> GpuSpec:
    """Several nodes' specs of one type (``node_spec``'s) as one, by ``node_spec``'s own
    rule across GPUs: the clocks all of them have, the lowest board limit and
    reference power, the highest power floor (the first's where they share no clock)."""
    first = specs[0]
    if len(specs) == 1:
        return first
    clocks = sorted(set.intersection(*(set(s.clocks_mhz) for s in specs)))
    if not clocks:
        return first
    floors = [s.min_power_limit_w for s in specs if s.min_power_limit_w is not None]
    refs = [s.reference_power_w for s in specs if s.reference_power_w is not None]
    board = min(s.max_power_w for s in specs)
    return dataclasses.replace(
        first,
        clocks_mhz=tuple(clocks),
        default_clock_mhz=clocks[-1],
        f0_mhz=_knee_within(first.f0_mhz, clocks),
        max_power_w=board,
        idle_power_w=min(s.idle_power_w for s in specs),
        min_power_limit_w=min(max(floors), board) if floors else None,
        reference_power_w=min(refs) if refs else None,
    )


def _knee_within(f0_mhz: int, clocks: Sequence[int]) -> int:
    """The type's voltage knee where ``clocks`` reach it, else the knee of ``clocks``."""
    return f0_mhz if clocks[0] <= f0_mhz <= clocks[-1] else knee_clock(clocks)
