"""The operator's sample ingest, as node agents reach it: real HTTP to ``powerflow operator``.

The operator runs through ``serve`` with a kubeconfig to the emulator and
``--ingest-port``; the emulator reviews the agents' tokens (``TokenReview``,
``register_token``). One DLJob ``resnet`` runs 4 worker pods of generation 1,
two bound to ``n1`` and two to ``n2`` (``cluster``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from kmock import method as verb
from operator_cases import (
    JOBS,
    NS,
    PODS,
    ThresholdPolicy,
    dljob,
    eventually,
    models,
    pods_of,
    poked_pass,
)
from powerflow.nodeagent.sender import Backoff, Batching, IngestConnection, SampleSender
from powerflow.operator import ingest
from prometheus_client import CollectorRegistry
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, free_port, operator_args

from powerflow.core import contract
from powerflow.core.telemetry import (
    MAX_BODY_BYTES,
    JobProgress,
    NodePower,
    SampleBatch,
    TelemetryError,
    WindowSample,
    encode_batch,
    parse_batch,
)
from powerflow.core.timefmt import format_time

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

AGENT = "system:serviceaccount:powerflow-system:powerflow-nodeagent"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
POD_EXTRA = "authentication.kubernetes.io/pod-name"
UID_EXTRA = "authentication.kubernetes.io/pod-uid"
AGENT_PODS = "/api/v1/namespaces/powerflow-system/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


class Recording:
    """A ``SampleSink`` that keeps what it is given."""

    def __init__(self) -> None:
        self.added: list[tuple[str, tuple[WindowSample, ...]]] = []

    def add(self, node: str, samples: Sequence[WindowSample], now_s: float) -> None:
        self.added.append((node, tuple(samples)))

    @property
    def samples(self) -> list[WindowSample]:
        return [s for _, batch in self.added for s in batch]


@dataclass
class Cluster:
    api: httpx.AsyncClient
    emulator: KubeEmulator
    operator: Operator
    sink: Recording
    url: str
    started_s: float
    """Before the operator started: every view it reads is newer."""

    def metric(self, name: str, **labels: str) -> float:
        assert self.operator.controller is not None
        value = self.operator.controller.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def may_defer(self, sent: bytes) -> bool:
        """Whether a 503 ``view_behind`` is honest for ``sent``: a well-formed batch (the
        wire format's) with a sample that ended after the operator started, so maybe after
        its view was read, and not over ``MAX_AHEAD_S`` past now."""
        try:
            parsed = parse_batch(json.loads(sent))
        except (ValueError, TelemetryError):
            return False
        latest = time.time() + ingest.MAX_AHEAD_S
        return any(self.started_s < s.end_s <= latest for s in parsed.samples)

    def refused(self, reason: str) -> float:
        return self.metric("powerflow_ingest_refused_total", reason=reason)

    async def post(self, body: Any, token: str | None = "agent-n1", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with httpx.AsyncClient() as client:
            return await client.post(self.url, content=content, headers=headers, **kw)


_LAST_END = [0.0]


def sample(**changes: Any) -> WindowSample:
    """A window of ``resnet`` on n1 as its agent measures it; without ``end_s``, the
    window after the last one this module made (windows of one job follow each other:
    the ingest refuses a replay or an overlap)."""
    base = WindowSample(
        namespace=NS,
        job="resnet",
        generation=1,
        n=4,
        gpus_per_node=2,
        local_batch_size=16.0,
        frequency_mhz=1410,
        gpus_measured=2,
        iterations=10,
        step_time_s=0.5,
        energy_j=300.0,
        end_s=0.0,
    )
    out = replace(base, **changes)
    if "end_s" not in changes:
        _LAST_END[0] = max(time.time(), _LAST_END[0] + out.iterations * out.step_time_s)
        out = replace(out, end_s=_LAST_END[0])
    _LAST_END[0] = max(_LAST_END[0], out.end_s)
    return out


def batch(node: str, *samples: WindowSample, watts: float | None = None) -> dict[str, Any]:
    power = None if watts is None else NodePower(watts, time.time())
    return encode_batch(SampleBatch(node, tuple(samples), power))


async def bind(api: httpx.AsyncClient, pod: str, node: str) -> None:
    binding = {"metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
    assert (await api.post(f"{PODS}/{pod}/binding", json=binding)).status_code == 201


def register_agents(emulator: KubeEmulator) -> None:
    aud = (contract.INGEST_AUDIENCE,)
    for node in ("n1", "n2"):
        emulator.register_token(f"agent-{node}", AGENT, extra={NODE_EXTRA: [node]}, audiences=aud)
    emulator.register_token(
        "intruder", "system:serviceaccount:ml:default", extra={NODE_EXTRA: ["n1"]}, audiences=aud
    )
    emulator.register_token("api-audience", AGENT, extra={NODE_EXTRA: ["n1"]})
    emulator.register_token("no-node", AGENT, audiences=aud)


@pytest.fixture
async def cluster(
    api: httpx.AsyncClient, kmock: KubeEmulator, kubeconfig: Path
) -> AsyncIterator[Cluster]:
    async with running_cluster(api, kmock, kubeconfig) as made:
        yield made


@asynccontextmanager
async def running_cluster(
    api: httpx.AsyncClient, kmock: KubeEmulator, kubeconfig: Path, *options: str
) -> AsyncIterator[Cluster]:
    """An operator with its ingest on, DLJob ``resnet``'s four workers bound two to n1
    and two to n2, and a sample from n1 taken (its view has the bindings)."""
    register_agents(kmock)
    port = free_port()
    args = operator_args(
        kubeconfig,
        "--profiling-window",
        "0",
        "--ingest-port",
        str(port),
        "--ingest-host",
        "127.0.0.1",
        *options,
    )
    sink = Recording()
    started_s = time.time()
    _LAST_END[0] = 0.0  # a new operator: it has taken no window yet
    async with Operator(args, ThresholdPolicy(), models, sink=sink) as op:
        await api.post(
            f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/dljobs",
            json=dljob("resnet"),
        )

        async def four_pods() -> list[dict[str, Any]]:
            pods = await pods_of(api, "resnet")
            return pods if len(pods) == 4 else []

        pods = await eventually(four_pods, timeout=10)
        for pod, node in zip(pods, ("n1", "n1", "n2", "n2"), strict=True):
            await bind(api, pod["metadata"]["name"], node)
        url = f"http://127.0.0.1:{port}{contract.SAMPLES_PATH}"
        cluster = Cluster(api, kmock, op, sink, url, started_s)

        async def sees_pods() -> bool:  # the operator's next pass reads the bindings
            return (await cluster.post(batch("n1", sample(end_s=time.time())))).status_code == 200

        await eventually(sees_pods, timeout=10)
        sink.added.clear()
        yield cluster


async def test_accepted_samples_reach_the_sink(cluster: Cluster) -> None:
    before = cluster.metric("powerflow_ingest_samples_total")
    s1, s2 = sample(iterations=5), sample(iterations=6, frequency_mhz=1005, energy_j=150.0)
    resp = await cluster.post(batch("n1", s1, s2))
    assert resp.status_code == 200
    assert resp.json() == {"accepted": 2, "refused": 0, "reasons": {}}
    assert cluster.sink.added == [("n1", (s1, s2))]
    assert cluster.metric("powerflow_ingest_samples_total") == before + 2
    other = sample(iterations=7)
    assert (await cluster.post(batch("n2", other), token="agent-n2")).status_code == 200
    assert cluster.sink.added[-1] == ("n2", (other,))


async def test_refusal_series_exist_at_zero_before_any_refusal(cluster: Cluster) -> None:
    """The dashboard rates them by reason (and sender): a series never exported is no
    data, not 0, so each exists from the start (per sender: from its first batch)."""
    from powerflow.operator.sample_checks import REASONS

    assert cluster.operator.controller is not None
    registry = cluster.operator.controller.metrics.registry
    sender = "powerflow_ingest_samples_refused_total"
    for why in REASONS:
        assert registry.get_sample_value("powerflow_ingest_refused_total", {"reason": why}) == 0
        assert registry.get_sample_value(sender, {"sender_node": "n2", "reason": why}) is None
    ok = await cluster.post(batch("n2", sample(iterations=5)), token="agent-n2")
    assert ok.status_code == 200
    for why in REASONS:
        assert registry.get_sample_value(sender, {"sender_node": "n2", "reason": why}) == 0


@pytest.mark.parametrize(
    ("token", "header", "status", "reason"),
    [
        (None, None, 401, "unauthenticated"),
        (None, "Basic YWxpY2U6cHc=", 401, "unauthenticated"),
        ("unknown", None, 401, "unauthenticated"),
        ("api-audience", None, 401, "unauthenticated"),  # a token for the API server
        ("intruder", None, 403, "wrong_account"),
        ("no-node", None, 403, "no_node"),
        ("agent-n2", None, 403, "node_mismatch"),  # n2's agent posting for n1
    ],
)
async def test_senders_that_are_not_the_nodes_agent_are_refused(
    cluster: Cluster, token: str | None, header: str | None, status: int, reason: str
) -> None:
    before = cluster.refused(reason)
    headers = {"Authorization": header} if header else {}
    async with httpx.AsyncClient() as client:
        if header or not token:
            resp = await client.post(cluster.url, json=batch("n1", sample()), headers=headers)
        else:
            resp = await cluster.post(batch("n1", sample()), token=token)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"] == reason and resp.json()["message"]
    assert cluster.sink.added == []
    assert cluster.refused(reason) == before + 1


async def test_samples_of_jobs_not_on_the_senders_node_are_refused_one_by_one(
    cluster: Cluster,
) -> None:
    """A batch is judged sample by sample: the good one is kept, the rest counted. The
    bad ones ended before the operator started, so its view is newer than they are."""
    good = sample()
    old = time.time() - 3600
    bad = [
        sample(job="ghost", end_s=old),  # no such DLJob
        sample(namespace="other", end_s=old),
        sample(generation=2, end_s=old),  # no pod of generation 2
        sample(gpus_measured=3, n=4, end_s=old),  # 2 worker pods (one GPU each) on n1
    ]
    before = {r: cluster.refused(r) for r in ("unknown_job", "not_on_node", "too_many_gpus")}
    resp = await cluster.post(batch("n1", bad[0], good, *bad[1:]))
    assert resp.status_code == 200
    assert resp.json() == {
        "accepted": 1,
        "refused": 4,
        "reasons": {"unknown_job": 2, "not_on_node": 1, "too_many_gpus": 1},
    }
    assert cluster.sink.added == [("n1", (good,))]
    assert cluster.refused("unknown_job") == before["unknown_job"] + 2
    assert cluster.refused("not_on_node") == before["not_on_node"] + 1
    assert cluster.refused("too_many_gpus") == before["too_many_gpus"] + 1
    only_bad = await cluster.post(batch("n1", *bad))
    assert only_bad.status_code == 422  # nothing accepted: resending will not help
    assert only_bad.json()["accepted"] == 0
    assert len(cluster.sink.added) == 1


def progress_batch(node: str, *progress: JobProgress) -> dict[str, Any]:
    return encode_batch(SampleBatch(node, (), None, progress))


async def test_progress_is_taken_only_from_the_nodes_of_the_jobs_workers(
    cluster: Cluster,
) -> None:
    """A job's progress counts from an agent whose node holds a worker of that
    generation; a job it does not hold, another generation or namespace is refused and
    changes nothing. Within a generation the count only grows."""
    assert cluster.operator.controller is not None
    kept = cluster.operator.controller.progress
    stray = [
        JobProgress(NS, "ghost", 1, 5),  # no such DLJob
        JobProgress(NS, "resnet", 2, 5),  # no worker of generation 2
        JobProgress("other", "resnet", 1, 5),
    ]
    resp = await cluster.post(
        progress_batch("n2", JobProgress(NS, "resnet", 1, 900), *stray), token="agent-n2"
    )
    assert resp.status_code == 200
    assert resp.json() == {"accepted": 0, "refused": 0, "reasons": {}, "progressRefused": 3}
    assert kept.snapshot() == {f"{NS}/resnet": (1, 900, None)}
    back = await cluster.post(progress_batch("n1", JobProgress(NS, "resnet", 1, 800)))
    assert back.status_code == 200 and back.json()["progressRefused"] == 0
    assert kept.snapshot() == {f"{NS}/resnet": (1, 900, None)}  # a late post does not go back


async def test_an_operator_serving_one_namespace_posts_node_events_in_its_own(
    api: httpx.AsyncClient, kmock: KubeEmulator, kubeconfig: Path
) -> None:
    """With ``--namespace``, a Warning about a Node (cluster-scoped) goes to the budget's
    namespace, where the chart's Role lets it post Events, not to ``default``."""
    async with running_cluster(api, kmock, kubeconfig, "--namespace", NS) as made:
        told = await made.post(batch("n1", sample(frequency_mhz=9999)))
        assert told.json()["reasons"] == {"impossible_clock": 1}
        await poked_pass(made.api, made.operator, "resnet")

        async def events(namespace: str) -> list[dict[str, Any]]:
            path = f"/api/v1/namespaces/{namespace}/events"
            items = (await made.api.get(path)).json()["items"]
            return [e for e in items if e["reason"] == "SamplesRefused"]

        async def in_release() -> list[dict[str, Any]]:
            return await events("powerflow-system")

        await eventually(in_release, timeout=10)
        assert await events("default") == []


async def test_progress_that_reaches_the_total_finishes_the_job_at_once(
    cluster: Cluster,
) -> None:
    """The job's 1,000 iterations reported through the agent: the job succeeds and its
    workers go, without waiting for the next periodic pass (60 s) and without any pod
    having written anything to the API server."""
    resp = await cluster.post(progress_batch("n1", JobProgress(NS, "resnet", 1, 1000)))
    assert resp.status_code == 200 and resp.json()["progressRefused"] == 0

    async def succeeded() -> dict[str, Any]:
        status = (await cluster.api.get(f"{JOBS}/resnet")).json().get("status", {})
        return status if status.get("phase") == "Succeeded" else {}

    status = await eventually(succeeded, timeout=10)
    assert status["progress"]["iterations"] == 1000
    pods = (await cluster.api.get(PODS)).json()["items"]
    assert all(contract.PROGRESS_ANNOTATION not in (p["metadata"].get("annotations") or {})
               for p in pods)  # fmt: skip


async def test_samples_that_do_not_match_the_allocation_or_physics_are_refused(
    cluster: Cluster,
) -> None:
    """A node agent's token can send anything that parses: a sample must also match the
    generation's allocation (n, GPUs per node, local batch), have a clock the node's GPU
    (an A100, by its product label) has and a power it can draw, and follow the last
    window taken from its sender; each refusal is counted by reason and by sender."""
    before = {
        r: cluster.metric("powerflow_ingest_samples_refused_total", sender_node="n1", reason=r)
        for r in ("wrong_allocation", "impossible_clock", "impossible_power", "duplicate")
    }
    bad = {
        "wrong_allocation": [
            sample(n=8),  # the generation has 4 workers
            sample(gpus_per_node=1),  # 2 of them on n1
            sample(gpus_per_node=3),  # all 4 bound, 2 per node: the placement is known
            sample(local_batch_size=32.0),  # they were given 16
        ],
        "impossible_clock": [sample(frequency_mhz=1980), sample(frequency_mhz=100)],
        "impossible_power": [
            sample(step_time_s=0.001, energy_j=1e11),  # 5e13 W per GPU
            sample(energy_j=10.0),  # 10 W per GPU: below an idle A100
            sample(energy_j=2 * 0.5 * 1.21 * 400),  # 21 % over the 400 W board limit
        ],
    }
    for reason, cases in bad.items():
        resp = await cluster.post(batch("n1", *cases))
        assert resp.status_code == 422, resp.text
        assert resp.json()["reasons"] == {reason: len(cases)}, (reason, resp.json())
    ghost = await cluster.post(batch("n1", sample(job="ghost")))  # honest: not told
    assert ghost.json()["reasons"] == {"unknown_job": 1}
    good = sample(energy_j=2 * 0.5 * 1.19 * 400)  # within the slack: believed
    accepted = await cluster.post(batch("n1", good, good))  # a batch of copies: one taken
    assert accepted.status_code == 200
    assert accepted.json() == {"accepted": 1, "refused": 1, "reasons": {"duplicate": 1}}
    replayed = [await cluster.post(batch("n1", good)) for _ in range(3)]
    assert all(r.status_code == 422 for r in replayed)
    assert replayed[0].json()["reasons"] == {"duplicate": 1}
    overlap = replace(sample(), end_s=good.end_s + 1.0)  # a 5 s window that ended 1 s later
    assert (await cluster.post(batch("n1", overlap))).json()["reasons"] == {"overlap": 1}
    assert cluster.sink.samples == [good]

    async def node_events() -> list[dict[str, Any]]:
        items = (await cluster.api.get("/api/v1/namespaces/default/events")).json()["items"]
        return [
            e
            for e in items
            if e["reason"] == "SamplesRefused" and e["involvedObject"]["name"] == "n1"
        ]

    await poked_pass(cluster.api, cluster.operator, "resnet")  # Events go with a pass
    told = await eventually(node_events, timeout=10)
    assert {e["message"].split(": ")[1].split(" ")[0] for e in told} >= set(bad)
    counts = {"wrong_allocation": 4, "impossible_clock": 2, "impossible_power": 3}
    assert "unknown_job" not in {e["message"].split(": ")[1].split(" ")[0] for e in told}
    for reason, count in {**counts, "duplicate": 4}.items():
        after = cluster.metric(
            "powerflow_ingest_samples_refused_total", sender_node="n1", reason=reason
        )
        assert after == before[reason] + count, reason


async def relabel(cluster: Cluster, node: str, product: str) -> None:
    patch = {"metadata": {"labels": {contract.GPU_PRODUCT_LABEL: product}}}
    relabelled = await cluster.api.patch(f"/api/v1/nodes/{node}", json=patch, headers=MERGE)
    assert relabelled.status_code == 200
    await poked_pass(cluster.api, cluster.operator, "resnet")


async def test_a_node_is_judged_by_the_physics_of_its_own_gpu_type(cluster: Cluster) -> None:
    """An H100's 1,980 MHz and 600 W per GPU are real on an H100 node (the A100's
    1,410 MHz and 400 W are not its bounds), and 2,100 MHz is not; a node of a type
    nothing knows is judged by allocation and time alone."""
    await relabel(cluster, "n1", "NVIDIA-H100-80GB-HBM3")
    fast = sample(frequency_mhz=1980, energy_j=2 * 0.5 * 600)
    answer = await cluster.post(batch("n1", fast))
    assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    too_fast = await cluster.post(batch("n1", sample(frequency_mhz=2100)))
    assert too_fast.json()["reasons"] == {"impossible_clock": 1}
    await relabel(cluster, "n1", "NVIDIA-Z900")
    answer = await cluster.post(batch("n1", sample(frequency_mhz=2100)))
    assert answer.json()["accepted"] == 1, answer.text


def h100_report(node: str = "n1", **changes: Any) -> dict[str, Any]:
    """What an H100 node's agent reports (``nvidia-smi -q``: 345-1980 MHz, 200-700 W)."""
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "clocksMhz": list(range(345, 1981, 15)),
           "defaultLimitW": 700.0, "minLimitW": 200.0, "maxLimitW": 700.0}  # fmt: skip
    return {"node": node, "gpus": [{**gpu, **changes}]}


