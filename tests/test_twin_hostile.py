"""Hostile tenants and broken nodes on the twin: one bad sample, pod or ConfigMap stops
nothing (docs/security.md).

Each test is one way for a single sender, pod or ConfigMap to stop everyone, played end
to end against the real component processes on one twin (2 nodes x 8 GPUs, booted once
for the module):

1. a node agent's token posts samples that match a running job's plan but claim an
   impossible power, 50 times over: every one is refused, and no job loses a GPU;
2. a tenant's pod with the job label, bound by hand, no GPU request and a placement
   annotation naming every GPU: a 16-GPU job is still placed and runs;
3. a pod with a 10 KB ``[[[[`` annotation on a node whose agent (re)starts: the agent
   lists its pods and locks the clocks of the workers that come;
4. a budget schedule of 10,000 one-second windows (630 KB): refused with a clear Event,
   the operator's liveness answered within the chart's probe timeout all along, jobs
   still scheduled;
5. 16 concurrent 3.9 MB bodies to the extender: its memory stays bounded, /healthz
   answers, the bodies past its budget are told to retry, and it binds the next gang.

(A pod without ``status.startTime``, which must not arm free GPUs for ever, is tested in
``tests/test_nodeagent_loop.py``: the twin's kubelet always sets it.)
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from extender_bodies import node as extender_node
from support.twin_checks import eventually

from powerflow.core import contract
from powerflow.core.budget_schedule import clock_text
from powerflow.core.telemetry import SampleBatch, WindowSample, encode_batch
from powerflow.lab.twin.harness import DLJOBS, MERGE, Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import NAMESPACE

SEED = 27
SCALE = TimeScale(0.02)
CHART = Path(__file__).parent.parent / "helm" / "powerflow" / "templates" / "operator.yaml"
PODS = "/api/v1/pods"
BUDGET = f"/api/v1/namespaces/powerflow-system/configmaps/{contract.BUDGET_CONFIGMAP}"
NESTED = "[" * 10_000 + "]" * 10_000

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    folder = tmp_path_factory.mktemp("twin-hostile")
    with Twin(folder, nodes=2, gpus_per_node=8, scale=SCALE, seed=SEED) as twin:
        yield twin


@pytest.fixture(autouse=True)
def tidy(twin: Twin) -> Iterator[None]:
    """Each test from the same cluster, whatever the one before left: no DLJob, no
    tenant pod, the twin's own budget."""
    yield
    api = client(twin)
    for job in api.get(DLJOBS).json()["items"]:
        api.delete(f"{DLJOBS}/{job['metadata']['name']}")
    for pod in api.get("/api/v1/namespaces/tenant/pods").json()["items"]:
        api.delete(f"/api/v1/namespaces/tenant/pods/{pod['metadata']['name']}")
    budget = {"data": {"schedule": None, **twin.budget_configmap()["data"]}}
    api.patch(BUDGET, json=budget, headers=MERGE).raise_for_status()
    listed = {"labelSelector": contract.JOB_LABEL}
    assert eventually(lambda: not api.get(PODS, params=listed).json()["items"], 120)


def client(twin: Twin) -> httpx.Client:
    assert twin.client is not None
    return twin.client


def submit(twin: Twin, name: str, gpus: int) -> None:
    """A DLJob of ``gpus`` GPUs exactly, long enough to outlast the test."""
    body = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": "resnet50",
            "globalBatchSize": 256,
            "iterations": 10_000_000,
            "gpus": {"requested": gpus, "min": gpus, "max": gpus},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "twin-worker"}]}},
        },
    }
    client(twin).post(DLJOBS, json=body).raise_for_status()


def job_pods(twin: Twin, name: str) -> list[dict[str, Any]]:
    params = {"labelSelector": f"{contract.JOB_LABEL}={name}"}
    items: list[dict[str, Any]] = client(twin).get(PODS, params=params).json()["items"]
    return [p for p in items if p["metadata"]["namespace"] == NAMESPACE]


def dljob(twin: Twin, name: str) -> dict[str, Any]:
    body: dict[str, Any] = client(twin).get(f"{DLJOBS}/{name}").json()
    return body


def training(twin: Twin, name: str, gpus: int) -> bool:
    """All ``gpus`` workers of the job's current generation bound and running."""
    status = dljob(twin, name).get("status") or {}
    alloc = status.get("allocation") or {}
    generation = str(alloc.get("generation"))
    pods = [
        p
        for p in job_pods(twin, name)
        if (p["metadata"].get("annotations") or {}).get(contract.GENERATION_ANNOTATION)
        == generation
        and (p.get("status") or {}).get("phase") == "Running"
    ]
    return alloc.get("gpus") == gpus and len(pods) == gpus


