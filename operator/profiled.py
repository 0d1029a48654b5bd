"""The GPU counts a job has profiled, per GPU type, as its ``status.model`` keeps them.

A job profiles a GPU count the first time it runs on that count on a GPU type
(``reconcile``'s module docstring): each type has its own clocks, so a count profiled
on the A100 is profiled again on the H100. ``status.model.profiledGpuCountsByType``
holds one entry per type, ``{"gpu": <type name>, "gpuCounts": [...]}``; the counts
of the list without a type, ``status.model.profiledGpuCounts``, count as profiled on
every type (the operator writes only the typed list, and leaves that one as it is).

Status is anyone's to edit, so it is read as untrusted: at most ``MAX_TYPES`` entries
and ``MAX_COUNTS`` counts each (the CRD's bounds), type names of at most
``MAX_NAME`` characters, positive integer counts; anything else is skipped. A write
keeps within the same bounds, so the API server never refuses it: a count beyond
them is not recorded (the job profiles it again next time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from powerflow.operator.allocation import count as _count

from powerflow.core.policy.snapshot import Node

BY_TYPE = "profiledGpuCountsByType"
"""The typed field of ``status.model``."""
UNTYPED = "profiledGpuCounts"
"""The untyped field of ``status.model``: counts profiled on every type."""
MAX_TYPES = 16
"""Entries read and written (the catalogue has 14 types; agents may report others)."""
MAX_COUNTS = 64
"""Counts per type read and written."""
MAX_NAME = 63
"""Longest type name read (the CRD's bound, as for other names)."""


@dataclass(frozen=True)
class NodeTypes:
    """Each planned node's GPU type name, and the type a job on none of them is of (the
    first planned node's, the main pool's)."""

    of_node: Mapping[str, str]
    default: str
    names: tuple[str, ...]
    """Every planned type, once each."""

    def of(self, nodes: Iterable[str]) -> str:
        """The type of the first of ``nodes`` that is planned; ``default`` if none is."""
        for node in nodes:
            found = self.of_node.get(node)
            if found is not None:
                return found
        return self.default

    def of_slots(self, slots: Iterable[tuple[str, int]]) -> str:
        """``of`` the slots' nodes, in their order (no generator per call: per job)."""
        for node, _ in slots:
            found = self.of_node.get(node)
            if found is not None:
                return found
        return self.default


@dataclass(frozen=True)
class ProfileWindow:
    """The pass's profiling window (``--profiling-window``; 0: none) and its planned
    nodes' types, which a profiled count is recorded and looked up for."""

    seconds: float
    types: NodeTypes


def node_types(nodes: Iterable[Node]) -> NodeTypes:
    """The types of ``nodes`` (a pass's planned nodes, the main pool's first)."""
    of_node = {node.name: node.gpu.name for node in nodes}
    names = tuple(dict.fromkeys(of_node.values()))
    return NodeTypes(of_node, names[0] if names else "", names)


def _untyped(model: Mapping[str, Any]) -> set[int]:
    raw = model.get(UNTYPED)
    if not isinstance(raw, list):
        return set()
    return {_count(n) for n in raw[:MAX_COUNTS]} - {0}


def by_type(model: Any) -> dict[str, list[int]]:
    """``status.model.profiledGpuCountsByType`` read as untrusted (module docstring): the
    counts of each type, sorted, without the untyped ones. A type named twice: its
    first entry."""
    raw = model.get(BY_TYPE) if isinstance(model, dict) else None
    out: dict[str, list[int]] = {}
    if not isinstance(raw, list):
        return out
    for item in raw[:MAX_TYPES]:
        if not isinstance(item, dict):
            continue
        gpu, counts = item.get("gpu"), item.get("gpuCounts")
        if not isinstance(gpu, str) or not 0 < len(gpu) <= MAX_NAME or gpu in out:
            continue
        if not isinstance(counts, list):
            continue
        out[gpu] = sorted({_count(n) for n in counts[:MAX_COUNTS]} - {0})
    return out


def profiled_on(model: Any, gpu: str) -> frozenset[int]:
    """The counts the job has profiled on type ``gpu`` (the untyped ones included)."""
    if not model or not isinstance(model, dict):  # a new job's (or junk): nothing to parse
        return frozenset()
    return frozenset(_untyped(model).union(by_type(model).get(gpu, ())))


def profiled_everywhere(model: Any, gpus: Iterable[str]) -> frozenset[int]:
    """The counts the job has profiled on every type of ``gpus``: a job that may be
    planned on any of them profiles the others on the first run there."""
    if not model or not isinstance(model, dict):
        return frozenset()
    untyped, typed = _untyped(model), by_type(model)
    out: set[int] | None = None
    for gpu in gpus:
        here = untyped.union(typed.get(gpu, ()))
        out = here if out is None else out & here
    return frozenset(out or ())


def with_profiled(model: Any, gpu: str, count: int) -> list[dict[str, Any]]:
    """``status.model.profiledGpuCountsByType`` with ``count`` added to type ``gpu``'s
    counts, the entries sorted by type; within the bounds (module docstring)."""
    typed = by_type(model)
    counts = typed.get(gpu, [])
    room = len(counts) < MAX_COUNTS and (gpu in typed or len(typed) < MAX_TYPES)
    if count not in counts and room:
        typed[gpu] = sorted({*counts, count})
    return [{"gpu": name, "gpuCounts": typed[name]} for name in sorted(typed)]
