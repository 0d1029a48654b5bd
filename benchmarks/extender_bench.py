"""Time the scheduler extender's verbs: in-process filter/prioritize, bind over HTTP.

Target (issue 6): filter and prioritize p99 under 5 ms in-process with 1,000
nodes and 5,000 pods in the cache; bind dominated by the API round trip.

The cache holds 1,000 8-GPU nodes and 5,000 bound PowerFlow workers (500
gangs of 8 and 250 gangs of 4, with placement annotations, as a restarted
extender would find them). Rows:

- ``core``: ``ClusterState.filter``/``prioritize`` alone (no HTTP, no JSON);
- ``NodeNames``: the whole request through the ASGI app (JSON in and out),
  ``nodeCacheCapable: true`` as shipped: the body carries 1,000 names;
- ``Nodes``: the same with ``nodeCacheCapable: false``: the body carries the
  full NodeList (about 2.5 kB per node), which decoding dominates;
- ``first worker``: a new gang's first filter, which reserves its block
  with the core's ``reserve_block``;
- ``bind``: the extender's ``/bind`` against the emulated API server
  (``tests/support/kube_emulator.py``) over localhost HTTP, next to the bare
  ``POST pods/binding`` round trip it wraps.

    python -m benchmarks.extender_bench [--nodes 1000] [--pods 5000] [--repeat 1000]
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


def percentiles(samples_s: Sequence[float]) -> tuple[float, float]:
    ms = np.asarray(samples_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


async def atimed(fn: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return out


async def verbs(nodes: int, pods: int, repeat: int) -> list[tuple[str, int, float, float]]:
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
    rows: list[tuple[str, int, float, float]] = []

    rows.append(("filter", repeat, *percentiles(timed(lambda: state.filter(info, names), repeat))))
    rows[-1] = ("filter (core)", *rows[-1][1:])
    core_prio = timed(lambda: state.prioritize(info, names), repeat)
    rows.append(("prioritize (core)", repeat, *percentiles(core_prio)))

    def first_worker() -> None:
        fresh = pod_info(b.pod("fresh-0", job="fresh", workers=8))
        state.filter(fresh, names)
        del state.gangs[fresh.gang]  # type: ignore[arg-type]

    first = timed(first_worker, max(50, repeat // 10))
    rows.append(("filter, first worker (core)", len(first), *percentiles(first)))

    by_names = json.dumps(b.args(worker, node_bodies, cache_capable=True)).encode()
    by_nodes = json.dumps(b.args(worker, node_bodies, cache_capable=False)).encode()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        for verb in ("filter", "prioritize"):
            for mode, body, n in (
                ("NodeNames", by_names, repeat),
                ("Nodes", by_nodes, repeat // 10),
            ):

                async def call(verb: str = verb, body: bytes = body) -> None:
                    response = await client.post(f"/{verb}", content=body, headers=JSON)
                    text = response.text
                    assert '"Error":""' in text or text.startswith('[{"Host"'), text[:200]

                await call()
                size = (
                    f"{len(body) / 1e6:.1f} MB" if len(body) > 1e6 else f"{len(body) / 1e3:.0f} kB"
                )
                rows.append(
                    (f"{verb} ({mode}, body {size})", n, *percentiles(await atimed(call, n)))
                )
    return rows


async def binds(repeat: int) -> list[tuple[str, int, float, float]]:
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
    rows.append(("bind via the extender (emulator)", len(samples), *percentiles(samples)))
    rows.append(("bare POST pods/binding (emulator)", len(raw), *percentiles(raw)))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--binds", type=int, default=256)
    args = parser.parse_args(argv)
    rows = asyncio.run(verbs(args.nodes, args.pods, args.repeat))
    rows += asyncio.run(binds(args.binds))
    table = Table(
        title=f"Extender latency: {args.nodes} nodes x {PER_NODE} GPUs, {args.pods} pods cached"
        " (target: filter/prioritize p99 < 5 ms)"
    )
    for column in ("call", "n", "p50 ms", "p99 ms"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for name, n, p50, p99 in rows:
        table.add_row(name, str(n), f"{p50:.3f}", f"{p99:.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()
