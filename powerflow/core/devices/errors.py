"""What can go wrong with a GPU, by what the caller can do about it.

The split follows NVML's error codes, grouped by the caller's reaction:
``GpuUnavailable`` (no library, driver or GPU: nothing to manage on this
node), ``GpuPermissionError`` (the agent lacks the privilege: a deployment
fix), ``GpuNotSupported`` (this board cannot do it: skip the feature),
``GpuInvalidArgument`` (the caller asked for something out of range: a bug or
bad input), ``GpuLost`` (the GPU fell off the bus or needs a reset). Every
message names the GPU and, where NVML raised it, NVML's error class name, so
that one log line is enough to act on.
"""

from __future__ import annotations

from powerflow.core.errors import PowerFlowError


class GpuError(PowerFlowError):
    """Root of every GPU error; ``gpu`` and ``nvml_error`` say where and what.

    ``gpu`` is a label such as ``"GPU 0 (GPU-8f3c...)"``, or None for errors
    about the library itself; ``nvml_error`` is NVML's class name (for example
    ``"NVMLError_NoPermission"``), None when PowerFlow refused the call itself.
    """

    def __init__(
        self, message: str, *, gpu: str | None = None, nvml_error: str | None = None
    ) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.nvml_error = nvml_error


class GpuUnavailable(GpuError):
    """No NVML library, no driver, no GPU, or the interface is closed."""


class GpuPermissionError(GpuError):
    """The process may read but not change this GPU (needs root or CAP_SYS_ADMIN)."""


class GpuNotSupported(GpuError):
    """The GPU or driver does not offer this operation."""


class GpuInvalidArgument(GpuError):
    """A GPU index, clock or power limit the device does not accept."""


class GpuLost(GpuError):
    """The GPU stopped answering (fell off the bus) or needs a reset."""
