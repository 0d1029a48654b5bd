"""``Twin``: the whole system on this machine, and a trace run to completion on it.

::

    with Twin(folder, nodes=2, gpus_per_node=8, scale=TimeScale(0.02)) as twin:
        result = twin.run(mini_trace(24, TimeScale(0.02)))

``start`` brings up, in order: the emulated API server (a process) with the nodes
(``nvidia.com/gpu`` allocatable, Ready) and the budget ConfigMap; one
ServiceAccount token per node agent (registered with the emulator's
TokenReview, as the kubelet projects them); the extender and the operator
(processes, ``components``); the twin's GPUs, served to the node agents
(processes too, ``agentproc``); the kubelet;
the scheduler. ``run`` applies each job's DLJob at its submission time,
waits until every DLJob is ``Succeeded`` (or ``Failed``), and returns each
job's JCT (from its submission to the moment the twin saw it finish) and the
GPUs' energy. The parts stay reachable for fault tests and the demo:
``twin.operator.signal(SIGKILL)`` then ``twin.operator.start()``,
``twin.agents[node].kill()`` (SIGKILL), ``.stop()`` (SIGTERM), ``.start()``,
``twin.gpu_server.journal`` (every GPU setting the agents made),
``twin.api`` (the API server's process),
``twin.scheduler.stats``, ``twin.kubelet.stats``. Node faults: ``fail_node`` and
``restore_node`` (the machine dies and boots again: its kubelet and node agent with
it; ``twin.nodelife``, kube-controller-manager's node lifecycle, marks it and evicts
its pods), ``fence_node`` (an admin's ``node.kubernetes.io/out-of-service`` taint),
``fail_gpu`` (the device plugin reports a GPU unhealthy).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from powerflow.core import contract
from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.sim.config import INTERVAL_S, RESTART_S
from powerflow.lab.twin.agentproc import GpuServer
from powerflow.lab.twin.apiserver import write_kubeconfig
from powerflow.lab.twin.components import (
    Agent,
    Process,
    apiserver_process,
    extender_process,
    operator_process,
)
from powerflow.lab.twin.gpus import TwinGpus, totals
from powerflow.lab.twin.kubelet import Kubelet
from powerflow.lab.twin.nodelife import OUT_OF_SERVICE, NodeLifecycle, grace_s, toleration_s
from powerflow.lab.twin.ports import free_port
from powerflow.lab.twin.scheduler import Scheduler
from powerflow.lab.twin.timescale import DEFAULT, SAMPLE_WINDOW_S, TimeScale
from powerflow.lab.twin.trace import NAMESPACE, MiniJob, dljob

log = logging.getLogger(__name__)
MERGE = {"Content-Type": "application/merge-patch+json"}
TICKS_PER_WINDOW = 5
"""The simulated GPUs' clock steps at least this many times per node-agent window
(``gpu_tick_s``). A window's energy is the difference of the counters at its two ends,
which move only at a step; the agent drops a window whose counters did not move. With
the step (0.1 s) twice the scaled window (0.05 s at ``TimeScale(0.01)``), a window
either saw no step (dropped) or one step's energy in less than a step's time: the
windows measured 1.8 times the counters' power (``tests/test_twin.py``), the
operator's power ratio (the largest over an hour: the whole run) reached 1.14 in a
run here, and the operator planned against the lowered limit for the rest of the run
(docs/twin.md, "Agreement with `powerflow simulate`")."""
USER_AGENT = "twin-harness"
"""The ``User-Agent`` of the twin's own clients (the user's DLJobs, the kubelet, the
scheduler: ``twin-*``), apart from the product's, so that API faults can be aimed
at the product alone (``api_faults``' ``user_agent`` pattern)."""
NODE_EXTRA = "authentication.kubernetes.io/node-name"
DLJOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
"""Where the twin's user puts its DLJobs."""


@dataclass(frozen=True)
class JobOutcome:
    name: str
    submit_s: float
    finish_s: float
    phase: str
    generations: int = 1
    """Worker generations the job went through (``status.allocation.generation``): 1
    when it never restarted; each rescale, move, resume after a preemption, restart
    after a failure or retry after a refused create adds one."""

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.submit_s

    @property
    def restarts(self) -> int:
        return max(self.generations - 1, 0)


@dataclass(frozen=True)
class TwinResult:
    jobs: tuple[JobOutcome, ...]
    active_energy_j: float
    """Energy of GPUs while they trained (what ``simulate`` counts per job)."""
    idle_energy_j: float
    makespan_s: float

    @property
    def avg_jct_s(self) -> float:
        return sum(j.jct_s for j in self.jobs) / len(self.jobs)

    @property
    def restarts(self) -> int:
        """New generations of all jobs after their first: ``simulate``'s ``restarts``
        (rescales, moves, resumes after a preemption), plus what the simulator does
        not have (restarts after a failure, retries after a refused create)."""
        return sum(j.restarts for j in self.jobs)


def gpu_tick_s(scale: TimeScale) -> float:
    """The step of the twin's GPU clock: ``TICKS_PER_WINDOW`` per agent window, at most
    0.1 s (0.01 s at ``TimeScale(0.01)``, as ``powerflow nodeagent --simulate``'s)."""
    return min(0.1, scale(SAMPLE_WINDOW_S) / TICKS_PER_WINDOW)


@dataclass(frozen=True)
class StatusChange:
    """A DLJob's decision-bearing status as one poll of ``Twin.states`` saw it (phase,
    generation, GPUs, nodes, message), kept when it differs from the poll before: a
    run's churn read job by job (``Twin.changes``)."""

    at_s: float
    """``time.monotonic()`` of the poll."""
    phase: str
    generation: int
    gpus: int
    nodes: tuple[str, ...]
    message: str

    def describe(self, start_s: float) -> str:
        where = ",".join(self.nodes) or "-"
        return (
            f"{self.at_s - start_s:8.2f} s  g{self.generation} {self.phase:<11} "
            f"{self.gpus:>2} GPUs on {where}: {self.message}"
        )


def status_change(body: Mapping[str, Any], at_s: float) -> StatusChange:
    status = body.get("status") or {}
    alloc = status.get("allocation") or {}
    phase, generation = job_state(body)
    gpus = alloc.get("gpus", 0)
    nodes = alloc.get("nodes") or []
    return StatusChange(
        at_s,
        phase,
        generation,
        gpus if isinstance(gpus, int) else 0,
        tuple(str(n) for n in nodes) if isinstance(nodes, list) else (),
        str(status.get("message") or ""),
    )


def job_state(body: Mapping[str, Any]) -> tuple[str, int]:
    """A DLJob's phase and worker generation, from its body as the API server lists it."""
    status = body.get("status") or {}
    generation = (status.get("allocation") or {}).get("generation", 0)
    return str(status.get("phase", "")), generation if isinstance(generation, int) else 0


def product_label(gpu: GpuSpec) -> str:
    """The ``nvidia.com/gpu.product`` label GPU feature discovery writes for ``gpu``: its
    NVML product name with dashes for spaces."""
    return (gpu.nvml_names[0] if gpu.nvml_names else f"NVIDIA {gpu.name}").replace(" ", "-")


def node_body(name: str, gpus: int, gpu: GpuSpec = A100) -> dict[str, Any]:
    """A GPU node as its kubelet and the NVIDIA device plugin register it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                contract.GPU_PRODUCT_LABEL: product_label(gpu),
                "kubernetes.io/hostname": name,
            },
        },
        "status": {
            "capacity": {contract.GPU_RESOURCE: str(gpus)},
            "allocatable": {contract.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        },
    }


@dataclass(frozen=True)
class Timing:
    """The twin's durations that the simulator also has, at full size (the twin scales
    them, as it does the trace): what a run of the twin is compared with
    ``powerflow simulate`` on."""

    interval_s: float = INTERVAL_S
    """The budget ConfigMap's ``schedulingIntervalSeconds`` (the simulator's
    ``interval_s``)."""
    restart_s: float = RESTART_S
    """A worker's checkpoint-restart cost (the simulator's ``restart_s``)."""
    checkpoint_s: float | None = None
    """How often a training worker checkpoints (None: only when its pod is deleted,
    which is all the simulator assumes; a node fault loses what was reached since)."""


class Twin:
    """The twin (see the module docstring). ``scale``: the time scale of everything the
    simulator also times (``timescale``); ``eta``: the budget ConfigMap's ``eta``;
    ``timing``: the run's durations at full size (``Timing``); ``fault_control``: the
    API server's fault routes open (``apiserver.FaultControl(twin.client)``);
    ``nodes``: how many A100 nodes, or each node's GPU type (its product label and its
    simulated GPUs')."""

    def __init__(
        self,
        folder: Path,
        *,
        nodes: int | tuple[GpuSpec, ...] = 2,
        gpus_per_node: int = 8,
        scale: TimeScale = DEFAULT,
        eta: float = 1.0,
        seed: int = 0,
        timing: Timing = Timing(),
        fault_control: bool = False,
    ) -> None:
        types = (A100,) * nodes if isinstance(nodes, int) else nodes
        self.folder = folder
        self.node_names = tuple(f"node-{i}" for i in range(len(types)))
        self.gpu_types: dict[str, GpuSpec] = dict(zip(self.node_names, types, strict=True))
        """Each node's GPU type (its product label and its GPUs' ground truth)."""
        self.gpus_per_node = gpus_per_node
        self.scale = scale
        self.eta, self.seed, self.timing = eta, seed, timing
        self._stopped = threading.Event()
        self._polls = threading.Lock()
        """Serialises ``states``: ``run`` polls on a test's worker thread while the test
        may poll too, and ``changes`` must stay in time order."""
        self.nodelife: NodeLifecycle | None = None
        self.fault_control = fault_control
        self.api: Process | None = None
        self.url = ""
        self.gpus: dict[str, TwinGpus] = {}
        self.gpu_server: GpuServer | None = None
        self.agents: dict[str, Agent] = {}
        self.operator: Process | None = None
        self.extender: Process | None = None
        self.kubelet: Kubelet | None = None
        self.scheduler: Scheduler | None = None
        self.client: httpx.Client | None = None
        self.ingest_url = ""
        """The operator's sample ingest (``contract.SAMPLES_PATH``), once started."""
        self.extender_url = ""
        """The extender's base URL (the scheduler's ``urlPrefix``), once started."""
        self.changes: dict[str, list[StatusChange]] = {}
        """Each DLJob's status changes as ``states`` saw them (``StatusChange``)."""

    def gpu_clock(self) -> float:
        """``time.monotonic`` in steps of ``gpu_tick_s(scale)``: a burst of reads (the
        agent's metrics, the workers' polls) costs one noisy draw per GPU, not one per
        read (``powerflow nodeagent --simulate`` rounds its clock the same way)."""
        tick = gpu_tick_s(self.scale)
        return math.floor(time.monotonic() / tick) * tick

    @property
    def cluster_gpus(self) -> int:
        return len(self.node_names) * self.gpus_per_node

    def start(self) -> Twin:
        self.folder.mkdir(parents=True, exist_ok=True)
        tokens = [
            {
                "token": self.token(name),
                "username": contract.AGENT_ACCOUNT,
                "groups": ["system:serviceaccounts", "system:serviceaccounts:powerflow-system"],
                "extra": {NODE_EXTRA: [name]},
                "audiences": [contract.INGEST_AUDIENCE],
            }
            for name in self.node_names
        ]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        tolerate = toleration_s(self.scale)
        self.api = apiserver_process(
            self.folder, port, tokens, toleration_s=tolerate, fault_control=self.fault_control
        ).start()
        client = self.client = httpx.Client(
            base_url=self.url, timeout=30.0, headers={"User-Agent": USER_AGENT}
        )
        for name in self.node_names:
            body = node_body(name, self.gpus_per_node, self.gpu_types[name])
            ok = client.post("/api/v1/nodes", json=body)
            ok.raise_for_status()
        client.post(
            "/api/v1/namespaces/powerflow-system/configmaps", json=self.budget_configmap()
        ).raise_for_status()
        kubeconfig = write_kubeconfig(self.folder / "kubeconfig", self.url)
        ingest_port = free_port()
        ext_port = free_port()
        self.ingest_url = f"http://127.0.0.1:{ingest_port}{contract.SAMPLES_PATH}"
        self.extender_url = f"http://127.0.0.1:{ext_port}"
        self.extender = extender_process(kubeconfig, self.folder, ext_port)
        self.operator = operator_process(kubeconfig, self.folder, ingest_port, scale=self.scale)
        for i, name in enumerate(self.node_names):
            gpus = TwinGpus(
                self.gpus_per_node,
                node=name,
                seed=self.seed + i,
                clock=self.gpu_clock,
                gpu=self.gpu_types[name],
            )
            self.gpus[name] = gpus
        self.gpu_server = GpuServer(self.gpus, self.folder / "gpu-server.key").start()
        for name in self.node_names:
            token_file = self.folder / f"token-{name}"
            token_file.write_text(self.token(name))
            self.agents[name] = Agent(
                name,
                self.gpus[name],
                kubeconfig,
                scale=self.scale,
                ingest_url=f"http://127.0.0.1:{ingest_port}",
                token_file=token_file,
                gpu_server=self.gpu_server,
                folder=self.folder,
            )
        # Every component launched, then each waited for: their start-ups (an
        # interpreter's imports each, the agents' first passes) overlap instead of
        # adding up (docs/verification.md, "CI time"). None needs another to be up: an
        # agent's samples wait in its queue until the operator's ingest answers.
        launched = [self.extender, self.operator, *(a.process for a in self.agents.values())]
        for process in launched:
            process.launch()
        for process in launched:
            process.wait_ready()
        checkpoint_s = self.timing.checkpoint_s
        self.kubelet = Kubelet(
            self.url,
            self.gpus,
            {n: a.port for n, a in self.agents.items()},
            startup_s=self.scale(self.timing.restart_s),
            checkpoint_s=None if checkpoint_s is None else self.scale(checkpoint_s),
        ).start()
        self.nodelife = NodeLifecycle(self.url, grace_s=grace_s(self.scale)).start()
        self.scheduler = Scheduler(self.url, f"http://127.0.0.1:{ext_port}", seed=self.seed).start()
        return self

    @staticmethod
    def token(node: str) -> str:
        """The node agent's projected ServiceAccount token (the emulator's TokenReview
        knows it: the agents' account, the node named in its extra)."""
        return f"twin-agent-token-{node}"

    def budget_configmap(self) -> dict[str, Any]:
        data = {
            "eta": f"{self.eta:g}",
            "schedulingIntervalSeconds": f"{self.scale(self.timing.interval_s):g}",
        }
        return {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": data}

    def submit(self, job: MiniJob) -> None:
        assert self.client is not None
        body = dljob(job, self.cluster_gpus)
        self.client.post(DLJOBS, json=body).raise_for_status()

    def phases(self) -> dict[str, str]:
        return {name: phase for name, (phase, _) in self.states().items()}

    def states(self) -> dict[str, tuple[str, int]]:
        """Each DLJob's phase and worker generation; a change of its status since the
        last call is kept in ``changes``."""
        assert self.client is not None
        with self._polls:
            items = self.client.get(DLJOBS).json()["items"]
            now = time.monotonic()
            for item in items:
                change = status_change(item, now)
                seen = self.changes.setdefault(item["metadata"]["name"], [])
                if not seen or replace(seen[-1], at_s=now) != change:
                    seen.append(change)
        return {i["metadata"]["name"]: job_state(i) for i in items}

    def run(self, jobs: tuple[MiniJob, ...], *, timeout_s: float = 600.0) -> TwinResult:
        """Submit ``jobs`` on their submission times (relative to now), wait until all end
        (``timeout_s`` real seconds at most: a TimeoutError naming the unfinished)."""
        start = time.monotonic() - min(j.job.submit_s for j in jobs)
        active0, idle0 = totals(self.gpus)
        pending = sorted(jobs, key=lambda j: j.job.submit_s)
        finish: dict[str, tuple[float, str, int]] = {}
        deadline = time.monotonic() + timeout_s
        while len(finish) < len(jobs):
            now = time.monotonic() - start
            while pending and pending[0].job.submit_s <= now:
                self.submit(pending.pop(0))
            try:
                states = self.states()
            except httpx.HTTPError as exc:  # a slow moment of the API server: ask again
                log.warning("twin: reading the DLJobs: %s", exc)
                states = {}
            for name, (phase, generation) in states.items():
                if phase in ("Succeeded", "Failed") and name not in finish:
                    finish[name] = (time.monotonic() - start, phase, generation)
            if self._stopped.is_set():  # a failing test's teardown: end now, not at the timeout
                raise RuntimeError("the twin was stopped during the run")
            if time.monotonic() > deadline:
                left = sorted({j.name for j in jobs} - set(finish))
                raise TimeoutError(f"jobs not finished in {timeout_s:g} s: {left}")
            time.sleep(0.05)
        active, idle = totals(self.gpus)
        outcomes = tuple(JobOutcome(j.name, j.job.submit_s, *finish[j.name]) for j in jobs)
        makespan = max(o.finish_s for o in outcomes) - min(o.submit_s for o in outcomes)
        return TwinResult(outcomes, active - active0, idle - idle0, makespan)

    def fail_node(self, node: str) -> list[str]:
        """The node's machine dies: its workers stop, its node agent is killed (no
        clean-up of its runs: the machine lost power), its kubelet falls silent
        (``Kubelet.fail_node``). The pods whose workers died."""
        assert self.kubelet is not None
        dead = self.kubelet.fail_node(node)
        self.agents[node].kill()
        return dead

    def restore_node(self, node: str) -> None:
        """The node boots again: its node agent starts (clocks back to default), its
        kubelet reports ``Ready`` (``Kubelet.restore_node``)."""
        assert self.kubelet is not None
        self.agents[node].start()
        self.kubelet.restore_node(node)

    def fence_node(self, node: str, *, on: bool = True) -> None:
        """What an admin does once a dead node is known to be off (non-graceful node
        shutdown): the ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``
        taint; ``on=False`` removes it (the node is back)."""
        assert self.client is not None
        body = self.client.get(f"/api/v1/nodes/{node}").json()
        taints = [t for t in body.get("spec", {}).get("taints") or [] if t["key"] != OUT_OF_SERVICE]
        if on:
            taints.append({"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"})
        patch = {
            "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
            "spec": {"taints": taints or None},
        }
        self.client.patch(f"/api/v1/nodes/{node}", json=patch, headers=MERGE).raise_for_status()

    def stop(self) -> None:
        self._stopped.set()
        if self.nodelife is not None:
            self.nodelife.stop()
        for part in (self.scheduler, self.kubelet):
            if part is not None:
                part.stop()
        processes = [a.process for a in self.agents.values()]
        processes += [p for p in (self.operator, self.extender) if p is not None]
        for process in processes:  # all asked to end at once, then each waited for
            process.signal(signal.SIGTERM)
        for process in processes:
            process.stop()
        if self.gpu_server is not None:
            self.gpu_server.stop()
        if self.client is not None:
            self.client.close()
        if self.api is not None:
            self.api.stop()

    def __enter__(self) -> Twin:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
