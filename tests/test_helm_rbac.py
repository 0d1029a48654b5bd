"""The chart's RBAC against every API call each component makes, both ways.

Each component runs as a user runs it, with the command line the chart
gives its container (``chart_args``; only the cluster address, ports and,
for speed, the operator's Lease duration and profiling window overridden),
against the emulated API server, through scenarios that take each of its
API paths. It logs in with a kubeconfig carrying a token of its own, so the
emulator's request log (kmock records every request) tells whose each
request is. Each request
is mapped to what RBAC authorizes (``powerflow.lab.twin.rbac.call_of``, as the API
server's request-info resolver does: GET of a collection is ``list``,
``?watch=true`` is ``watch``, GET of one object ``get``, POST ``create``, PUT
``update``, PATCH ``patch``, DELETE ``delete``/``deletecollection``).
Discovery (``/api``, ``/apis``, ``/apis/GROUP/VERSION``) and ``/version``
are non-resource URLs that ``system:discovery`` and
``system:public-info-viewer`` let every authenticated user read: they are
not the chart's to grant and are left out.

The rules come from the chart as the real ``helm template`` renders it, per
ServiceAccount: ClusterRoles through ClusterRoleBindings (everywhere), Roles
through RoleBindings (in their namespace only: the budget ConfigMap, the
budget-in-force record and the Lease live in the release namespace). Then,
for each component:

- every call it made is granted (else: the call, and whose it is);
- every (group, resource, verb) its roles grant was used by some call
  (else: the unused grant).

The scheduler pod's ServiceAccount also binds upstream's
``system:kube-scheduler`` and ``system:volume-scheduler`` ClusterRoles (and
the ``extension-apiserver-authentication-reader`` Role): the API server
defines those for kube-scheduler itself, whose calls are not PowerFlow's
code, so the extender's calls are checked against ``powerflow-extender``
alone. The worker library (``powerflow.worker``, in users' training pods)
makes no call at all, and the chart ships no role for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from extender_bodies import args as extender_args
from extender_bodies import binding_args, go_json, node, pod
from operator_cases import JOBS, MERGE, NS, PODS, dljob, eventually, header, models, pods_of, seed
from powerflow.worker import Worker
from support.kube_emulator import KubeEmulator
from support.nodeagent_harness import (
    DLJOB_RESOURCE,
    NODE,
    NodeAgent,
    RecordingGpus,
    create_worker,
    worker_pod,
)
from support.nodeagent_harness import eventually as wait_until
from support.operator_harness import Operator, free_port, write_kubeconfig

from powerflow.cli import build_parser
from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import JobPlan, Plan, Snapshot
from powerflow.core.telemetry import SampleBatch, encode_batch
from powerflow.lab.twin.rbac import Call, Grant, call_of, grants_of

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "powerflow"
HELM = ROOT / ".tools" / "helm"
RELEASE_NS = "powerflow-system"
CMS = f"/api/v1/namespaces/{RELEASE_NS}/configmaps"
BUDGET = f"{CMS}/{contract.BUDGET_CONFIGMAP}"
AGENT = f"system:serviceaccount:{RELEASE_NS}:powerflow-nodeagent"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
POD_EXTRA = "authentication.kubernetes.io/pod-name"
UID_EXTRA = "authentication.kubernetes.io/pod-uid"
JSON = {"Content-Type": "application/json"}


# -- the chart's rules ---------------------------------------------------------------------


def render(*sets: str) -> list[dict[str, Any]]:
    """The chart as ``helm template`` renders it in the release namespace, with ``--set``s."""
    if not HELM.exists():
        subprocess.run([str(ROOT / "scripts" / "fetch-k8s-tools.sh")], check=True)
    args = [str(HELM), "template", "pf", str(CHART), "-n", RELEASE_NS]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    """The chart with its default values (agent on)."""
    return render()


def account_grants(chart: list[dict[str, Any]], account: str) -> list[Grant]:
    """The chart's own grants to one of its ServiceAccounts (upstream roles left out)."""
    grants, _upstream = grants_of(chart, RELEASE_NS, account)
    return grants


def chart_args(chart: list[dict[str, Any]], workload: str, container: str, *drop: str) -> list[str]:
    """The command line the chart gives a container, less the arguments in ``drop``: the
    tests start each component with it, then override only what points at the cluster
    and the ports (later options win)."""
    (found,) = [
        c
        for d in chart
        if d["kind"] in ("Deployment", "DaemonSet") and d["metadata"]["name"] == workload
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == container
    ]
    return [str(a) for a in found["args"] if a not in drop]


