"""A simulated kubelet for the twin's nodes, and the workers it runs.

The kubelet (one thread for every node) does what a node's kubelet and the
NVIDIA device plugin do for PowerFlow's worker pods:

- a pod bound to one of its nodes becomes ``Running`` (``hostIP`` 127.0.0.1:
  the twin is one machine) and gets the GPU the extender's placement block
  names for it (the block's GPUs on the node, in worker-index order: what the
  node agent's ``--simulate`` mapping assumes too), as the device plugin's
  ``NVIDIA_VISIBLE_DEVICES`` would;
- its worker first spends ``startup_s`` (container start, model load, restore:
  the simulator's checkpoint-restart cost), then trains: its iterations are
  what its simulated GPU has run since (``TwinGpus``: the ground truth at the
  clock the node agent set, with the measurement noise), from the job's last
  checkpoint;
- it reports iterations as ``powerflow.worker`` does: ``AgentReporter`` (the
  library's own class) posts them to its node's agent at boundaries at least
  ``REPORT_INTERVAL_S`` apart, and the pod's ``powerflow.io/iterations``
  annotation is patched every ``progress_interval_s`` and once more at the end;
- at the job's total the worker exits 0: the pod becomes ``Succeeded``;
- a pod deleted stops its worker, which checkpoints the iterations it reached
  (the worker library's SIGTERM hook at the next boundary; the twin's
  checkpoint store plays the job's shared volume). The emulator removes a pod
  at once (it has no kubelet to wait for), so the checkpoint is taken when the
  kubelet sees it gone.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerflow import contract
from powerflow.twin.gpus import TwinGpus
from powerflow.worker.reporter import AgentReporter

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE = {"Content-Type": "application/merge-patch+json"}
REPORT_INTERVAL_S = 0.1
"""The worker library's ``min_interval_s`` between reports (real seconds)."""


def _env(pod: Obj) -> dict[str, str]:
    (container, *_) = pod["spec"]["containers"]
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