async def post_report(cluster: Cluster, body: Any, token: str = "agent-n1") -> httpx.Response:
    url = cluster.url.replace(contract.SAMPLES_PATH, contract.GPUS_PATH)
    async with httpx.AsyncClient() as client:
        content = json.dumps(body).encode()
        return await client.post(url, content=content, headers={"Authorization": f"Bearer {token}"})


def frequencies(pods: list[dict[str, Any]]) -> set[str | None]:
    return {(p["metadata"].get("annotations") or {}).get(contract.FREQUENCY_ANNOTATION)
            for p in pods}  # fmt: skip


async def test_an_unknown_gpu_type_gets_no_clock_and_is_told_once_per_node(
    cluster: Cluster,
) -> None:
    """Both nodes relabelled to a product nothing knows: the workers keep running but
    lose their clock annotation (their agents reset the GPUs to their defaults); one
    ``UnknownGpu`` Warning per Node however many passes, and the gauge counts them."""
    assert frequencies(await pods_of(cluster.api, "resnet")) == {"1410"}
    await relabel(cluster, "n1", "NVIDIA-Z900")
    await relabel(cluster, "n2", "NVIDIA-Z900")
    await poked_pass(cluster.api, cluster.operator, "resnet")

    async def unclocked() -> bool:
        pods = await pods_of(cluster.api, "resnet")
        return len(pods) == 4 and frequencies(pods) == {None}

    await eventually(unclocked, timeout=10)
    assert cluster.metric("powerflow_nodes_unknown_gpu") == 2
    events = (await cluster.api.get("/api/v1/namespaces/default/events")).json()["items"]
    told = sorted(e["involvedObject"]["name"] for e in events if e["reason"] == "UnknownGpu")
    assert told == ["n1", "n2"]
    assert all(e["type"] == "Warning" for e in events if e["reason"] == "UnknownGpu")


