"""The Helm chart as the system under test: its own pods, from the built image, on the twin.

``scripts/chart-twin.sh`` runs this (root, the image ``scripts/build-image.sh``
builds, ``helm``): ``helm template`` of the chart, every object applied to the
twin's API server with RBAC enforced, every Deployment and DaemonSet pod run
from the image by the twin's kubelet (``powerflow.lab.twin.chart``,
``docs/verification.md`` says what is imitated and what is not), then DLJobs
run to ``Succeeded`` by the chart's operator, scheduler and node agents.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from powerflow.lab.twin.chart import NAMESPACE, ChartTwin
from powerflow.lab.twin.chartpods import pod_ready, pod_status_text
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import dljob, mini_trace

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/powerflow:dev"
VALUES = {
    "budget": {"schedulingIntervalSeconds": 5},
    "serviceMonitor": {"enabled": True, "interval": "2s"},
    "prometheusRule": {"enabled": True},
}
"""The chart's defaults but these: a pass every 5 s instead of 60 s, so that jobs of a
few hundred iterations do not wait a minute for their GPUs; the ServiceMonitors and
the PrometheusRule on (a cluster with the Prometheus Operator), scraped every 2 s."""
DASHBOARD = REPO / "helm" / "powerflow" / "files" / "dashboard.json"
PICTURE = os.environ.get("POWERFLOW_DASHBOARD_PNG")
"""Where to draw the dashboard from the run's series (docs/dashboard.png is one such
drawing: ``POWERFLOW_DASHBOARD_PNG=docs/dashboard.png scripts/chart-twin.sh``)."""


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartTwin]:
    with ChartTwin(tmp_path_factory.mktemp("chart"), image=IMAGE, values=VALUES) as t:
        t.wait_ready(240)
        t.start_prometheus()
        yield t


@pytest.fixture(scope="module")
def run(twin: ChartTwin) -> tuple[float, float, dict[str, str]]:
    """The README's example DLJob and a 10-job mini trace, to the end: (start, end,
    each job's last phase)."""
    example = yaml.safe_load((REPO / "examples" / "torch-ddp-dljob.yaml").read_text())
    # The twin's workers are simulated from a ground-truth model; the example's tiny
    # DDP model has none, so the test names one, and fewer iterations. The jobs are
    # short (the trace at 1/667 of its size): the last ended 71 s after the first was
    # applied, where at 1/333 (and 300 iterations for the example) it took 111 s.
    example["spec"].update(model="resnet50", iterations=150)
    start = time.time()
    twin.dljob(example)
    for m in mini_trace(10, TimeScale(0.0015)):
        twin.dljob(dljob(m, twin.gpus_per_node * len(twin.gpu_nodes)))
    deadline = time.monotonic() + 420
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        jobs = twin.dljobs() + twin.dljobs("default")
        phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase", "") for j in jobs}
        if len(phases) == 11 and all(p in ("Succeeded", "Failed") for p in phases.values()):
            break
        time.sleep(2)
    time.sleep(6)  # three more scrapes of the end
    return start, time.time(), phases


def test_every_chart_pod_starts_from_the_image_and_stays_up(twin: ChartTwin) -> None:
    """Init containers (the numba cache copy, as uid 10001 with a read-only root) exit 0,
    every container is ready by its own probes, nothing restarted."""
    pods = twin.chart_pods()
    kinds = sorted(p["metadata"]["ownerReferences"][0]["name"] for p in pods)
    assert kinds == [
        "powerflow-nodeagent",
        "powerflow-nodeagent",
        "powerflow-operator",
        "powerflow-scheduler",
    ], twin.pods_table()
    for pod in pods:
        status = pod["status"]
        assert pod_ready(pod) and pod_status_text(pod) == "Running", twin.pods_table()
        for init in status["initContainerStatuses"]:
            assert init["state"]["terminated"]["exitCode"] == 0
        assert all(s["ready"] and s["restartCount"] == 0 for s in status["containerStatuses"]), (
            twin.pods_table()
        )


