"""The twin: every component together, a mini trace to completion, and the simulator's
figures on the same jobs (``powerflow.lab.twin``, ``docs/twin.md``).

The run starts the operator and the extender as processes (as a user starts them), two
node agents on simulated GPUs, the kubelet and the scheduler, and runs the 20-job mini
trace of the default trace in real time. Tolerances are justified in docs/twin.md.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from powerflow.nodeagent.windows import JobShape, Reading, Windows

from powerflow.core import contract
from powerflow.core.devices import Workload
from powerflow.lab.twin.apiserver import ApiServer
from powerflow.lab.twin.compare import agreement, simulate_mini
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.lab.twin.harness import DLJOBS, Twin, TwinResult
from powerflow.lab.twin.kubelet import gpu_of, gpus_per_node
from powerflow.lab.twin.scheduler import feasible, gpu_request
from powerflow.lab.twin.timescale import SAMPLE_WINDOW_S, TimeScale
from powerflow.lab.twin.trace import mini_trace

NODES, GPUS = 2, 8
MINI_JOBS, MINI_SCALE, MINI_TIMEOUT_S = 20, TimeScale(0.01), 450
MINI_MAX_DURATION_S = 6000.0
JCT_TOLERANCE = 1.0
ENERGY_TOLERANCE = 0.15
RESTART_TOLERANCE = 0.5


def node(name: str, gpus: int, *, ready: bool = True, taints: list[Any] | None = None) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {contract.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(gpus: int, tolerations: list[Any] | None = None) -> Any:
    limits = {contract.GPU_RESOURCE: str(gpus)}
    return {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": limits}}],
            "tolerations": tolerations or [],
        },
    }


def test_scheduler_in_tree_filters_as_kube_scheduler() -> None:
    """NodeResourcesFit counts the GPUs bound and assumed; NotReady, cordoned and
    untolerated-taint nodes never reach the extender; the message lists why."""
    taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    nodes = [
        node("full", 8),
        node("free", 8),
        node("down", 8, ready=False),
        node("tainted", 8, taints=[taint]),
    ]
    names, why = feasible(pod(1), nodes, {"full": 8, "free": 7})
    assert names == ["free"]
    assert "1 Insufficient nvidia.com/gpu" in why
    assert "1 node(s) had untolerated taint" in why
    assert "1 node(s) were unschedulable or not ready" in why
    names, _ = feasible(pod(1, [{"key": "nvidia.com/gpu", "operator": "Exists"}]), nodes, {})
    assert names == ["full", "free", "tainted"]
    assert gpu_request(pod(2)) == 2


def test_kubelet_gives_the_block_gpus_first() -> None:
    """The device plugin's choice: the lowest free GPU of the extender's block on the
    node, then any free one; none before the block is written."""
    placed = pod(1)
    block = '{"node": "n1", "block": [["n1", 4], ["n1", 5], ["n2", 0]]}'
    placed["metadata"]["annotations"] = {contract.PLACEMENT_ANNOTATION: block}
    assert gpu_of(placed, "n1", 8, set()) == 4
    assert gpu_of(placed, "n1", 8, {4}) == 5
    assert gpu_of(placed, "n1", 8, {4, 5}) == 0
    assert gpu_of(pod(1), "n1", 8, set()) is None
    assert gpus_per_node(block) == 2


def test_emulator_with_a_bounded_log_serves_every_write() -> None:
    """The twin's API server keeps only the last requests in kmock's log (kmock scans
    the whole log per request: seconds per call after a few minutes of a twin); writes,
    whose results are kept by request, still answer each with its own object."""
    with ApiServer(keep_requests=10) as server, httpx.Client(base_url=server.url) as client:
        for i in range(60):
            body = {"metadata": {"name": f"cm{i}"}, "data": {"i": str(i)}}
            made = client.post("/api/v1/namespaces/ns/configmaps", json=body)
            assert made.status_code == 201 and made.json()["metadata"]["name"] == f"cm{i}"
            patch = {"data": {"j": str(i)}}
            merge = {"Content-Type": "application/merge-patch+json"}
            done = client.patch(
                f"/api/v1/namespaces/ns/configmaps/cm{i}", json=patch, headers=merge
            )
            assert done.json()["data"] == {"i": str(i), "j": str(i)}
        assert len(client.get("/api/v1/namespaces/ns/configmaps").json()["items"]) == 60
        assert server.emulator is not None
        assert len(server.emulator._requests) <= 21


def test_windows_over_the_twins_gpus_measure_their_power(tmp_path: Path) -> None:
    """The node agent's windows (``nodeagent.windows``) over the twin's GPUs, read at
    a worker's iteration reports as the agent reads them, measure the power the GPUs'
    energy counters show over the whole time. With the GPU clock's step at 0.1 s,
    twice the scaled window, the windows measured 1.8 times that power (a window
    either saw no step and was dropped, or a step's energy in less than a step's time),
    and the operator planned against a lower limit for the rest of the run."""
    twin = Twin(tmp_path, nodes=1, gpus_per_node=8, scale=MINI_SCALE)
    gpus = TwinGpus(8, node="n", seed=0, clock=twin.gpu_clock)
    gpus.assign(0, Workload("resnet50", 1, 1, 128))
    windows = Windows(MINI_SCALE(SAMPLE_WINDOW_S))
    shape = JobShape("ns", "j", generation=1, n=1, gpus_per_node=1, local_batch_size=128)
    rng = random.Random(0)
    start_s, start_mj = time.monotonic(), gpus.total_energy_mj(0)
    samples = []
    iterations = 0
    while time.monotonic() - start_s < 1.5:
        time.sleep(rng.uniform(0.005, 0.02))  # a training step, then the lead reports
        iterations += 1
        reading = Reading(time.monotonic(), iterations, (gpus.total_energy_mj(0),))
        sample = windows.observe(
            "j", shape, "w0", (0,), reading, frequency_mhz=1410, next_clock_mhz=1410
        )
        if sample is not None:
            samples.append(sample)
    end_s, end_mj = time.monotonic(), gpus.total_energy_mj(0)
    counters_w = (end_mj - start_mj) / 1000.0 / (end_s - start_s)
    joules = sum(s.energy_j * s.iterations for s in samples)
    seconds = sum(s.step_time_s * s.iterations for s in samples)
    assert len(samples) >= 10
    assert joules / seconds == pytest.approx(counters_w, rel=0.1)


def test_states_keep_each_jobs_status_changes(tmp_path: Path) -> None:
    """``Twin.changes``, what a failure on restarts prints: one entry per change of a
    job's phase, generation, GPUs, nodes or message, none for a poll that saw no change."""
    twin = Twin(tmp_path, nodes=1, gpus_per_node=8, scale=MINI_SCALE)
    job = mini_trace(1, MINI_SCALE)[0]
    status = f"{DLJOBS}/{job.name}/status"
    merge = {"Content-Type": "application/merge-patch+json"}
    with ApiServer() as server, httpx.Client(base_url=server.url) as client:
        twin.client = client
        twin.submit(job)
        twin.states()
        alloc = {"generation": 1, "gpus": 4, "nodes": ["n0"]}
        patch = {"status": {"phase": "Running", "message": "4 GPUs", "allocation": alloc}}
        client.patch(status, json=patch, headers=merge).raise_for_status()
        twin.states()
        twin.states()
        patch = {"status": {"message": "checkpoint-restart from 4 to 8 GPUs"}}
        client.patch(status, json=patch, headers=merge).raise_for_status()
        assert twin.states() == {job.name: ("Running", 1)}
    seen = twin.changes[job.name]
    assert [(c.phase, c.generation, c.gpus, c.nodes, c.message) for c in seen] == [
        ("", 0, 0, (), ""),
        ("Running", 1, 4, ("n0",), "4 GPUs"),
        ("Running", 1, 4, ("n0",), "checkpoint-restart from 4 to 8 GPUs"),
    ]
    assert "g1 Running      4 GPUs on n0: 4 GPUs" in seen[1].describe(seen[0].at_s)