# -- the request log -----------------------------------------------------------------------


TEST_AGENT = "powerflow-rbac-test"
"""The User-Agent of the test's own requests (seeding the cluster, playing the kubelet)."""


def client(emulator: KubeEmulator) -> httpx.AsyncClient:
    """The test's own HTTP client of the emulator."""
    return httpx.AsyncClient(base_url=str(emulator.url), headers={"User-Agent": TEST_AGENT})


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """``conftest.api``'s cluster (two 4-GPU nodes, a 5 kW budget), seeded by ``client``."""
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with client(kmock) as test_client:
        await seed(test_client)
        yield test_client


def calls_of(emulator: KubeEmulator, token: str) -> set[Call]:
    """The calls made with ``token``, as RBAC sees them (non-resource URLs left out).

    Every other request must be the test's own: a request of the component without
    its credentials would otherwise go unchecked."""
    calls = set()
    strays = []
    for request in emulator:
        if header(request, "Authorization") != f"Bearer {token}":
            if header(request, "User-Agent") != TEST_AGENT:
                strays.append(f"{request.method.value} {request.url}")
            continue
        call = call_of(str(request.method.value), request.url.path, request.params)
        if call is not None:
            calls.add(call)
    assert not strays, f"requests without the component's token: {strays}"
    return calls


def check(component: str, calls: Iterable[Call], grants: list[Grant]) -> None:
    """Both ways: each call granted, each grant used."""
    calls = set(calls)
    denied = sorted(str(c) for c in calls if not any(g.allows(c) for g in grants))
    assert not denied, f"{component} makes calls the chart does not grant: {denied}"
    unused = sorted({str(g) for g in grants if not any(g.allows(c) for c in calls)})
    assert not unused, f"the chart grants {component} what it never uses: {unused}"


# -- the model of RBAC, pinned ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "params", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {}, Call("", "pods", "list", "ns")),
        ("GET", "/api/v1/pods", {"watch": "true"}, Call("", "pods", "watch")),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, Call("", "pods", "watch", "ns")),
        ("GET", "/api/v1/namespaces/ns/pods/p", {}, Call("", "pods", "get", "ns", "p")),
        ("POST", "/api/v1/namespaces/ns/pods", {}, Call("", "pods", "create", "ns")),
        (
            "POST",
            "/api/v1/namespaces/ns/pods/p/binding",
            {},
            Call("", "pods/binding", "create", "ns", "p"),
        ),
        (
            "PATCH",
            "/apis/powerflow.io/v1/namespaces/ml/dljobs/j/status",
            {},
            Call("powerflow.io", "dljobs/status", "patch", "ml", "j"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/s/leases/l",
            {},
            Call("coordination.k8s.io", "leases", "update", "s", "l"),
        ),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", {}, Call("", "pods", "delete", "ns", "p")),
        ("DELETE", "/api/v1/namespaces/ns/pods", {}, Call("", "pods", "deletecollection", "ns")),
        ("PATCH", "/api/v1/nodes/n", {}, Call("", "nodes", "patch", None, "n")),
        ("GET", "/api/v1/namespaces/ns", {}, Call("", "namespaces", "get", None, "ns")),
        # A list or watch selecting one name is authorized as that name (resourceNames).
        (
            "GET",
            "/api/v1/configmaps",
            {"watch": "true", "fieldSelector": "metadata.name=b,metadata.namespace=s"},
            Call("", "configmaps", "watch", None, "b"),
        ),
        ("GET", "/api", {}, None),
        ("GET", "/api/v1", {}, None),
        ("GET", "/apis", {}, None),
        ("GET", "/apis/powerflow.io", {}, None),
        ("GET", "/apis/powerflow.io/v1", {}, None),
        ("GET", "/version", {}, None),
    ],
)
def test_requests_map_to_what_rbac_authorizes(
    method: str, path: str, params: dict[str, str], expected: Call | None
) -> None:
    assert call_of(method, path, params) == expected


ROLES: list[dict[str, Any]] = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "everywhere"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
    },
    {
        "kind": "Role",
        "metadata": {"name": "here", "namespace": "s"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get", "create"],
                "resourceNames": ["a"],
            },
        ],
    },
    {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "x"},
        "roleRef": {"kind": "ClusterRole", "name": "everywhere"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "s"}],
    },
    {
        "kind": "RoleBinding",
        "metadata": {"name": "y", "namespace": "s"},
        "roleRef": {"kind": "Role", "name": "here"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "s"}],
    },
    {
        "kind": "RoleBinding",
        "metadata": {"name": "z", "namespace": "s"},
        "roleRef": {"kind": "ClusterRole", "name": "upstream"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "s"}],
    },
]