async def test_discovered_facts_beat_the_label_and_a_lying_report_changes_nothing(
    cluster: Cluster,
) -> None:
    """Both nodes are labelled with a product nothing knows. n1's agent reports H100s:
    that is not enough for n2, whose GPUs stay unclocked; once n2's agent reports H100s
    too, the pool is planned as H100s and its workers get their clock again. A report
    out of physics' bounds, for another node, or too soon is refused, counted, and kept
    from the plan."""
    await relabel(cluster, "n1", "NVIDIA-Z900")
    await relabel(cluster, "n2", "NVIDIA-Z900")
    assert cluster.metric("powerflow_nodes_unknown_gpu") == 2
    controller = cluster.operator.controller
    assert controller is not None
    refused = "powerflow_ingest_gpu_reports_refused_total"
    lies = [
        (h100_report(clocksMhz=[345, 9000]), 400, "invalid"),
        (h100_report(defaultLimitW=1e6, maxLimitW=1e6), 400, "invalid"),
        (h100_report(clocksMhz=[1980, 345]), 400, "invalid"),
        (h100_report("n2"), 403, "node_mismatch"),
    ]
    for body, status, reason in lies:
        before = cluster.metric(refused, reason=reason)
        answer = await post_report(cluster, body)
        assert (answer.status_code, answer.json()["error"]) == (status, reason), answer.text
        assert cluster.metric(refused, reason=reason) == before + 1
    assert controller.discovered.specs() == {}
    answer = await post_report(cluster, h100_report())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"gpu": "H100-SXM", "clocks": 110, "boardW": 700.0}
    assert cluster.metric("powerflow_ingest_gpu_reports_total") == 1
    again = await post_report(cluster, h100_report(clocksMhz=[345, 360]))
    assert (again.status_code, again.json()["error"]) == (429, "too_often")
    assert controller.discovered.specs()["n1"].clocks_mhz[-1] == 1980
    await poked_pass(cluster.api, cluster.operator, "resnet")
    # One agent does not speak for a node that said nothing: n2's GPUs stay unclocked.
    pods = await pods_of(cluster.api, "resnet")
    assert frequencies(pods) == {None}
    assert cluster.metric("powerflow_nodes_unknown_gpu") == 1  # n2 reported nothing
    answer = await post_report(cluster, h100_report("n2"), token="agent-n2")
    assert answer.status_code == 200, answer.text
    await poked_pass(cluster.api, cluster.operator, "resnet")

    async def clocked() -> bool:
        return frequencies(await pods_of(cluster.api, "resnet")) == {"1410"}

    await eventually(clocked, timeout=10)
    assert cluster.metric("powerflow_nodes_unknown_gpu") == 0
    fast = await cluster.post(batch("n1", sample(frequency_mhz=2100)))
    assert fast.json()["reasons"] == {"impossible_clock": 1}  # judged by n1's facts


