"""GPUs as the node agent sees them: one small interface, two implementations.

Pure core: no NVML, no clock, no I/O. ``GpuDevices`` is the interface (units
in every name). The NVML implementation lives in the node agent component
(``powerflow.nodeagent.nvml``), the only code that touches hardware; the
simulated one (``powerflow.lab.simulated_gpus.SimulatedGpus``) drives it from
the ground truth for tests, the twin and ``--simulate``, in the lab because the
ground truth is.
"""

from powerflow.core.devices.capping import capped_clock_mhz
from powerflow.core.devices.energy import energy_delta_mj, energy_deltas_mj
from powerflow.core.devices.errors import (
    GpuError,
    GpuInvalidArgument,
    GpuLost,
    GpuNotSupported,
    GpuPermissionError,
    GpuUnavailable,
)
from powerflow.core.devices.interface import (
    GpuDevices,
    GpuInfo,
    PowerLimitRangeW,
    RunsWorkloads,
    Workload,
)

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
    "RunsWorkloads",
    "Workload",
    "capped_clock_mhz",
    "energy_delta_mj",
    "energy_deltas_mj",
]