def test_bindings_scope_their_rules_as_rbac_does() -> None:
    """A RoleBinding's rules hold in its namespace only; resourceNames limit to those
    names and never allow create; a role the manifests lack is reported, not guessed."""
    grants, missing = grants_of(ROLES, "s", "sa")
    assert missing == ["ClusterRole upstream"]

    def allowed(call: Call) -> bool:
        return any(g.allows(call) for g in grants)

    assert allowed(Call("", "nodes", "get", None, "n"))
    assert allowed(Call("", "configmaps", "get", "s", "a"))
    assert not allowed(Call("", "configmaps", "get", "other", "a"))
    assert not allowed(Call("", "configmaps", "get", "s", "b"))
    assert not allowed(Call("", "configmaps", "get", None, "a"))  # all namespaces
    assert not allowed(Call("", "configmaps", "create", "s", "a"))
    assert grants_of(ROLES, "s", "another") == ([], [])


def test_the_check_fails_both_ways() -> None:
    grants, _ = grants_of(ROLES, "s", "sa")
    used = {Call("", "nodes", "get", None, "n"), Call("", "configmaps", "get", "s", "a")}
    check("c", used, [g for g in grants if g.verb == "get"])
    with pytest.raises(AssertionError, match=r"does not grant.*list core/nodes"):
        check("c", {*used, Call("", "nodes", "list")}, grants)
    with pytest.raises(AssertionError, match=r"never uses.*create core/configmaps \['a'\]"):
        check("c", used, grants)


# -- operator ------------------------------------------------------------------------------