def chart_probe_timeout_s() -> float:
    """The operator's liveness ``timeoutSeconds`` in the chart (Kubernetes' default 1)."""
    text = CHART.read_text()
    probe = text[text.index("livenessProbe:") : text.index("readinessProbe:")]
    found = re.search(r"timeoutSeconds:\s*(\d+)", probe)
    return float(found[1]) if found else 1.0


# -- 1. one node agent's token ----------------------------------------------------------------


def test_impossible_samples_from_a_nodes_token_are_refused_and_move_no_job(twin: Twin) -> None:
    """30 samples matching the job's plan but claiming 10^11 J per 1 ms step, 50 times
    over: believed, they would make the planning limit the budget over 10^11 and preempt
    every job of the cluster."""
    submit(twin, "victim", 8)
    submit(twin, "bystander", 8)
    assert eventually(lambda: training(twin, "victim", 8) and training(twin, "bystander", 8), 180)
    pods = job_pods(twin, "victim")
    ann = pods[0]["metadata"]["annotations"]
    node = pods[0]["spec"]["nodeName"]
    here = sum(1 for p in pods if p["spec"]["nodeName"] == node)
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0].get("env", [])}
    start = time.time()
    poison = tuple(
        WindowSample(
            namespace=NAMESPACE,
            job="victim",
            generation=int(ann[contract.GENERATION_ANNOTATION]),
            n=int(ann[contract.WORKERS_ANNOTATION]),
            gpus_per_node=here,
            local_batch_size=float(env["LOCAL_BATCH_SIZE"]),
            frequency_mhz=int(ann[contract.FREQUENCY_ANNOTATION]),
            gpus_measured=here,
            iterations=1,
            step_time_s=0.001,
            energy_j=1e11,
            end_s=start + 0.001 * (i + 1),
        )
        for i in range(30)
    )
    body = encode_batch(SampleBatch(node, poison))
    headers = {"Authorization": f"Bearer {twin.token(node)}"}
    answers = [httpx.post(twin.ingest_url, json=body, headers=headers) for _ in range(50)]
    assert {a.status_code for a in answers} == {422}, answers[0].text
    assert all(a.json()["reasons"] == {"impossible_power": 30} for a in answers)
    # Several scheduling intervals later both jobs still hold all their GPUs.
    watched = time.monotonic() + max(15.0, 10 * SCALE(60.0))
    while time.monotonic() < watched:
        for name in ("victim", "bystander"):
            alloc = (dljob(twin, name).get("status") or {}).get("allocation") or {}
            assert alloc.get("gpus") == 8, (name, alloc)
        time.sleep(0.5)


# -- 2. a tenant's pod ------------------------------------------------------------------------


def test_a_squatter_pod_with_the_job_label_blocks_no_placement(twin: Twin) -> None:
    """Adopted by the extender as a settled gang, such a pod would hold every GPU for as
    long as it exists."""
    block = [[n, i] for n in twin.node_names for i in range(twin.gpus_per_node)]
    squatter = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "squatter",
            "namespace": "tenant",
            "labels": {contract.JOB_LABEL: "anything"},
            "annotations": {
                contract.PLACEMENT_ANNOTATION: json.dumps({"node": "node-0", "block": block}),
                contract.WORKERS_ANNOTATION: "1",
                contract.GENERATION_ANNOTATION: "1",
            },
        },
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "busybox"}]},
    }
    client(twin).post("/api/v1/namespaces/tenant/pods", json=squatter).raise_for_status()
    submit(twin, "gang16", 16)
    assert eventually(lambda: training(twin, "gang16", 16), 120), twin.scheduler and (
        twin.scheduler.stats
    )


# -- 3. a nested annotation -------------------------------------------------------------------


def test_a_nested_annotation_on_the_node_stops_no_clock(twin: Twin) -> None:
    """A pod on the node with a 10 KB ``[[[[`` annotation when its agent (re)starts: the
    agent's pod listing must go on past it, or no worker's GPU there is ever locked
    while its /healthz says 200."""
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nested",
            "namespace": "tenant",
            "labels": {contract.JOB_LABEL: "nested"},
            "annotations": {
                contract.PLACEMENT_ANNOTATION: NESTED,
                contract.PROFILE_ANNOTATION: NESTED,
                contract.WORKERS_ANNOTATION: NESTED,
            },
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
    }
    client(twin).post("/api/v1/namespaces/tenant/pods", json=bad).raise_for_status()
    agent = twin.agents["node-1"]
    agent.stop()
    agent.start()
    assert twin.gpu_server is not None
    mark = len(twin.gpu_server.journal)
    submit(twin, "after", 16)
    assert eventually(lambda: training(twin, "after", 16), 120)

    def locked_on_node_1() -> bool:
        assert twin.gpu_server is not None
        new = twin.gpu_server.journal[mark:]
        return any(s.node == "node-1" and s.call == "lock_clocks_mhz" for s in new)

    assert eventually(locked_on_node_1, 60), "no clock was locked on node-1 after its restart"


