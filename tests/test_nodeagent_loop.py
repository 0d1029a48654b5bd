"""The node agent's control loop, started as ``powerflow nodeagent`` starts it.

Against the emulated API server (a kubeconfig file pointing at it) with
simulated A100s injected through ``serve``'s ``devices`` seam. Without a
kubelet socket the agent maps pods to GPUs by the extender's placement (the
``--simulate`` fallback) unless a PodResources source is given. Every check
polls ("eventually", generous); none asserts speed (the benchmark measures it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from powerflow.nodeagent.podresources import PodResourcesClient
from powerflow.nodeagent.pods import PodKey, PodView
from support.kube_emulator import KubeEmulator
from support.kubelet_podresources import FakeKubelet
from support.kubelet_podresources import pod as kubelet_pod
from support.kubelet_podresources import serve as serve_kubelet
from support.nodeagent_harness import (
    DLJOB_RESOURCE,
    NODE,
    PODS,
    NodeAgent,
    RecordingGpus,
    agent_args,
    create_worker,
    eventually,
    worker_pod,
)
from support.operator_harness import write_kubeconfig

from powerflow.commands.nodeagent import Parts
from powerflow.core import contract
from powerflow.core.gpus import A100

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
MERGE = {"Content-Type": "application/merge-patch+json"}
MIN_W, MAX_W = A100.min_power_limit_w, A100.max_power_w


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(DLJOB_RESOURCE, contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        node = {"metadata": {"name": NODE}, "status": {"allocatable": {contract.GPU_RESOURCE: "4"}}}
        assert (await client.post("/api/v1/nodes", json=node)).status_code == 201
        yield client


@pytest.fixture
def kubeconfig(kmock: KubeEmulator, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))


async def create(api: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await create_worker(api, body)
    assert response.status_code == 201, response.text


async def annotate(api: httpx.AsyncClient, name: str, **annotations: str | None) -> None:
    ann = {f"{contract.GROUP}/{k.replace('_', '-')}": v for k, v in annotations.items()}
    patch = {"metadata": {"annotations": ann}}
    response = await api.patch(f"{PODS}/{name}", json=patch, headers=MERGE)
    assert response.status_code == 200, response.text


async def events_of(api: httpx.AsyncClient, pod: str) -> list[dict[str, Any]]:
    items = (await api.get("/api/v1/namespaces/ns/events")).json()["items"]
    return [e for e in items if e["involvedObject"]["name"] == pod]


async def test_a_labelled_pod_its_job_does_not_control_sets_no_clock(
    api: httpx.AsyncClient, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The job label is anyone's to write: a pod with it but no controller, and one
    controlled by a DLJob of another name than its label, are another workload's. Their
    clock annotations set nothing, whatever GPUs they name; a worker beside them is
    clocked as ever."""
    gpus = RecordingGpus()
    squatter = worker_pod("t", 1, job="x", frequency_mhz="600")
    del squatter["metadata"]["ownerReferences"]
    assert (await api.post(PODS, json=squatter)).status_code == 201
    await create(api, worker_pod("u", 2, job="y", frequency_mhz="600"))
    relabel = {"metadata": {"labels": {contract.JOB_LABEL: "z"}}}
    assert (await api.patch(f"{PODS}/u", json=relabel, headers=MERGE)).status_code == 200
    await create(api, worker_pod("a", 0, frequency_mhz="1200"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(0) == 1200)
        assert gpus.locked(1) is None and gpus.locked(2) is None
        await annotate(api, "u", frequency_mhz="900")  # and no later change does
        await annotate(api, "a", frequency_mhz="1005")
        await eventually(lambda: gpus.locked(0) == 1005)
        assert gpus.locked(1) is None and gpus.locked(2) is None
    ignored = [r.getMessage() for r in caplog.records if "no DLJob of that name" in r.getMessage()]
    assert any("ns/t" in m for m in ignored) and any("ns/u" in m for m in ignored)


async def test_annotation_change_locks_the_pods_gpu_and_others_stay_default(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 2, frequency_mhz="1200"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(2) == 1200)
        assert [gpus.locked(i) for i in (0, 1, 3)] == [None, None, None]
        await annotate(api, "a", frequency_mhz="1005")
        await eventually(lambda: gpus.locked(2) == 1005)
        assert gpus.locks[2] == (1005, 1005)
        await annotate(api, "a", frequency_mhz=None)  # the operator takes the clock back
        await eventually(lambda: gpus.locked(2) is None)


async def test_gpu_of_a_deleted_pod_is_reset(api: httpx.AsyncClient, kubeconfig: Path) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 1, frequency_mhz="900", power_limit_watts="250"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(1) == 900 and gpus.power_limit_w(1) == 250)
        assert (await api.delete(f"{PODS}/a")).status_code == 200
        await eventually(lambda: gpus.locked(1) is None and gpus.power_limit_w(1) == MAX_W)


