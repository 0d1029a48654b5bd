"""Time the operator's sample ingest: accepted samples per second on one core.

Target: 10,000 samples/s on one core, batched, with the
TokenReview cache warm. The ingest (``powerflow.operator.ingest``: aiohttp
server, bearer token, ``telemetry.parse_batch``, per-sample checks against a
cluster view of 64 jobs on 8 nodes, the sink) runs on an event loop in a
thread of its own; clients post batches from the main thread over
real HTTP (keep-alive), each for jobs of its own, every window after its job's
last (the ingest refuses repeats and overlaps). "server CPU" is the ingest thread's CPU time
(``time.thread_time``), so samples per server CPU-second is what one core
sustains; "wall" includes the clients' work on the same process.
The one TokenReview (cache miss) goes to the emulated API server
(``tests/support/kube_emulator.py``) before timing starts.

    python -m benchmarks.ingest_bench [--seconds 3] [--clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import orjson
from powerflow.operator.actions import Observed
from powerflow.operator.ingest import ClusterPower, ClusterView, Ingest, start
from powerflow.operator.kube import ClusterState
from powerflow.operator.metrics import Metrics
from powerflow.operator.tokenreview import TokenReviewer
from rich.console import Console
from rich.table import Table

from powerflow.core import contract
from powerflow.core.telemetry import NodePower, SampleBatch, WindowSample, encode_batch

TESTS = Path(__file__).resolve().parent.parent / "tests"
AGENT = "system:serviceaccount:powerflow-system:powerflow-nodeagent"
NODES = [f"gpu-{i}" for i in range(8)]
JOBS = 64
TARGET = 10_000


class CountingSink:
    def __init__(self) -> None:
        self.samples = 0

    def add(self, node: str, samples: Sequence[WindowSample], now_s: float) -> None:
        self.samples += len(samples)


def cluster_view() -> ClusterView:
    """64 jobs of 8 one-GPU workers (generation 3), each job's workers on one node."""
    jobs = []
    for j in range(JOBS):
        name, node = f"job-{j}", NODES[j % len(NODES)]
        pods = tuple(
            {
                "metadata": {
                    "name": f"{name}-g3-w{i}",
                    "namespace": "ml",
                    "labels": {contract.JOB_LABEL: name},
                    "annotations": {
                        contract.GENERATION_ANNOTATION: "3",
                        contract.WORKERS_ANNOTATION: "8",
                    },
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"env": [{"name": "LOCAL_BATCH_SIZE", "value": "32"}]}],
                },
            }
            for i in range(8)
        )
        jobs.append(Observed({"metadata": {"name": name, "namespace": "ml"}}, pods))
    return ClusterView(ClusterState(tuple(jobs), (), None), leading=True, read_at_s=time.time())


GPU0_JOBS = [f"job-{j}" for j in range(JOBS) if NODES[j % len(NODES)] == "gpu-0"]
WINDOW_GAP_S = 10.0
"""Between two windows of one job: longer than a window (at most 46 x 0.14 s), so
that none overlaps the one before (the ingest refuses overlaps and repeats)."""