def writes_to(emulator: KubeEmulator, plural: str, since: int) -> list[Any]:
    """The PATCHes of ``plural`` the API server received after its ``since``-th request."""
    return [
        r
        for r in list(emulator)[since:]
        if r.method == verb.PATCH and r.resource is not None and r.resource.plural == plural
    ]


async def unknown_gpu_events(cluster: Cluster) -> int:
    events = (await cluster.api.get("/api/v1/namespaces/default/events")).json()["items"]
    return sum(1 for e in events if e["reason"] == "UnknownGpu")


@asynccontextmanager
async def restarted(cluster: Cluster, kubeconfig: Path) -> AsyncIterator[Cluster]:
    """``cluster``'s operator stopped and a new one started (ingest on another port),
    as a rolling update or a crash would; returns once its first pass is done."""
    await cluster.operator.stop()
    port = free_port()
    args = operator_args(
        kubeconfig, "--profiling-window", "0", "--ingest-port", str(port),
        "--ingest-host", "127.0.0.1",
    )  # fmt: skip
    async with Operator(args, ThresholdPolicy(), models, sink=cluster.sink) as op:
        url = f"http://127.0.0.1:{port}{contract.SAMPLES_PATH}"
        yield replace(cluster, operator=op, url=url)


async def reported_h100_pool(cluster: Cluster) -> None:
    """Both nodes relabelled to a product the catalogue lacks, both agents report H100s:
    the workers get their clock back, and each node carries its report's record."""
    await relabel(cluster, "n1", "NVIDIA-Z900")
    await relabel(cluster, "n2", "NVIDIA-Z900")
    for node in ("n1", "n2"):
        answer = await post_report(cluster, h100_report(node), token=f"agent-{node}")
        assert answer.status_code == 200, answer.text
    await poked_pass(cluster.api, cluster.operator, "resnet")

    async def recorded() -> bool:
        pods = await pods_of(cluster.api, "resnet")
        nodes = [(await cluster.api.get(f"/api/v1/nodes/{n}")).json() for n in ("n1", "n2")]
        records = [(n["metadata"].get("annotations") or {}) for n in nodes]
        return frequencies(pods) == {"1410"} and all(
            contract.GPU_REPORT_ANNOTATION in r for r in records
        )

    await eventually(recorded, timeout=10)


