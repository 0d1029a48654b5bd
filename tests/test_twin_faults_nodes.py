"""Node faults on the twin, with nothing lost (``docs/twin.md``, "Faults"): in one run
on 2 nodes of 4 GPUs, a node dies, comes back, then a GPU dies.

- A node dies with workers on it (``Twin.fail_node``: its workers stop without a
  checkpoint, its kubelet and node agent fall silent). The twin's node lifecycle
  controller marks it ``Ready`` ``Unknown`` and taints it ``unreachable``; its pods
  are evicted after their ``tolerationSeconds`` (the ``DefaultTolerationSeconds``
  admission's, scaled) and stay terminating, since their kubelet cannot finish the
  deletion. While they are there, the job waits: no second generation of a job ever
  lives beside the first (its old processes may still run and write its
  checkpoints). An admin fences the node (``node.kubernetes.io/out-of-service``):
  the pods are force-deleted, the job restarts from its last checkpoint on the
  healthy node; the node then comes back.
- Then a GPU becomes unhealthy under a worker (``Kubelet.fail_gpu_under``): its node's
  allocatable drops from 4 to 3, the worker dies and its pod is ``Failed``; the job
  restarts from its last checkpoint, no pod is ever given the bad GPU, no more than 3
  GPUs' worth of pods are ever bound to the node after it (the kubelet's admission
  would reject one), and none is rejected.
- Every job completes, no pod is created twice, no GPU is in two live gangs' blocks.

Real time at ``TimeScale(0.01)``; the workers checkpoint every 300 s of the trace
(3 s here), as a training script does, so a fault loses at most that much.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.twin_checks import POD_NAME, SEED, ProgressLog, Watch, bad_resumes, job_progress

from powerflow.core import contract
from powerflow.lab.twin.harness import Timing, Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import NAMESPACE, mini_trace

Obj = dict[str, Any]
SCALE = TimeScale(0.01)
GPUS = 4
"""Per node."""
CHECKPOINT_S = 300.0
"""Between two checkpoints of a training worker (trace seconds)."""
TIMING = Timing(checkpoint_s=CHECKPOINT_S)


class NodeWatch(Watch):
    """``Watch``, plus what node faults need: pods that exist (terminating ones
    included: their processes may still run), when each pod was added, and the
    checks that two generations of one job never exist at once and that no node
    ever holds more GPUs' worth of bound pods than its allocatable (``allocatable``,
    set by the test when it lowers it)."""

    def __post_init__(self) -> None:
        self.bound: set[str] = set()
        self.present: dict[str, Obj] = {}
        self.added_at: dict[str, float] = {}
        self.two_generations: list[str] = []
        self.allocatable: dict[str, int] = {}
        self.over: list[str] = []
        super().__post_init__()

    def _see(self, event: Obj) -> None:
        super()._see(event)
        pod = event["object"]
        name = pod["metadata"]["name"]
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if event["type"] == "ADDED":
            self.added_at.setdefault(name, time.monotonic())
        if event["type"] == "DELETED" or phase in ("Succeeded", "Failed"):
            self.present.pop(name, None)
        else:
            self.present[name] = pod
        generations: dict[str, set[str]] = {}
        bound: dict[str, int] = {}
        for other, body in self.present.items():
            match = POD_NAME.match(other)
            if match is not None:
                generations.setdefault(match["job"], set()).add(match["gen"])
            where = body["spec"].get("nodeName")
            if where:
                bound[where] = bound.get(where, 0) + 1
        for job, gens in generations.items():
            if len(gens) > 1:
                self.two_generations.append(f"{job}: generations {sorted(gens)} at once")
        node = pod["spec"].get("nodeName")
        if node and name not in self.bound:  # a bind: never beyond the node's allocatable
            self.bound.add(name)
            if name in self.present and bound[node] > self.allocatable.get(node, bound[node]):
                self.over.append(
                    f"{name} bound to {node} as GPU {bound[node]}, "
                    f"allocatable {self.allocatable[node]}"
                )


def say(what: str) -> None:
    """Progress of a long test, for ``pytest -s`` and a failure's captured output."""
    print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)


def _node(twin: Twin, name: str) -> Obj:
    assert twin.client is not None
    body: Obj = twin.client.get(f"/api/v1/nodes/{name}").json()
    return body


def _ready(node: Obj) -> str:
    conditions = node.get("status", {}).get("conditions") or []
    return str(next((c["status"] for c in conditions if c["type"] == "Ready"), ""))


def _until(what: str, test: Any, timeout_s: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout_s:g} s: {what}")
        time.sleep(every_s)