def body(size: int, jobs: Sequence[str] = GPU0_JOBS, start_s: float = 1.6e9) -> bytes:
    """A batch of ``size`` samples from gpu-0's ``jobs``, every one accepted: windows
    of each job one after another from ``start_s``."""
    samples = tuple(
        WindowSample(
            namespace="ml",
            job=jobs[k % len(jobs)],
            generation=3,
            n=8,
            gpus_per_node=8,
            local_batch_size=32.0,
            frequency_mhz=1005 + (k % 8) * 45,  # A100 clocks, 1005-1320 MHz
            gpus_measured=8,
            iterations=40 + k % 7,
            step_time_s=0.12 + k * 1e-5,
            energy_j=210.5 + k % 13,
            end_s=start_s + (k // len(jobs)) * WINDOW_GAP_S,
        )
        for k in range(size)
    )
    return orjson.dumps(encode_batch(SampleBatch("gpu-0", samples, NodePower(2400.0, 1.7e9))))


class Feed:
    """One client's batches: its own jobs, each batch's windows after the last's (a
    client that repeated a batch would be timing the ingest's refusals)."""

    def __init__(self, jobs: Sequence[str]) -> None:
        self.jobs = list(jobs)
        self.next_s = 1.6e9

    def __call__(self, size: int) -> bytes:
        data = body(size, self.jobs, self.next_s)
        self.next_s += (-(-size // len(self.jobs)) + 1) * WINDOW_GAP_S
        return data


class Server:
    """The ingest on its own loop in a thread; ``cpu_s()`` is that thread's CPU time."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.sink = CountingSink()
        reviewer = TokenReviewer(lambda: api, contract.INGEST_AUDIENCE, AGENT, ttl_s=3600)
        view = cluster_view()
        self.ingest = Ingest(reviewer, lambda: view, self.sink, Metrics(), ClusterPower())
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(start(self.ingest, "127.0.0.1", 0, None))
        self.port = server.port
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(server.stop())

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def cpu_s(self) -> float:
        future = asyncio.run_coroutine_threadsafe(_thread_time(), self.loop)
        return future.result(10)


async def _thread_time() -> float:
    return time.thread_time()


async def post_for(url: str, feeds: Sequence[Feed], size: int, seconds: float) -> tuple[int, int]:
    """Post batches of ``size`` from one keep-alive connection per feed for ``seconds``;
    requests done and bytes of the last batch."""
    headers = {"Authorization": "Bearer agent-token", "Content-Type": "application/json"}
    deadline = time.perf_counter() + seconds
    done = 0
    last = 0

    async def client(session: aiohttp.ClientSession, feed: Feed) -> None:
        nonlocal done, last
        while time.perf_counter() < deadline:
            data = feed(size)
            last = len(data)
            async with session.post(url, data=data, headers=headers) as resp:
                answer = await resp.read()
                assert resp.status == 200, (resp.status, answer[:200])
            done += 1

    connector = aiohttp.TCPConnector(limit=len(feeds))
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session, feed) for feed in feeds))
    return done, last


async def measure(seconds: float, clients: int, sizes: list[int]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(TESTS))
    from kmock._internal import apps
    from support.kube_emulator import KubeEmulator

    rows = []
    async with KubeEmulator() as emulator, apps.Server(emulator):
        emulator.load_builtins()
        emulator.register_token(
            "agent-token",
            AGENT,
            extra={"authentication.kubernetes.io/node-name": ["gpu-0"]},
            audiences=(contract.INGEST_AUDIENCE,),
        )
        config = kubernetes.client.Configuration(host=str(emulator.url).rstrip("/"))
        api = kubernetes.client.ApiClient(config)
        with Server(api) as server:
            url = f"http://127.0.0.1:{server.port}{contract.SAMPLES_PATH}"
            feeds = [Feed(GPU0_JOBS[c::clients]) for c in range(clients)]
            await post_for(url, feeds[:1], 1, 0.2)  # the one TokenReview; the cache is warm
            assert server.ingest.reviewer.reviews == 1
            for size in sizes:
                accepted0, cpu0, wall0 = server.sink.samples, server.cpu_s(), time.perf_counter()
                requests, size_bytes = await post_for(url, feeds, size, seconds)
                wall = time.perf_counter() - wall0
                cpu = server.cpu_s() - cpu0
                accepted = server.sink.samples - accepted0
                assert accepted == requests * size
                rows.append(
                    {
                        "size": size,
                        "bytes": size_bytes,
                        "requests": requests,
                        "samples": accepted,
                        "per_cpu_s": accepted / cpu,
                        "per_wall_s": accepted / wall,
                        "us_per_sample": cpu / accepted * 1e6,
                    }
                )
            assert server.ingest.reviewer.reviews == 1
        api.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per batch size (3)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent connections (4)")
    parser.add_argument("--sizes", default="10,100,500,2000", help="samples per batch")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= len(GPU0_JOBS):
        parser.error(f"--clients must be 1 to {len(GPU0_JOBS)} (each posts for jobs of its own)")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = asyncio.run(measure(args.seconds, args.clients, sizes))
    table = Table(
        title=f"ingest: accepted samples ({args.clients} keep-alive clients, TokenReview cache "
        "warm); batch = samples per POST, /CPU-s = per CPU-second of the ingest thread, "
        "µs CPU = its CPU per sample"
    )
    for col in ("batch", "KiB", "batches", "/CPU-s", "µs CPU", "/s wall", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(
            str(row["size"]),
            f"{row['bytes'] / 1024:.1f}",
            str(row["requests"]),
            f"{row['per_cpu_s']:,.0f}",
            f"{row['us_per_sample']:.1f}",
            f"{row['per_wall_s']:,.0f}",
            f"{TARGET:,}",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
