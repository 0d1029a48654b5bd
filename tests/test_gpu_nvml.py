"""The NVML implementation against pynvml's own behaviour, and the read-only probe.

No NVML function is faked: on a machine without an NVIDIA driver (CI) pynvml
really fails to load libnvidia-ml, and ``pynvml.NVMLError(code)`` builds the
exception class NVML would raise for each code. Where a driver is present
the same tests check the read-only path instead.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from powerflow.nodeagent.nvml import NvmlGpus
from powerflow.nodeagent.nvml_errors import map_nvml_error, nvml_errors
from powerflow.nodeagent.probe import probe
from support.nvml_library import has_nvml_library

from powerflow.core.devices import (
    GpuError,
    GpuInvalidArgument,
    GpuLost,
    GpuNotSupported,
    GpuPermissionError,
    GpuUnavailable,
    Workload,
)
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpus import A100
from powerflow.lab.simulated_gpus import SimulatedGpus

ROOT = Path(__file__).resolve().parent.parent
LABEL = "GPU 3 (GPU-5b0c1d2e-0000-4000-8000-000000000003)"


HAS_NVML = has_nvml_library()


def test_opening_nvml_without_a_driver_is_one_clear_line() -> None:
    if HAS_NVML:  # a GPU machine: opening works and lists its GPUs
        with NvmlGpus() as gpus:
            assert gpus.gpus()
        return
    with pytest.raises(GpuUnavailable) as caught:
        NvmlGpus()
    err = caught.value
    message = str(err)
    assert "\n" not in message
    assert message.startswith("NVML: ")
    assert "(NVMLError_LibraryNotFound)" in message
    assert "no NVIDIA driver on this machine" in message
    assert err.nvml_error == "NVMLError_LibraryNotFound" and err.gpu is None
    assert isinstance(err.__cause__, pynvml.NVMLError_LibraryNotFound)


@pytest.mark.parametrize(
    ("code", "expected", "name"),
    [
        (pynvml.NVML_ERROR_NO_PERMISSION, GpuPermissionError, "NVMLError_NoPermission"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GpuNotSupported, "NVMLError_NotSupported"),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, GpuNotSupported, "NVMLError_FunctionNotFound"),
        (pynvml.NVML_ERROR_FREQ_NOT_SUPPORTED, GpuNotSupported, "NVMLError_FreqNotSupported"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, GpuInvalidArgument, "NVMLError_InvalidArgument"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost, "NVMLError_GpuIsLost"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost, "NVMLError_ResetRequired"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, GpuUnavailable, "NVMLError_LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, GpuUnavailable, "NVMLError_DriverNotLoaded"),
        (pynvml.NVML_ERROR_UNINITIALIZED, GpuUnavailable, "NVMLError_Uninitialized"),
        (pynvml.NVML_ERROR_TIMEOUT, GpuError, "NVMLError_Timeout"),
        (pynvml.NVML_ERROR_UNKNOWN, GpuError, "NVMLError_Unknown"),
    ],
)
def test_nvml_codes_map_to_gpu_errors_naming_the_gpu_and_the_code(
    code: int, expected: type[GpuError], name: str
) -> None:
    nvml = pynvml.NVMLError(code)
    assert type(nvml).__name__ == name  # pynvml's own class for the code
    err = map_nvml_error(nvml, LABEL)
    assert type(err) is expected and isinstance(err, PowerFlowError)
    assert str(err).startswith(f"{LABEL}: NVML: ")
    assert f"({name})" in str(err) and "\n" not in str(err)
    assert err.gpu == LABEL and err.nvml_error == name


def test_a_code_pynvml_does_not_know_maps_to_the_root_with_its_number() -> None:
    err = map_nvml_error(pynvml.NVMLError(12345), None)
    assert type(err) is GpuError
    assert err.nvml_error == "NVMLError (code 12345)"
    assert str(err).startswith("NVML: ") and "code 12345" in str(err)


def test_permission_and_lost_errors_say_what_to_do() -> None:
    denied = map_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), LABEL)
    assert "CAP_SYS_ADMIN" in str(denied)
    lost = map_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), LABEL)
    assert "reset" in str(lost)


def test_nvml_errors_block_chains_the_nvml_error_and_passes_others() -> None:
    with pytest.raises(GpuLost) as caught, nvml_errors(LABEL):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(caught.value.__cause__, pynvml.NVMLError_GpuIsLost)
    with pytest.raises(KeyError), nvml_errors(LABEL):
        raise KeyError("not NVML's")
    with nvml_errors(LABEL):
        pass


# -- the read-only probe -----------------------------------------------------------


def test_probe_script_without_a_gpu_prints_one_line_and_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "nvml_probe.py"), "--interval-s", "0.1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if HAS_NVML:  # a GPU machine: it reads and exits 0
        assert done.returncode == 0 and "energy:" in done.stdout
        return
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert "NVMLError_LibraryNotFound" in lines[0] and "no NVIDIA driver" in lines[0]


class _ReadOnly(SimulatedGpus):
    """Simulated GPUs on which any setting fails the test."""

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        raise AssertionError("the probe locked clocks")

    def reset_clocks(self, gpu: int) -> None:
        raise AssertionError("the probe reset clocks")

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        raise AssertionError("the probe set a power limit")

    def reset_power_limit(self, gpu: int) -> None:
        raise AssertionError("the probe reset a power limit")


def test_probe_reads_every_gpu_and_sets_nothing() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    gpus = _ReadOnly(2, seed=1, clock=lambda: now[0])
    gpus.assign(0, Workload("resnet50", 1, 1, 128))
    out = io.StringIO()
    probe(gpus, out, interval_s=2.0, sleep=sleep, monotonic=lambda: now[0])
    text = out.getvalue()
    for info in gpus.gpus():
        assert f"GPU {info.index}  {info.uuid}  NVIDIA A100-SXM4-40GB" in text
    assert text.count("graphics clocks: 81 supported, 210-1410 MHz, steps 15 MHz") == 2
    assert "power limit: 400 W (range 100-400 W, default 400 W)" in text
    assert "SM clock now: 1410 MHz" in text and "SM clock now: 210 MHz" in text
    busy_mj = gpus.total_energy_mj(0)
    assert f"GPU 0 energy: 0 mJ -> {busy_mj} mJ over 2.00 s: {busy_mj} mJ" in text
    assert f"mean power {busy_mj / 2000:.1f} W" in text


def test_probe_reports_a_missing_feature_and_goes_on() -> None:
    gpus = SimulatedGpus(1, gpu=dataclasses.replace(A100, min_power_limit_w=None))
    out = io.StringIO()
    probe(gpus, out, interval_s=1.0, sleep=gpus.advance, monotonic=lambda: gpus.now_s)
    text = out.getvalue()
    assert "power limit: unavailable: GPU 0 (GPU-" in text
    assert "GPU 0 energy: 0 mJ -> " in text and "mean power 52." in text