# -- 4. a large budget schedule ---------------------------------------------------------------


def test_a_10000_window_schedule_is_refused_and_the_operator_stays_responsive(
    twin: Twin,
) -> None:
    """10,000 one-second windows (630 KB): refused by size, and the liveness probe never
    waits as long as the chart's probe timeout (a timed-out probe restarts the operator,
    and loses its Lease)."""
    windows = [
        {"start": clock_text(i), "end": clock_text(i + 1), "powerLimitWatts": 1000}
        for i in range(10_000)
    ]
    schedule = json.dumps(windows)
    assert len(schedule) > 600_000
    assert twin.operator is not None
    liveness = twin.operator.ready
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            began = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(liveness, timeout=30.0)
            latencies.append(time.monotonic() - began)
            stop.wait(0.25)

    with ThreadPoolExecutor(1) as pool:
        watching = pool.submit(probe)
        try:
            patch = {"data": {"schedule": schedule}}
            client(twin).patch(BUDGET, json=patch, headers=MERGE).raise_for_status()
            submit(twin, "meanwhile", 8)
            assert eventually(lambda: training(twin, "meanwhile", 8), 120)

            def refused() -> list[dict[str, Any]]:
                events = client(twin).get("/api/v1/namespaces/powerflow-system/events")
                return [
                    e
                    for e in events.json()["items"]
                    if e.get("reason") == "InvalidBudget"
                    and e["involvedObject"].get("name") == contract.BUDGET_CONFIGMAP
                ]

            assert eventually(lambda: bool(refused()), 60)
            message = refused()[0]["message"]
            assert "at most" in message and "keeping" in message, message
            time.sleep(5.0)  # more passes with the refused schedule in place
        finally:
            stop.set()
            watching.result()
    worst = max(latencies)
    print(f"liveness: {len(latencies)} probes, worst {worst:.3f} s")
    assert len(latencies) >= 10
    assert worst < chart_probe_timeout_s(), latencies


# -- 5. concurrent bodies ---------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_concurrent_huge_bodies_leave_the_extender_bounded_and_serving(twin: Twin) -> None:
    """Floods of 16 concurrent 3.9 MB bodies: decoded all at once they would approach the
    extender's 1 GiB limit and hold /healthz for seconds."""
    assert twin.extender is not None and twin.extender.proc is not None
    pid = twin.extender.proc.pid
    # What kube-scheduler sends without nodeCacheCapable: whole Node objects.
    nodes = [extender_node(f"gpu-{i:05d}") for i in range(3_900_000 // 1830)]
    pod = {"metadata": {"name": "x", "namespace": "tenant", "uid": "u"}, "spec": {}}
    wire = {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    body = json.dumps(wire, separators=(",", ":")).encode()
    assert 3_800_000 < len(body) < 4 << 20
    peak = [rss_bytes(pid)]
    health: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak.append(rss_bytes(pid))
            began = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{twin.extender_url}/healthz", timeout=30.0)
            health.append(time.monotonic() - began)
            stop.wait(0.1)

    together = threading.Barrier(16)

    def post(_: int) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        together.wait(30)  # the 16 bodies at once
        return httpx.post(f"{twin.extender_url}/filter", content=body, headers=headers, timeout=60)

    with ThreadPoolExecutor(1) as watcher, ThreadPoolExecutor(16) as senders:
        watching = watcher.submit(watch)
        try:
            answers = [a for _ in range(3) for a in senders.map(post, range(16))]
        finally:
            stop.set()
            watching.result()
    statuses = Counter(a.status_code for a in answers)
    grown = max(peak) - peak[0]
    print(
        f"extender: {dict(statuses)}; RSS {peak[0] / 2**20:.0f} MiB before, peak "
        f"+{grown / 2**20:.0f} MiB; worst /healthz {max(health):.2f} s"
    )
    assert set(statuses) <= {200, 503} and statuses[200] >= 12, statuses
    assert statuses[503] > 0, "no body was ever told to wait: nothing bounds them"
    assert all(a.headers.get("Retry-After") for a in answers if a.status_code == 503)
    assert grown < 400 * 2**20, grown
    # The chart's liveness probe gives /healthz 3 s (its urlopen timeout) before the
    # kubelet counts a failure: within that, on a machine busy with other tests too.
    assert max(health) < 3.0, health
    submit(twin, "next", 8)
    assert eventually(lambda: training(twin, "next", 8), 120)
