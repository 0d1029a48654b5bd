"""The GPU interface the node agent drives: plain data in and out, units in names.

Shaped after Zeus's ``zeus/device/gpu/common.py`` (one method per NVML knob,
units in every name), without its process-wide GPU singleton (an instance is
opened and closed by its owner, so tests and a simulated node can have many)
and without mixing watts and milliwatts in one concept: limits are set in
watts (what an operator thinks in), instantaneous power and the energy
counter come in NVML's own integer mW and mJ (no rounding on the hot path).
GPUs are named by their NVML index on this node; ``gpus()`` maps indices to
UUIDs, which is what the kubelet's device plugin hands to pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from powerflow.core.devices.errors import GpuInvalidArgument


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of this node: NVML index, UUID (``GPU-...``) and product name."""

    index: int
    uuid: str
    name: str

    @property
    def label(self) -> str:
        """How errors and logs name the GPU: index and UUID."""
        return f"GPU {self.index} ({self.uuid})"


@dataclass(frozen=True)
class PowerLimitRangeW:
    """The board power limits a GPU accepts, and the one it boots with (W)."""

    min_w: float
    max_w: float
    default_w: float


@runtime_checkable
class GpuDevices(Protocol):
    """The GPUs of one node. ``gpu`` is always an index from ``gpus()``.

    Every method raises a ``powerflow.core.devices.GpuError`` subclass: an unknown
    index or an out-of-range clock or limit raises ``GpuInvalidArgument``,
    whichever implementation answers.
    """

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU of the node, by index."""
        ...

    def supported_graphics_clocks_mhz(self, gpu: int) -> tuple[int, ...]:
        """Graphics (SM) clocks the GPU can lock to, ascending."""
        ...

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        """Keep the SM clock within [lo, hi]; the GPU rounds to supported clocks."""
        ...

    def reset_clocks(self, gpu: int) -> None:
        """Undo ``lock_clocks_mhz``: the GPU picks its clock itself again."""
        ...

    def power_limit_w(self, gpu: int) -> float:
        """The board power limit in force."""
        ...

    def power_limit_range_w(self, gpu: int) -> PowerLimitRangeW:
        """Lowest and highest settable limit, and the default."""
        ...

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        """Cap the board power; outside ``power_limit_range_w`` raises ``GpuInvalidArgument``."""
        ...

    def reset_power_limit(self, gpu: int) -> None:
        """Back to the default power limit."""
        ...

    def total_energy_mj(self, gpu: int) -> int:
        """Energy counter since the driver loaded (mJ). It restarts with the
        driver or a GPU reset: difference readings with
        ``powerflow.core.devices.energy_delta_mj``, never by plain subtraction."""
        ...

    def power_mw(self, gpu: int) -> int:
        """Current board power draw (mW)."""
        ...

    def sm_clock_mhz(self, gpu: int) -> int:
        """Current SM clock."""
        ...

    def close(self) -> None:
        """Release the library (idempotent); no method may be called after."""
        ...


def check_clock_range(label: str, lo_mhz: int, hi_mhz: int) -> None:
    """Refuse a clock range NVML would refuse, with a message naming the GPU."""
    if not 0 < lo_mhz <= hi_mhz:
        raise GpuInvalidArgument(
            f"{label}: clock range [{lo_mhz}, {hi_mhz}] MHz needs 0 < lo <= hi", gpu=label
        )


def check_power_limit(label: str, watts: float, allowed: PowerLimitRangeW) -> None:
    """Refuse a power limit outside the GPU's range (NVML answers InvalidArgument)."""
    if not allowed.min_w <= watts <= allowed.max_w:
        raise GpuInvalidArgument(
            f"{label}: power limit {watts:g} W outside [{allowed.min_w:g}, {allowed.max_w:g}] W",
            gpu=label,
        )


def gpu_at(gpus: tuple[GpuInfo, ...], gpu: int) -> GpuInfo:
    """The GPU with this index, or ``GpuInvalidArgument`` naming the valid ones."""
    if isinstance(gpu, int) and 0 <= gpu < len(gpus):
        return gpus[gpu]
    raise GpuInvalidArgument(
        f"GPU {gpu!r}: no such GPU on this node (indices 0-{len(gpus) - 1})", gpu=f"GPU {gpu!r}"
    )


@dataclass(frozen=True)
class Workload:
    """What one GPU runs: one of the ``n`` GPUs of a training job.

    ``gpus_per_node`` is the job's placement (GPUs it uses per node), as in
    the performance models' ``r``; ``local_batch_size`` is per GPU. The clock
    is not part of it: the GPU's locked clock and power limit decide it.
    """

    model_name: str
    n: int
    gpus_per_node: int
    local_batch_size: float


@runtime_checkable
class RunsWorkloads(Protocol):
    """GPUs whose speed and draw follow what they are told they run: the simulated
    ones (``powerflow.lab.simulated_gpus``). The node agent's ``--simulate`` tells
    each GPU the job its pod trains; the agent needs only this much of them, so it
    never imports the lab (the ground truth) itself."""

    def workload(self, gpu: int) -> Workload | None:
        """What ``gpu`` runs now, if anything."""
        ...

    def assign(self, gpu: int, workload: Workload) -> None:
        """From now on ``gpu`` trains ``workload``."""
        ...

    def clear(self, gpu: int) -> None:
        """From now on ``gpu`` is idle."""
        ...