async def test_unsupported_clock_is_clamped_and_reported_once_as_an_event(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 0, frequency_mhz="1400"))  # A100: 15 MHz steps
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(0) == 1395)

        async def clamped() -> list[dict[str, Any]]:
            return await events_of(api, "a")

        (event,) = await _eventually_async(clamped)
        assert (event["type"], event["reason"]) == ("Warning", "ClockClamped")
        assert "1400 MHz" in event["message"] and "1395 MHz" in event["message"]
        assert event["involvedObject"]["kind"] == "Pod"
        pod = (await api.get(f"{PODS}/a")).json()
        assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
        await asyncio.sleep(1.5)  # passes go on (resync each second): no second Event
        assert len(await events_of(api, "a")) == 1


async def test_power_limit_annotation_is_applied_and_clamped(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 3, power_limit_watts="275.5"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.power_limit_w(3) == 275.5)
        assert gpus.locked(3) is None  # no clock asked: default clocks
        await annotate(api, "a", power_limit_watts="40")
        await eventually(lambda: gpus.power_limit_w(3) == MIN_W)

        async def clamped() -> list[dict[str, Any]]:
            return [e for e in await events_of(api, "a") if e["reason"] == "PowerLimitClamped"]

        (event,) = await _eventually_async(clamped)
        assert "40 W" in event["message"] and f"{MIN_W:g} W" in event["message"]
        await annotate(api, "a", power_limit_watts=None)
        await eventually(lambda: gpus.power_limit_w(3) == MAX_W)


async def test_powered_down_node_parks_idle_gpus_until_unmarked(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 0, frequency_mhz="1200"))
    lowest = A100.clocks_mhz[0]
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(0) == 1200)
        mark = {"metadata": {"annotations": {contract.POWERED_DOWN_ANNOTATION: "now"}}}
        await api.patch(f"/api/v1/nodes/{NODE}", json=mark, headers=MERGE)

        def parked() -> bool:
            return all(
                gpus.locked(i) == lowest and gpus.power_limit_w(i) == MIN_W for i in (1, 2, 3)
            )

        await eventually(parked)
        assert gpus.locked(0) == 1200 and gpus.power_limit_w(0) == MAX_W  # in use: not parked
        await create(api, worker_pod("b", 2, job="k", frequency_mhz="900"))  # used again
        await eventually(lambda: gpus.locked(2) == 900 and gpus.power_limit_w(2) == MAX_W)
        unmark = {"metadata": {"annotations": {contract.POWERED_DOWN_ANNOTATION: None}}}
        await api.patch(f"/api/v1/nodes/{NODE}", json=unmark, headers=MERGE)
        await eventually(
            lambda: all(gpus.locked(i) is None and gpus.power_limit_w(i) == MAX_W for i in (1, 3))
        )


