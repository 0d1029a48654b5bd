"""Two replicas of ``powerflow operator`` on one API server: only the Lease holder acts.

Each replica names itself with ``--leader-identity``, which is also in the
User-Agent of its writes, so the emulator's request log tells who wrote what.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import http.server
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import kubernetes
import pytest
from operator_cases import (
    JOBS,
    ThresholdPolicy,
    dljob,
    eventually,
    header,
    models,
    pods_of,
    start,
)
from powerflow.operator.connection import Source, load_configuration
from powerflow.operator.leader import LeaderElector, LeaseConfig
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, free_port, operator_args

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/powerflow-system/leases"
LEASE = f"{LEASES}/powerflow-operator"
WRITES = {kmock.method.POST, kmock.method.PATCH, kmock.method.PUT, kmock.method.DELETE}


def replica(kubeconfig: Path, identity: str, *, wait_for_pass: bool = True) -> Operator:
    args = operator_args(
        kubeconfig, "--leader-identity", identity, "--lease-duration", "1", "--debounce", "0.02"
    )
    return Operator(args, ThresholdPolicy(), models, wait_for_pass=wait_for_pass)


def writers(requests: list[Any]) -> list[str]:
    """Who wrote, per write of the cluster's objects (the Lease itself excluded)."""
    out = []
    for r in requests:
        agent = header(r, "User-Agent") or ""
        ours = r.method in WRITES and agent.startswith("powerflow-operator/")
        if ours and "/leases" not in r.url.path:
            out.append(agent.split("(", 1)[1].rstrip(")"))
    return out


def leading(replica: Any) -> float | None:
    """``powerflow_operator_leader`` as the replica exports it."""
    assert replica.controller is not None
    registry = replica.controller.metrics.registry
    value: float | None = registry.get_sample_value("powerflow_operator_leader")
    return value


async def holder(api: httpx.AsyncClient) -> str:
    spec: dict[str, Any] = (await api.get(LEASE)).json().get("spec", {})
    return str(spec.get("holderIdentity", ""))


