"""NVML's errors as PowerFlow's ``GpuError`` subclasses, naming the GPU and the code.

``pynvml`` raises one ``NVMLError`` subclass per NVML return code
(``NVMLError_NoPermission``, ...). Callers of the node agent should not need
to know NVML's codes, only what to do: so each code maps to the
``powerflow.core.devices`` class that says it, and the message keeps NVML's class
name and text for the operator reading the log. Codes pynvml does not know
yet fall back to the root ``GpuError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pynvml

from powerflow.core.devices import (
    GpuError,
    GpuInvalidArgument,
    GpuLost,
    GpuNotSupported,
    GpuPermissionError,
    GpuUnavailable,
)

_BY_CODE: dict[int, type[GpuError]] = {
    pynvml.NVML_ERROR_UNINITIALIZED: GpuUnavailable,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: GpuUnavailable,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: GpuUnavailable,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: GpuUnavailable,
    pynvml.NVML_ERROR_NOT_FOUND: GpuUnavailable,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: GpuUnavailable,
    pynvml.NVML_ERROR_NO_PERMISSION: GpuPermissionError,
    pynvml.NVML_ERROR_NOT_SUPPORTED: GpuNotSupported,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: GpuNotSupported,
    pynvml.NVML_ERROR_FREQ_NOT_SUPPORTED: GpuNotSupported,
    pynvml.NVML_ERROR_INVALID_ARGUMENT: GpuInvalidArgument,
    pynvml.NVML_ERROR_GPU_IS_LOST: GpuLost,
    pynvml.NVML_ERROR_RESET_REQUIRED: GpuLost,
}

# What to do about the errors a node without a working driver gives.
_HINTS: dict[int, str] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine"
        " (or not mounted into the container)"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the kernel driver differ in version (reboot or reload the driver)"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: "run the agent privileged (root or CAP_SYS_ADMIN)",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU fell off the bus; it needs a reset or a reboot",
}


def nvml_error_name(err: pynvml.NVMLError) -> str:
    """NVML's class name for the error (``NVMLError_<Code>``), with the code if unnamed."""
    name = type(err).__name__
    code = getattr(err, "value", None)
    return name if name != "NVMLError" else f"NVMLError (code {code})"


def map_nvml_error(err: pynvml.NVMLError, gpu: str | None) -> GpuError:
    """The ``GpuError`` for ``err``, its message one line naming the GPU and the error.

    ``gpu`` labels the GPU (``GpuInfo.label``), or None for errors of the
    library as a whole (initialisation, shutdown, counting GPUs).
    """
    code = int(getattr(err, "value", -1))
    name = nvml_error_name(err)
    where = f"{gpu}: NVML" if gpu is not None else "NVML"
    message = f"{where}: {err} ({name})"
    hint = _HINTS.get(code)
    if hint is not None:
        message += f": {hint}"
    cls = _BY_CODE.get(code, GpuError)
    return cls(" ".join(message.split()), gpu=gpu, nvml_error=name)


@contextmanager
def nvml_errors(gpu: str | None = None) -> Iterator[None]:
    """Raise NVML errors in the block as ``GpuError`` (the NVML error chained as cause)."""
    try:
        yield
    except pynvml.NVMLError as err:
        raise map_nvml_error(err, gpu) from err
