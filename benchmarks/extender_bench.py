"""Time the scheduler extender's verbs: in-process, over HTTP as the chart serves it, bind.

Target: filter and prioritize p99 at most 1 ms in-process, and at least 3,000
calls a second over HTTP from 8 clients, with 5,000 nodes (Kubernetes' largest
supported cluster) and 25,000 pods in the cache; bind dominated by the API
round trip. Two runs of ``python -m benchmarks.extender_bench --no-bind`` on
the shared 2-core dev machine (AMD EPYC, other work running): over HTTP,
filter 2,842 and 3,228 calls/s at 0.19 and 0.18 ms of server CPU a call
(5,230 and 5,700 calls/s on a core of the server's own), prioritize 3,404
and 3,719 at 0.17 ms (5,750 and 5,900); in-process CPU p99 0.29 ms
(filter) and 0.27 ms (prioritize); at load average 1.2, 5,834 (filter)
and 6,066 (prioritize) calls/s at 0.16 ms. ``docs/extender.md`` has every
row.

The cache holds 5,000 8-GPU nodes and 25,000 bound PowerFlow workers of one
GPU each, five per node on average (2,500 gangs of 8, one node each, and
1,250 gangs of 4, two per node: 3,125 nodes busy, 1,875 free), as the
extender's mirror lists them: each gang is the current allocation of a DLJob
(``status.allocation``), its pods that DLJob's workers (``ownerReferences``,
the allocation's generation), Running, with the placement annotation their
bind wrote, so every gang is adopted as a restarted extender adopts it. Rows:

- ``core``: the decision alone, ``ClusterState.filter``/``block_scores`` (what
  the app asks the state for each verb) on a decoded pod (no HTTP, no JSON);
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
  5,000 names; ``Nodes``: ``nodeCacheCapable: false``: the body carries the
  full NodeList (about 2 kB per node: 9.8 MB at 5,000 nodes, so the app is
  built with ``--max-body-bytes`` raised to take it), which decoding dominates;
- ``HTTP``: the real server, uvicorn serving the app as ``powerflow
  extender`` does (``powerflow.commands.extender.serve``, logging at its
  default level into a file), in a process of its own on one core, and
  ``--clients`` keep-alive connections posting a worker's ``NodeNames`` body
  over localhost from a second process on another core (a plain asyncio
  client, light next to the server): calls a second, latency percentiles,
  each side's CPU per call, the calls a second that the server's CPU per call
  allows on a core of its own (what a loaded machine's wall clock hides), and
  the server's log lines (``--no-http`` skips it);
- ``bind``: the extender's ``/bind`` against the emulated API server
  (``tests/support/kube_emulator.py``) over localhost HTTP, next to the bare
  ``POST pods/binding`` round trip it wraps (``--no-bind`` skips it).

Wall-clock and CPU (this thread's ``thread_time``) percentiles are both
reported: on a shared machine the wall-clock tail holds the time the process
waited for a core.

    python -m benchmarks.extender_bench [--nodes 5000] [--pods 25000] [--repeat 1000]
                                        [--clients 8] [--seconds 5] [--no-http]
                                        [--no-bind] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from powerflow.extender import create_app
from powerflow.extender.app import MAX_BODY_BYTES, BodyLimits
from powerflow.extender.kube import Connection, KubeApi
from powerflow.extender.objects import placement_annotation, pod_info
from powerflow.extender.state import ClusterState
from rich.console import Console
from rich.table import Table

from powerflow.core.contract import GROUP, KIND, PLACEMENT_ANNOTATION, PLURAL, VERSION

TESTS = Path(__file__).resolve().parent.parent / "tests"
JSON = {"Content-Type": "application/json"}
PER_NODE = 8


def _bodies() -> Any:
    sys.path.insert(0, str(TESTS))
    import extender_bodies

    return extender_bodies


Cluster = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]


def cluster(nodes: int, pods: int) -> Cluster:
    """Nodes, bound gang workers packed onto them (gangs of 8 first, then gangs of 4), and
    the DLJobs whose current allocations they are (see the module docstring)."""
    b = _bodies()
    node_bodies = [b.node(f"gpu-{i:04d}", PER_NODE) for i in range(nodes)]
    pod_bodies: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []

    def gang(job: str, node: str, block: tuple[tuple[str, int], ...]) -> None:
        if int(node.removeprefix("gpu-")) >= nodes:
            raise ValueError(
                f"{pods} pods do not fit on {nodes} nodes as this benchmark packs them"
            )
        dljob = b.dljob(job, gpus=len(block))
        jobs.append(dljob)
        annotation = placement_annotation(node, block)
        for w in range(len(block)):
            p = b.pod(
                f"{job}-g1-w{w}",
                job=job,
                workers=len(block),
                index=w,
                node_name=node,
                phase="Running",
                owner=dljob,
            )
            p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = annotation
            pod_bodies.append(p)

    n = 0
    big = pods * 4 // 5 // PER_NODE
    for g in range(big):
        name = f"gpu-{n:04d}"
        gang(f"big{g}", name, tuple((name, i) for i in range(PER_NODE)))
        n += 1
    g = 0
    while len(pod_bodies) < pods:
        name = f"gpu-{n:04d}"
        offset = 4 * (g % 2)
        gang(f"small{g}", name, tuple((name, offset + i) for i in range(4)))
        g += 1
        n += g % 2 == 0
    return node_bodies, pod_bodies[:pods], jobs


def new_worker(job: str, index: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pending worker of a new DLJob of 8 GPUs, and that DLJob."""
    b = _bodies()
    dljob = b.dljob(job, gpus=PER_NODE)
    name = f"{job}-g1-w{index}"
    return b.pod(name, job=job, workers=PER_NODE, index=index, owner=dljob), dljob


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
    node_bodies, pod_bodies, jobs = cluster(nodes, pods)
    worker, job = new_worker("new", index=1)
    fresh, fresh_job = new_worker("fresh")
    by_names = json.dumps(b.args(worker, node_bodies, cache_capable=True)).encode()
    by_nodes = json.dumps(b.args(worker, node_bodies, cache_capable=False)).encode()
    first_body = json.dumps(b.args(fresh, node_bodies, cache_capable=True)).encode()
    # nodeCacheCapable: false sends ~2 kB a node: past the default limit beyond ~2,000 nodes.
    app = create_app(
        connect=False, limits=BodyLimits(max_body_bytes=max(MAX_BODY_BYTES, len(by_nodes)))
    )
    state: ClusterState = app.state.extender.state
    state.replace(node_bodies, pod_bodies, [*jobs, job, fresh_job])
    assert len(state.pods) == pods, len(state.pods)
    assert len(state.gangs) == len(jobs), (len(state.gangs), len(jobs))  # every gang adopted
    names = [nb["metadata"]["name"] for nb in node_bodies]
    info = pod_info(worker)
    state.filter(info, names)  # the gang's reservation exists from here on
    rows: list[Row] = [
        row("filter (core)", *timed(lambda: state.filter(info, names), repeat)),
        row("prioritize (core)", *timed(lambda: state.block_scores(info, names), repeat)),
    ]
    fresh_info = pod_info(fresh)

    def first_worker() -> None:
        state.filter(fresh_info, names)

    def forget_fresh() -> None:
        del state.gangs[fresh_info.gang]  # type: ignore[index]

    few = max(50, repeat // 10)
    rows.append(row("filter, first worker (core)", *untimed_after(first_worker, forget_fresh, few)))

    def size(body: bytes) -> str:
        return f"{len(body) / 1e6:.1f} MB" if len(body) > 1e6 else f"{len(body) / 1e3:.0f} kB"

    for verb in ("filter", "prioritize"):
        for mode, body, n in (("NodeNames", by_names, repeat), ("Nodes", by_nodes, few // 2)):

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
        emulator.declare(f"{GROUP}/{VERSION}/{PLURAL}", KIND)  # the chart installs the CRD
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


# -- over HTTP, as the chart serves it ------------------------------------------------------

WARMUP_S = 1.0
"""Calls before the measured window (connections, caches, the allocator's first pages)."""


def _cores() -> tuple[set[int], set[int]]:
    """The server's core and the clients' (another where the process may use two)."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]}, {cpus[1] if len(cpus) > 1 else cpus[0]}


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (Linux's /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(nodes: int, pods: int, port: int) -> None:
    """The server process: the benchmark's cluster in the cache, served as ``powerflow
    extender`` serves its app (its logging, uvicorn and settings, ``--log-level info``)."""
    from powerflow.commands.extender import configure_logging, serve

    configure_logging("info")
    node_bodies, pod_bodies, jobs = cluster(nodes, pods)
    _, job = new_worker("new", index=1)
    app = create_app(connect=False)
    app.state.extender.state.replace(node_bodies, pod_bodies, [*jobs, job])
    serve(app, "127.0.0.1", port, "info")


def _answer_ok(verb: str, answer: bytes) -> bool:
    return b'"Error":""' in answer if verb == "filter" else answer.startswith(b'[{"Host"')


async def _load(
    port: int, server: int, verb: str, body: bytes, clients: int, seconds: float
) -> Any:
    """``clients`` keep-alive connections posting ``body`` to ``/verb`` back to back for
    ``WARMUP_S`` + ``seconds``; the calls started in the last ``seconds`` count."""
    head = (
        f"POST /{verb} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    request = head.encode() + body
    latencies: list[float] = []
    failed = 0
    start = time.perf_counter()
    measure, stop = start + WARMUP_S, start + WARMUP_S + seconds

    async def client() -> None:
        nonlocal failed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while (begin := time.perf_counter()) < stop:
            writer.write(request)
            header = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            answer = await reader.readexactly(length)
            end = time.perf_counter()
            if header[9:12] != b"200" or not _answer_ok(verb, answer):
                failed += 1
            if begin >= measure:
                latencies.append(end - begin)
        writer.close()

    async def cpu_window() -> tuple[float, float]:
        await asyncio.sleep(measure - time.perf_counter())
        server_s, client_s = _cpu_s(server), time.process_time()
        await asyncio.sleep(stop - time.perf_counter())
        return _cpu_s(server) - server_s, time.process_time() - client_s

    window, *_ = await asyncio.gather(cpu_window(), *(client() for _ in range(clients)))
    return {"latencies": latencies, "failed": failed, "server_cpu_s": window[0],
            "client_cpu_s": window[1]}  # fmt: skip


def _clients(port: int, server: int, verb: str, nodes: int, clients: int, seconds: float) -> None:
    """The clients' process: prints ``_load``'s result as JSON."""
    b = _bodies()
    worker, _ = new_worker("new", index=1)
    names = [{"metadata": {"name": f"gpu-{i:04d}"}} for i in range(nodes)]
    body = b.go_json(b.args(worker, names, cache_capable=True))
    print(json.dumps(asyncio.run(_load(port, server, verb, body, clients, seconds))))


HttpRow = dict[str, Any]


def over_http(nodes: int, pods: int, clients: int, seconds: float) -> list[HttpRow]:
    """Filter and prioritize against the real server, each from its own clients' process."""
    sys.path.insert(0, str(TESTS))
    from powerflow.lab.twin.ports import free_port

    server_cores, client_cores = _cores()
    port = free_port()
    me = [sys.executable, "-m", "benchmarks.extender_bench"]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # as in the image: a write per log line
    rows: list[HttpRow] = []
    with tempfile.NamedTemporaryFile("w+b", suffix=".log") as log:
        argv = [*me, "--serve", str(port), "--nodes", str(nodes), "--pods", str(pods)]
        server = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
            preexec_fn=lambda: os.sched_setaffinity(0, server_cores),
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).is_success:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the server did not start: {log.read().decode()[-2000:]}")
                time.sleep(0.2)
            for verb in ("filter", "prioritize"):
                log.seek(0)
                lines = log.read().count(b"\n")
                argv = [*me, "--load", str(port), str(server.pid), verb, "--nodes", str(nodes)]
                argv += ["--clients", str(clients), "--seconds", str(seconds)]
                out = subprocess.run(
                    argv,
                    capture_output=True,
                    check=True,
                    cwd=root,
                    preexec_fn=lambda: os.sched_setaffinity(0, client_cores),
                ).stdout
                result = json.loads(out)
                log.seek(0)
                done = len(result["latencies"])
                p50, p99 = percentiles(result["latencies"]) if done else (math.nan,) * 2
                rows.append(
                    {
                        "call": f"{verb} (NodeNames)",
                        "clients": clients,
                        "n": done,
                        "failed": result["failed"],
                        "per_s": done / seconds,
                        "wall_p50_ms": p50,
                        "wall_p99_ms": p99,
                        "server_cpu_ms": 1e3 * result["server_cpu_s"] / max(done, 1),
                        "client_cpu_ms": 1e3 * result["client_cpu_s"] / max(done, 1),
                        "log_lines": log.read().count(b"\n") - lines,
                    }
                )
        finally:
            server.terminate()
            server.wait(30)
    return rows


def machine() -> str:
    """The CPU, the cores this process may use and the load, for the tables' captions."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    return f"{model}, {len(os.sched_getaffinity(0))} cores usable, load average {load:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=25000)
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--binds", type=int, default=256)
    parser.add_argument("--clients", type=int, default=8, help="HTTP clients (default 8)")
    parser.add_argument("--seconds", type=float, default=5.0, help="HTTP load per verb (5)")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP rows")
    parser.add_argument("--no-bind", action="store_true", help="skip the bind rows (minutes)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    # The HTTP rows' two processes (over_http), not for people.
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve(args.nodes, args.pods, args.serve)
        return
    if args.load is not None:
        port, pid, verb = args.load
        _clients(int(port), int(pid), verb, args.nodes, args.clients, args.seconds)
        return
    rows = asyncio.run(verbs(args.nodes, args.pods, args.repeat))
    http = [] if args.no_http else over_http(args.nodes, args.pods, args.clients, args.seconds)
    if not args.no_bind:
        rows += asyncio.run(binds(args.binds))
    if args.json:
        keys = ("call", "n", "wall_p50_ms", "wall_p99_ms", "cpu_p50_ms", "cpu_p99_ms")
        print(json.dumps([dict(zip(keys, r, strict=True)) for r in rows] + http))
        return
    console = Console(width=max(Console().width, 130))
    table = Table(
        title=f"Extender latency: {args.nodes} nodes x {PER_NODE} GPUs, {args.pods} pods cached"
        " (target: filter/prioritize p99 <= 1 ms in-process)",
        caption=machine(),
    )
    for column in ("call", "n", "wall p50 ms", "wall p99 ms", "CPU p50 ms", "CPU p99 ms"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for name, n, *ms in rows:
        table.add_row(name, str(n), *("-" if v != v else f"{v:.3f}" for v in ms))
    console.print(table)
    if not http:
        return
    table = Table(
        title=f"Extender over HTTP: uvicorn as `powerflow extender` runs it, {args.clients} "
        f"clients, {args.seconds:g} s (target: >= 3,000 calls/s)",
        caption=f"{machine()}; server and clients on cores of their own where there are two; "
        "CPU per call; calls/s/core: 1 / the server's CPU per call",
    )
    columns = ("call", "calls/s", "p50 ms", "p99 ms", "server CPU ms", "calls/s/core",
               "client CPU ms", "failed", "log lines")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "call" else "right", no_wrap=True)
    for r in http:
        table.add_row(
            r["call"],
            f"{r['per_s']:,.0f}",
            f"{r['wall_p50_ms']:.2f}",
            f"{r['wall_p99_ms']:.2f}",
            f"{r['server_cpu_ms']:.3f}",
            f"{1e3 / r['server_cpu_ms']:,.0f}",
            f"{r['client_cpu_ms']:.3f}",
            str(r["failed"]),
            str(r["log_lines"]),
        )
    console.print(table)


if __name__ == "__main__":
    main()
