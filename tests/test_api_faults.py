"""The components ride through API-server faults with nothing lost.

Each component is started as a user starts it (its command's ``serve`` or the
command itself, with a kubeconfig pointing at the emulator) while the
emulator injects faults into its requests only (``support.api_faults``, rules
matched by the component's ``User-Agent``; the test's own requests, playing
the kubelet and the user, are never faulted): 409 conflicts, 429 throttling
with ``Retry-After``, 500s before and after a committed write, watches that
end with a 410 ``ERROR`` event (and etcd compaction), and answers seconds
late. Draws are seeded.

Nothing lost means, for the operator: every DLJob reaches ``Succeeded``,
no job was restarted (no fault cost a generation), and each worker slot's pod
was created once (one uid per pod name, over the emulator's whole history);
for the node agent: every pod's clocks are applied and reset as without
faults; for the extender: a bind whose API call fails answers an ``Error``
and books nothing, and no GPU is ever booked twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import operator_cases
import pytest
from extender_bodies import args as ext_args
from extender_bodies import binding_args, go_json
from extender_bodies import node as ext_node
from extender_bodies import pod as ext_pod
from powerflow.nodeagent.kube import COMPONENT as AGENT_COMPONENT
from support.api_faults import Answer, Fault
from support.extender_process import create, extender_process
from support.kube_emulator import KubeEmulator
from support.nodeagent_harness import (
    DLJOB_RESOURCE,
    NODE,
    NodeAgent,
    RecordingGpus,
    agent_args,
    create_worker,
    worker_pod,
)
from support.nodeagent_harness import PODS as AGENT_PODS
from support.nodeagent_harness import eventually as agent_eventually
from support.operator_cluster import NODES, cluster, gang_dljob, kubelet, operator
from support.operator_harness import write_kubeconfig

from powerflow.core import contract
from powerflow.core.contract import PLACEMENT_ANNOTATION

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

NS = "ml"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON = {"Content-Type": "application/json"}
TESTER = {"User-Agent": "test-kubelet"}
"""The test's own client: never matched by the components' fault rules."""
OPERATOR_AGENTS = ("powerflow-operator/*", "kopf/*")
"""The operator's two clients: its allocation loop's and kopf's watches."""
ITERATIONS = 100
JOBS_N = 4

eventually = functools.partial(operator_cases.eventually, timeout=90.0)


def dljob(name: str) -> dict[str, Any]:
    return gang_dljob(name, ITERATIONS)


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    bodies = [operator_cases.node(name, 4) for name in NODES]
    async with cluster(kmock, bodies, headers=TESTER) as client:
        yield client


def pod_incarnations(kmock: KubeEmulator) -> dict[str, set[str]]:
    """Each pod name the API server ever stored, with the uids it had (one per creation)."""
    uids: dict[str, set[str]] = {}
    for key in list(kmock.objects):
        resource, _namespace, name = key
        if getattr(resource, "plural", None) != "pods" or getattr(resource, "group", None):
            continue
        for version in kmock.objects[key].history:  # None marks a deletion
            uid = (version or {}).get("metadata", {}).get("uid")
            if uid:
                uids.setdefault(name, set()).add(uid)
    return uids


def for_operator(
    kmock: KubeEmulator, verb: str, resource: str, answer: Answer, **how: Any
) -> list[Fault]:
    """The same rule for both of the operator's clients."""
    return [
        kmock.faults.inject(verb, resource, answer, user_agent=agent, **how)
        for agent in OPERATOR_AGENTS
    ]


def conflicts(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(
            kmock, "patch", f"{contract.PLURAL}/status", Answer(status=409), probability=0.3
        ),
        *for_operator(kmock, "create", "pods", Answer(status=409), probability=0.2),
        *for_operator(kmock, "patch", "pods", Answer(status=409), probability=0.3),
    ]


def throttling(kmock: KubeEmulator) -> list[Fault]:
    return for_operator(kmock, "*", "*", Answer(status=429, retry_after_s=1), probability=0.15)


def internal_errors(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(kmock, "create", "pods", Answer(status=500, committed=True), probability=0.2),
        *for_operator(kmock, "create", "pods", Answer(status=500), probability=0.1),
        *for_operator(kmock, "delete", "pods", Answer(status=500, committed=True), probability=0.3),
        *for_operator(
            kmock, "patch", f"{contract.PLURAL}/status", Answer(status=500), probability=0.15
        ),
        *for_operator(kmock, "list", "*", Answer(status=500), probability=0.1),
    ]


def gone_watches(kmock: KubeEmulator) -> list[Fault]:
    return for_operator(kmock, "watch", "*", Answer(status=410, after_events=2), probability=0.5)


