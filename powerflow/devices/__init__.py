"""GPUs as the node agent sees them: one small interface, two implementations.

Pure core: no NVML, no clock, no I/O. ``GpuDevices`` is the interface (units
in every name); ``SimulatedGpus`` drives it from the ground truth for tests,
the simulator's twin and ``--simulate``; the NVML implementation lives in the
node agent component (``powerflow.nodeagent.nvml``), the only code that
touches hardware.
"""

from powerflow.devices.energy import energy_delta_mj, energy_deltas_mj
from powerflow.devices.errors import (
    GpuError,
    GpuInvalidArgument,
    GpuLost,
    GpuNotSupported,
    GpuPermissionError,
    GpuUnavailable,
)
from powerflow.devices.interface import GpuDevices, GpuInfo, PowerLimitRangeW
from powerflow.devices.simulated import SimulatedGpus, Workload, capped_clock_mhz

__all__ = [
    "GpuDevices",
    "GpuError",
    "GpuInfo",
    "GpuInvalidArgument",
    "GpuLost",
    "GpuNotSupported",
    "GpuPermissionError",
    "GpuUnavailable",
    "PowerLimitRangeW",
    "SimulatedGpus",
    "Workload",
    "capped_clock_mhz",
    "energy_delta_mj",
    "energy_deltas_mj",
]
