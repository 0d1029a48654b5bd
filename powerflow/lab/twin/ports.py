"""Ports for servers that must be told a number before they start.

kopf's liveness URL cannot say "any port" (it reads port 0 as 80), and the twin
starts the operator, extender and API server as processes whose ports it must know
in advance. The usual trick, bind port 0 and release it, picks from the kernel's
ephemeral range, and between the release and the server's bind the kernel may hand
that very port to any outgoing connection of any process: CI once saw kopf's
liveness server fail on it ("address already in use"), and the operator with it.
Ports here come from outside the ephemeral range, which the kernel never hands out
on its own: only a process that binds a port there by number can take one. Each
process walks the range from a random start (a forked child from a new one), and a
port is returned only if it binds now. Where the ephemeral range leaves too few
ports outside it (``ip_local_port_range`` set to ``1024 65535``), bind(0) it is.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 16384
"""At most this many ports next to the ephemeral range are used."""
_FEWEST = 256
"""Fewer ports than this outside the ephemeral range: fall back to bind(0)."""


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands out on its own, first and last (Linux's default where
    the file cannot be read: 32768-60999)."""
    try:
        low, high = (int(word) for word in path.read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def outside(low: int, high: int) -> range:
    """The larger stretch of at most ``_SPAN`` unprivileged ports just below or just
    above ``low``-``high``; empty when neither has ``_FEWEST``."""
    below = range(max(1024, low - _SPAN), max(1024, low))
    above = range(min(65536, high + 1), min(65536, high + 1 + _SPAN))
    best = max(below, above, key=len)
    return best if len(best) >= _FEWEST else range(0)


class _Walk:
    """This process's walk over ``outside``'s ports, from a random start."""

    def __init__(self) -> None:
        self.ports = outside(*ephemeral_range())
        self._lock = threading.Lock()
        self._next: Iterator[int] | None = None

    def restart(self) -> None:
        """A new random start (in a forked child, so that it does not repeat its
        parent's ports)."""
        self._lock = threading.Lock()
        self._next = None

    def _cycle(self) -> Iterator[int]:
        start = random.SystemRandom().randrange(len(self.ports))
        while True:
            yield from self.ports[start:]
            yield from self.ports[:start]

    def free_port(self) -> int:
        if not self.ports:
            return _any_port()
        with self._lock:
            if self._next is None:
                self._next = self._cycle()
            for _ in range(len(self.ports)):
                port = next(self._next)
                if _binds(port):
                    return port
        raise OSError(f"no free port in {self.ports.start}-{self.ports.stop - 1}")


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_walk = _Walk()
os.register_at_fork(after_in_child=_walk.restart)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds now and that the kernel will not give to
    an outgoing connection before its server binds it; not one returned before in
    this process unless all of the range has been. (Neither promise holds in the
    bind(0) fallback, where the kernel leaves no room outside its range.)"""
    return _walk.free_port()