async def test_only_the_leader_writes_and_a_successor_takes_over(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """The follower makes no pass and no write while the leader runs (several lease
    durations); when the leader stops, it releases the Lease and the follower acts."""
    async with replica(kubeconfig, "a") as a, replica(kubeconfig, "b", wait_for_pass=False) as b:
        assert await holder(api) == "a"
        await api.post(JOBS, json=dljob("one"))
        await eventually(lambda: _n_pods(api, "one", 4))
        await asyncio.sleep(2.5)  # > 2 lease durations: the leader keeps renewing
        assert await holder(api) == "a"
        assert b.passes == 0
        assert set(writers(list(kmock))) == {"a"}
        assert (leading(a), leading(b)) == (1.0, 0.0)
        await a.stop()
        handed_over = len(list(kmock))

        async def b_leads() -> bool:
            return await holder(api) == "b"

        await eventually(b_leads)
        await api.post(JOBS, json=dljob("two"))
        await eventually(lambda: _n_pods(api, "two", 4))
        assert b.passes > 0
        assert leading(b) == 1.0
    assert set(writers(list(kmock)[handed_over:])) == {"b"}
    spec = (await api.get(LEASE)).json()["spec"]
    assert spec.get("holderIdentity", "") == ""  # b released it too
    assert spec["leaseTransitions"] == 1


async def test_killed_leader_is_replaced_after_the_lease_expires(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A leader that dies without releasing (SIGKILL): the follower waits until the
    record has not changed for the lease duration, then takes over and acts."""
    proc = await start(
        "--kubeconfig",
        str(kubeconfig),
        "--leader-identity",
        "a",
        "--lease-duration",
        "2",
        "--metrics-port",
        "0",
        "--liveness",
        f"http://127.0.0.1:{free_port()}/healthz",
    )
    try:

        async def a_leads() -> bool:
            return (await api.get(LEASE)).is_success and await holder(api) == "a"

        await eventually(a_leads, timeout=60)
        args = operator_args(kubeconfig, "--leader-identity", "b", "--lease-duration", "2")
        async with Operator(args, ThresholdPolicy(), models, wait_for_pass=False) as b:
            await asyncio.sleep(1.0)
            assert b.passes == 0
            killed = time.time()
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            handed_over = len(list(kmock))

            async def b_leads() -> bool:
                return await holder(api) == "b"

            await eventually(b_leads, timeout=10)
            spec = (await api.get(LEASE)).json()["spec"]
            acquired = datetime.datetime.fromisoformat(spec["acquireTime"]).timestamp()
            # Not at the follower's next try (every 0.27 s) but once the record went
            # unchanged for the lease duration (2 s after the leader's last renewal,
            # at most one retry period before the kill).
            assert acquired - killed >= 1.0
            assert spec["leaseTransitions"] == 1
            await api.post(JOBS, json=dljob("after"))
            await eventually(lambda: _n_pods(api, "after", 4))
        assert set(writers(list(kmock)[handed_over:])) == {"b"}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_leader_steps_down_when_it_cannot_renew(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """Another holder took the Lease (e.g. after a network partition): the old leader's
    renewals fail, and after the renew deadline it stops acting."""
    async with replica(kubeconfig, "a") as a:
        lease = (await api.get(LEASE)).json()
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"] = {
            "holderIdentity": "intruder",
            "leaseDurationSeconds": 60,
            "renewTime": now,
            "acquireTime": now,
        }
        assert (await api.put(LEASE, json=lease)).is_success

        async def stepped_down() -> bool:
            return (
                a.controller is not None
                and a.controller.leader is not None
                and (not a.controller.leader.is_leader)
            )

        await eventually(stepped_down, timeout=5)
        passes = a.passes
        await api.post(JOBS, json=dljob("orphan"))
        await asyncio.sleep(1.0)
        assert await pods_of(api, "orphan") == []
        assert a.passes == passes
        assert await holder(api) == "intruder"


async def test_racing_candidates_elect_one_leader_at_a_time(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """Three candidates start together on a missing Lease: the create and the PUTs with
    ``resourceVersion`` let exactly one win; cancelling it releases the Lease and one of
    the others takes over (``leaseTransitions`` counts it)."""
    client = kubernetes.client.ApiClient(load_configuration(Source(str(kubeconfig))))
    electors = [
        # A 3 s lease (retries every 0.4 s, calls bounded at 2 s): with a 1 s lease, calls
        # timed out on a loaded machine, were retried while the emulator still served the
        # abandoned ones, and the request flood stalled the test.
        LeaderElector(client, LeaseConfig.scaled("powerflow-system", "race", name, 3))
        for name in ("x", "y", "z")
    ]
    tasks = [asyncio.create_task(e.run()) for e in electors]
    try:
        for _ in range(20):  # 2 s: several retry periods
            await asyncio.sleep(0.1)
            assert sum(e.is_leader for e in electors) <= 1
        (first,) = [e for e in electors if e.is_leader]
        tasks[electors.index(first)].cancel()
        await asyncio.gather(tasks[electors.index(first)], return_exceptions=True)
        rest = [e for e in electors if e is not first]

        async def successor() -> bool:
            return sum(e.is_leader for e in rest) == 1

        await eventually(successor, timeout=5)
        spec = (await api.get(f"{LEASES}/race")).json()["spec"]
        (second,) = [e for e in rest if e.is_leader]
        assert spec["holderIdentity"] == second.config.identity
        assert spec["leaseTransitions"] == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client.close()
    assert not any(e.is_leader for e in electors)
    assert (await api.get(f"{LEASES}/race")).json()["spec"].get("holderIdentity", "") == ""


async def test_a_leader_renews_while_other_work_fills_asyncios_thread_pool(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A pass's writes run in asyncio's shared thread pool (hundreds of pod creations
    behind a slow admission webhook fill it); the Lease's renewals have a thread of their
    own, so a healthy leader keeps the Lease meanwhile."""
    client = kubernetes.client.ApiClient(load_configuration(Source(str(kubeconfig))))
    elector = LeaderElector(client, LeaseConfig.scaled("powerflow-system", "busy", "a", 3))
    task = asyncio.create_task(elector.run())
    try:

        async def leading() -> bool:
            return elector.is_leader

        await eventually(leading, timeout=10)
        # Every thread of the shared pool (asyncio's default: min(32, cores + 4)) busy for
        # 3.5 s, longer than the 2 s renew deadline.
        threads = min(32, (os.cpu_count() or 1) + 4)
        busy = asyncio.gather(*(asyncio.to_thread(time.sleep, 3.5) for _ in range(threads)))
        for _ in range(30):
            await asyncio.sleep(0.1)
            assert elector.is_leader, "stepped down while the shared pool was busy"
        await busy
        assert elector.transitions == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        client.close()


async def _n_pods(api: httpx.AsyncClient, job: str, n: int) -> bool:
    return len(await pods_of(api, job)) == n


class _LeaseServer(http.server.ThreadingHTTPServer):
    """A Lease endpoint whose behaviour the test controls, over real HTTP: it stores the
    Lease as the API server does until ``broken_since`` is set, then answers 500 at once
    for ``fail_for_s`` and then hangs (until the test ends) — a partitioned API server."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _LeaseHandler)
        self.lock = threading.Lock()
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.last_write = 0.0  # time.monotonic() of the last stored write
        self.broken_since: float | None = None
        self.fail_for_s = 1.9
        self.slow_s = 0.0  # > 0: once broken, every answer (500) comes this late instead
        self.released = threading.Event()


class _LeaseHandler(http.server.BaseHTTPRequestHandler):
    server: _LeaseServer

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _serve(self) -> None:
        server = self.server
        size = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(size)) if size else None
        broken = server.broken_since
        if broken is not None:
            if server.slow_s:
                time.sleep(server.slow_s)
            elif time.monotonic() - broken >= server.fail_for_s:
                server.released.wait(10)  # hangs: the client's own timeout ends the call
            status = {"kind": "Status", "status": "Failure", "code": 500, "reason": "Internal"}
            self._answer(500, status)
            return
        with server.lock:
            if self.command == "GET":
                if server.lease is None:
                    self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                else:
                    self._answer(200, server.lease)
                return
            assert isinstance(data, dict)
            server.version += 1
            data.setdefault("metadata", {})["resourceVersion"] = str(server.version)
            server.lease = data
            server.last_write = time.monotonic()
            self._answer(201 if self.command == "POST" else 200, data)

    do_GET = do_POST = do_PUT = _serve


@contextlib.asynccontextmanager
async def leading_on(server: _LeaseServer, config: LeaseConfig) -> AsyncIterator[LeaderElector]:
    """A candidate running against ``server`` (served from a thread), once it leads; all
    of it stopped at the end."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    client = kubernetes.client.ApiClient(configuration)
    elector = LeaderElector(client, config)
    task = asyncio.create_task(elector.run())
    try:

        async def leading() -> bool:
            return elector.is_leader

        await eventually(leading, timeout=5)
        yield elector
    finally:
        server.released.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()
        server.server_close()
        client.close()


async def test_leader_stops_acting_by_its_last_renewal_plus_the_renew_deadline() -> None:
    """Renewals fail fast for 1.9 s, then the API server hangs: the leader must stop acting
    by the last stored renewal + ``renew_deadline_s`` (2 s), before the 3 s Lease expires
    and a successor may act. (It stepped down 4 s after: it waited a whole deadline for the
    hung try, and counted a renewal from when the answer came.)"""
    server = _LeaseServer()
    async with leading_on(server, LeaseConfig("ns", "lease", "me", 3, 2.0, 0.4)) as elector:
        server.broken_since = time.monotonic()
        with server.lock:
            last_write = server.last_write
        deadline = last_write + elector.config.renew_deadline_s
        # epsilon 0.5 s for a loaded event loop: still well before the Lease expires (3 s)
        while elector.is_leader and time.monotonic() < deadline + 0.5:
            await asyncio.sleep(0.01)
        assert not elector.is_leader, "still acting after its last renewal + renew deadline"


async def test_a_try_that_ends_after_its_deadline_is_still_read_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server hangs a renewal: the leader stops waiting at its deadline and
    steps down, and the try fails later, on its own timeout. The next round replaced it
    unread: asyncio's "Task exception was never retrieved" with a traceback, instead of
    the elector's one line."""
    server = _LeaseServer()
    server.slow_s = 1.5  # past the renew deadline (2 s from the last renewal, which was
    # a retry period, 1 s, before the try), before the next round (1 s after that)
    async with leading_on(server, LeaseConfig("ns", "lease", "me", 3, 2.0, 1.0)) as elector:
        caplog.clear()
        server.broken_since = time.monotonic()

        async def late_try_logged() -> bool:
            return any("lease ns/lease: 500" in r.getMessage() for r in caplog.records)

        await eventually(late_try_logged, timeout=10)
        assert not elector.is_leader
        await asyncio.sleep(2.0)  # more rounds, each replacing the try before
        gc.collect()  # an unread task's exception is reported when it is collected
        unread = [r for r in caplog.records if "never retrieved" in r.getMessage()]
        assert not unread, unread[0].getMessage()
