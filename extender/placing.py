"""The bridge to the core's placement: cache entries in, one aligned block out.

Placement decisions come from ``powerflow.policy.placement`` (buddy
allocation with network packing); this module only translates the cache's
view (node GPU counts, GPUs already taken) into the core's types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from powerflow.errors import PlacementError
from powerflow.policy.snapshot import GpuSlot


class _Entry(Protocol):
    name: str
    gpus: int
    product: str


def choose_block(
    nodes: Iterable[_Entry], slots: Mapping[str, set[int]], extra: Mapping[str, int], size: int
) -> tuple[GpuSlot, ...] | None:
    """An aligned block of ``size`` free GPUs, or None when none is free."""
    raise PlacementError("placement core not available yet")
