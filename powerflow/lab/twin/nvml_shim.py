"""The twin's ``pynvml``: NVML's Python API, answered by the twin's simulated GPUs.

Why it exists: on a real node the NVIDIA container toolkit injects the driver's
``libnvidia-ml.so.1`` into the node agent's container, and ``pynvml`` (the
image's nvidia-ml-py) calls it. The twin has no driver, yet it runs the agent
from the real image with the chart's arguments, no ``--simulate``, so that the
agent takes its real NVML path (``powerflow.nodeagent.nvml``). In place of the
library, the twin's container runtime bind-mounts this file over the
image's ``site-packages/pynvml.py``: the agent imports it as ``pynvml`` and
reaches the node's ``TwinGpus`` in the twin's process, through the same
``GpuServer`` socket that ``powerflow.lab.twin.agentproc`` serves.

It imports nothing outside the standard library because it runs in the
image's interpreter, mounted as a top-level module, beside a ``powerflow`` it
must not rely on (the server answers it with plain Python values only).

Where it finds the server: the JSON file ``ENDPOINT_PATH``
(``/run/powerflow-twin/gpus.json``; the environment variable ``ENDPOINT_ENV``
names another), ``{"address": "HOST:PORT", "node": NAME, "key": HEX}``, written
by ``GpuServer.endpoint_file``. ``nvmlInit`` reads it and connects.

What it imitates, as nvidia-ml-py 12+ does it: the functions the node agent
calls (``powerflow.nodeagent.nvml`` and ``nvml_errors``), with their
signatures, return types and units (clocks in MHz, power and limits in mW,
energy in mJ, names and UUIDs as ``str``, clock lists highest first), ctypes'
handling of ``unsigned int`` arguments (an ``int``, taken modulo 2**32), the
reference-counted ``nvmlInit``/``nvmlShutdown`` (a call before ``nvmlInit`` or
after the last ``nvmlShutdown`` raises ``Uninitialized``), and ``NVMLError``,
whose ``NVMLError(code)`` builds the per-code subclass (``NVMLError_NoPermission``
...) with NVML's message. The node's state (clocks, limits, power, energy) is
the twin's, so the agent in the image and the twin's workers act on one GPU.
Errors come as NVML's codes: no endpoint file is a node without a driver
(``LibraryNotFound``); a server that does not answer, refuses the key or does not
serve the node, a driver that is not loaded (``DriverNotLoaded``); a file it may
not read ``NoPermission``, one it cannot parse ``Unknown``; a GPU the twin refuses a setting on
(``powerflow.core.devices`` errors) the code NVML gives for it (``InvalidArgument``,
``NotSupported``, ...); a server lost after ``nvmlInit``, ``GpuIsLost``. Each of
these carries a note saying what the twin saw (shown in tracebacks only: NVML's
own message stays the exception's text).

What it does not imitate: the rest of NVML (any other function is missing,
as in an older library); privileges (a real driver refuses clock and limit
settings without CAP_SYS_ADMIN, this file lets any process set them); memory
clocks (one, ``MEMORY_CLOCK_MHZ``, fixed: the twin's GPUs model only the SM
clock); handles are the GPU's index, not a pointer into the driver.
"""

from __future__ import annotations

import json
import os
import string
import threading
from multiprocessing.managers import BaseManager
from typing import Any, ClassVar

ENDPOINT_PATH = "/run/powerflow-twin/gpus.json"
"""Where ``nvmlInit`` reads its server's address, node and key (in the container)."""
ENDPOINT_ENV = "POWERFLOW_TWIN_GPUS"
"""An environment variable naming another endpoint file (tests)."""
MEMORY_CLOCK_MHZ = 1215
"""The one memory clock the twin's GPUs report (an A100 40GB's HBM2 clock)."""

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_CLOCK_COUNT = 4


