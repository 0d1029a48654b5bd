"""A simulated kubelet for the twin's nodes, and the workers it runs.

The kubelet (one thread for every node) does what a node's kubelet and the
NVIDIA device plugin do for PowerFlow's worker pods:

- a pod bound to one of its nodes becomes ``Running`` (``hostIP`` 127.0.0.1:
  the twin is one machine) and gets the GPU the extender's placement block
  names for it (the block's GPUs on the node, in worker-index order: what the
  node agent's ``--simulate`` mapping assumes too), as the device plugin's
  ``NVIDIA_VISIBLE_DEVICES`` would;
- its worker waits for the rendezvous (every worker of its generation
  started, as ``torchrun`` waits for ``WORLD_SIZE``), first spending
  ``startup_s`` when the job ran before (container
  start, model load, restore: the simulator's checkpoint-restart cost, which
  it charges on every start but the first), its GPU idle, then trains: its iterations are
  what its simulated GPU has run since (``TwinGpus``: the ground truth at the
  clock the node agent set, with the measurement noise), from the job's last
  checkpoint;
- it reports iterations as ``powerflow.worker`` does: ``AgentReporter`` (the
  library's own class) posts them to its node's agent at boundaries at least
  ``REPORT_INTERVAL_S`` apart, and once more at the end; the agent passes the
  counts on to the operator as the job's progress (no pod writes to the API server);
- at the job's total the worker exits 0: the pod becomes ``Succeeded``;
- a pod deleted stops its worker, which checkpoints the iterations it reached
  (the worker library's SIGTERM hook at the next boundary; the twin's
  checkpoint store plays the job's shared volume); then the kubelet deletes the
  pod with grace 0, which is when the API server lets it go (the twin's
  emulator runs with ``kubelets``); with ``checkpoint_s`` a worker also
  checkpoints that often while it trains, as a training script does;
- it renews its node's Lease (``kube-node-lease``) every ``lease_s``: the
  heartbeat the node lifecycle controller (``nodelife``) watches.

Faults (from any thread): ``fail_node`` (the machine dies: its workers stop
where they are, without a checkpoint, its Lease is no longer renewed and its
pods are left as they were: a terminating one stays terminating),
``restore_node`` (it boots again: it posts ``Ready``, finishes the deletions
left and fails the pods whose containers died with it: ``restartPolicy:
Never``), ``fail_gpu`` (the device plugin reports a GPU unhealthy: the node's
allocatable ``nvidia.com/gpu`` drops by one, as the kubelet's device manager
reports only healthy devices, and the worker on it dies, its pod ``Failed``;
no pod gets that GPU again, and a pod for which no healthy GPU is free is
rejected at admission, ``UnexpectedAdmissionError``, as the device manager does).

The workers, not the node agents, make the simulated GPUs compute: the agents
run without ``--simulate`` on the twin's GPUs (``TwinGpus``, through
``serve``'s ``devices`` seam), so they see pods and GPUs as on a real node:
which GPU a pod holds from its worker's reports (``gpuUuids``; there is no
PodResources socket), clocks and power limits set, power and energy read.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerflow.core import contract
from powerflow.core.devices import Workload
from powerflow.core.timefmt import format_time
from powerflow.lab.groundtruth import MODEL_NAMES
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.worker.reporter import AgentReporter

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE = {"Content-Type": "application/merge-patch+json"}
PROGRESS_INTERVAL_S = 5.0
"""The operator's ``--progress-interval`` in the twin (how often a job's progress and
energy are written to its status): not scaled (the simulator has no such writes, and
the operator learns that a job is done from its workers' exit or the agents' counts,
not from these), and short enough for the demo to show progress."""
NODE_LEASE_NS = "kube-node-lease"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NS}/leases"
REPORT_INTERVAL_S = 0.1
"""The worker library's ``min_interval_s`` between reports (real seconds)."""


def _env(pod: Obj) -> dict[str, str]:
    (container, *_) = pod["spec"]["containers"]
    return {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}