class RbacPolicy:
    """Budget tiers that take each of the operator's write paths: at least 1 kW every job
    its requested GPUs at 1410 MHz; from 500 W the same GPUs at 1005 MHz (a frequency
    change: pods annotated); below, min GPUs at 1005 MHz (a rescale: a new generation).
    Nodes no job needs (jobs packed on whole nodes, in name order) are powered down."""

    def plan(self, snapshot: Snapshot) -> Plan:
        limit = snapshot.budget.limit_w
        watts = 1e9 if limit is None else limit
        nodes = sorted(snapshot.nodes, key=lambda n: n.name)
        free = sum(n.gpus for n in nodes)
        plans = []
        for job in sorted(snapshot.jobs, key=lambda j: j.id):
            want = job.requested_gpus if watts >= 500 else job.min_gpus
            n = want if want <= free else 0
            free -= n
            bs = -(-job.global_batch_size // n) if n else 0
            plans.append(JobPlan(job.id, n, 1410 if watts >= 1000 else 1005, bs))
        used = sum(p.gpus for p in plans)
        per_node = nodes[0].gpus if nodes else 1
        needed = -(-used // per_node)
        down = tuple(n.name for n in nodes[needed:])
        return Plan(tuple(plans), limit_w=watts, predicted_w=1.0, powered_down_nodes=down)


async def set_budget(api: httpx.AsyncClient, watts: int | str) -> None:
    patch = {"data": {"powerLimitWatts": str(watts)}}
    assert (await api.patch(BUDGET, json=patch, headers=MERGE)).is_success


def generation_of(pods: list[dict[str, Any]]) -> set[str]:
    """The generations of worker pods, from their names (``<job>-g<generation>-w<index>``)."""
    return {p["metadata"]["name"].rsplit("-", 2)[1][1:] for p in pods}


def chart_operator(chart: list[dict[str, Any]], kubeconfig: Path, port: int) -> argparse.Namespace:
    """``powerflow operator`` as the chart runs it, logged in to the emulator, with free
    ports, the ingest on ``port`` and shorter Lease and profiling times."""
    # The ingest over plain HTTP here: its TLS has nothing to do with RBAC, and
    # tests/test_helm_chart.py checks the chart's certificate on its own.
    tls = [a for a in chart_args(chart, "powerflow-operator", "operator") if "-tls-" in a]
    argv = chart_args(chart, "powerflow-operator", "operator", *tls)
    argv += ["--kubeconfig", str(kubeconfig), "--metrics-port", "0"]
    argv += ["--liveness", f"http://127.0.0.1:{free_port()}/healthz"]
    argv += ["--ingest-port", str(port), "--ingest-host", "127.0.0.1"]
    argv += ["--lease-duration", "3", "--profiling-window", "0"]
    args: argparse.Namespace = build_parser().parse_args(argv)
    return args


@pytest.mark.parametrize("watch", ["", NS], ids=["cluster-wide", "one-namespace"])
async def test_operator_calls_match_its_rules(
    kmock: KubeEmulator,
    api: httpx.AsyncClient,
    chart: list[dict[str, Any]],
    tmp_path: Path,
    watch: str,
) -> None:
    """With the default values and with ``operator.watchNamespace`` (the DLJobs' namespace:
    the chart then grants pod, Service, Event and status writes there only, and the
    operator, passed ``--namespace``, makes no call those grants miss): DLJobs created,
    re-clocked, rescaled, finished and failed; the budget changed and its in-force
    record written, and read back by a restart while the budget is invalid; the
    Lease taken, renewed and released; a node powered down (once after a conflict); events;
    status writes; the ingest's TokenReview and, for a pre-1.30 token, the read of the
    agent's pod."""
    if watch:
        chart = render(f"operator.watchNamespace={watch}")
        assert f"--namespace={watch}" in chart_args(chart, "powerflow-operator", "operator")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="operator")
    aud = (contract.INGEST_AUDIENCE,)
    kmock.register_token("agent-n1", AGENT, extra={NODE_EXTRA: ["n1"]}, audiences=aud)
    agent_pod = {"metadata": {"name": "nodeagent-x"}, "spec": {"nodeName": "n1"}}
    made = await api.post(f"/api/v1/namespaces/{RELEASE_NS}/pods", json=agent_pod)
    extra = {POD_EXTRA: ["nodeagent-x"], UID_EXTRA: [made.json()["metadata"]["uid"]]}
    kmock.register_token("old-agent", AGENT, extra=extra, audiences=aud)
    # One conflict on the first node write: the operator reads the node again.
    conflict = kmock.refuse("patch", "nodes", status=409, reason="Conflict", times=1)
    port = free_port()
    async with Operator(chart_operator(chart, kubeconfig, port), RbacPolicy(), models):
        await api.post(JOBS, json=dljob("a"))

        async def running(job: str, n: int) -> list[dict[str, Any]]:
            pods = await pods_of(api, job)
            return pods if len(pods) == n else []

        await eventually(lambda: running("a", 4))

        async def n2_parked() -> bool:
            node = (await api.get("/api/v1/nodes/n2")).json()
            return contract.POWERED_DOWN_ANNOTATION in node["metadata"].get("annotations", {})

        await eventually(n2_parked)
        assert conflict.hits == 1
        await set_budget(api, 700)  # same GPUs, a lower clock: the pods are annotated

        async def reclocked() -> bool:
            pods = await pods_of(api, "a")
            ann = [p["metadata"].get("annotations", {}) for p in pods]
            return len(pods) == 4 and all(
                a.get(contract.FREQUENCY_ANNOTATION) == "1005" for a in ann
            )

        await eventually(reclocked)
        await set_budget(api, 300)  # min GPUs: a new generation (Service exists: 409, get)

        async def rescaled() -> bool:
            pods = await pods_of(api, "a")
            return len(pods) == 2 and generation_of(pods) == {"2"}

        await eventually(rescaled)
        for token in ("agent-n1", "old-agent"):
            batch = encode_batch(SampleBatch("n1", ()))
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{port}{contract.SAMPLES_PATH}"
                headers = {"Authorization": f"Bearer {token}"}
                sent = await client.post(url, content=json.dumps(batch), headers=headers)
            assert sent.status_code == 200, sent.text
        progress = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "1000"}}}
        name = (await pods_of(api, "a"))[0]["metadata"]["name"]
        await api.patch(f"{PODS}/{name}", json=progress, headers=MERGE)

        async def finished(job: str, phase: str) -> bool:
            status = (await api.get(f"{JOBS}/{job}")).json().get("status", {})
            return status.get("phase") == phase and not await pods_of(api, job)

        await eventually(lambda: finished("a", "Succeeded"), timeout=10)
        await api.post(JOBS, json=dljob("b", restart={"limit": 0, "backoffSeconds": 0}))
        pods = await eventually(lambda: running("b", 2))  # 300 W: min GPUs
        failed = {"status": {"phase": "Failed"}}
        name = pods[0]["metadata"]["name"]
        assert (await api.patch(f"{PODS}/{name}/status", json=failed, headers=MERGE)).is_success
        await eventually(lambda: finished("b", "Failed"), timeout=10)
    # A restart while the budget is invalid starts from the recorded budget in force.
    await set_budget(api, "lots")
    restart = chart_operator(chart, kubeconfig, free_port())
    async with Operator(restart, RbacPolicy(), models) as again:
        assert again.controller is not None and again.controller.budget.budget.limit_w == 300
    check("the operator", calls_of(kmock, "operator"), account_grants(chart, "powerflow-operator"))