@pytest.mark.timeout(MINI_TIMEOUT_S + 120)
def test_mini_trace_runs_to_completion_and_agrees_with_simulate(tmp_path: Path) -> None:
    """The first 20 jobs of the default trace that took at most ``MINI_MAX_DURATION_S``
    there, scaled by ``MINI_SCALE``, on 2 x 8 GPUs, through every component: every job
    succeeds, a gang of all 16 GPUs among them, every worker was bound through the
    extender, no progress was lost, and the average JCT and the jobs' energy agree with
    the simulator's run of the same jobs within the tolerances that docs/twin.md states
    and justifies. The cap keeps the run about half as long as the first 20 jobs'
    (whose longest sets the end) with as many jobs and rescales."""
    jobs = mini_trace(MINI_JOBS, MINI_SCALE, max_duration_s=MINI_MAX_DURATION_S)
    sim = simulate_mini(jobs, nodes=NODES, gpus_per_node=GPUS, scale=MINI_SCALE)
    with Twin(tmp_path, nodes=NODES, gpus_per_node=GPUS, scale=MINI_SCALE) as twin:
        result = twin.run(jobs, timeout_s=MINI_TIMEOUT_S)
        assert twin.scheduler is not None and twin.kubelet is not None
        scheduler, kubelet = twin.scheduler.stats, twin.kubelet.stats
        widest = max(c.gpus for seen in twin.changes.values() for c in seen)
    assert widest == NODES * GPUS, f"no gang spanned both nodes (widest: {widest} GPUs)"
    assert sorted((j.name, j.phase) for j in result.jobs) == sorted(
        (job.name, "Succeeded") for job in jobs
    )
    # A pod the operator deletes (a rescale) after its bind but before the kubelet
    # starts it is bound and never started.
    assert 0 < kubelet.started <= scheduler.bound
    assert kubelet.lost_iterations == 0
    agree = agreement(result, sim)
    print(agree.describe())
    assert abs(agree.jct_diff) <= JCT_TOLERANCE, agree.describe()
    assert abs(agree.energy_diff) <= ENERGY_TOLERANCE, agree.describe()
    # The operator restarts jobs about as often as the simulator does (each one a
    # checkpoint-restart on a real cluster), not in a loop of rescales.
    if agree.twin_restarts > (1 + RESTART_TOLERANCE) * agree.sim_restarts:
        report = restart_report(result, twin, tmp_path)
        counts = f"started {kubelet.started}, died {kubelet.died}, rejected {kubelet.rejected}"
        raise AssertionError(f"{agree.describe()}\nkubelet: {counts}\n{report}")


def restart_report(result: TwinResult, twin: Twin, folder: Path) -> str:
    """What a failure on restarts needs to be understood from CI's output alone: the
    restarts job by job, the
    status changes of the three jobs restarted most (phase, generation, GPUs, nodes and
    the operator's message at each), and the operator's log but for kopf's routine lines
    (its handlers' successes) and health checks."""
    by_job = ", ".join(f"{j.name} {j.restarts}" for j in result.jobs if j.restarts)
    start = min((c.at_s for seen in twin.changes.values() for c in seen), default=0.0)
    most = sorted(result.jobs, key=lambda j: -j.restarts)[:3]
    timelines = [
        f"{job.name} (last 40 changes):\n"
        + "\n".join(c.describe(start) for c in twin.changes.get(job.name, [])[-40:])
        for job in most
    ]
    log = folder / "operator.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    routine = ("' succeeded.", " aiohttp.access ")  # kopf's handler lines, health checks
    lines = [line for line in text.splitlines() if not any(m in line for m in routine)]
    return (
        f"restarts by job: {by_job}\n"
        + "\n".join(timelines)
        + f"\noperator log ({len(lines)} lines):\n"
        + "\n".join(lines[-40:])
    )
