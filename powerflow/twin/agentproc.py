"""A node agent in a process of its own, on GPUs that stay in the twin's process.

Why a process: a fault test kills the agent, and a kill must be a kill. A
SIGKILLed agent runs no code at all: it does not restore the GPUs' defaults,
does not flush its sample queue, does not answer its workers; the GPUs keep
the clocks and power limits it set (the driver keeps them), and the next
agent finds them so. An agent in a thread cannot be stopped that way (its
event loop's ``finally`` blocks always run), so the twin runs each agent as
``python -m powerflow.twin.agentproc`` and ``signal``s it: SIGKILL for a
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
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.managers import BaseManager, Server
from pathlib import Path
from typing import Any

from powerflow.devices import GpuDevices
from powerflow.twin.gpus import TwinGpus

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


class GpuServer:
    """Serves ``gpus`` (node -> ``TwinGpus``) to agent processes (module docstring)."""

    def __init__(self, gpus: dict[str, TwinGpus], key_file: Path) -> None:
        self.journal: list[Setting] = []
        self.key = secrets.token_bytes(32)
        key_file.write_bytes(b"")
        key_file.chmod(0o600)
        key_file.write_bytes(self.key)
        self.key_file = key_file
        served = {node: _Served(node, g, self.journal) for node, g in gpus.items()}

        class Manager(BaseManager):
            pass

        Manager.register("node", callable=served.__getitem__, exposed=EXPOSED)
        self._server: Server = Manager(address=("127.0.0.1", 0), authkey=self.key).get_server()
        address: Any = self._server.address  # (host, port) for a TCP listener
        host, port = address
        self.address = f"{host}:{port}"
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
    """``python -m powerflow.twin.agentproc --gpus HOST:PORT --key-file F -- NODEAGENT_ARGS``:
    ``powerflow nodeagent NODEAGENT_ARGS`` (``serve``, what it runs) on the served GPUs of
    its ``--node-name``."""
    parser = argparse.ArgumentParser(prog="python -m powerflow.twin.agentproc")
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
