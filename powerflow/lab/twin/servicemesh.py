"""The chart twin's kube-proxy: each Service port a TCP listener on its cluster IP.

kube-proxy's original (userspace) mode: a connection to ``clusterIP:port`` is
accepted on this machine and copied to one ready endpoint of the Service (a
ready pod its selector matches, at the container port the Service's
``targetPort`` names), picked round-robin at each connection. The endpoints are
looked up at each connection (``Endpoints``, from the twin's kubelet), so a pod
that becomes ready or stops is seen at once.

The ``kubernetes`` Service (``default`` namespace) is the API server: its
listener ends TLS with the twin's certificate (the CA pods find in their
service-account volume, ``ca.crt``) and copies the plain bytes to the
emulator, which speaks HTTP: what pods see is the in-cluster endpoint of a
real cluster.

What it does not imitate: session affinity, ``externalTrafficPolicy``, UDP,
NodePorts; a Service with no ready endpoint refuses the connection (closes it
at once) where iptables would drop or reject.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Endpoints = Callable[[], list[tuple[str, int]]]
"""The ready endpoints (address, port) of one Service port, looked up per connection."""


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    endpoints: Endpoints
    tls: ssl.SSLContext | None = None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class ServiceMesh:
    """``mesh.add(Listener(...))`` from any thread; ``stop()`` closes every listener."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="twin-kube-proxy")
        self._thread.daemon = True
        self._thread.start()
        self._servers: list[asyncio.Server] = []
        self._turn = itertools.count()

    def add(self, listener: Listener) -> None:
        future = asyncio.run_coroutine_threadsafe(self._listen(listener), self._loop)
        self._servers.append(future.result(10))

    async def _listen(self, listener: Listener) -> asyncio.Server:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ready = listener.endpoints()
            if not ready:
                log.info("no ready endpoint for %s:%s", listener.address, listener.port)
                writer.close()
                return
            host, port = ready[next(self._turn) % len(ready)]
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError as exc:
                log.info("%s:%s -> %s:%s: %s", listener.address, listener.port, host, port, exc)
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        return await asyncio.start_server(
            accept, listener.address, listener.port, ssl=listener.tls, reuse_address=True
        )

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
