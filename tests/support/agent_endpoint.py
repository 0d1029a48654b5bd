"""A real aiohttp server for tests, on a free localhost port, in its own thread.

The worker library is synchronous (it posts from a background thread) and
hypothesis drives examples synchronously, so the server under test runs in
a thread with its own event loop, as the node agent runs it: a real socket,
real HTTP parsing, nothing stubbed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aiohttp import web


@contextmanager
def serve_in_thread(make_app: Callable[[], web.Application]) -> Iterator[str]:
    """Serve ``make_app()`` on 127.0.0.1; yields its base URL."""
    ready = threading.Event()
    stop: list[Callable[[], None]] = []
    url: list[str] = []

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(make_app())
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None and isinstance(server, asyncio.base_events.Server)
        port = server.sockets[0].getsockname()[1]
        url.append(f"http://127.0.0.1:{port}")
        done = asyncio.Event()
        stop.append(lambda: loop.call_soon_threadsafe(done.set))
        ready.set()
        loop.run_until_complete(done.wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=main, name="test-server", daemon=True)
    thread.start()
    assert ready.wait(10), "the test server did not start"
    try:
        yield url[0]
    finally:
        stop[0]()
        thread.join(10)