def _checkpointed(twin: Twin, watch: NodeWatch) -> list[Any]:
    """Workers training in a generation that has taken a checkpoint already, their pods
    not being deleted."""
    assert twin.kubelet is not None
    kubelet = twin.kubelet
    return [
        w
        for w in list(kubelet.workers.values())
        if w.gpu_seen is not None
        and kubelet.checkpoints.get((w.namespace, w.job), 0) > w.base
        and w.pod in watch.present
        and not watch.present[w.pod]["metadata"].get("deletionTimestamp")
    ]


def _restarts(twin: Twin) -> dict[str, int]:
    assert twin.client is not None
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
    items = twin.client.get(path).json()["items"]
    return {i["metadata"]["name"]: int((i.get("status") or {}).get("restarts") or 0) for i in items}


@pytest.mark.timeout(600)
def test_a_node_dies_then_a_gpu_and_every_job_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    jobs = mini_trace(4, SCALE, max_duration_s=3000)
    with Twin(tmp_path, nodes=2, gpus_per_node=GPUS, scale=SCALE, seed=SEED, timing=TIMING) as twin:
        assert twin.kubelet is not None and twin.nodelife is not None
        watch = NodeWatch(twin.url)
        progress = ProgressLog(twin)
        began = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(twin.run, jobs, timeout_s=480)
            try:
                # A node with workers training past a checkpoint. A rescale can stop them
                # just before the node dies (the kubelet then had none there): the node
                # comes back at once (before anything saw it gone) and the test tries again.
                for _ in range(5):
                    _until("a worker past a checkpoint", lambda: _checkpointed(twin, watch), 240)
                    victim = _checkpointed(twin, watch)[0].node
                    failed_at = time.monotonic()
                    died = twin.fail_node(victim)
                    if died:
                        break
                    say(f"{victim} had no worker left when it died: back, and again")
                    twin.restore_node(victim)
                time.sleep(1.0)  # the watch catches up
                on_it = {pod: str((POD_NAME.match(pod) or {"job": ""})["job"]) for pod in died}
                victims = set(on_it.values())
                assert on_it, "no worker on the node when it died"
                _until("the node Unknown", lambda: _ready(_node(twin, victim)) == "Unknown", 60)
                life = twin.nodelife.stats
                say(f"failed {victim} with {on_it}")
                _until(
                    "its pods terminating (evicted, or deleted by the operator)",
                    lambda: all(
                        (watch.present.get(n) or {}).get("metadata", {}).get("deletionTimestamp")
                        for n in on_it
                    ),
                    60,
                )
                say(f"terminating; evicted {life.evicted}")
                time.sleep(10.0)  # the job waits: its old pods still terminating
                stuck = sorted(n for n in on_it if n in watch.present)
                fenced_at = time.monotonic()
                say(f"fencing; still there {stuck}; jobs {twin.phases()}")
                twin.fence_node(victim)
                _until(
                    "the dead node's pods gone",
                    lambda: not any(n in watch.present for n in on_it),
                    60,
                )
                kubelet = twin.kubelet

                def resumed() -> bool:
                    training = {
                        w.job for w in list(kubelet.workers.values()) if w.gpu_seen is not None
                    }
                    return victims <= training | _finished(twin)

                _until("its jobs training again elsewhere", resumed, 240)
                say("resumed; the node comes back")
                twin.fence_node(victim, on=False)
                twin.restore_node(victim)
                _until("the node Ready", lambda: _ready(_node(twin, victim)) == "True", 60)

                def untainted() -> bool:
                    taints = _node(twin, victim).get("spec", {}).get("taints") or []
                    return not any(t["key"].startswith("node.kubernetes.io/") for t in taints)

                _until("its node-failure taints gone", untainted, 30)
                # Then a GPU under a worker past a checkpoint.
                failed: list[tuple[float, Any]] = []

                def checkpointed_one() -> Any:
                    """A worker past a checkpoint, chosen as its GPU fails (the kubelet's
                    step: chosen first, it may end before the failure on a busy machine)."""
                    ready = _checkpointed(twin, watch)
                    if ready:
                        watch.allocatable[ready[0].node] = GPUS - 1
                        failed.append((time.monotonic(), ready[0]))
                    return ready[0] if ready else None

                _until(
                    "a worker past a checkpoint",
                    lambda: kubelet.fail_gpu_under(checkpointed_one) is not None,
                    240,
                )
                ((gpu_failed_at, worker),) = failed
                say(f"GPU {worker.gpu} of {worker.node} failed under {worker.pod}")
                allocatable = _node(twin, worker.node)["status"]["allocatable"]
                capacity = _node(twin, worker.node)["status"]["capacity"]
                result = running.result()
                restarts = _restarts(twin)
            except BaseException:
                for t, name, what in sorted(twin.kubelet.stats.events + twin.nodelife.stats.events):
                    say(f"{t - began:7.1f} {name}: {what}")
                watch.close()
                progress.close()
                twin.stop()  # the run ends now, not at its timeout
                raise
            finally:
                watch.close()
                progress.close()
        took = time.monotonic() - began
        final = job_progress(twin)
        stats = twin.kubelet.stats
        events = [e for e in stats.events if e[0] >= failed_at]
        later = [e for e in stats.events if e[0] >= gpu_failed_at]
    print(
        f"node {victim} failed at {failed_at - began:.0f} s with {sorted(on_it)}; fenced "
        f"{fenced_at - failed_at:.0f} s later; evicted {life.evicted}; force-deleted "
        f"{life.force_deleted}; node events {[e[1:] for e in life.events]}; GPU "
        f"{worker.gpu} of {worker.node} failed at {gpu_failed_at - began:.0f} s under "
        f"{worker.pod}; restarts {restarts}; run {took:.0f} s; workers died {stats.died}, "
        f"iterations lost {stats.lost_in_faults}, rejected {stats.rejected}"
    )
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert stuck == sorted(on_it), "the dead node's pods went before it was fenced"
    # At most one generation of a job at once: nothing of a victim job was created
    # between the failure and the fence, and no two generations ever coexisted.
    early = [
        n
        for n, at in watch.added_at.items()
        if failed_at <= at < fenced_at and (POD_NAME.match(n) or {"job": ""})["job"] in victims
    ]
    assert early == [], f"victims' pods created while the old ones may still run: {early}"
    assert watch.two_generations == []
    assert set(on_it) <= set(life.force_deleted)
    twice = {name: n for name, n in watch.created.items() if n > 1}
    assert not twice, f"pods created more than once: {twice}"
    assert not watch.overlaps, "GPUs held by two gangs at once:\n" + "\n".join(
        list(dict.fromkeys(watch.overlaps))[:8]
    )
    assert stats.died >= len(on_it)
    assert stats.lost_iterations == 0
    assert bad_resumes(twin) == [], "a restart trained from before its job's last checkpoint"
    assert any(what.startswith("training from ") for _, _, what in events)
    for job in jobs:
        assert final[job.name] == job.job.iterations
    # The GPU: allocatable one less, its worker the only one to die, its job restarted,
    # no worker given that GPU again, none bound beyond the allocatable or rejected.
    assert (allocatable[contract.GPU_RESOURCE], capacity[contract.GPU_RESOURCE]) == ("3", "4")
    died = [e for e in later if ", lost " in e[2]]
    assert [e[1] for e in died] == [worker.pod], died
    # Its job resumed from a checkpoint. The operator counts a restart when it sees the
    # worker Failed first; when the node's allocatable (3 of 4) reaches its pass first,
    # it rescales the job off the GPU and deletes the worker itself: no restart counted,
    # the same resumption.
    resumed = [
        e for e in later if e[1].startswith(f"{worker.job}-") and e[2].startswith("training from ")
    ]
    assert resumed or restarts[worker.job] >= 1, (restarts, later)
    given = [e for e in later if e[2].startswith("started on ")]
    assert given, "no worker started after the GPU fault"
    assert not [e for e in given if e[2] == f"started on {worker.node} GPU {worker.gpu}"]
    assert not [e for e in later if e[2] == "rejected"], "a pod bound beyond the allocatable"
    assert watch.over == []


def _finished(twin: Twin) -> set[str]:
    return {name for name, phase in twin.phases().items() if phase == "Succeeded"}


def test_the_node_watch_sees_two_generations_and_a_node_over_its_gpus() -> None:
    """The checks above can fail: a job with pods of two generations present at once,
    a node with more pods bound than its allocatable GPUs."""
    watch = NodeWatch.__new__(NodeWatch)
    watch.present, watch.added_at, watch.two_generations = {}, {}, []
    watch.allocatable, watch.over, watch.bound = {"n": 1}, [], set()
    watch.created, watch.live, watch.blocks, watch.overlaps = {}, {}, {}, []
    watch.partial = threading.Event()

    def added(name: str, node: str) -> Obj:
        spec = {"nodeName": node, "containers": [{"name": "w", "image": "i", "env": []}]}
        meta = {"name": name, "resourceVersion": "1", "annotations": {}}
        return {"type": "ADDED", "object": {"metadata": meta, "spec": spec}}

    watch._see(added("j-g1-w0", "n"))
    assert watch.two_generations == [] and watch.over == []
    watch._see(added("j-g2-w0", "m"))
    assert watch.two_generations and watch.over == []
    watch._see(added("k-g1-w0", "n"))
    assert watch.over