async def test_restart_after_a_crash_resets_stale_settings_then_reapplies(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A crashed agent leaves clocks locked and limits set (nothing restored them);
    the next agent resets every GPU first, then applies what the pods say."""
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 1, frequency_mhz="1200"))
    async with NodeAgent(agent_args(kubeconfig), gpus) as first:
        await eventually(lambda: gpus.locked(1) == 1200)
        first.agent.applier.restore_defaults = lambda: ()  # the crash: no cleanup at exit
    assert gpus.locked(1) == 1200
    for gpu in (0, 3):  # what the crashed agent also left behind
        gpus.lock_clocks_mhz(gpu, 300, 300)
        gpus.set_power_limit_w(gpu, 150.0)
    await annotate(api, "a", frequency_mhz="1005")  # changed while no agent ran
    gpus.calls.clear()
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(1) == 1005)
        assert [gpus.locked(i) for i in (0, 2, 3)] == [None, None, None]
        assert [gpus.power_limit_w(i) for i in range(4)] == [MAX_W] * 4
        resets = [g for what, g in gpus.calls if what == "reset"]
        assert gpus.calls.index(("lock", 1)) > gpus.calls.index(("reset", 1))
        assert sorted(resets[:4]) == [0, 1, 2, 3]


async def test_stopping_restores_defaults_on_every_gpu(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 0, frequency_mhz="1200", power_limit_watts="200"))
    await create(api, worker_pod("b", 1, job="k", frequency_mhz="600"))
    agent = NodeAgent(agent_args(kubeconfig), gpus)
    async with agent:
        await eventually(lambda: gpus.locked(0) == 1200 and gpus.locked(1) == 600)
        await agent.stop()  # what SIGTERM does (the signal handler sets the same flag)
    assert agent.code == 0
    assert list(gpus.locks.values()) == [None] * 4
    assert [gpus.power_limit_w(i) for i in range(4)] == [MAX_W] * 4


async def test_a_gpu_raising_errors_never_stops_the_others(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    gpus.broken.add(1)
    await create(api, worker_pod("a", 1, frequency_mhz="1200"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await create(api, worker_pod("b", 2, job="k", frequency_mhz="900"))
        await eventually(lambda: gpus.locked(2) == 900)
        gpus.broken.clear()  # the GPU is back (reset by an admin): the next pass applies
        await eventually(lambda: gpus.locked(1) == 1200)


async def test_simulated_gpus_run_the_pods_model(api: httpx.AsyncClient, kubeconfig: Path) -> None:
    """``--simulate``: a pod with a model hint makes its GPU draw that model's power."""
    gpus = RecordingGpus()
    body = worker_pod("a", 2, frequency_mhz="1200", model="resnet50")
    await create(api, body)
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.workload(2) is not None)
        workload = gpus.workload(2)
        assert workload is not None
        assert (workload.model_name, workload.n, workload.local_batch_size) == ("resnet50", 1, 32)
        assert gpus.sm_clock_mhz(2) == 1200
        assert gpus.workload(0) is None
        assert (await api.delete(f"{PODS}/a")).status_code == 200
        await eventually(lambda: gpus.workload(2) is None)


async def test_podresources_decides_the_gpu_and_foreign_gpus_are_not_parked(
    api: httpx.AsyncClient, kubeconfig: Path, tmp_path: Path
) -> None:
    """The real PodResources client against a kubelet stand-in serving the gRPC
    API on a unix socket: the device plugin's choice wins over the placement."""
    gpus = RecordingGpus()
    uuids = [g.uuid for g in gpus.gpus()]
    kubelet = FakeKubelet()
    kubelet.pods = [
        kubelet_pod("ns", "a", {"trainer": {contract.GPU_RESOURCE: [uuids[3]]}}),
        kubelet_pod("other", "foreign", {"main": {contract.GPU_RESOURCE: [uuids[1]]}}),
    ]
    socket = str(tmp_path / "kubelet.sock")
    await create(api, worker_pod("a", 0, frequency_mhz="1200"))  # placement says 0
    mark = {"metadata": {"annotations": {contract.POWERED_DOWN_ANNOTATION: "now"}}}
    await api.patch(f"/api/v1/nodes/{NODE}", json=mark, headers=MERGE)
    client = PodResourcesClient(socket, timeout_s=0.5)
    async with NodeAgent(agent_args(kubeconfig), gpus, podresources=client):
        lowest = A100.clocks_mhz[0]
        async with serve_kubelet(kubelet, socket):
            await eventually(lambda: gpus.locked(3) == 1200 and gpus.locked(2) == lowest)
            assert gpus.locked(0) == lowest  # the placement was not where the device plugin put it
            assert gpus.locked(1) is None and gpus.power_limit_w(1) == MAX_W  # a foreign pod's
        # The kubelet goes away: the agent falls back to the placement.
        await eventually(lambda: gpus.locked(0) == 1200)