def slow(kmock: KubeEmulator) -> list[Fault]:
    return [
        *for_operator(kmock, "list", "*", Answer(delay_s=2.0), probability=0.1),
        *for_operator(kmock, "create", "pods", Answer(delay_s=1.5), probability=0.1),
        *for_operator(kmock, "patch", "*", Answer(delay_s=1.5), probability=0.1),
    ]


def outage(kmock: KubeEmulator) -> list[Fault]:
    """The first five lists of pods of each client fail (an API server restarting, an
    etcd leader election: 8.6 s of kopf's retries, ``API_BACKOFFS_S``). With four
    retries kopf's pod watcher gives up at the fifth, and with it the whole operator:
    no pass ever again (the case fails with ``API_BACKOFFS_S`` cut to four); more
    failures only wait longer between the same retries."""
    return for_operator(kmock, "list", "pods", Answer(status=500), times=5)


def everything(kmock: KubeEmulator) -> list[Fault]:
    """Every kind at once, the outage first (its rules answer before the others see a
    list of pods): the operator starts into an outage, then works through the rest."""
    return [
        *outage(kmock),
        *conflicts(kmock),
        *throttling(kmock),
        *internal_errors(kmock),
        *gone_watches(kmock),
        *slow(kmock),
    ]


# throttling, slow and outage cost real time (Retry-After, late answers, kopf's
# back-off): they run within everything only, which asserts that each answered requests.
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "faults",
    [conflicts, internal_errors, gone_watches, everything],
    ids=lambda f: f.__name__,
)
async def test_the_operator_loses_nothing_under_api_faults(
    kmock: KubeEmulator, api: httpx.AsyncClient, faults: Any
) -> None:
    kmock.faults.reseed(16)
    rules: list[Fault] = faults(kmock)
    for i in range(JOBS_N):
        assert (await api.post(JOBS, json=dljob(f"job{i}"))).status_code == 201
    player = asyncio.create_task(kubelet(api, PODS, run_s=0.3))
    try:
        async with operator(kmock):

            async def all_done() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = (await api.get(JOBS)).json()["items"]
                phases = [j.get("status", {}).get("phase") for j in items]
                return items if phases.count("Succeeded") == JOBS_N else []

            jobs = await eventually(all_done)
    finally:
        player.cancel()
        await asyncio.gather(player, return_exceptions=True)
    assert sum(rule.hits for rule in rules) > 0, "no fault was injected"
    if faults is everything:  # which draws fire follows the requests' timing: per scenario
        assert sum(r.hits for r in rules if r.answer.status == 429) > 0, "no throttling"
        assert sum(r.hits for r in rules if r.answer.delay_s > 0) > 0, "no late answer"
        assert [r.hits for r in rules if r.times] == [5, 5], "the outage did not happen"
    restarted = {j["metadata"]["name"]: j["status"].get("restarts") for j in jobs}
    assert not any(restarted.values()), f"generations lost to faults: {restarted}"
    incarnations = pod_incarnations(kmock)
    twice = {name: len(uids) for name, uids in incarnations.items() if len(uids) > 1}
    assert not twice, f"pods created more than once: {twice}"
    expected = {f"job{i}-g1-w{w}" for i in range(JOBS_N) for w in range(4)}
    assert set(incarnations) == expected
    hits: Counter[str] = Counter()
    for r in rules:
        hits[f"{r.verb} {r.resource} {r.answer.status or r.answer.delay_s}"] += r.hits
    print(f"faults injected: {dict(hits)}")


# -- the node agent ----------------------------------------------------------------------


@pytest.fixture
async def agent_api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(DLJOB_RESOURCE, contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=TESTER) as client:
        node = {"metadata": {"name": NODE}, "status": {"allocatable": {contract.GPU_RESOURCE: "4"}}}
        assert (await client.post("/api/v1/nodes", json=node)).status_code == 201
        yield client


def agent_faults(kmock: KubeEmulator) -> list[Fault]:
    """The agent's requests fail in turn (counted, so each happens whatever the timing):
    its pod watch ends three times with 410 after one event and its node watch breaks
    with 500, its LISTs fail (500), are throttled (429) and come late, its Events fail.
    The agent lists and watches rarely: a probability would rarely fire."""
    agent = {"user_agent": f"{AGENT_COMPONENT}/*"}
    inject = kmock.faults.inject
    return [
        inject("watch", "pods", Answer(status=410, after_events=1), times=3, **agent),
        inject("watch", "nodes", Answer(status=500), times=2, **agent),
        inject("list", "pods", Answer(status=500), times=2, **agent),
        inject("list", "pods", Answer(status=429), times=2, **agent),
        inject("list", "pods", Answer(delay_s=1.5), times=2, **agent),
        inject("create", "events", Answer(status=500), times=1, **agent),
    ]