class NVMLError(Exception):
    """An NVML return code other than success, as pynvml raises it.

    ``NVMLError(code)`` is an instance of the code's subclass
    (``NVMLError_InvalidArgument`` for ``NVML_ERROR_INVALID_ARGUMENT``), or of
    ``NVMLError`` itself for a code without one; ``value`` is the code, ``str``
    NVML's message for it.
    """

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    _errcode_to_string: ClassVar[dict[int, str]] = {  # pynvml's texts
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    _code: ClassVar[int | None] = None  # a per-code subclass's code
    value: int

    def __new__(cls, *args: Any) -> NVMLError:
        if cls._code is not None:  # NVMLError_NoPermission(): its own code
            value = cls._code
        elif len(args) == 1 and isinstance(args[0], int):
            value = args[0]
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, NVMLError)
        else:
            raise TypeError("NVMLError() takes one argument, the NVML return code")
        err = Exception.__new__(cls)
        err.value = value
        return err

    def __str__(self) -> str:
        text = NVMLError._errcode_to_string.get(self.value)
        return text if text is not None else f"NVML Error with code {self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value


def _error_classes() -> None:
    """``NVMLError_<Name>`` for each ``NVML_ERROR_<NAME>``, named as pynvml names them."""
    names = globals()
    for constant in [n for n in names if n.startswith("NVML_ERROR_")]:
        code = names[constant]
        words = string.capwords(constant.removeprefix("NVML_ERROR_"), "_").replace("_", "")
        cls = type(f"NVMLError_{words}", (NVMLError,), {"_code": code, "__module__": __name__})
        names[cls.__name__] = cls
        NVMLError._valClassMapping[code] = cls


_error_classes()


def _error(code: int, note: str) -> NVMLError:
    """``NVMLError(code)`` with a note saying what the twin saw."""
    err = NVMLError(code)
    err.add_note(f"PowerFlow twin: {note}")
    return err


def _uint(value: object) -> int:
    """``value`` as ctypes' ``c_uint`` takes it (pynvml's arguments): an int, modulo 2**32."""
    if not isinstance(value, int):
        raise TypeError(f"int expected instead of {type(value).__name__}")
    return value & 0xFFFFFFFF


def _last_line(exc: BaseException) -> str:
    """One line about ``exc`` (a ``RemoteError`` carries the server's whole traceback)."""
    lines = [line for line in str(exc).splitlines() if line.strip(" -")]
    return f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__


class _Manager(BaseManager):
    pass


_Manager.register("nvml")

_lock = threading.Lock()
_refcount = 0
_server: Any = None
"""While initialised: the server's proxy for this node's GPUs (``agentproc._NvmlServed``)."""


def _endpoint() -> tuple[str, int, str, bytes]:
    """(host, port, node, key) from the endpoint file, or the ``NVMLError`` a node without
    a working driver gives."""
    path = os.environ.get(ENDPOINT_ENV) or ENDPOINT_PATH
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise _error(NVML_ERROR_LIBRARY_NOT_FOUND, f"{path}: no such file") from None
    except PermissionError:
        raise _error(NVML_ERROR_NO_PERMISSION, f"{path}: permission denied") from None
    except OSError as exc:
        raise _error(NVML_ERROR_UNKNOWN, f"{path}: {exc}") from None
    try:
        body = json.loads(text)
        host, _, port = str(body["address"]).rpartition(":")
        return host, int(port), str(body["node"]), bytes.fromhex(body["key"])
    except (ValueError, KeyError, TypeError) as exc:
        note = f'{path}: expected {{"address": "HOST:PORT", "node": NAME, "key": HEX}} ({exc!r})'
        raise _error(NVML_ERROR_UNKNOWN, note) from None


def _connect() -> Any:
    host, port, node, key = _endpoint()
    manager = _Manager(address=(host, port), authkey=key)
    try:
        manager.connect()
        return manager.nvml(node)  # type: ignore[attr-defined]
    except Exception as exc:  # refused, reset, a wrong key, a node it does not serve
        where = f"GPU server {host}:{port} for node {node!r}"
        raise _error(NVML_ERROR_DRIVER_NOT_LOADED, f"{where}: {_last_line(exc)}") from None


CAP_SYS_ADMIN = 21
SETTERS = frozenset({"lock_clocks_mhz", "reset_clocks", "set_power_limit_mw"})
"""What NVML allows only to a process with ``CAP_SYS_ADMIN`` (the driver answers
``NO_PERMISSION`` otherwise; the Dockerfile's and the chart's ``SYS_ADMIN`` is for these)."""


