"""``GpuDevices`` on real NVIDIA GPUs, through NVML (``pynvml``, from nvidia-ml-py).

The only code in PowerFlow that touches hardware. One instance initialises
NVML once (``nvmlInit``) and shuts it down on ``close`` (or leaving a ``with``
block); pynvml counts initialisations, so several instances coexist. Every
NVML call sits in ``nvml_errors``, so callers see ``powerflow.core.devices``
errors naming the GPU and NVML's error. Setting clocks and power limits needs
root or CAP_SYS_ADMIN; reading needs neither.

Units as NVML gives them: clocks in MHz, power and limits in mW (limits are
converted to W at this boundary, as ``GpuDevices`` names them), energy in mJ.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pynvml
from powerflow.nodeagent.nvml_errors import nvml_errors

from powerflow.core.devices import (
    GpuDevices,
    GpuError,
    GpuInfo,
    GpuNotSupported,
    GpuUnavailable,
    PowerLimitRangeW,
)
from powerflow.core.devices.interface import check_clock_range, check_power_limit, gpu_at


def _text(value: object) -> str:
    """pynvml returns str for names and UUIDs, bytes in older versions."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGpus:
    """The NVIDIA GPUs of this machine (satisfies ``GpuDevices``).

    Raises ``GpuUnavailable`` at construction when there is no NVML library,
    no driver or no GPU, with one line saying which.
    """

    def __init__(self) -> None:
        with nvml_errors():
            pynvml.nvmlInit()
        self._open = True
        try:
            with nvml_errors():
                count = int(pynvml.nvmlDeviceGetCount())
            if count < 1:
                raise GpuUnavailable("NVML: no GPU found (nvmlDeviceGetCount() returned 0)")
            handles: list[Any] = []
            infos: list[GpuInfo] = []
            for index in range(count):
                with nvml_errors(f"GPU {index}"):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                    name = _text(pynvml.nvmlDeviceGetName(handle))
                handles.append(handle)
                infos.append(GpuInfo(index, uuid, name))
        except BaseException:
            with contextlib.suppress(GpuError):  # keep the first error, not shutdown's
                self.close()
            raise
        self._handles = tuple(handles)
        self._infos = tuple(infos)
        self._clocks: dict[int, tuple[int, ...]] = {}

    def __enter__(self) -> NvmlGpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            with nvml_errors():
                pynvml.nvmlShutdown()

    def _gpu(self, gpu: int) -> tuple[Any, str]:
        """(NVML handle, label) of a GPU index, refusing a closed instance."""
        if not self._open:
            raise GpuUnavailable("NVML: the GPU interface is closed")
        info = gpu_at(self._infos, gpu)
        return self._handles[info.index], info.label

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._infos

    def supported_graphics_clocks_mhz(self, gpu: int) -> tuple[int, ...]:
        """At the highest memory clock (the one training runs at); static, so cached."""
        handle, label = self._gpu(gpu)
        if gpu not in self._clocks:
            with nvml_errors(label):
                memory = pynvml.nvmlDeviceGetSupportedMemoryClocks(handle)
                clocks = (
                    pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, max(memory))
                    if memory
                    else []
                )
            if not clocks:
                raise GpuNotSupported(f"{label}: NVML lists no supported clocks", gpu=label)
            self._clocks[gpu] = tuple(sorted({int(c) for c in clocks}))
        return self._clocks[gpu]

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        handle, label = self._gpu(gpu)
        check_clock_range(label, lo_mhz, hi_mhz)
        with nvml_errors(label):
            pynvml.nvmlDeviceSetGpuLockedClocks(handle, lo_mhz, hi_mhz)

    def reset_clocks(self, gpu: int) -> None:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            pynvml.nvmlDeviceResetGpuLockedClocks(handle)

    def power_limit_w(self, gpu: int) -> float:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            return int(pynvml.nvmlDeviceGetPowerManagementLimit(handle)) / 1000.0

    def power_limit_range_w(self, gpu: int) -> PowerLimitRangeW:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            low_mw, high_mw = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            default_mw = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
        return PowerLimitRangeW(
            min_w=int(low_mw) / 1000.0, max_w=int(high_mw) / 1000.0, default_w=default_mw / 1000.0
        )

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        handle, label = self._gpu(gpu)
        check_power_limit(label, watts, self.power_limit_range_w(gpu))
        with nvml_errors(label):
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, round(watts * 1000.0))

    def reset_power_limit(self, gpu: int) -> None:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            default_mw = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, default_mw)

    def total_energy_mj(self, gpu: int) -> int:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def power_mw(self, gpu: int) -> int:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    def sm_clock_mhz(self, gpu: int) -> int:
        handle, label = self._gpu(gpu)
        with nvml_errors(label):
            return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))


def open_nvml_gpus() -> GpuDevices:
    """The node's GPUs as ``GpuDevices`` (typed so mypy checks the conformance)."""
    return NvmlGpus()