# -- extender ------------------------------------------------------------------------------

UPSTREAM = [
    "ClusterRole system:kube-scheduler",
    "ClusterRole system:volume-scheduler",
    "Role extension-apiserver-authentication-reader",
]
"""The scheduler pod's roles that upstream defines for kube-scheduler itself."""
SCHEDULER_LEASE = "powerflow-scheduler-lease"
"""The chart's Role for kube-scheduler's own Lease (not the extender's: left out of its
check, and checked here to grant that Lease alone)."""


async def create_pod(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """Create a pod of ``extender_bodies`` (server-set fields left to the server)."""
    fresh = json.loads(json.dumps(body))
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        fresh["metadata"].pop(key)
    namespace = fresh["metadata"]["namespace"]
    response = await api.post(f"/api/v1/namespaces/{namespace}/pods", json=fresh)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


async def test_extender_calls_match_its_rules(
    kmock: KubeEmulator, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``powerflow extender`` mirrors DLJobs, nodes and pods (list, watch), filters,
    prioritizes and binds a two-worker gang, and binds a pod it does not cache (no GPU:
    read first)."""
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    names = ["gpu-0", "gpu-1"]
    async with client(kmock) as api:
        for name in names:
            body = node(name)
            status = body.pop("status")
            assert (await api.post("/api/v1/nodes", json=body)).status_code == 201
            patch = {"status": status}
            assert await api.patch(f"/api/v1/nodes/{name}/status", json=patch, headers=MERGE)
        gang = [
            await create_pod(api, pod(f"j-g1-w{i}", job="j", workers=2, generation="1", index=i))
            for i in range(2)
        ]
        plain = await create_pod(api, pod("web", gpus=0))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="extender")
        port = free_port()
        argv = [sys.executable, "-m", "powerflow"]
        argv += chart_args(chart, "powerflow-scheduler", "extender", "--in-cluster")
        argv += ["--port", str(port), "--metrics-port", str(free_port())]
        argv += ["--kubeconfig", str(kubeconfig), "--log-level", "warning"]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as ext:
                await ready(ext, proc)
                nodes = [node(n) for n in names]
                for worker in gang:
                    wire = go_json(extender_args(worker, nodes, cache_capable=True))
                    answer = (await ext.post("/filter", content=wire, headers=JSON)).json()
                    assert not answer.get("Error") and answer["NodeNames"], answer
                    host = answer["NodeNames"][0]
                    ranked = await ext.post("/prioritize", content=wire, headers=JSON)
                    assert ranked.status_code == 200, ranked.text
                    bound = (await ext.post("/bind", json=binding_args(worker, host))).json()
                    assert not bound.get("Error"), bound
                bound = (await ext.post("/bind", json=binding_args(plain, "gpu-1"))).json()
                assert not bound.get("Error"), bound
        finally:
            if proc.returncode is None:
                proc.terminate()
            output = (await proc.communicate())[0].decode()
        assert "Traceback" not in output, output
        stored = (await api.get("/api/v1/namespaces/default/pods/web")).json()
        assert stored["spec"]["nodeName"] == "gpu-1"
    grants, upstream = grants_of(chart, RELEASE_NS, "powerflow-scheduler")
    assert sorted(upstream) == sorted(UPSTREAM)
    lease = [g for g in grants if g.role == f"Role {SCHEDULER_LEASE}"]
    check("the extender", calls_of(kmock, "extender"), [g for g in grants if g not in lease])
    assert sorted((g.group, g.resource, g.verb, g.namespace, g.names) for g in lease) == [
        ("coordination.k8s.io", "leases", verb, RELEASE_NS, ("powerflow-scheduler",))
        for verb in ("get", "update")
    ]


async def ready(ext: httpx.AsyncClient, proc: asyncio.subprocess.Process) -> None:
    """Until ``/readyz`` answers 200 (its mirror listed); the emulator serves from this loop,
    so the wait never blocks it."""
    for _ in range(600):
        try:
            if (await ext.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            if proc.returncode is not None:
                assert proc.stdout is not None
                output = (await proc.stdout.read()).decode()
                message = f"the extender exited ({proc.returncode}):\n{output}"
                raise AssertionError(message) from None
        await asyncio.sleep(0.1)
    raise AssertionError("the extender never became ready")


# -- node agent ----------------------------------------------------------------------------


async def test_node_agent_calls_match_its_rules(
    kmock: KubeEmulator, chart: list[dict[str, Any]], tmp_path: Path
) -> None:
    """``powerflow nodeagent`` watches its node's pods and its node, applies a pod's clock
    and power limit (both clamped: an Event each) and parks idle GPUs of its node once the
    node is marked powered down."""
    kmock.load_builtins()
    kmock.declare(DLJOB_RESOURCE, contract.KIND)
    async with client(kmock) as api:
        body = {"metadata": {"name": NODE}, "status": {"allocatable": {contract.GPU_RESOURCE: "4"}}}
        assert (await api.post("/api/v1/nodes", json=body)).status_code == 201
        clamped = worker_pod("a", 0, frequency_mhz="1400", power_limit_watts="40")
        assert (await create_worker(api, clamped)).status_code == 201
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="agent")
        gpus = RecordingGpus()
        token = tmp_path / "token"
        token.write_text("agent-ingest-token")
        argv = chart_args(chart, "powerflow-nodeagent", "nodeagent")
        argv += ["--kubeconfig", str(kubeconfig), "--node-name", NODE, "--simulate", "4"]
        argv += ["--metrics-port", "0", "--worker-host", "127.0.0.1", "--worker-port", "0"]
        argv += ["--pod-resources-socket", "/nonexistent/pod-resources/kubelet.sock"]
        argv += ["--ingest-url", f"http://127.0.0.1:{free_port()}", "--token-file", str(token)]
        argv += ["--ingest-ca", ""]  # plain HTTP here (the chart's TLS: test_helm_chart)
        async with NodeAgent(build_parser().parse_args(argv), gpus):

            async def reported() -> bool:
                items = (await api.get("/api/v1/namespaces/ns/events")).json()["items"]
                reasons = {e["reason"] for e in items}
                return {"ClockClamped", "PowerLimitClamped"} <= reasons

            await eventually(reported)
            mark = {"metadata": {"annotations": {contract.POWERED_DOWN_ANNOTATION: "now"}}}
            await api.patch(f"/api/v1/nodes/{NODE}", json=mark, headers=MERGE)
            lowest = A100.clocks_mhz[0]
            await wait_until(lambda: all(gpus.locked(i) == lowest for i in (1, 2, 3)))
    check("the node agent", calls_of(kmock, "agent"), account_grants(chart, "powerflow-nodeagent"))


# -- worker library ------------------------------------------------------------------------


async def test_the_worker_library_needs_no_role(
    kmock: KubeEmulator,
    chart: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``powerflow.worker`` in a training pod, with credentials at hand (a kubeconfig, as
    outside a cluster), calls nothing on the API server: its progress reaches the
    operator through the node agent. So the chart ships no role for training pods, and
    of its accounts only the operator may write pods, which carry the clocks and power
    limits the agents apply."""
    kmock.load_builtins()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="worker")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kmock.declare(DLJOB_RESOURCE, contract.KIND)
    async with client(kmock) as api:
        made = await create_worker(api, worker_pod("a", 0))
        assert made.status_code == 201, made.text
        env = {
            "POWERFLOW_POD_NAME": "a",
            "POWERFLOW_POD_NAMESPACE": "ns",
            "POWERFLOW_POD_UID": made.json()["metadata"]["uid"],
            "RANK": "0",
            "WORLD_SIZE": "1",
        }
        worker = Worker(env=env, min_interval_s=3600.0)
        for _ in range(3):
            worker.report_iteration()
        await asyncio.to_thread(worker.close)
    assert calls_of(kmock, "worker") == set()
    roles = {d["metadata"]["name"] for d in chart if d["kind"] in ("Role", "ClusterRole")}
    assert not any("worker" in name for name in roles), roles
    writers = sorted(
        f"{d['kind']} {d['metadata']['name']}"
        for d in chart
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d.get("rules") or []
        if "pods" in rule.get("resources", []) and {"patch", "update"} & set(rule["verbs"])
    )
    assert writers == ["ClusterRole powerflow-operator"], writers
