"""``powerflow extender --kubeconfig FILE`` as a user starts it, against the emulated API server.

A subprocess serves the real command on a free port, logs in with a kubeconfig
(bearer token) pointing at the emulator, mirrors its nodes and pods, and
places and binds a two-worker gang as kube-scheduler would call it: filter,
then bind, for each worker (``support.extender_process``; it fails the test if the log
holds a traceback). Its ``--metrics-port`` serves the metrics, and
only them, where Prometheus reaches them (the app itself stays on loopback).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from extender_bodies import args, binding_args, go_json, node, pod
from operator_cases import header
from support.extender_process import create, extender_process
from support.kube_emulator import KubeEmulator
from support.operator_harness import write_kubeconfig

from powerflow.core.contract import PLACEMENT_ANNOTATION

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
TOKEN = "extender-token"


@pytest.fixture
async def cluster(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """Two 8-GPU nodes."""
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for name in ("gpu-0", "gpu-1"):
            await create(api, "/api/v1/nodes", node(name))
        yield api


async def test_the_command_places_and_binds_a_gang(
    kmock: KubeEmulator, cluster: httpx.AsyncClient, tmp_path: Path
) -> None:
    pods = "/api/v1/namespaces/default/pods"
    workers = [await create(cluster, pods, pod(f"j-g1-w{i}", job="j", workers=2, generation="1",
                                               index=i)) for i in range(2)]  # fmt: skip
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token=TOKEN)
    async with (
        extender_process(kubeconfig) as running,
        httpx.AsyncClient(base_url=running.url) as ext,
    ):
        names = ["gpu-0", "gpu-1"]
        nodes = [node(n) for n in names]
        hosts = []
        for worker in workers:
            body = go_json(args(worker, nodes, cache_capable=True))
            answer = (await ext.post("/filter", content=body, headers=JSON)).json()
            assert not answer.get("Error") and answer["NodeNames"], answer
            host = answer["NodeNames"][0]
            bound = (await ext.post("/bind", json=binding_args(worker, host))).json()
            assert not bound.get("Error"), bound
            hosts.append(host)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.metrics_port}") as scrape:
            text = (await scrape.get("/metrics")).text
            # Only the exposition: the app's verbs are not served there.
            refused = await scrape.post("/bind", json=binding_args(workers[0], hosts[0]))
    assert hosts[0] == hosts[1]  # a gang of two fits in one node's aligned block
    assert 'powerflow_extender_binds_total{result="bound"} 2.0' in text
    assert 'powerflow_extender_requests_total{outcome="ok",verb="filter"} 2.0' in text
    assert refused.status_code == 405
    for worker in workers:
        name = worker["metadata"]["name"]
        stored = (await cluster.get(f"/api/v1/namespaces/default/pods/{name}")).json()
        assert stored["spec"]["nodeName"] == hosts[0]
        block = json.loads(stored["metadata"]["annotations"][PLACEMENT_ANNOTATION])["block"]
        assert len(block) == 2 and {n for n, _ in block} == {hosts[0]}
    # The command's requests (its lists and watches, its bindings) carried the token.
    theirs = [
        r
        for r in kmock
        if (r.method == kmock.method.GET and str(r.url.path) in ("/api/v1/pods", "/api/v1/nodes"))
        or str(r.url.path).endswith("/binding")
    ]
    assert len([r for r in theirs if str(r.url.path).endswith("/binding")]) == 2
    assert {header(r, "Authorization") for r in theirs} == {f"Bearer {TOKEN}"}
