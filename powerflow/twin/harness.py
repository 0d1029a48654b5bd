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
``twin.scheduler.stats``, ``twin.kubelet.stats``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from powerflow import contract
from powerflow.commands.operator import AGENT_ACCOUNT
from powerflow.sim.config import INTERVAL_S, RESTART_S
from powerflow.twin.agentproc import GpuServer
from powerflow.twin.apiserver import write_kubeconfig
from powerflow.twin.components import (
    Agent,
    Process,
    apiserver_process,
    extender_process,
    free_port,
    operator_process,
)
from powerflow.twin.gpus import TwinGpus, totals
from powerflow.twin.kubelet import Kubelet
from powerflow.twin.scheduler import Scheduler
from powerflow.twin.timescale import DEFAULT, TimeScale
from powerflow.twin.trace import NAMESPACE, MiniJob, dljob

log = logging.getLogger(__name__)
MERGE = {"Content-Type": "application/merge-patch+json"}
GPU_TICK_S = 0.1
NODE_EXTRA = "authentication.kubernetes.io/node-name"


@dataclass(frozen=True)
class JobOutcome:
    name: str
    submit_s: float
    finish_s: float
    phase: str

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.submit_s


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


def node_body(name: str, gpus: int) -> dict[str, Any]:
    """A GPU node as its kubelet and the NVIDIA device plugin register it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB",
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


class Twin:
    """The twin (see the module docstring). ``scale``: the time scale of everything the
    simulator also times (``timescale``); ``eta``: the budget ConfigMap's ``eta``;
    ``interval_s``: its ``schedulingIntervalSeconds`` and ``restart_s`` a worker's
    checkpoint-restart cost, both at full size (the simulator's ``interval_s`` and
    ``restart_s``; the twin scales them)."""

    def __init__(
        self,
        folder: Path,
        *,
        nodes: int = 2,
        gpus_per_node: int = 8,
        scale: TimeScale = DEFAULT,
        eta: float = 1.0,
        interval_s: float = INTERVAL_S,
        restart_s: float = RESTART_S,
        seed: int = 0,
    ) -> None:
        self.folder = folder
        self.node_names = tuple(f"node-{i}" for i in range(nodes))
        self.gpus_per_node = gpus_per_node
        self.scale = scale
        self.eta, self.interval_s, self.restart_s, self.seed = eta, interval_s, restart_s, seed
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

    @staticmethod
    def gpu_clock() -> float:
        """``time.monotonic`` in steps of ``GPU_TICK_S``: a burst of reads (the agent's
        metrics, the workers' polls) costs one noisy draw per GPU, not one per read
        (``powerflow nodeagent --simulate`` rounds its clock the same way)."""
        return math.floor(time.monotonic() / GPU_TICK_S) * GPU_TICK_S

    @property
    def cluster_gpus(self) -> int:
        return len(self.node_names) * self.gpus_per_node

    def start(self) -> Twin:
        self.folder.mkdir(parents=True, exist_ok=True)
        tokens = [
            {
                "token": self.token(name),
                "username": AGENT_ACCOUNT,
                "groups": ["system:serviceaccounts", "system:serviceaccounts:powerflow-system"],
                "extra": {NODE_EXTRA: [name]},
                "audiences": [contract.INGEST_AUDIENCE],
            }
            for name in self.node_names
        ]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.api = apiserver_process(self.folder, port, tokens).start()
        client = self.client = httpx.Client(base_url=self.url, timeout=30.0)
        for name in self.node_names:
            ok = client.post("/api/v1/nodes", json=node_body(name, self.gpus_per_node))
            ok.raise_for_status()
        client.post(
            "/api/v1/namespaces/powerflow-system/configmaps", json=self.budget_configmap()
        ).raise_for_status()
        kubeconfig = write_kubeconfig(self.folder / "kubeconfig", self.url)
        ingest_port = free_port()
        ext_port = free_port()
        self.extender = extender_process(kubeconfig, self.folder, ext_port)
        self.operator = operator_process(kubeconfig, self.folder, ingest_port, scale=self.scale)
        self.extender.start()
        self.operator.start()
        for i, name in enumerate(self.node_names):
            gpus = TwinGpus(self.gpus_per_node, node=name, seed=self.seed + i, clock=self.gpu_clock)
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
            ).start()
        self.kubelet = Kubelet(
            self.url,
            self.gpus,
            {n: a.port for n, a in self.agents.items()},
            startup_s=self.scale(self.restart_s),
        ).start()
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
            "schedulingIntervalSeconds": f"{self.scale(self.interval_s):g}",
        }
        return {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": data}

    def submit(self, job: MiniJob) -> None:
        assert self.client is not None
        body = dljob(job, self.cluster_gpus)
        path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
        self.client.post(path, json=body).raise_for_status()

    def phases(self) -> dict[str, str]:
        assert self.client is not None
        path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
        items = self.client.get(path).json()["items"]
        return {i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in items}

    def run(self, jobs: tuple[MiniJob, ...], *, timeout_s: float = 600.0) -> TwinResult:
        """Submit ``jobs`` on their submission times (relative to now), wait until all end
        (``timeout_s`` real seconds at most: a TimeoutError naming the unfinished)."""
        start = time.monotonic() - min(j.job.submit_s for j in jobs)
        active0, idle0 = totals(self.gpus)
        pending = sorted(jobs, key=lambda j: j.job.submit_s)
        finish: dict[str, tuple[float, str]] = {}
        deadline = time.monotonic() + timeout_s
        while len(finish) < len(jobs):
            now = time.monotonic() - start
            while pending and pending[0].job.submit_s <= now:
                self.submit(pending.pop(0))
            try:
                phases = self.phases()
            except httpx.HTTPError as exc:  # a slow moment of the API server: ask again
                log.warning("twin: reading the DLJobs: %s", exc)
                phases = {}
            for name, phase in phases.items():
                if phase in ("Succeeded", "Failed") and name not in finish:
                    finish[name] = (time.monotonic() - start, phase)
            if time.monotonic() > deadline:
                left = sorted({j.name for j in jobs} - set(finish))
                raise TimeoutError(f"jobs not finished in {timeout_s:g} s: {left}")
            time.sleep(0.05)
        active, idle = totals(self.gpus)
        outcomes = tuple(
            JobOutcome(j.name, j.job.submit_s, finish[j.name][0], finish[j.name][1]) for j in jobs
        )
        makespan = max(o.finish_s for o in outcomes) - min(o.submit_s for o in outcomes)
        return TwinResult(outcomes, active - active0, idle - idle0, makespan)

    def stop(self) -> None:
        for part in (self.scheduler, self.kubelet):
            if part is not None:
                part.stop()
        for agent in self.agents.values():
            agent.stop()
        for proc in (self.operator, self.extender):
            if proc is not None:
                proc.stop()
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