def gpu_of(pod: Obj, pods: list[Obj], node: str) -> int | None:
    """The GPU the device plugin gives ``pod``: the placement block's GPUs on ``node``,
    handed to the gang's pods on the node in worker-index order."""
    meta = pod["metadata"]
    raw = (meta.get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        block = sorted(int(g) for where, g in json.loads(raw)["block"] if where == node)
    except (ValueError, KeyError, TypeError):
        return None
    job = (meta.get("labels") or {}).get(contract.JOB_LABEL)

    def index(p: Obj) -> tuple[int, str]:
        labels = p["metadata"].get("labels") or {}
        return int(labels.get(contract.WORKER_INDEX_LABEL, 1 << 30)), p["metadata"]["name"]

    gang = sorted(
        (
            p
            for p in pods
            if p["metadata"].get("namespace") == meta.get("namespace")
            and (p["metadata"].get("labels") or {}).get(contract.JOB_LABEL) == job
            and (p["metadata"].get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION) == raw
            and (p.get("spec") or {}).get("nodeName") == node
        ),
        key=index,
    )
    names = [p["metadata"]["name"] for p in gang]
    rank = names.index(meta["name"]) if meta["name"] in names else -1
    return block[rank] if 0 <= rank < len(block) else None


@dataclass
class Worker:
    """One worker pod's trainer."""

    namespace: str
    pod: str
    uid: str
    job: str
    node: str
    gpu: int
    total: int
    started_s: float
    train_from_s: float
    base: int
    reporter: AgentReporter
    done: int = 0
    gpu_seen: int | None = None
    progress_at: float = -1e18
    written: int | None = None
    finished: bool = False
    reported_at: float = -1e18

    @property
    def iterations(self) -> int:
        return self.base + self.done


@dataclass
class KubeletStats:
    started: int = 0
    succeeded: int = 0
    checkpoints: int = 0
    lost_iterations: int = 0
    """Iterations reached but not checkpointed (0: the worker's hook always ran)."""
    finished_jobs: dict[str, float] = field(default_factory=dict)


class Kubelet:
    """The simulated kubelets of every node in ``gpus`` (one thread)."""

    def __init__(
        self,
        api: str,
        gpus: Mapping[str, TwinGpus],
        agent_ports: Mapping[str, int],
        *,
        now_s: Callable[[], float],
        real_s: Callable[[float], float],
        startup_s: float = 30.0,
        progress_interval_s: float = 30.0,
        tick_s: float = 0.02,
    ) -> None:
        self.api = httpx.Client(base_url=api, timeout=30.0)
        self.gpus = gpus
        self.agent_ports = agent_ports
        self.now_s = now_s
        self.real_s = real_s
        self.startup_s = startup_s
        self.progress_interval_s = progress_interval_s
        self.tick_s = tick_s
        self.workers: dict[str, Worker] = {}
        self.checkpoints: dict[tuple[str, str], int] = {}
        self.stats = KubeletStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="twin-kubelet", daemon=True)

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        for w in self.workers.values():
            w.reporter.close(0.5)
        self.api.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except httpx.HTTPError as exc:
                log.warning("kubelet: %s", exc)
            self._stop.wait(self.tick_s)

    def step(self) -> None:
        pods: list[Obj] = self.api.get("/api/v1/pods").json()["items"]
        live = {p["metadata"]["uid"]: p for p in pods}
        for uid in list(self.workers):
            pod = live.get(uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self._terminate(self.workers.pop(uid))
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if node not in self.gpus or pod["metadata"].get("deletionTimestamp"):
                continue
            uid = pod["metadata"]["uid"]
            if phase == "Pending" and uid not in self.workers:
                self._start(pod, pods, node)
        now = self.now_s()
        for w in list(self.workers.values()):
            self._train(w, now)

    def _start(self, pod: Obj, pods: list[Obj], node: str) -> None:
        gpu = gpu_of(pod, pods, node)
        if gpu is None:
            return  # not placed yet (the extender's bind writes the block with the node)
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        env = _env(pod)
        job = labels.get(contract.JOB_LABEL, meta["name"])
        key = (meta["namespace"], job)
        uuid = self.gpus[node].gpus()[gpu].uuid
        status = {
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        if not self.api.patch(path, json=status, headers=MERGE).is_success:
            return
        now = self.now_s()
        self.workers[meta["uid"]] = Worker(
            namespace=meta["namespace"],
            pod=meta["name"],
            uid=meta["uid"],
            job=job,
            node=node,
            gpu=gpu,
            total=int(env.get("POWERFLOW_ITERATIONS", "0")),
            started_s=now,
            train_from_s=now + self.startup_s,
            base=self.checkpoints.get(key, 0),
            reporter=AgentReporter(
                "127.0.0.1",
                self.agent_ports[node],
                namespace=meta["namespace"],
                pod=meta["name"],
                uid=meta["uid"],
                gpu_uuids=(uuid,),
            ),
        )
        self.stats.started += 1

    def _train(self, w: Worker, now: float) -> None:
        if w.finished or now < w.train_from_s:
            return
        gpus = self.gpus[w.node]
        ran = gpus.iterations_completed(w.gpu) if gpus.workload(w.gpu) is not None else 0
        if w.gpu_seen is None:
            w.gpu_seen = ran  # training starts now: what the GPU ran before was start-up
        delta = ran - w.gpu_seen if ran >= w.gpu_seen else ran  # reassigned: counts restart
        w.gpu_seen = ran
        w.done = min(w.done + delta, max(w.total - w.base, 0))
        real_now = self.real_s(now)
        if delta and real_now - w.reported_at >= REPORT_INTERVAL_S:
            w.reported_at = real_now
            w.reporter.offer(w.iterations)
        if w.iterations >= w.total:
            w.finished = True
            self._progress(w)
            self._exit(w, "Succeeded")
        elif now - w.progress_at >= self.progress_interval_s:
            w.progress_at = now
            self._progress(w)

    def _progress(self, w: Worker) -> None:
        if w.written == w.iterations:
            return
        body = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: str(w.iterations)}}}
        path = f"/api/v1/namespaces/{w.namespace}/pods/{w.pod}"
        if self.api.patch(path, json=body, headers=MERGE).is_success:
            w.written = w.iterations

    def _exit(self, w: Worker, phase: str) -> None:
        key = (w.namespace, w.job)
        self.checkpoints[key] = max(self.checkpoints.get(key, 0), w.iterations)
        w.reporter.close(0.5)
        self.workers.pop(w.uid, None)
        path = f"/api/v1/namespaces/{w.namespace}/pods/{w.pod}/status"
        self.api.patch(path, json={"status": {"phase": phase}}, headers=MERGE)
        self.stats.succeeded += 1

    def _terminate(self, w: Worker) -> None:
        """The pod was deleted: the worker's SIGTERM hook checkpoints where it is."""
        self._train(w, self.now_s())
        key = (w.namespace, w.job)
        self.checkpoints[key] = max(self.checkpoints.get(key, 0), w.iterations)
        self.stats.checkpoints += 1
        w.reporter.close(0.5)
