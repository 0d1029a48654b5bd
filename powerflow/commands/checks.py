"""Argument checks that run before a command does any work.

A simulation or a fit can take minutes; an output path that cannot be written,
or a value outside its range, must stop the command at once with one line
(``PowerFlowError``, exit 2 in ``powerflow.cli``), never with a traceback
after the work is done. Nothing here writes: a folder the user asked for is
created when the results are written, and a file's folder must already exist
(a typo in ``--report reprot/x.md`` should not create ``reprot/``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import A100


class ArgumentError(PowerFlowError):
    """A command-line value the command cannot use."""


def output_file(path: Path, option: str) -> Path:
    """Refuse a file that cannot be written: its folder must exist and be writable,
    and the path must not be a folder."""
    if path.is_dir():
        raise ArgumentError(f"{option} {path} is a folder; name a file")
    folder = path.parent
    if not folder.is_dir():
        blocker = _first_file(folder)
        if blocker is not None:
            raise ArgumentError(f"{option} {path}: {blocker} is a file, not a folder")
        raise ArgumentError(f"{option} {path}: no folder {folder}; create it first")
    if path.exists() and not os.access(path, os.W_OK):
        raise ArgumentError(f"{option} {path}: not writable")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ArgumentError(f"{option} {path}: cannot write in {folder}")
    return path


def output_folder(path: Path, option: str) -> Path:
    """Refuse a folder that cannot be made or written: what exists of it must be a
    folder, and the deepest existing one must be writable (the rest is created
    when the results are written)."""
    blocker = _first_file(path)
    if blocker == path:
        raise ArgumentError(f"{option} {path} is a file, not a folder")
    if blocker is not None:
        raise ArgumentError(f"{option} {path}: {blocker} is a file, not a folder")
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArgumentError(f"{option} {path}: cannot write in {existing}")
    return path


def _first_file(path: Path) -> Path | None:
    """The first of ``path`` and its parents that exists and is not a folder, if any."""
    for part in reversed((path, *path.parents)):
        if part.exists() and not part.is_dir():
            return part
    return None


def hours(value: float | None, option: str = "--hours") -> float | None:
    """A trace window in hours: positive and finite when given (0 is not 'all')."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ArgumentError(f"{option} must be a positive number of hours, got {value:g}")
    return value


ETA_RANGE = "(0, 1]"
"""The power budget as a share of the cluster's maximum power: 0 would stop every
job (only a budget schedule's window may do that), above 1 is no budget."""

ETA_HELP = (
    f"power budget: the limit is eta x GPUs x P_max ({A100.p_max_w:g} W per A100), "
    f"eta in {ETA_RANGE}"
)


def eta(value: float | None, option: str = "--eta") -> float | None:
    """PowerFlow's budget knob, the same range in every command."""
    if value is not None and not 0 < value <= 1:  # NaN fails too
        raise ArgumentError(f"{option} must be in {ETA_RANGE}, got {value:g}")
    return value


def eta_knob(value: float | None) -> float | None:
    """Zeus's ``eta_knob``: the weight of energy in its cost, 0 (time only) to 1
    (energy only); outside that the cost rewards more time or more energy."""
    if value is not None and not 0 <= value <= 1:  # NaN fails too
        raise ArgumentError(f"--eta-knob must be in [0, 1], got {value:g}")
    return value


MAX_NODES = 10_000
"""Far above any cluster the papers simulate (64 nodes here, 2,000 GPUs in
Tiresias'); a typo of a billion nodes took 21 GB of memory before any job ran."""

MAX_GPUS_PER_NODE = 8
"""An A100 server (DGX/HGX A100) holds at most eight GPUs."""


def cluster(nodes: int | None, gpus_per_node: int) -> None:
    """The simulated cluster's size, each option by its own name."""
    if nodes is not None and not 1 <= nodes <= MAX_NODES:
        raise ArgumentError(f"--nodes must be 1 to {MAX_NODES}, got {nodes}")
    if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise ArgumentError(
            f"--gpus-per-node must be 1 to {MAX_GPUS_PER_NODE}, got {gpus_per_node}"
        )