async def test_a_restarted_operator_plans_the_reported_type_at_once_without_churn(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """A pool whose label the catalogue lacks, planned as H100s from its agents' reports.
    The restarted operator reads the reports back from the nodes' records: its first
    pass plans H100s, so it writes no pod (no clock taken off and put back) and posts
    no ``UnknownGpu``; the agents' next reports are taken (not ``too_often``) and,
    being the same, cost no node write."""
    await reported_h100_pool(cluster)
    told = await unknown_gpu_events(cluster)  # the first operator's, before the reports
    since = len(list(cluster.emulator))
    async with restarted(cluster, kubeconfig) as again:
        assert again.metric("powerflow_nodes_unknown_gpu") == 0
        for _ in range(2):
            await poked_pass(again.api, again.operator, "resnet")
        for node in ("n1", "n2"):
            answer = await post_report(again, h100_report(node), token=f"agent-{node}")
            assert answer.status_code == 200, answer.text
        await poked_pass(again.api, again.operator, "resnet")
        assert frequencies(await pods_of(again.api, "resnet")) == {"1410"}
        assert writes_to(again.emulator, "pods", since) == []
        assert writes_to(again.emulator, "nodes", since) == []
        assert again.metric("powerflow_nodes_unknown_gpu") == 0
    assert await unknown_gpu_events(cluster) == told


def _out_of_bounds(record: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    record["report"]["gpus"][0]["clocksMhz"] = [345, 9000]
    return record


def _stale(record: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    record["reportedAt"] = format_time(time.time() - 2 * 3600)
    return record


def _another_nodes(record: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    return other


@pytest.mark.parametrize("edit", [_out_of_bounds, _stale, _another_nodes])
async def test_a_record_edited_on_the_node_is_taken_no_more_than_a_report(
    cluster: Cluster, kubeconfig: Path, edit: Callable[..., dict[str, Any]]
) -> None:
    """Anyone who may patch a node may edit its record: a restarted operator reads it as
    the ingest reads a report. n2's record made one the ingest would refuse (clocks out
    of bounds, older than the operator keeps a report, n1's report) is not taken, so
    n2 is unknown and so is the pool, as without records: its workers run at their
    defaults until n2's agent reports again, and its record is then rewritten."""
    await reported_h100_pool(cluster)
    records = {}
    for node in ("n1", "n2"):
        body = (await cluster.api.get(f"/api/v1/nodes/{node}")).json()
        records[node] = json.loads(body["metadata"]["annotations"][contract.GPU_REPORT_ANNOTATION])
    text = json.dumps(edit(records["n2"], records["n1"]))
    patch = {"metadata": {"annotations": {contract.GPU_REPORT_ANNOTATION: text}}}
    edited = await cluster.api.patch("/api/v1/nodes/n2", json=patch, headers=MERGE)
    assert edited.status_code == 200
    async with restarted(cluster, kubeconfig) as again:
        assert again.operator.controller is not None
        assert set(again.operator.controller.discovered.specs()) == {"n1"}
        assert again.metric("powerflow_nodes_unknown_gpu") == 1

        async def unclocked() -> bool:
            return frequencies(await pods_of(again.api, "resnet")) == {None}

        await eventually(unclocked, timeout=10)
        answer = await post_report(again, h100_report("n2"), token="agent-n2")
        assert answer.status_code == 200, answer.text
        await poked_pass(again.api, again.operator, "resnet")

        async def clocked() -> bool:
            return frequencies(await pods_of(again.api, "resnet")) == {"1410"}

        await eventually(clocked, timeout=10)
        n2 = (await again.api.get("/api/v1/nodes/n2")).json()
        record = n2["metadata"]["annotations"][contract.GPU_REPORT_ANNOTATION]
        assert json.loads(record)["report"] == h100_report("n2")


async def test_a_sample_newer_than_the_view_is_resent_until_a_pass_judges_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The 20-job twin's ``too_many_gpus``: a gang's pods bound after the operator's last
    pass; the agent's sample measuring them must not be dropped. Job ``bert`` has one
    worker bound to n1 (its other three pending) when n1's agent sends a sample of two
    GPUs; the operator's view cannot judge it yet (503, the agent keeps it), and once
    the second worker is bound the next pass's view takes it."""
    api = cluster.api
    await api.post(
        f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/dljobs", json=dljob("bert")
    )

    async def bert_pods() -> list[dict[str, Any]]:
        pods = await pods_of(api, "bert")
        return pods if len(pods) == 4 else []

    pods = await eventually(bert_pods, timeout=10)
    await bind(api, pods[0]["metadata"]["name"], "n1")

    async def sees_one() -> bool:
        one = sample(job="bert", gpus_measured=1, energy_j=150.0)
        return (await cluster.post(batch("n1", one))).status_code == 200

    await eventually(sees_one, timeout=10)
    cluster.sink.added.clear()
    # The agent's clock a little ahead: the sample ends after any view read so far.
    two = sample(job="bert", gpus_measured=2, end_s=max(time.time(), _LAST_END[0]) + 30)
    direct = await cluster.post(batch("n1", two))
    assert direct.status_code == 503, direct.text
    assert direct.json()["error"] == "view_behind" and direct.headers["Retry-After"]
    assert cluster.sink.added == []
    assert cluster.refused("view_behind") >= 1

    token = tmp_path / "token"
    token.write_text("agent-n1")
    registry = CollectorRegistry()
    sender = SampleSender(
        IngestConnection(cluster.url.removesuffix(contract.SAMPLES_PATH), str(token)),
        "n1",
        batching=Batching(interval_s=0.05),
        backoff=Backoff(initial_s=0.05, max_s=0.2),
        registry=registry,
        rng=random.Random(1),
    )
    sender.put(two)
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    try:

        async def resent() -> bool:
            return sender.failures >= 2  # answered 503 at least twice, still queued

        await eventually(resent, timeout=10)
        assert sender.queued() == (two,)
        await bind(api, pods[1]["metadata"]["name"], "n1")

        async def delivered() -> bool:
            return not sender.queued()

        await eventually(delivered, timeout=10)
    finally:
        stop.set()
        await task
    assert cluster.sink.samples == [two]
    assert registry.get_sample_value("powerflow_agent_samples_sent_total") == 1
    dropped = registry.get_sample_value(
        "powerflow_agent_samples_dropped_total", {"reason": "rejected"}
    )
    assert dropped == 0


async def test_a_sample_the_view_is_newer_than_or_from_far_ahead_is_judged_at_once(
    cluster: Cluster,
) -> None:
    """Only a view older than the sample defers it: a sample that ended before the view
    was read, or that claims to end over ``MAX_AHEAD_S`` past the operator's clock (it
    would hold its batch, and the agent's queue behind it, as long; and it is refused
    for that alone), gets its 422; so does one of a deleted job, whatever its time."""
    ahead = time.time() + ingest.MAX_AHEAD_S + 600
    cases = [
        sample(generation=2, end_s=time.time() - 3600),
        sample(gpus_measured=3, end_s=ahead),
        sample(job="ghost", end_s=time.time() + 30),
    ]
    for case in cases:
        resp = await cluster.post(batch("n1", case))
        assert resp.status_code == 422, (case, resp.text)
    assert cluster.sink.added == []
    fine_but_ahead = await cluster.post(batch("n1", sample(end_s=ahead)))
    assert fine_but_ahead.json()["reasons"] == {"clock_ahead": 1}


async def test_invalid_bodies_are_400_with_the_parsers_message(cluster: Cluster) -> None:
    before = cluster.refused("invalid")
    not_json = await cluster.post(b"{nope")
    assert not_json.status_code == 400 and not_json.json()["error"] == "invalid"
    body = batch("n1", sample())
    body["samples"][0]["energyJ"] = float("nan")
    nan = await cluster.post(json.dumps(body).encode())  # Python's json writes NaN: not JSON
    assert nan.status_code == 400 and nan.json()["error"] == "invalid"
    body["samples"][0]["energyJ"] = -1.0
    negative = await cluster.post(body)
    assert negative.status_code == 400
    assert negative.json()["message"].startswith("samples[0].energyJ")
    assert cluster.refused("invalid") == before + 3
    assert cluster.sink.added == []


async def test_older_kubernetes_tokens_find_the_node_through_their_pod(cluster: Cluster) -> None:
    """Before 1.30 a projected token names its pod, not its node: the pod says the node,
    and a token whose pod was replaced (another uid) is refused."""
    agent_pod = {
        "metadata": {"name": "nodeagent-x"},
        "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "powerflow"}]},
    }
    created = (await cluster.api.post(AGENT_PODS, json=agent_pod)).json()
    aud = (contract.INGEST_AUDIENCE,)
    uid = created["metadata"]["uid"]
    extra = {POD_EXTRA: ["nodeagent-x"], UID_EXTRA: [uid]}
    cluster.emulator.register_token("old-agent", AGENT, extra=extra, audiences=aud)
    stale = {POD_EXTRA: ["nodeagent-x"], UID_EXTRA: ["another-uid"]}
    cluster.emulator.register_token("stale-agent", AGENT, extra=stale, audiences=aud)
    gone = {POD_EXTRA: ["nodeagent-gone"]}
    cluster.emulator.register_token("gone-agent", AGENT, extra=gone, audiences=aud)

    assert (await cluster.post(batch("n1", sample()), token="old-agent")).status_code == 200
    assert (await cluster.post(batch("n2", sample()), token="old-agent")).status_code == 403
    for token in ("stale-agent", "gone-agent"):
        resp = await cluster.post(batch("n1", sample()), token=token)
        assert resp.status_code == 403 and resp.json()["error"] == "no_node", resp.text
    assert len(cluster.sink.added) == 1


async def test_reviews_are_cached_by_token(cluster: Cluster) -> None:
    """One TokenReview for many batches with one token; a new token gets its own."""

    def reviews() -> int:
        return sum(1 for r in cluster.emulator if r.url.path.endswith("/tokenreviews"))

    before = reviews()
    for _ in range(5):
        assert (await cluster.post(batch("n1", sample()))).status_code == 200
    assert reviews() == before  # agent-n1 was reviewed when the fixture waited
    for _ in range(3):
        assert (await cluster.post(batch("n2", sample()), token="agent-n2")).status_code == 200
    assert reviews() == before + 1


async def test_api_server_failures_are_503_not_refusals(cluster: Cluster) -> None:
    """The operator may not review tokens (RBAC missing): the agent must retry, so 503 with
    Retry-After, never a 4xx that would make it drop the samples."""
    cluster.emulator.refuse("create", "tokenreviews")
    resp = await cluster.post(batch("n2", sample()), token="agent-n2")
    assert resp.status_code == 503 and resp.headers["Retry-After"]
    assert "tokenreviews" in resp.json()["message"]
    assert cluster.sink.added == []


async def test_a_body_over_the_bound_is_refused_before_it_is_read(cluster: Cluster) -> None:
    """A huge Content-Length gets 413 while the client has sent only the headers (also
    when it asks ``Expect: 100-continue``); a chunked body is cut off at the bound."""
    host, port = "127.0.0.1", int(cluster.url.split(":")[2].split("/")[0])
    head = (
        f"POST {contract.SAMPLES_PATH} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer agent-n1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10**12}\r\n\r\n"
    )
    for expect in ("", "Expect: 100-continue\r\n"):  # curl asks before a large body
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(head.replace("\r\n\r\n", f"\r\n{expect}\r\n").encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        assert status_line.split()[1] == b"413", status_line

    before = cluster.refused("body_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    async with httpx.AsyncClient() as client:
        headers = {"Authorization": "Bearer agent-n1"}
        try:
            resp = await client.post(cluster.url, content=chunks(), headers=headers)
        except httpx.HTTPError:  # closed while sending: the 413 is counted below
            resp = None
    if resp is not None:
        assert resp.status_code == 413
    assert cluster.refused("body_too_large") == before + 1
    assert cluster.sink.added == []


async def test_cluster_power_sums_fresh_readings_of_each_node(cluster: Cluster) -> None:
    power = cluster.operator.controller
    assert power is not None
    assert (await cluster.post(batch("n1", sample(), watts=400.0))).status_code == 200
    assert (await cluster.post(batch("n2", watts=250.0), token="agent-n2")).status_code == 200
    assert cluster.metric("powerflow_cluster_power_watts") == 650.0
    assert (await cluster.post(batch("n1", watts=300.0))).status_code == 200  # latest wins
    assert cluster.metric("powerflow_cluster_power_watts") == 550.0


def test_a_nodes_reading_is_dropped_once_stale_and_old_retries_do_not_win() -> None:
    from powerflow.operator.ingest import ClusterPower

    now = [1000.0]
    power = ClusterPower(staleness_s=60.0, clock=lambda: now[0])
    power.record("n1", NodePower(400.0, at_s=990.0))
    power.record("n2", NodePower(250.0, at_s=995.0))
    assert power.total_w() == 650.0
    power.record("n1", NodePower(999.0, at_s=980.0))  # a retried older batch
    assert power.total_w() == 650.0
    now[0] = 1030.0
    power.record("n2", NodePower(200.0, at_s=1029.0))
    now[0] = 1061.0  # n1 last heard 61 s ago, n2 31 s ago
    assert power.total_w() == 200.0
    now[0] = 1100.0
    assert power.total_w() == 0.0


def test_a_stale_reading_gives_way_to_one_from_an_agent_whose_clock_went_back() -> None:
    from powerflow.operator.ingest import ClusterPower

    now = [1000.0]
    power = ClusterPower(staleness_s=60.0, clock=lambda: now[0])
    power.record("n1", NodePower(400.0, at_s=990.0))
    now[0] = 1100.0  # nothing read the total meanwhile
    power.record("n1", NodePower(100.0, at_s=500.0))
    assert power.total_w() == 100.0
