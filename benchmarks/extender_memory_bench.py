"""Memory and loop stalls of the extender under big or many-named calls.

Rows:

- ``N distinct names``: ``/prioritize`` called with ``N`` node names never
  seen before, 1,000 at a time, as a churning cluster (or a client making
  names up) would; memory still held afterwards (tracemalloc): none, as
  nothing is kept of a call's names.
- ``one call, N names``: a single ``/prioritize`` with ``N`` names (the body
  limit raised to let it in; by default such a body gets 413 unread): its
  wall time, the peak memory while it runs and what is still held after it,
  and the longest time ``/healthz`` waited meanwhile (the loop stall; decoding
  and writing run on a thread above ``app.OFFLOAD_BYTES``).
- ``default limit``: the same body with the default ``--max-body-bytes``:
  answered 413.

    python -m benchmarks.extender_memory_bench [--names 70000] [--big 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import orjson
from powerflow.extender import create_app
from powerflow.extender.app import MAX_BODY_BYTES, BodyLimits
from rich.console import Console
from rich.table import Table

from benchmarks.extender_bench import asgi_post

MB = 1 << 20


def body(names: Sequence[str]) -> bytes:
    return orjson.dumps({"Pod": {"metadata": {"name": "web"}}, "NodeNames": list(names)})


async def cache_row(names: int) -> list[str]:
    app = create_app(connect=False)
    app.state.extender.state.replace([], [])
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for start in range(0, names, 1000):
        batch = [f"node-{i:09d}.pool-{i % 97}.example.internal" for i in range(start, start + 1000)]
        status, _ = await asgi_post(app, "/prioritize", body(batch))
        assert status == 200
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return [f"{names:,} distinct names, 1,000 a call", f"{held / MB:.1f} MB held", "", ""]


async def big_row(names: int) -> list[list[str]]:
    payload = body([f"node-{i:09d}" for i in range(names)])
    default = create_app(connect=False)
    default.state.extender.state.replace([], [])
    refused, _ = await asgi_post(default, "/prioritize", payload)
    app = create_app(connect=False, limits=BodyLimits(max_body_bytes=len(payload) + 1))
    app.state.extender.state.replace([], [])
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    stalls: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            sent = time.perf_counter()
            await asgi_get(app, "/healthz")
            stalls.append(time.perf_counter() - sent)
            await asyncio.sleep(0.005)

    prober = asyncio.create_task(probe())
    started = time.perf_counter()
    status, _ = await asgi_post(app, "/prioritize", payload)
    wall = time.perf_counter() - started
    done.set()
    await prober
    peak = tracemalloc.get_traced_memory()[1] - base
    for _ in range(3):  # the loop keeps its last callback (and the answer) until the next runs
        await asyncio.sleep(0)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert status == 200
    return [
        [
            f"one call, {names:,} names ({len(payload) / MB:.0f} MB)",
            f"{held / MB:.1f} MB held after, {peak / MB:.0f} MB peak",
            f"{wall:.2f} s",
            f"/healthz waited at most {max(stalls, default=0) * 1000:.0f} ms",
        ],
        [f"default limit ({MAX_BODY_BYTES / MB:.0f} MB)", f"HTTP {refused}", "", ""],
    ]


async def asgi_get(app: Any, path: str) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"extender")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8888),
        "state": {},
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(scope, receive, send)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=70_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    rows = [asyncio.run(cache_row(args.names)), *asyncio.run(big_row(args.big))]
    table = Table(title="Extender memory")
    for column in ("case", "memory", "time / state", "loop"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