def requests_gpu(pod: Obj) -> bool:
    """Whether a container asks for a GPU: the twin's workers do; a pod that does not
    would run on the CPU, which the twin does not simulate (it stays ``Pending``)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(
        str(((c.get("resources") or {}).get("limits") or {}).get(contract.GPU_RESOURCE, "0"))
        not in ("", "0")
        for c in containers
        if isinstance(c, dict)
    )


def gpu_of(pod: Obj, node: str, gpus: int, taken: set[int]) -> int | None:
    """The GPU the device plugin gives ``pod`` on ``node``: the lowest free one of the
    extender's placement block there (the block is the extender's plan for these
    pods), else the lowest free one; None if the block is not written yet."""
    meta = pod["metadata"]
    raw = (meta.get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        block: list[int] = sorted(int(g) for where, g in json.loads(raw)["block"] if where == node)
    except (ValueError, KeyError, TypeError):
        block = []
    for gpu in [*block, *range(gpus)]:
        if gpu not in taken:
            return int(gpu)
    return None


def gpus_per_node(raw: str) -> int:
    """The placement block's GPUs per node (the most on any node: the models' ``r``)."""
    try:
        block = json.loads(raw)["block"]
    except (ValueError, KeyError, TypeError):
        return 1
    per_node: dict[str, int] = {}
    for where, _ in block:
        per_node[str(where)] = per_node.get(str(where), 0) + 1
    return max(per_node.values(), default=1)


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
    workload: Workload
    generation: str
    world: int
    started_s: float
    train_from_s: float
    base: int
    reporter: AgentReporter
    done: int = 0
    gpu_seen: int | None = None
    finished: bool = False
    reported_at: float = -1e18
    checkpointed_at: float = 0.0

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
    died: int = 0
    """Workers stopped by a fault (their node died, their GPU failed): no hook ran."""
    lost_in_faults: int = 0
    """Iterations those workers reached after their job's last checkpoint."""
    rejected: int = 0
    """Pods refused at admission: no healthy GPU free for them on their node."""
    events: list[tuple[float, str, str]] = field(default_factory=list)
    """(``time.monotonic()``, pod, what): started, training, succeeded, checkpointed."""


