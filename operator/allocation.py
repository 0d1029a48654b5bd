"""One job's allocation: the allocator's single output per DLJob, kept in its
``status.allocation``, and the only input the job controller (``job_controller``)
converges the job's pods to.

The allocator (``reconcile``: lifecycle, snapshot, plan, ``carry_out``) decides it
and writes it into the job's status; the job controller reads it back, never the
plan. So what the pods carry (the clock, the power cap, the planned block, the
profiling sweep) always follows a value the status holds, and an operator
restarted after any write finds in status what the pods were made from and
rewrites nothing.

``read_allocation`` is the one reader of ``status.allocation`` (the pass's view of
a job and the metrics read it): the wire names (``frequencyMHz``, ``localBatchSize``,
``powerCapWatts``, ``profilingUntil``, CRD fields a running cluster holds) are
parsed here, into Python names with their units (``frequency_mhz``, ``power_cap_w``,
``profiling_until_s``), and ``status_fields`` writes them back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from powerflow.core.policy.snapshot import GpuSlot
from powerflow.core.timefmt import format_time_ms, parse_time

CLOCK_FIELD = "frequencyMHz"
"""``status.allocation``'s clock (MHz): the CRD's name, shown by ``kubectl get dlj``."""
CAP_FIELD = "powerCapWatts"
BLOCK_FIELD = "block"

_INT_MAX = 1 << 63


class JobAllocation(NamedTuple):
    """What the allocator gives one job, as its status records it (a tuple: one is
    read per job per pass)."""

    generation: int = 0
    """The allocation counter; the job's worker pods carry it in their names."""
    gpus: int = 0
    """Workers (one GPU each); 0: the job holds no GPUs."""
    local_batch_size: int = 0
    frequency_mhz: int = 0
    """The GPU clock every worker is locked at."""
    power_cap_w: float | None = None
    """The per-GPU power cap (watts, to a tenth); None: none."""
    block: tuple[GpuSlot, ...] = ()
    """The GPUs the plan gave the generation when it started (the extender takes
    them when free); empty: none planned. Read only while the generation is not
    complete: no worker of a complete one is created again."""
    profiling_until_s: float | None = None
    """End of the profiling window (Unix seconds); None: not profiling (or not yet)."""
    complete: bool = False
    """Every worker of the generation existed: a lost one restarts the generation."""
    stopped: bool = False
    """The operator stopped the generation: its workers are being deleted."""


def read_allocation(raw: object) -> JobAllocation:
    """``status.allocation`` as a ``JobAllocation``; anything junk reads as absent (0,
    None, empty), as ``job_view._clean_status`` does for the status it keeps."""
    if not raw or not isinstance(raw, dict):  # bodies are JSON dicts: no Mapping ABC check
        return _NONE
    get = raw.get
    cap, until, complete = get(CAP_FIELD), get("profilingUntil"), get("complete") is True
    block = None if complete else get(BLOCK_FIELD)
    return JobAllocation(
        count(get("generation")),
        count(get("gpus")),
        count(get("localBatchSize")),
        count(get(CLOCK_FIELD)),
        None if cap is None else _cap(cap),
        () if block is None else _slots(block),
        None if until is None else parse_time(until),
        complete,
        get("stopped") is True,
    )


_NONE = JobAllocation()


def status_fields(allocation: JobAllocation) -> dict[str, Any]:
    """The wire form of what a generation runs with: the allocator writes it into
    ``status.allocation`` (the rest of it, ``nodes``, ``profilingUntil``,
    ``complete`` and ``stopped``, is bookkeeping it sets as the generation goes)."""
    return {
        "gpus": allocation.gpus,
        CLOCK_FIELD: allocation.frequency_mhz,
        "localBatchSize": allocation.local_batch_size,
        "generation": allocation.generation,
        CAP_FIELD: allocation.power_cap_w,
        BLOCK_FIELD: block_field(allocation.block),
    }


def cap_w(cap: float | None) -> float | None:
    """A plan's per-GPU cap as status keeps it: rounded down to a tenth of a watt,
    the value the pods' ``power-limit-watts`` annotation carries (a cap only gets
    stricter in writing), so an unchanged cap never rewrites the status."""
    if cap is None:
        return None
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"power cap {cap} W must be finite and > 0")
    tenths = math.floor(cap * 10 + 1e-9)
    return (tenths if tenths > 1 else 1) / 10  # ``max(1, tenths)``, without the call


def block_field(block: Sequence[GpuSlot]) -> list[dict[str, Any]] | None:
    """``status.allocation.block``: ``[{"node": ..., "gpu": ...}, ...]`` sorted; None
    (the field removed) when no block was planned."""
    return [{"node": node, "gpu": gpu} for node, gpu in sorted(block)] or None


def profiling_until_field(until_s: float | None) -> str | None:
    return None if until_s is None else format_time_ms(until_s)


def count(value: Any, default: int = 0) -> int:
    """A non-negative integer written by someone else (status field, annotation).

    ``default`` for anything else: ``int()`` of a float ``1e400`` (inf) raises
    ``OverflowError``, of ``"1e400"`` or 5,000 digits ``ValueError``, of a
    dict ``TypeError``; none of it may stop a pass. Strings of digits count
    (annotations are strings); values past int64 do not.
    """
    if type(value) is int:  # the common cases first
        return value if 0 <= value < 1 << 63 else default
    if value is None:
        return default
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if 0 <= value < 1 << 63 else default
    if isinstance(value, float):
        ok = math.isfinite(value) and value.is_integer() and 0 <= value < 2.0**63
        return int(value) if ok else default
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return default


def _cap(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not 0 < value < _INT_MAX:
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _slots(value: Any) -> tuple[GpuSlot, ...]:
    if not isinstance(value, list):
        return ()
    slots = []
    for entry in value:
        node = entry.get("node") if isinstance(entry, Mapping) else None
        gpu = entry.get("gpu") if isinstance(entry, Mapping) else None
        if not isinstance(node, str) or isinstance(gpu, bool) or not isinstance(gpu, int):
            return ()
        if not 0 <= gpu < 1 << 16:
            return ()
        slots.append((node, gpu))
    return tuple(sorted(slots))
