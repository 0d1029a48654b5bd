"""Time the scheduler extender's verbs: in-process filter/prioritize, bind over HTTP.

Target (issue 6): filter and prioritize p99 under 5 ms in-process with 1,000
nodes and 5,000 pods in the cache; bind dominated by the API round trip.

The cache holds 1,000 8-GPU nodes and 5,000 bound PowerFlow workers (500
gangs of 8 and 250 gangs of 4, with placement annotations, as a restarted
extender would find them). Rows:

- ``core``: the decision alone, ``ClusterState.filter``/``prioritize`` on a
  decoded pod (no HTTP, no JSON);
- ``first worker (core)``: a new gang's first filter, which reserves its
  block with the core's ``reserve_block``;
- ``ASGI``: the whole request in-process: the app called directly as an
  ASGI callable (``scope``/``receive``/``send``) with the raw JSON body, as
  uvicorn hands it over, up to the answer's bytes; ``first worker`` again
  through the app;
- ``httpx``: the same through ``httpx.ASGITransport``, which adds the
  client's own request and response handling (a test client's cost, not the
  extender's);
- ``NodeNames``: ``nodeCacheCapable: true`` as shipped: the body carries
  1,000 names; ``Nodes``: ``nodeCacheCapable: false``: the body carries the
  full NodeList (about 2 kB per node), which decoding dominates;
- ``bind``: the extender's ``/bind`` against the emulated API server
  (``tests/support/kube_emulator.py``) over localhost HTTP, next to the bare
  ``POST pods/binding`` round trip it wraps (``--no-bind`` skips it).

Wall-clock and CPU (this thread's ``thread_time``) percentiles are both
reported: on a shared machine the wall-clock tail holds the time the process
waited for a core.

    python -m benchmarks.extender_bench [--nodes 1000] [--pods 5000] [--repeat 1000]
                                        [--no-bind] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from powerflow.extender import create_app
from powerflow.extender.kube import Connection, KubeApi
from powerflow.extender.objects import placement_annotation, pod_info
from powerflow.extender.state import ClusterState
from rich.console import Console
from rich.table import Table

from powerflow.contract import PLACEMENT_ANNOTATION

TESTS = Path(__file__).resolve().parent.parent / "tests"
JSON = {"Content-Type": "application/json"}
PER_NODE = 8


def _bodies() -> Any:
    sys.path.insert(0, str(TESTS))
    import extender_bodies

    return extender_bodies


def cluster(nodes: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes, and bound gang workers packed onto them: gangs of 8 first, then gangs of 4."""
    b = _bodies()
    node_bodies = [b.node(f"gpu-{i:04d}", PER_NODE) for i in range(nodes)]
    pod_bodies: list[dict[str, Any]] = []
    n = 0
    big = pods * 4 // 5 // PER_NODE
    for g in range(big):
        name = f"gpu-{n:04d}"
        block = tuple((name, i) for i in range(PER_NODE))
        for w in range(PER_NODE):
            p = b.pod(f"big{g}-{w}", job=f"big{g}", workers=8, index=w, node_name=name)
            p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement_annotation(name, block)
            pod_bodies.append(p)
        n += 1
    g = 0
    while len(pod_bodies) < pods:
        name = f"gpu-{n:04d}"
        offset = 4 * (g % 2)
        block = tuple((name, offset + i) for i in range(4))
        for w in range(4):
            p = b.pod(f"small{g}-{w}", job=f"small{g}", workers=4, index=w, node_name=name)
            p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement_annotation(name, block)
            pod_bodies.append(p)
        g += 1
        n += g % 2 == 0
    return node_bodies, pod_bodies[:pods]


Row = tuple[str, int, float, float, float, float]
"""call, samples, wall p50, wall p99, CPU p50, CPU p99 (ms); CPU is NaN where not measured."""


