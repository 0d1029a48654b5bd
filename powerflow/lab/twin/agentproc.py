"""A node agent in a process of its own, on GPUs that stay in the twin's process.

Why a process: a fault test kills the agent, and a kill must be a kill. A
SIGKILLed agent runs no code at all: it does not restore the GPUs' defaults,
does not flush its sample queue, does not answer its workers; the GPUs keep
the clocks and power limits it set (the driver keeps them), and the next
agent finds them so. An agent in a thread cannot be stopped that way (its
event loop's ``finally`` blocks always run), so the twin runs each agent as
``python -m powerflow.lab.twin.agentproc`` and ``signal``s it: SIGKILL for a
crash, SIGTERM for a graceful stop (the agent's own handler restores the
defaults), as the kubelet does to the DaemonSet's pod.

The GPUs stay here because the workers (the twin's kubelet, in this process)
make them compute: both sides must act on one ground truth. ``GpuServer``
serves each node's ``TwinGpus`` over a local socket
(``multiprocessing.managers``, authenticated with a key only the twin's
folder holds); the agent process reaches them through a proxy with the
``GpuDevices`` methods, as the real agent reaches the driver through NVML.
``GpuServer.journal`` keeps every call that changes a GPU's settings (the
driver's view: which clocks and limits were set, in which order, by which
agent start), for the checks of a fault test.

The same socket serves the agent of the product's container image, which
takes its real NVML path: there ``pynvml`` is ``powerflow.lab.twin.nvml_shim``,
mounted over the image's, and it asks for a node's GPUs in NVML's terms
(``_NvmlServed``). ``GpuServer.endpoint_file`` writes what it needs to connect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.managers import BaseManager, Server
from pathlib import Path
from typing import Any

from powerflow.core.devices import (
    GpuDevices,
    GpuError,
    GpuInvalidArgument,
    GpuLost,
    GpuNotSupported,
    GpuPermissionError,
    GpuUnavailable,
)
from powerflow.core.devices.interface import gpu_at
from powerflow.lab.twin import nvml_shim as nvml
from powerflow.lab.twin.gpus import TwinGpus

log = logging.getLogger(__name__)

EXPOSED = (
    "gpus",
    "supported_graphics_clocks_mhz",
    "lock_clocks_mhz",
    "reset_clocks",
    "power_limit_w",
    "power_limit_range_w",
    "set_power_limit_w",
    "reset_power_limit",
    "total_energy_mj",
    "power_mw",
    "sm_clock_mhz",
)
"""``GpuDevices`` without ``close``: the GPUs outlive any agent."""
SETTERS = ("lock_clocks_mhz", "reset_clocks", "set_power_limit_w", "reset_power_limit")


@dataclass(frozen=True)
class Setting:
    """One call that changed a GPU's settings: when (``time.monotonic``), on which
    node and GPU, which call, its arguments after the GPU index."""

    at_s: float
    node: str
    gpu: int
    call: str
    args: tuple[Any, ...]


class _Served:
    """What an agent's proxy calls: the node's GPUs, with setters journaled."""

    def __init__(self, node: str, gpus: TwinGpus, journal: list[Setting]) -> None:
        self._node, self._gpus, self._journal = node, gpus, journal

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._gpus, name)
        if name not in SETTERS:
            return method

        def setter(gpu: int, *args: Any) -> Any:
            out = method(gpu, *args)  # a refused setting raises, and is not journaled
            self._journal.append(Setting(time.monotonic(), self._node, gpu, name, args))
            return out

        return setter


NVML_EXPOSED = (
    "count",
    "device",
    "supported_graphics_clocks_mhz",
    "lock_clocks_mhz",
    "reset_clocks",
    "power_limit_mw",
    "power_limit_constraints_mw",
    "default_power_limit_mw",
    "set_power_limit_mw",
    "total_energy_mj",
    "power_mw",
    "sm_clock_mhz",
)
"""What ``nvml_shim`` calls (``_NvmlServed``)."""

_NVML_RETURNS: dict[type[GpuError], int] = {
    GpuInvalidArgument: nvml.NVML_ERROR_INVALID_ARGUMENT,
    GpuNotSupported: nvml.NVML_ERROR_NOT_SUPPORTED,
    GpuPermissionError: nvml.NVML_ERROR_NO_PERMISSION,
    GpuLost: nvml.NVML_ERROR_GPU_IS_LOST,
    GpuUnavailable: nvml.NVML_ERROR_UNINITIALIZED,  # the twin's GPUs are closed
}
"""The NVML return code for each refusal of the twin's GPUs (NVML's own, where the
driver refuses the same: an index, clock range or limit out of range, a board
without power management)."""


def _mw(watts: float) -> int:
    return round(watts * 1000.0)


class _NvmlServed:
    """One node's GPUs in NVML's terms, for ``nvml_shim`` (the twin's ``pynvml``).

    Each method answers as NVML's C functions do, ``(nvmlReturn_t, value)``:
    ``(NVML_SUCCESS, value)``, or an error code and the twin's message. Values
    are plain Python (ints, strs, tuples) in NVML's units, and nothing raises
    across the socket: the shim unpickles in the agent's image, which it must
    not need PowerFlow's classes for (``GpuInfo``, the ``GpuError``s).
    Settings go through ``_Served``, so the journal sees them.
    """

    def __init__(self, served: _Served) -> None:
        self._gpus = served

    def _answer(self, read: Callable[[], Any]) -> tuple[int, Any]:
        try:
            return nvml.NVML_SUCCESS, read()
        except GpuError as err:
            code = next(
                (c for cls, c in _NVML_RETURNS.items() if isinstance(err, cls)),
                nvml.NVML_ERROR_UNKNOWN,
            )
            return code, str(err)
        except Exception as err:  # a bug of the twin's: NVML's internal error
            log.exception("the NVML shim's call failed")
            return nvml.NVML_ERROR_UNKNOWN, f"{type(err).__name__}: {err}"

    def count(self) -> tuple[int, Any]:
        return self._answer(lambda: len(self._gpus.gpus()))

    def device(self, gpu: int) -> tuple[int, Any]:
        """(UUID, name) of a GPU index; an unknown index is ``InvalidArgument``."""

        def read() -> tuple[str, str]:
            info = gpu_at(self._gpus.gpus(), gpu)
            return info.uuid, info.name

        return self._answer(read)

    def supported_graphics_clocks_mhz(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: tuple(self._gpus.supported_graphics_clocks_mhz(gpu)))

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> tuple[int, Any]:
        return self._answer(lambda: self._gpus.lock_clocks_mhz(gpu, lo_mhz, hi_mhz))

    def reset_clocks(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: self._gpus.reset_clocks(gpu))

    def power_limit_mw(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: _mw(self._gpus.power_limit_w(gpu)))

    def power_limit_constraints_mw(self, gpu: int) -> tuple[int, Any]:
        def read() -> tuple[int, int]:
            allowed = self._gpus.power_limit_range_w(gpu)
            return _mw(allowed.min_w), _mw(allowed.max_w)

        return self._answer(read)

    def default_power_limit_mw(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: _mw(self._gpus.power_limit_range_w(gpu).default_w))

    def set_power_limit_mw(self, gpu: int, mw: int) -> tuple[int, Any]:
        """NVML has no reset of the power limit: the agent resets it by setting the
        default, which leaves the GPU as ``reset_power_limit`` does, and is journaled so."""

        def write() -> None:
            if mw == _mw(self._gpus.power_limit_range_w(gpu).default_w):
                self._gpus.reset_power_limit(gpu)
            else:
                self._gpus.set_power_limit_w(gpu, mw / 1000.0)

        return self._answer(write)

    def total_energy_mj(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: self._gpus.total_energy_mj(gpu))

    def power_mw(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: self._gpus.power_mw(gpu))

    def sm_clock_mhz(self, gpu: int) -> tuple[int, Any]:
        return self._answer(lambda: self._gpus.sm_clock_mhz(gpu))


class GpuServer:
    """Serves ``gpus`` (node -> ``TwinGpus``) to agent processes (module docstring),
    on ``host`` (an IPv4 address or name; the loopback by default) and a free port."""

    def __init__(
        self, gpus: dict[str, TwinGpus], key_file: Path, *, host: str = "127.0.0.1"
    ) -> None:
        self.journal: list[Setting] = []
        self.key = secrets.token_bytes(32)
        key_file.write_bytes(b"")
        key_file.chmod(0o600)
        key_file.write_bytes(self.key)
        self.key_file = key_file
        served = {node: _Served(node, g, self.journal) for node, g in gpus.items()}
        self._nodes = frozenset(served)

        class Manager(BaseManager):
            pass

        Manager.register("node", callable=served.__getitem__, exposed=EXPOSED)
        Manager.register(
            "nvml", callable=lambda node: _NvmlServed(served[node]), exposed=NVML_EXPOSED
        )
        self._server: Server = Manager(address=(host, 0), authkey=self.key).get_server()
        address: Any = self._server.address  # (host, port) for a TCP listener
        bound, port = address
        self.address = f"{bound}:{port}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="twin-gpu-server", daemon=True)

    def _serve(self) -> None:
        """Accept agents until ``stop``: ``Server.serve_forever``'s accept loop, without
        what it does as a process's main (it resets ``sys.stdout`` and ``sys.stderr`` and
        calls ``sys.exit`` when it ends, which would take a test's or the demo's output)."""
        server: Any = self._server
        server.stop_event = self._stopping  # what each connection's loop checks
        # ``Listener`` keeps its socket private; a timeout lets the loop see ``stop``.
        server.listener._listener._socket.settimeout(0.25)
        while not self._stopping.is_set():
            try:
                connection = server.listener.accept()
            except OSError:  # the timeout, or one failed handshake
                continue
            threading.Thread(target=server.handle_request, args=(connection,), daemon=True).start()

    def start(self) -> GpuServer:
        self._thread.start()
        return self

    def endpoint_file(self, node: str, path: Path, *, address: str | None = None) -> Path:
        """Write ``path``, what ``nvml_shim`` needs to reach ``node``'s GPUs here:
        ``{"address": "HOST:PORT", "node": NODE, "key": HEX}``, readable by its owner only
        (the key lets one use every node's GPUs). ``address`` is where the agent dials
        (default ``self.address``: a server on 0.0.0.0 may need the host's address).

        The container runtime mounts it at ``nvml_shim.ENDPOINT_PATH`` in the agent's
        container. Written whole, then renamed into place: a shim never reads half a
        file, but a bind mount of the file itself keeps the version it mounted, so
        mount its folder to see a rewrite."""
        if node not in self._nodes:
            raise ValueError(f"no GPUs served for node {node!r}")
        body = {"address": address or self.address, "node": node, "key": self.key.hex()}
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
            f.write("\n")
        os.chmod(part, 0o600)  # O_CREAT's mode does not change an existing file
        os.replace(part, path)
        return path

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        server: Any = self._server
        server.listener.close()


def connect(address: str, key: bytes, node: str) -> GpuDevices:
    """The GPUs of ``node`` served at ``address`` (``HOST:PORT``), as ``GpuDevices``."""

    class Manager(BaseManager):
        pass

    Manager.register("node")
    host, port = address.rsplit(":", 1)
    manager = Manager(address=(host, int(port)), authkey=key)
    manager.connect()
    devices: GpuDevices = manager.node(node)  # type: ignore[attr-defined]
    return devices


def main(argv: list[str] | None = None) -> int:
    """``python -m powerflow.lab.twin.agentproc --gpus HOST:PORT --key-file F -- NODEAGENT_ARGS``:
    ``powerflow nodeagent NODEAGENT_ARGS`` (``serve``, what it runs) on the served GPUs of
    its ``--node-name``."""
    parser = argparse.ArgumentParser(prog="python -m powerflow.lab.twin.agentproc")
    parser.add_argument("--gpus", required=True, metavar="HOST:PORT")
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("agent", nargs=argparse.REMAINDER)
    own = parser.parse_args(argv)
    from powerflow.cli import build_parser
    from powerflow.commands.nodeagent import serve

    rest = own.agent[1:] if own.agent[:1] == ["--"] else own.agent
    args = build_parser(only="nodeagent").parse_args(["nodeagent", *rest])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every worker report
    devices = connect(own.gpus, own.key_file.read_bytes(), args.node_name)
    return serve(args, devices=devices)


if __name__ == "__main__":
    sys.exit(main())