def _may_set() -> bool:
    """Whether this process holds ``CAP_SYS_ADMIN`` in its effective set, as the driver
    checks: so the chart's ``securityContext`` decides, in the twin too, whether the
    agent may set clocks and limits."""
    try:
        for line in open("/proc/self/status").read().splitlines():  # noqa: SIM115
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _call(method: str, *args: int) -> Any:
    """The server's answer to ``method(*args)``: its value, or the ``NVMLError`` of the
    NVML return code it gives (``Uninitialized`` outside ``nvmlInit``/``nvmlShutdown``)."""
    server = _server
    if server is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if method in SETTERS and not _may_set():
        raise _error(NVML_ERROR_NO_PERMISSION, "the process lacks CAP_SYS_ADMIN")
    try:
        code, value = server._callmethod(method, args)
    except Exception as exc:  # the server went away
        raise _error(NVML_ERROR_GPU_IS_LOST, f"GPU server: {_last_line(exc)}") from None
    if code != NVML_SUCCESS:
        raise _error(code, str(value))
    return value


class _Device:
    """What ``nvmlDeviceGetHandleByIndex`` returns: the GPU's index on the node."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<twin nvmlDevice_t {self.index}>"


def _index(handle: object) -> int:
    if not isinstance(handle, _Device):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.index


# -- the functions ----------------------------------------------------------------


def nvmlInit() -> None:
    global _refcount, _server
    with _lock:
        if _refcount == 0:
            _server = _connect()
        _refcount += 1


def nvmlShutdown() -> None:
    global _refcount, _server
    with _lock:
        if _refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1
        if _refcount == 0:
            _server = None  # the proxy's finaliser lets the server drop its object


def nvmlDeviceGetCount() -> int:
    return int(_call("count"))


def nvmlDeviceGetHandleByIndex(index: int) -> _Device:
    gpu = _uint(index)
    _call("device", gpu)  # NVML refuses an index it does not have
    return _Device(gpu)


def nvmlDeviceGetName(handle: _Device) -> str:
    return str(_call("device", _index(handle))[1])


def nvmlDeviceGetUUID(handle: _Device) -> str:
    return str(_call("device", _index(handle))[0])


def nvmlDeviceGetSupportedMemoryClocks(handle: _Device) -> list[int]:
    _call("device", _index(handle))
    return [MEMORY_CLOCK_MHZ]


def nvmlDeviceGetSupportedGraphicsClocks(handle: _Device, memoryClockMHz: int) -> list[int]:
    clocks = _call("supported_graphics_clocks_mhz", _index(handle))
    if _uint(memoryClockMHz) != MEMORY_CLOCK_MHZ:
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # not a supported memory clock
    return sorted((int(c) for c in clocks), reverse=True)


def nvmlDeviceSetGpuLockedClocks(handle: _Device, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
    lo, hi = _uint(minGpuClockMHz), _uint(maxGpuClockMHz)
    _call("lock_clocks_mhz", _index(handle), lo, hi)


def nvmlDeviceResetGpuLockedClocks(handle: _Device) -> None:
    _call("reset_clocks", _index(handle))


def nvmlDeviceGetPowerManagementLimit(handle: _Device) -> int:
    return int(_call("power_limit_mw", _index(handle)))


def nvmlDeviceGetPowerManagementDefaultLimit(handle: _Device) -> int:
    return int(_call("default_power_limit_mw", _index(handle)))


def nvmlDeviceGetPowerManagementLimitConstraints(handle: _Device) -> list[int]:
    low, high = _call("power_limit_constraints_mw", _index(handle))
    return [int(low), int(high)]


def nvmlDeviceSetPowerManagementLimit(handle: _Device, limit: int) -> None:
    _call("set_power_limit_mw", _index(handle), _uint(limit))


def nvmlDeviceGetTotalEnergyConsumption(handle: _Device) -> int:
    return int(_call("total_energy_mj", _index(handle)))


def nvmlDeviceGetPowerUsage(handle: _Device) -> int:
    return int(_call("power_mw", _index(handle)))


def nvmlDeviceGetClockInfo(handle: _Device, type: int) -> int:
    gpu, clock = _index(handle), _uint(type)
    if clock in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):  # one clock domain on these GPUs
        return int(_call("sm_clock_mhz", gpu))
    _call("device", gpu)
    if clock == NVML_CLOCK_MEM:
        return MEMORY_CLOCK_MHZ
    if clock == NVML_CLOCK_VIDEO:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # the twin has no video engine
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