def percentiles(samples_s: Sequence[float]) -> tuple[float, float]:
    ms = np.asarray(samples_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def row(call: str, wall: Sequence[float], cpu: Sequence[float] | None = None) -> Row:
    cpu_p = percentiles(cpu) if cpu else (float("nan"), float("nan"))
    return (call, len(wall), *percentiles(wall), *cpu_p)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds of each of ``repeat`` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return wall, cpu


async def atimed(fn: Callable[[], Awaitable[Any]], repeat: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        await fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return wall, cpu


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST through the ASGI app itself, as a server hands it over: status and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"extender"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8888),
        "state": {},
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def _answered(verb: str, status: int, text: str) -> None:
    assert status == 200, (status, text[:200])
    assert '"Error":""' in text or text.startswith('[{"Host"'), text[:200]


async def verbs(nodes: int, pods: int, repeat: int) -> list[Row]:
    b = _bodies()
    node_bodies, pod_bodies = cluster(nodes, pods)
    app = create_app(connect=False)
    state: ClusterState = app.state.extender.state
    state.replace(node_bodies, pod_bodies)
    assert len(state.pods) == pods, len(state.pods)
    names = [nb["metadata"]["name"] for nb in node_bodies]
    worker = b.pod("new-1", job="new", workers=8, index=1)
    info = pod_info(worker)
    state.filter(info, names)  # the gang's reservation exists from here on
    rows: list[Row] = [
        row("filter (core)", *timed(lambda: state.filter(info, names), repeat)),
        row("prioritize (core)", *timed(lambda: state.prioritize(info, names), repeat)),
    ]
    fresh = b.pod("fresh-0", job="fresh", workers=8)
    fresh_info = pod_info(fresh)

    def first_worker() -> None:
        state.filter(fresh_info, names)

    def forget_fresh() -> None:
        del state.gangs[fresh_info.gang]  # type: ignore[index]

    few = max(50, repeat // 10)
    rows.append(row("filter, first worker (core)", *untimed_after(first_worker, forget_fresh, few)))

    by_names = json.dumps(b.args(worker, node_bodies, cache_capable=True)).encode()
    by_nodes = json.dumps(b.args(worker, node_bodies, cache_capable=False)).encode()
    first_body = json.dumps(b.args(fresh, node_bodies, cache_capable=True)).encode()

    def size(body: bytes) -> str:
        return f"{len(body) / 1e6:.1f} MB" if len(body) > 1e6 else f"{len(body) / 1e3:.0f} kB"

    for verb in ("filter", "prioritize"):
        for mode, body, n in (("NodeNames", by_names, repeat), ("Nodes", by_nodes, repeat // 10)):

            async def direct(verb: str = verb, body: bytes = body) -> None:
                status, answer = await asgi_post(app, f"/{verb}", body)
                _answered(verb, status, answer.decode())

            await direct()
            rows.append(row(f"{verb} ({mode}, body {size(body)}), ASGI", *await atimed(direct, n)))

    async def direct_first() -> None:
        status, answer = await asgi_post(app, "/filter", first_body)
        _answered("filter", status, answer.decode())

    rows.append(
        row(
            "filter, first worker (NodeNames), ASGI",
            *await auntimed_after(direct_first, forget_fresh, few),
        )
    )

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        for verb in ("filter", "prioritize"):

            async def call(verb: str = verb) -> None:
                response = await client.post(f"/{verb}", content=by_names, headers=JSON)
                _answered(verb, response.status_code, response.text)

            await call()
            label = f"{verb} (NodeNames, body {size(by_names)}), httpx"
            rows.append(row(label, *await atimed(call, repeat)))
    return rows


def untimed_after(
    fn: Callable[[], Any], reset: Callable[[], Any], repeat: int
) -> tuple[list[float], list[float]]:
    """Like ``timed``, with ``reset`` run untimed after each call."""
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = timed(fn, 1)
        reset()
        wall += w
        cpu += c
    return wall, cpu


async def auntimed_after(
    fn: Callable[[], Awaitable[Any]], reset: Callable[[], Any], repeat: int
) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = await atimed(fn, 1)
        reset()
        wall += w
        cpu += c
    return wall, cpu


async def binds(repeat: int) -> list[Row]:
    """Bind through the extender vs the bare binding call, both against the emulator."""
    sys.path.insert(0, str(TESTS))
    from kmock._internal import apps
    from support.kube_emulator import KubeEmulator

    b = _bodies()
    rows = []
    async with KubeEmulator() as emulator, apps.Server(emulator):
        emulator.load_builtins()
        host = str(emulator.url).rstrip("/")
        async with httpx.AsyncClient(base_url=host) as api:
            gangs = max(1, repeat // PER_NODE)
            for i in range(gangs):
                body = b.node(f"gpu-{i:04d}", PER_NODE)
                status = body.pop("status")
                await api.post("/api/v1/nodes", json=body)
                await api.patch(
                    f"/api/v1/nodes/gpu-{i:04d}/status",
                    json={"status": status},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
            workers = []
            for g in range(gangs):
                for w in range(PER_NODE):
                    p = b.pod(f"g{g}-{w}", job=f"g{g}", workers=PER_NODE, index=w)
                    for key in ("uid", "resourceVersion", "creationTimestamp"):
                        p["metadata"].pop(key)
                    created = await api.post("/api/v1/namespaces/default/pods", json=p)
                    workers.append(created.json())
            raw = []
            for i in range(min(repeat, 200)):
                p = b.pod(f"raw-{i}", gpus=0)
                for key in ("uid", "resourceVersion", "creationTimestamp"):
                    p["metadata"].pop(key)
                await api.post("/api/v1/namespaces/default/pods", json=p)
            for i in range(min(repeat, 200)):
                binding = {"metadata": {"name": f"raw-{i}"}, "target": {"name": "gpu-0000"}}
                start = time.perf_counter()
                await api.post(f"/api/v1/namespaces/default/pods/raw-{i}/binding", json=binding)
                raw.append(time.perf_counter() - start)

            app = create_app(KubeApi(Connection(host)))
            await app.state.extender.start()
            try:
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://x"
                ) as ext:
                    while (await ext.get("/readyz")).status_code != 200:
                        await asyncio.sleep(0.01)
                    names = [f"gpu-{i:04d}" for i in range(gangs)]
                    samples = []
                    for p in workers:
                        filtered = await ext.post(
                            "/filter",
                            content=json.dumps({"Pod": p, "NodeNames": names}).encode(),
                            headers=JSON,
                        )
                        target = filtered.json()["NodeNames"][0]
                        args = json.dumps(b.binding_args(p, target)).encode()
                        start = time.perf_counter()
                        answer = await ext.post("/bind", content=args, headers=JSON)
                        samples.append(time.perf_counter() - start)
                        assert answer.json() == {"Error": ""}, answer.text
            finally:
                await app.state.extender.stop()
    rows.append(row("bind via the extender (emulator)", samples))
    rows.append(row("bare POST pods/binding (emulator)", raw))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--binds", type=int, default=256)
    parser.add_argument("--no-bind", action="store_true", help="skip the bind rows (minutes)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = asyncio.run(verbs(args.nodes, args.pods, args.repeat))
    if not args.no_bind:
        rows += asyncio.run(binds(args.binds))
    if args.json:
        keys = ("call", "n", "wall_p50_ms", "wall_p99_ms", "cpu_p50_ms", "cpu_p99_ms")
        print(json.dumps([dict(zip(keys, r, strict=True)) for r in rows]))
        return
    table = Table(
        title=f"Extender latency: {args.nodes} nodes x {PER_NODE} GPUs, {args.pods} pods cached"
        " (target: filter/prioritize p99 < 5 ms)"
    )
    for column in ("call", "n", "wall p50 ms", "wall p99 ms", "CPU p50 ms", "CPU p99 ms"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for name, n, *ms in rows:
        table.add_row(name, str(n), *("-" if v != v else f"{v:.3f}" for v in ms))
    Console(width=max(Console().width, 110)).print(table)


if __name__ == "__main__":
    main()