class Kubelet:
    """The simulated kubelets of every node in ``gpus`` (one thread)."""

    def __init__(
        self,
        api: str,
        gpus: Mapping[str, TwinGpus],
        agent_ports: Mapping[str, int],
        *,
        startup_s: float = 30.0,
        tick_s: float = 0.2,
        lease_s: float = 1.0,
        checkpoint_s: float | None = None,
        node_addresses: Mapping[str, str] | None = None,
    ) -> None:
        self.api = httpx.Client(base_url=api, timeout=30.0, headers={"User-Agent": "twin-kubelet"})
        self.gpus = gpus
        self.agent_ports = agent_ports
        self.node_addresses = dict(node_addresses or {})
        """Each node's address (its pods' ``hostIP``, where its agent listens): 127.0.0.1
        for a node not named, as in the twin whose nodes share this machine's network."""
        self.now_s = time.monotonic
        self.startup_s = startup_s
        self.tick_s = tick_s
        self.workers: dict[str, Worker] = {}
        self.checkpoints: dict[tuple[str, str], int] = {}
        self.stats = KubeletStats()
        self.lease_s, self.checkpoint_s = lease_s, checkpoint_s
        self.down: set[str] = set()
        """Nodes whose machine is dead (``fail_node``)."""
        self.unhealthy: dict[str, set[int]] = {}
        """Each node's GPUs the device plugin reports unhealthy (``fail_gpu``)."""
        self._renewed: dict[str, float] = {}
        self._lock = threading.RLock()
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
        with self._lock:
            self._step()

    def _step(self) -> None:
        self._renew_leases()
        pods: list[Obj] = self.api.get("/api/v1/pods").json()["items"]
        live = {p["metadata"]["uid"]: p for p in pods}
        for uid in list(self.workers):
            pod = live.get(uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self._terminate(self.workers.pop(uid))
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if not isinstance(node, str) or node not in self.gpus or node in self.down:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self._finish_deletion(pod)  # its worker (if any) checkpointed above
                continue
            uid = pod["metadata"]["uid"]
            if phase == "Pending" and uid not in self.workers and requests_gpu(pod):
                self._start(pod, pods, node)
        now = self.now_s()
        for w in list(self.workers.values()):
            self._train(w, now)

    def _renew_leases(self) -> None:
        """Each live node's heartbeat: its Lease's ``renewTime`` (created if missing)."""
        now = self.now_s()
        for node in self.gpus:
            if node in self.down or now - self._renewed.get(node, -1e18) < self.lease_s:
                continue
            stamp = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            spec = {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": stamp}
            path = f"{LEASES}/{node}"
            answer = self.api.patch(path, json={"spec": spec}, headers=MERGE)
            if answer.status_code == 404:
                lease = {"metadata": {"name": node, "namespace": NODE_LEASE_NS}, "spec": spec}
                answer = self.api.post(LEASES, json=lease)
            if answer.is_success:
                self._renewed[node] = now

    def _finish_deletion(self, pod: Obj) -> None:
        """The containers stopped: the kubelet's delete with grace 0 lets the pod go."""
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        self.api.request("DELETE", path, json=options)

    def _set_phase(self, pod: Obj, phase: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        status = {"status": {"phase": phase, "reason": reason, "message": message}}
        self.api.patch(path, json=status, headers=MERGE)

    def _start(self, pod: Obj, pods: list[Obj], node: str) -> None:
        if contract.PLACEMENT_ANNOTATION not in (pod["metadata"].get("annotations") or {}):
            return  # not placed yet (the extender's bind writes the block with the node)
        bad = self.unhealthy.get(node, set())
        taken = {w.gpu for w in self.workers.values() if w.node == node} | bad
        gpu = gpu_of(pod, node, len(self.gpus[node].gpus()), taken)
        if gpu is None:  # the device manager's admission: no healthy device free
            self.stats.rejected += 1
            message = (
                f"Allocate failed due to requested number of devices unavailable for "
                f"{contract.GPU_RESOURCE}. Requested: 1, Available: 0"
            )
            self._set_phase(pod, "Failed", "UnexpectedAdmissionError", message)
            self.stats.events.append((self.now_s(), pod["metadata"]["name"], "rejected"))
            return
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        model = annotations.get(contract.MODEL_ANNOTATION, "")
        if model not in MODEL_NAMES:  # the twin's trainer is a ground truth's model
            message = f"the twin simulates only the models {', '.join(MODEL_NAMES)}, not {model!r}"
            self._set_phase(pod, "Failed", "Error", message)
            self.stats.events.append((self.now_s(), meta["name"], "unknown model"))
            return
        env = _env(pod)
        per_node = gpus_per_node(annotations.get(contract.PLACEMENT_ANNOTATION, ""))
        job = labels.get(contract.JOB_LABEL, meta["name"])
        key = (meta["namespace"], job)
        uuid = self.gpus[node].gpus()[gpu].uuid
        started = format_time(time.time())
        status = {
            "status": {
                "phase": "Running",
                "startTime": started,  # as the kubelet acknowledges a pod
                "hostIP": self.node_addresses.get(node, "127.0.0.1"),
                "podIP": self.node_addresses.get(node, "127.0.0.1"),
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
            workload=Workload(
                annotations.get(contract.MODEL_ANNOTATION, ""),
                int(env.get("WORLD_SIZE", "1")),
                per_node,
                float(env.get("LOCAL_BATCH_SIZE", "1")),
            ),
            generation=env.get("POWERFLOW_GENERATION", ""),
            world=int(env.get("WORLD_SIZE", "1")),
            started_s=now,
            # The simulator's rule: a job's first start is free, every restart (a
            # rescale, a migration, a resume) costs the checkpoint-restart time.
            train_from_s=now + (self.startup_s if key in self.checkpoints else 0.0),
            base=self.checkpoints.get(key, 0),
            reporter=AgentReporter(
                self.node_addresses.get(node, "127.0.0.1"),
                self.agent_ports[node],
                namespace=meta["namespace"],
                pod=meta["name"],
                uid=meta["uid"],
                gpu_uuids=(uuid,),
            ),
        )
        self.stats.started += 1
        self.stats.events.append((now, meta["name"], f"started on {node} GPU {gpu}"))

    def _met(self, w: Worker, now: float) -> bool:
        """Whether the rendezvous is complete: every worker of the generation is up
        (``torchrun`` waits for ``WORLD_SIZE`` workers), each past its start-up."""
        gang = [
            o
            for o in self.workers.values()
            if (o.namespace, o.job, o.generation) == (w.namespace, w.job, w.generation)
        ]
        return len(gang) >= w.world and all(now >= o.train_from_s for o in gang)

    def _train(self, w: Worker, now: float) -> None:
        if w.finished:
            return
        gpus = self.gpus[w.node]
        if w.gpu_seen is None:
            if not self._met(w, now):
                return
            gpus.assign(w.gpu, w.workload)  # the trainer's kernels start
        ran = gpus.iterations_completed(w.gpu)
        if w.gpu_seen is None:
            w.gpu_seen = ran  # training starts now
            w.checkpointed_at = now
            self.stats.events.append((now, w.pod, f"training from {w.base}"))
        delta = ran - w.gpu_seen if ran >= w.gpu_seen else ran  # reassigned: counts restart
        w.gpu_seen = ran
        w.done = min(w.done + delta, max(w.total - w.base, 0))
        if self.checkpoint_s is not None and now - w.checkpointed_at >= self.checkpoint_s:
            w.checkpointed_at = now
            self._checkpoint(w, now)
        if delta and now - w.reported_at >= REPORT_INTERVAL_S:
            w.reported_at = now
            w.reporter.offer(w.iterations)
        if w.iterations >= w.total:
            w.finished = True
            self._exit(w, "Succeeded")

    def _exit(self, w: Worker, phase: str) -> None:
        key = (w.namespace, w.job)
        self.checkpoints[key] = max(self.checkpoints.get(key, 0), w.iterations)
        # The library's close: its last count reaches the agent (the job's progress).
        w.reporter.close(0.5, final=w.iterations)
        self.workers.pop(w.uid, None)
        self.gpus[w.node].clear(w.gpu)
        path = f"/api/v1/namespaces/{w.namespace}/pods/{w.pod}/status"
        self.api.patch(path, json={"status": {"phase": phase}}, headers=MERGE)
        self.stats.succeeded += 1
        self.stats.events.append((self.now_s(), w.pod, f"{phase} at {w.iterations}"))

    def _terminate(self, w: Worker) -> None:
        """The pod was deleted: the worker's SIGTERM hook checkpoints where it is."""
        self._train(w, self.now_s())
        key = (w.namespace, w.job)
        self.checkpoints[key] = max(self.checkpoints.get(key, 0), w.iterations)
        self.stats.checkpoints += 1
        self.gpus[w.node].clear(w.gpu)
        self.stats.events.append((self.now_s(), w.pod, f"checkpointed at {w.iterations}"))
        # The library's close: its last count reaches the agent (the job's progress).
        w.reporter.close(0.5, final=w.iterations)

    def _checkpoint(self, w: Worker, now: float) -> None:
        key = (w.namespace, w.job)
        if w.iterations > self.checkpoints.get(key, 0):
            self.checkpoints[key] = w.iterations
            self.stats.events.append((now, w.pod, f"checkpointed at {w.iterations}"))

    def _die(self, w: Worker, what: str) -> None:
        """The worker's process is gone without its hook: what it reached after its
        job's last checkpoint is lost."""
        self.workers.pop(w.uid, None)
        lost = max(w.iterations - self.checkpoints.get((w.namespace, w.job), 0), 0)
        self.stats.died += 1
        self.stats.lost_in_faults += lost
        self.gpus[w.node].clear(w.gpu)
        w.reporter.close(0.5)
        self.stats.events.append((self.now_s(), w.pod, f"{what} at {w.iterations}, lost {lost}"))

    # -- faults ----------------------------------------------------------------------------

    def fail_node(self, node: str) -> list[str]:
        """The node's machine dies: its workers stop where they are, nothing more of it
        reaches the API server (no Lease renewal, no pod status, no deletion finished).
        The pods whose workers died."""
        with self._lock:
            self.down.add(node)
            dead = [w for w in self.workers.values() if w.node == node]
            for w in dead:
                self._die(w, "died with its node")
            return [w.pod for w in dead]

    def restore_node(self, node: str) -> None:
        """The node boots again: the kubelet posts ``Ready`` and renews its Lease; pods
        that ran there lost their containers (``restartPolicy: Never``: ``Failed``), the
        terminating ones it deletes (next step), the bound, not started ones it starts."""
        with self._lock:
            self.down.discard(node)
            self._renewed.pop(node, None)
            self._renew_leases()  # first: a stale Lease beside Ready would read as dead again
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            body = {"status": {"conditions": [ready]}}
            self.api.patch(f"/api/v1/nodes/{node}/status", json=body, headers=MERGE)
            here = {"fieldSelector": f"spec.nodeName={node}"}
            for pod in self.api.get("/api/v1/pods", params=here).json()["items"]:
                phase = (pod.get("status") or {}).get("phase", "Pending")
                if phase == "Running" and not pod["metadata"].get("deletionTimestamp"):
                    message = "the container's state is unknown: its node restarted"
                    self._set_phase(pod, "Failed", "ContainerStatusUnknown", message)

    def fail_gpu_under(self, pick: Callable[[], Worker | None]) -> Worker | None:
        """Fails the GPU of the worker ``pick`` chooses (None: none yet), in one step: no
        worker ends, starts or takes that GPU between the choice and the failure, as none
        can between a real GPU's fault and its process's end."""
        with self._lock:
            worker = pick()
            if worker is not None:
                self.fail_gpu(worker.node, worker.gpu)
            return worker

    def fail_gpu(self, node: str, gpu: int) -> None:
        """The device plugin reports ``gpu`` unhealthy: the node's allocatable drops by
        one (capacity stays), then the worker on it dies and its pod is ``Failed``."""
        with self._lock:
            bad = self.unhealthy.setdefault(node, set())
            bad.add(gpu)
            healthy = len(self.gpus[node].gpus()) - len(bad)
            body = {"status": {"allocatable": {contract.GPU_RESOURCE: str(healthy)}}}
            self.api.patch(f"/api/v1/nodes/{node}/status", json=body, headers=MERGE)
            for w in [w for w in self.workers.values() if (w.node, w.gpu) == (node, gpu)]:
                self._die(w, f"GPU {gpu} failed")
                pod = {"metadata": {"namespace": w.namespace, "name": w.pod}}
                message = f"GPU {gpu} became unhealthy (Xid 79: fallen off the bus)"
                self._set_phase(pod, "Failed", "Error", message)