@pytest.mark.timeout(240)
async def test_the_node_agent_keeps_applying_clocks_through_api_faults(
    kmock: KubeEmulator, agent_api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Each change the operator writes reaches the GPUs, whatever the agent's watches
    and lists meet: clocks follow every annotation, a deleted pod's GPU goes back to
    its defaults, a pod created meanwhile is picked up."""
    kmock.faults.reseed(16)
    rules = agent_faults(kmock)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))
    gpus = RecordingGpus()
    wait = functools.partial(agent_eventually, timeout=60.0)

    async def annotate(name: str, mhz: str | None) -> None:
        patch = {"metadata": {"annotations": {contract.FREQUENCY_ANNOTATION: mhz}}}
        response = await agent_api.patch(f"{AGENT_PODS}/{name}", json=patch, headers=MERGE)
        assert response.status_code == 200, response.text

    for name, gpu in (("a", 0), ("b", 1)):
        body = worker_pod(name, gpu, job=name, frequency_mhz="1200")
        assert (await create_worker(agent_api, body)).status_code == 201
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await wait(lambda: gpus.locked(0) == 1200 and gpus.locked(1) == 1200)
        for step, mhz in enumerate(("1005", "1395", "900", "1110", "1305", "1200")):
            await annotate("a", mhz)
            await annotate("b", str(int(mhz) - 15 * (step + 1)))
            await wait(lambda m=mhz: gpus.locked(0) == int(m))
        await wait(lambda: gpus.locked(1) == 1200 - 15 * 6)
        body = worker_pod("c", 2, job="c", frequency_mhz="1005")
        assert (await create_worker(agent_api, body)).status_code == 201
        assert (await agent_api.delete(f"{AGENT_PODS}/b")).status_code == 200
        await wait(lambda: gpus.locked(2) == 1005 and gpus.locked(1) is None)
        await annotate("a", "1005")
        await annotate("c", "1395")
        await wait(lambda: gpus.locked(0) == 1005 and gpus.locked(2) == 1395)
        assert gpus.locked(3) is None
    assert [rule.hits for rule in rules[:5]] == [rule.times for rule in rules[:5]]


# -- the extender ------------------------------------------------------------------------

EXT_AGENT = {"user_agent": "powerflow-extender/*"}
"""The extender's client (httpx); the test's own client says ``test-kubelet``."""


@pytest.fixture
async def ext_api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """Two 8-GPU nodes."""
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url), headers=TESTER) as client:
        for name in ("gpu-0", "gpu-1"):
            await create(client, "/api/v1/nodes", ext_node(name))
        yield client


@contextlib.asynccontextmanager
async def extender(kmock: KubeEmulator, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """``powerflow extender --kubeconfig FILE`` in a subprocess; a client of it once ready."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="t")
    async with (
        extender_process(kubeconfig) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as ext,
    ):
        yield ext


async def created_pod(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    return await create(api, "/api/v1/namespaces/default/pods", body)


async def filter_and_bind(ext: httpx.AsyncClient, worker: dict[str, Any]) -> dict[str, Any]:
    """One scheduling cycle as kube-scheduler runs it: filter, then bind to the first
    node that passed; the extender's answer (``Error`` empty when bound)."""
    nodes = [ext_node(n) for n in ("gpu-0", "gpu-1")]
    body = go_json(ext_args(worker, nodes, cache_capable=True))
    answer: dict[str, Any] = (await ext.post("/filter", content=body, headers=JSON)).json()
    if answer.get("Error") or not answer.get("NodeNames"):
        return {"Error": answer.get("Error") or "no node passed", "filter": True}
    host = answer["NodeNames"][0]
    bound: dict[str, Any] = (
        await ext.post("/bind", content=go_json(binding_args(worker, host)), headers=JSON)
    ).json()
    return {**bound, "host": host}


async def scheduled(ext: httpx.AsyncClient, worker: dict[str, Any]) -> str:
    """Cycles until the pod is bound, as kube-scheduler retries with back-off: for a
    minute at most, as the extender's mirror waits up to 10 s (15 s with its jitter)
    between relists after failures in a row."""
    for _ in range(300):
        answer = await filter_and_bind(ext, worker)
        if not answer.get("Error"):
            return str(answer["host"])
        await asyncio.sleep(0.2)
    raise AssertionError(f"{worker['metadata']['name']} never bound: {answer}")


async def stored(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    body: dict[str, Any] = (await api.get(f"/api/v1/namespaces/default/pods/{name}")).json()
    return body


@pytest.mark.timeout(240)
async def test_the_extender_answers_errors_and_books_nothing_twice_under_api_faults(
    kmock: KubeEmulator, ext_api: httpx.AsyncClient, tmp_path: Path
) -> None:
    gang = [
        await created_pod(ext_api, ext_pod(f"j-g1-w{i}", job="j", workers=4, generation="1",
                                           index=i))
        for i in range(4)
    ]  # fmt: skip
    faults = kmock.faults
    async with extender(kmock, tmp_path) as ext:
        # 500 before the binding: an Error, nothing bound; the retry binds.
        rule = faults.inject("create", "pods/binding", Answer(status=500), times=1, **EXT_AGENT)
        answer = await filter_and_bind(ext, gang[0])
        assert "500" in answer["Error"] and rule.hits == 1, answer
        assert not (await stored(ext_api, "j-g1-w0"))["spec"].get("nodeName")
        hosts = [await scheduled(ext, gang[0])]
        # 409 on the binding (not bound after all): an Error, nothing bound; the retry binds.
        rule = faults.inject("create", "pods/binding", Answer(status=409), times=1, **EXT_AGENT)
        answer = await filter_and_bind(ext, gang[1])
        assert "409 Conflict" in answer["Error"] and rule.hits == 1, answer
        assert "bound to no node; nothing was bound" in answer["Error"]
        assert "already bound" not in answer["Error"]
        assert not (await stored(ext_api, "j-g1-w1"))["spec"].get("nodeName")
        hosts.append(await scheduled(ext, gang[1]))
        # 500 after a committed binding: an Error, but bound; the retry finds it bound there.
        rule = faults.inject(
            "create", "pods/binding", Answer(status=500, committed=True), times=1, **EXT_AGENT
        )
        answer = await filter_and_bind(ext, gang[2])
        assert "500" in answer["Error"] and rule.hits == 1, answer
        assert (await stored(ext_api, "j-g1-w2"))["spec"]["nodeName"] == answer["host"]
        again = await ext.post(
            "/bind", content=go_json(binding_args(gang[2], answer["host"])), headers=JSON
        )
        assert again.json() == {"Error": ""}
        hosts.append(answer["host"])
        # A binding seconds late: bound.
        rule = faults.inject("create", "pods/binding", Answer(delay_s=3.0), times=1, **EXT_AGENT)
        hosts.append(await scheduled(ext, gang[3]))
        assert rule.hits == 1
        # The mirror's lists and watches fail in turn while a second gang is placed. (A
        # 429 names its Retry-After, which the client waits out in place: the mirror
        # never sees one, tests/test_extender_retry_after.py; 503s here are failures.)
        inject, bind = faults.inject, "pods/binding"
        mirror = [
            inject("watch", "pods", Answer(status=410, after_events=2), times=3, **EXT_AGENT),
            inject("watch", "nodes", Answer(status=500), times=1, **EXT_AGENT),
            inject("list", "pods", Answer(status=503), times=2, **EXT_AGENT),
            inject("list", "pods", Answer(status=500), times=1, **EXT_AGENT),
            inject("create", bind, Answer(status=500), probability=0.3, **EXT_AGENT),
            inject(
                "create", bind, Answer(status=500, committed=True), probability=0.2, **EXT_AGENT
            ),
        ]
        big = [
            await created_pod(ext_api, ext_pod(f"k-g1-w{i}", job="k", workers=8,
                                               generation="1", index=i))
            for i in range(8)
        ]  # fmt: skip
        kmock.compact()
        for worker in big:
            name = worker["metadata"]["name"]
            if not (await stored(ext_api, name))["spec"].get("nodeName"):  # not bound yet
                await scheduled(ext, worker)
        assert [m.hits for m in mirror[:4]] == [3, 1, 2, 1]
    # Every pod bound once, inside its gang's block; the blocks share no GPU.
    blocks: dict[str, set[tuple[str, int]]] = {}
    per_node: Counter[str] = Counter()
    for worker in [*gang, *big]:
        pod = await stored(ext_api, worker["metadata"]["name"])
        node = pod["spec"]["nodeName"]
        per_node[node] += 1
        block = json.loads(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION])["block"]
        job = pod["metadata"]["labels"][contract.JOB_LABEL]
        members = {(str(n), int(g)) for n, g in block}
        assert blocks.setdefault(job, members) == members, f"{job}: two blocks"
        assert node in {n for n, _ in members}
    assert [p["metadata"]["name"] for p in gang] and hosts
    assert len(blocks["j"]) == 4 and len(blocks["k"]) == 8
    assert not blocks["j"] & blocks["k"], f"GPUs booked twice: {blocks['j'] & blocks['k']}"
    assert all(count <= 8 for count in per_node.values()), per_node
    for job, members in blocks.items():
        on_node = Counter(n for n, _ in members)
        bound: Counter[str] = Counter()
        for w in gang if job == "j" else big:
            bound[(await stored(ext_api, w["metadata"]["name"]))["spec"]["nodeName"]] += 1
        assert bound == on_node, f"{job}: pods {dict(bound)} vs block {dict(on_node)}"