def test_jobs_run_to_success_with_clocks_set_by_the_chart_agents(
    twin: ChartTwin, run: tuple[float, float, dict[str, str]]
) -> None:
    """The example and the mini trace finish; the chart's agents set clocks on both GPU
    nodes; the chart's pods never restarted meanwhile."""
    phases = run[2]
    assert set(phases.values()) == {"Succeeded"}, (phases, twin.pods_table(), twin.logs())
    assert twin.gpu_server is not None
    set_by = {(s.node, s.call) for s in twin.gpu_server.journal}
    for node in twin.gpu_nodes:
        assert (node, "lock_clocks_mhz") in set_by, set_by
    test_every_chart_pod_starts_from_the_image_and_stays_up(twin)


def test_every_dashboard_query_returns_data_from_the_scraped_pods(
    twin: ChartTwin, run: tuple[float, float, dict[str, str]]
) -> None:
    """A real Prometheus scraped every chart pod through the chart's ServiceMonitors, and
    every panel query of the shipped dashboard returned a number (not only NaN, which a
    quantile of no requests is) over the run; no alert
    of the chart's PrometheusRule fired on this healthy run."""
    prom = twin.prometheus
    assert prom is not None
    health = prom.targets_up()
    assert len(health) == 4 and set(health.values()) == {"up"}, health
    board = json.loads(DASHBOARD.read_text())
    start, end, _ = run
    empty = [
        f"{p['title']}: {t['expr']}"
        for p in board["panels"]
        for t in p["targets"]
        if not any(
            math.isfinite(float(v))
            for series in prom.query_range(t["expr"], start, end, 2)
            for _, v in series["values"]
        )
    ]
    assert not empty, "\n".join(empty)
    firing = [a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"]
    assert not firing, firing
    if PICTURE:
        from powerflow.lab.twin.dashboard_png import draw

        counts = draw(board, prom, start, end, Path(PICTURE))
        assert all(counts.values()), counts


def _token(twin: ChartTwin, account: str) -> str:
    assert twin.client is not None
    answer = twin.client.post(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    answer.raise_for_status()
    return str(answer.json()["status"]["token"])


def test_the_chart_accounts_get_what_their_roles_grant_and_no_more(twin: ChartTwin) -> None:
    """RBAC is enforced: the agent's account may read its DaemonSet (the chart grants it)
    and not the cluster's Secrets; no component was refused anything during the run."""
    token = _token(twin, "powerflow-nodeagent")
    with httpx.Client(
        base_url=f"http://127.0.0.1:{twin.api_port}", headers={"Authorization": f"Bearer {token}"}
    ) as agent:
        own = agent.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/powerflow-nodeagent")
        assert own.status_code == 200, own.text
        secrets = agent.get("/api/v1/namespaces/kube-system/secrets")
        assert secrets.status_code == 403
        assert 'cannot list resource "secrets"' in secrets.json()["message"]
    logs = twin.logs(lines=10_000)
    assert "Forbidden" not in logs, logs[-3000:]


def test_a_failing_init_container_shows_as_kubectl_shows_it(twin: ChartTwin) -> None:
    """The chart's pod with ``cp -a`` in its init container (which cannot set the times
    of an emptyDir it does not own, as uid 10001) never starts: Init:Error, then
    Init:CrashLoopBackOff, as ``kubectl get pods`` would show."""
    assert twin.client is not None
    operator = next(
        o
        for o in twin.objects
        if o.get("kind") == "Deployment" and o["metadata"]["name"] == "powerflow-operator"
    )
    broken = copy.deepcopy(operator)
    broken["metadata"] = {"name": "broken-init", "namespace": NAMESPACE}
    labels = {"app": "broken-init"}
    broken["spec"]["selector"] = {"matchLabels": labels}
    broken["spec"]["template"]["metadata"] = {"labels": labels}
    init = broken["spec"]["template"]["spec"]["initContainers"][0]
    init["command"] = ["sh", "-c", "cp -a /opt/powerflow/numba-cache/. /numba-cache/"]
    twin.client.post(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", json=broken)
    seen: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "Init:CrashLoopBackOff" not in seen:
        for pod in twin.chart_pods():
            if pod["metadata"]["name"].startswith("broken-init-"):
                seen.add(pod_status_text(pod))
        time.sleep(0.5)
    twin.client.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/broken-init")
    assert "Init:CrashLoopBackOff" in seen, seen
    assert "preserving times" in twin.logs(lines=10_000)


def _budget(twin: ChartTwin) -> dict[str, str]:
    assert twin.client is not None
    answer = twin.client.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/powerflow-budget")
    answer.raise_for_status()
    data: dict[str, str] = answer.json()["data"]
    return data


def _workers(twin: ChartTwin) -> dict[str, str]:
    assert twin.client is not None
    pods = twin.client.get("/api/v1/namespaces/ml/pods").json()["items"]
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }


def _generations(twin: ChartTwin, prefix: str) -> dict[str, int]:
    """Each job's generation (``status.allocation.generation``): a checkpoint-restart,
    whatever its cause, starts a new one. Pods are no measure of it: a worker that
    finished its iterations leaves phase Running before its job's status says
    Succeeded."""
    return {
        j["metadata"]["name"]: int(
            ((j.get("status") or {}).get("allocation") or {}).get("generation", 0)
        )
        for j in twin.dljobs()
        if j["metadata"]["name"].startswith(prefix)
    }


def test_an_upgrade_keeps_the_admins_budget_and_the_running_jobs(
    twin: ChartTwin, run: tuple[float, float, dict[str, str]]
) -> None:
    """``helm upgrade`` to a new image tag with changed values, applied as Helm applies
    it (the chart rendered with its lookups against the cluster, a three-way merge per
    object): the admin's edit of the budget stays, every chart pod rolls to the new
    template and is ready again, the workers running before it are not restarted by
    it, and the jobs finish."""
    assert twin.client is not None
    twin.client.patch(
        f"/api/v1/namespaces/{NAMESPACE}/configmaps/powerflow-budget",
        content=json.dumps({"data": {"eta": "0.5"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()
    for m in mini_trace(3, TimeScale(0.008), first=10):
        body = dljob(m, twin.gpus_per_node * len(twin.gpu_nodes))
        body["metadata"]["name"] = f"up-{m.name}"
        twin.dljob(body)
    # A limit, not a measure: on a loaded machine (CI runs this beside the suite) the
    # three jobs' workers took over 120 s.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_workers(twin)) < 3:
        time.sleep(1)
    running = {name: g for name, g in _generations(twin, "up-").items() if g}
    assert len(_workers(twin)) >= 3 and running, twin.dljobs()
    tag = "localhost/powerflow:upgrade"
    subprocess.run(["buildah", "--storage-driver", "vfs", "tag", IMAGE, tag], check=True)
    try:
        twin.upgrade({"agent": {"windowSeconds": 4}, "budget": {"eta": 0.9}}, image=tag)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            pods = twin.chart_pods()
            images = {
                c["image"]
                for p in pods
                for c in p["spec"]["containers"]
                if "powerflow" in c["image"]
            }
            if images == {tag} and len(pods) == 4 and all(pod_ready(p) for p in pods):
                break
            time.sleep(1)
        assert images == {tag} and len(pods) == 4, twin.pods_table()
        assert _budget(twin)["eta"] == "0.5"  # the admin's, not the values'
        agents = [p for p in pods if p["metadata"]["name"].startswith("powerflow-nodeagent")]
        for agent in agents:
            assert "--window=4" in agent["spec"]["containers"][0]["args"]
        after = _generations(twin, "up-")
        assert {name: after[name] for name in running} == running, twin.dljobs()
        deadline = time.monotonic() + 300
        phases: set[str] = set()
        while time.monotonic() < deadline:
            phases = {
                (j.get("status") or {}).get("phase", "")
                for j in twin.dljobs()
                if j["metadata"]["name"].startswith("up-")
            }
            if phases == {"Succeeded"}:
                break
            time.sleep(2)
        assert phases == {"Succeeded"}, twin.dljobs()
    finally:
        subprocess.run(["buildah", "--storage-driver", "vfs", "rmi", tag], check=False)
