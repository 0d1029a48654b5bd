"""Ports for servers that must be told a number before they start.

kopf's liveness URL cannot say "any port" (it reads port 0 as 80), and the twin
starts the operator, extender and API server as processes whose ports it must know
in advance. The usual trick, bind port 0 and release it, picks from the kernel's
ephemeral range, and between the release and the server's bind the kernel may hand
that very port to any outgoing connection of any process: CI once saw kopf's
liveness server fail on it ("address already in use"), and the operator with it.
Ports here come from below the ephemeral range, which the kernel never hands out on
its own, so only another caller of this module can take one; each process walks the
range from its own starting point, and a port is returned only if it binds now.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 16384
"""How many ports below the ephemeral range to use."""


def ephemeral_low(path: Path = _RANGE_FILE) -> int:
    """The lowest port the kernel hands out on its own (Linux's default where the file
    cannot be read: 32768)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _walk() -> itertools.cycle[int]:
    low = ephemeral_low()
    first = max(1024, low - _SPAN)
    ports = range(first, low)
    start = (os.getpid() * 7919) % len(ports)  # apart for concurrent processes
    return itertools.cycle([*ports[start:], *ports[:start]])


_ports = _walk()
_lock = threading.Lock()


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds now and that the kernel will not give to
    an outgoing connection before its server binds it."""
    with _lock:
        for _ in range(_SPAN):
            port = next(_ports)
            if _binds(port):
                return port
    raise OSError(f"no free port below {ephemeral_low()}")