class FakeTelemetry:
    """The telemetry side as the loop sees it: a sweep clock per pod, reported UUIDs."""

    def __init__(self) -> None:
        self.on_clock_change: Any = None
        self.clocks: dict[PodKey, int] = {}
        self.uuids: dict[PodKey, tuple[str, ...]] = {}
        self.synced: list[tuple[set[PodKey], dict[PodKey, tuple[int, ...]]]] = []

    def sync(
        self, pods: Mapping[PodKey, PodView], gpus_of: Mapping[PodKey, tuple[int, ...]]
    ) -> None:
        self.synced.append((set(pods), dict(gpus_of)))

    def clock_for(self, pod: PodKey) -> int | None:
        return self.clocks.get(pod)

    def reported_uuids(self, pod: PodKey) -> tuple[str, ...]:
        return self.uuids.get(pod, ())

    def report(self, r: Any) -> str | None:
        return None


async def test_sweep_clock_and_reported_gpus_from_telemetry(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    gpus = RecordingGpus()
    telemetry = FakeTelemetry()
    telemetry.uuids[("ns", "a")] = (gpus.gpus()[2].uuid,)  # the worker said which GPU it sees

    def parts(*_: Any, **__: Any) -> Parts:
        return Parts(telemetry)

    await create(api, worker_pod("a", None, frequency_mhz="1200"))  # no placement at all
    async with NodeAgent(agent_args(kubeconfig), gpus, parts=parts):
        await eventually(lambda: gpus.locked(2) == 1200)
        assert telemetry.synced[-1] == ({("ns", "a")}, {("ns", "a"): (2,)})
        telemetry.clocks[("ns", "a")] = 600  # the sweep steps
        telemetry.on_clock_change()
        await eventually(lambda: gpus.locked(2) == 600)
        del telemetry.clocks[("ns", "a")]  # sweep over: back to frequency-mhz
        telemetry.on_clock_change()
        await eventually(lambda: gpus.locked(2) == 1200)


async def test_free_gpus_armed_for_a_starting_worker_until_it_reports_its_gpu(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """Without PodResources the agent learns a worker's GPU from its first report; until
    then the worker may already compute on any free GPU, so each runs at its plan."""
    gpus = RecordingGpus()
    telemetry = FakeTelemetry()

    def parts(*_: Any, **__: Any) -> Parts:
        return Parts(telemetry)

    await create(api, worker_pod("a", None, frequency_mhz="1200", power_limit_watts="250"))

    def settings() -> list[tuple[tuple[int, int] | None, float]]:
        return [(gpus.locks[i], gpus.power_limit_w(i)) for i in range(4)]

    async with NodeAgent(agent_args(kubeconfig), gpus, parts=parts):
        armed = [((A100.clocks_mhz[0], 1200), 250.0)] * 4  # idle ones may stay low
        await eventually(lambda: settings() == armed)
        telemetry.uuids[("ns", "a")] = (gpus.gpus()[2].uuid,)  # the first report
        telemetry.on_clock_change()
        want = [(None, MAX_W), (None, MAX_W), ((1200, 1200), 250.0), (None, MAX_W)]
        await eventually(lambda: settings() == want)


async def _eventually_async(check: Any, timeout: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"condition not met in {timeout} s")
        await asyncio.sleep(0.02)


NESTED = "[" * 10_000 + "]" * 10_000
"""10 KB of JSON nesting: Python's decoder raises RecursionError on it."""


async def test_a_deeply_nested_annotation_stops_nothing_and_never_lifts_a_cap(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """One pod on the node with a 10 KB ``[[[[`` annotation (Python's decoder raises
    RecursionError on it), and a tenant who sets one on their own worker: the bad field
    is a problem of that pod alone; the other pods' clocks apply and follow their
    changes; an unreadable clock or power limit puts the pod's GPU at its lowest
    settings until the operator writes it again."""
    gpus = RecordingGpus()
    bad = worker_pod("bad", None, frequency_mhz="1200", profile=NESTED)
    bad["metadata"]["annotations"][contract.PLACEMENT_ANNOTATION] = NESTED
    await create(api, bad)
    await create(api, worker_pod("a", 2, frequency_mhz="1005"))
    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: gpus.locked(2) == 1005)
        await annotate(api, "a", frequency_mhz="900")
        await eventually(lambda: gpus.locked(2) == 900)
        await annotate(api, "a", frequency_mhz=NESTED)
        lowest = A100.clocks_mhz[0]
        await eventually(lambda: gpus.locked(2) == lowest and gpus.power_limit_w(2) == MIN_W)
        await annotate(api, "a", frequency_mhz="1005")  # the operator writes it again
        await eventually(lambda: gpus.locked(2) == 1005 and gpus.power_limit_w(2) == MAX_W)


async def test_a_pod_the_kubelet_never_started_arms_the_free_gpus_for_arm_s_only(
    api: httpx.AsyncClient, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``status.startTime`` (a kubelet that never acknowledges the pod, or a
    tenant's pod) the arming bound counts from when the agent first saw the pod bound:
    the free GPUs go back to their defaults after ``ARM_S`` (1 s here), not never."""
    from powerflow.nodeagent import agent as agent_module
    from powerflow.nodeagent import settings as settings_module

    monkeypatch.setattr(settings_module, "ARM_S", 1.0)
    monkeypatch.setattr(agent_module, "ARM_S", 1.0)
    gpus = RecordingGpus()
    await create(api, worker_pod("a", None, frequency_mhz="1200", power_limit_watts="250"))

    def settings() -> list[tuple[tuple[int, int] | None, float]]:
        return [(gpus.locks[i], gpus.power_limit_w(i)) for i in range(4)]

    async with NodeAgent(agent_args(kubeconfig), gpus):
        await eventually(lambda: settings() == [((A100.clocks_mhz[0], 1200), 250.0)] * 4)
        await eventually(lambda: settings() == [(None, MAX_W)] * 4)


DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "powerflow-nodeagent", "namespace": "powerflow-system"},
    "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {}},
}
DAEMONSETS = "/apis/apps/v1/namespaces/powerflow-system/daemonsets"


async def test_a_rolling_update_never_leaves_a_workers_gpu_uncapped(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """With ``--daemonset`` (the chart's), an agent stopped while its DaemonSet exists (a
    rolling update: another agent follows) resets the free GPUs but leaves the workers'
    GPUs at their clock and power limit, and the next agent does not reset them before
    its first pass: the worker's GPU never runs at the board's defaults between the
    two. Once the DaemonSet is gone (uninstalled), a stop resets every GPU."""
    gpus = RecordingGpus()
    await create(api, worker_pod("a", 1, frequency_mhz="1200", power_limit_watts="250"))
    assert (await api.post(DAEMONSETS, json=DAEMONSET)).status_code == 201
    args = agent_args(kubeconfig, "--daemonset", "powerflow-system/powerflow-nodeagent")
    async with NodeAgent(args, gpus):
        await eventually(lambda: gpus.locked(1) == 1200 and gpus.power_limit_w(1) == 250)
        gpus.lock_clocks_mhz(3, 300, 300)  # a free GPU left at something odd
    assert (gpus.locked(1), gpus.power_limit_w(1)) == (1200, 250.0)
    assert gpus.locked(3) is None
    gpus.calls.clear()
    async with NodeAgent(args, gpus):  # the next agent of the rollout
        await eventually(lambda: bool(gpus.calls))
        await asyncio.sleep(0.5)
        assert ("reset", 1) not in gpus.calls
        assert (gpus.locked(1), gpus.power_limit_w(1)) == (1200, 250.0)
        deleted = await api.delete(f"{DAEMONSETS}/powerflow-nodeagent")
        assert deleted.status_code == 200
    assert gpus.locked(1) is None and gpus.power_limit_w(1) == MAX_W
