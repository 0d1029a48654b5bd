"""Faults on the twin, with nothing lost (issue 16; ``docs/twin.md``, "Faults").

- The operator killed 20 times (SIGKILL and SIGTERM, at seeded random moments) during
  a mini trace: every job completes, no worker pod is created twice for one slot
  (``JOB-gGEN-wRANK``, from a watch of every pod event), no job's progress goes back
  (the DLJob's ``status.progress.iterations`` never decreases; every restart of a
  worker trains from the job's last checkpoint, and no iteration reached is lost).
- The extender killed while a gang is partly bound, and started again: the rest of
  the gang goes to the block its first pods were bound to (the reservation rebuilt
  from the cluster), no GPU is held by two gangs at once (the extender's placement
  blocks of the live pods, and the GPU the kubelet gave each worker), the gang runs
  to completion.
- The watch behind these checks, on its own: it does see a slot created twice, a GPU
  in two gangs' blocks and a partly bound gang.

The trace runs on one node of 8 GPUs: on 2 x 8, 16-GPU gangs can stall in the
extender (docs/twin.md, "Not done yet"), which another change fixes; gangs here are
up to 8 GPUs. Real time: limits are generous, nothing is timed.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from powerflow import contract
from powerflow.twin.apiserver import ApiServer
from powerflow.twin.harness import Twin
from powerflow.twin.timescale import TimeScale
from powerflow.twin.trace import NAMESPACE, mini_trace

SEED = 16
POD_NAME = re.compile(r"^(?P<job>.+)-g(?P<gen>\d+)-w(?P<rank>\d+)$")
Obj = dict[str, Any]


def _world(pod: Obj) -> int:
    (container, *_) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    return int(env.get("WORLD_SIZE") or 1)


def _block(pod: Obj) -> list[tuple[str, int]] | None:
    raw = (pod["metadata"].get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION)
    if raw is None:
        return None
    return [(str(n), int(g)) for n, g in json.loads(raw)["block"]]


@dataclass
class Watch:
    """Every pod event of the API server, from a watch resumed where it ended (a watch
    sees every creation, however short-lived the pod: a list every few seconds would
    not), with the checks that need the cluster as it was at each moment."""

    url: str
    created: dict[str, int] = field(default_factory=dict)
    """Pod name -> how many times it was ADDED."""
    live: dict[str, Obj] = field(default_factory=dict)
    blocks: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(job, generation) -> every placement annotation its bound pods carried."""
    overlaps: list[str] = field(default_factory=list)
    """GPUs that two gangs' blocks held at once (two live, bound pods)."""
    partial: threading.Event = field(default_factory=threading.Event)
    """Set while some gang has some, but not all, of its pods bound."""
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(30.0, read=None))
        self.version = self.client.get("/api/v1/pods").json()["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._main, name="faults-watch", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.client.close()
        self.thread.join(10)

    def _events(self) -> Iterator[Obj]:
        params = {"watch": "true", "resourceVersion": self.version}
        with self.client.stream("GET", "/api/v1/pods", params=params) as answer:
            for line in answer.iter_lines():
                if line:
                    yield json.loads(line)

    def _main(self) -> None:
        while not self.stop.is_set():
            try:
                for event in self._events():
                    self._see(event)
            except (httpx.HTTPError, RuntimeError, ValueError):
                if self.stop.is_set():
                    return
                time.sleep(0.2)

    def _see(self, event: Obj) -> None:
        kind, pod = event["type"], event["object"]
        if kind == "ERROR":
            raise RuntimeError(f"watch ended: {pod}")
        meta = pod["metadata"]
        self.version = meta["resourceVersion"]
        name = meta["name"]
        if kind == "ADDED":
            self.created[name] = self.created.get(name, 0) + 1
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if kind == "DELETED" or meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            self.live.pop(name, None)
        else:
            self.live[name] = pod
        self._check()

    def _check(self) -> None:
        held: dict[tuple[str, int], tuple[str, str]] = {}
        bound: dict[tuple[str, str], list[Obj]] = {}
        for name, pod in self.live.items():
            match = POD_NAME.match(name)
            if match is None or not pod["spec"].get("nodeName"):
                continue
            gang = (match["job"], match["gen"])
            bound.setdefault(gang, []).append(pod)
            raw = (pod["metadata"].get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION)
            self.blocks.setdefault(gang, set()).add(str(raw))
            for gpu in _block(pod) or []:
                other = held.setdefault(gpu, gang)
                if other != gang:
                    self.overlaps.append(f"{gpu} held by {other} and {gang}")
        if any(0 < len(pods) < _world(pods[0]) for pods in bound.values()):
            self.partial.set()
        else:
            self.partial.clear()


def _progress(twin: Twin) -> dict[str, int]:
    assert twin.client is not None
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
    items = twin.client.get(path).json()["items"]
    return {
        i["metadata"]["name"]: int(
            ((i.get("status") or {}).get("progress") or {}).get("iterations", 0)
        )
        for i in items
    }


@dataclass
class ProgressLog:
    """Each DLJob's ``status.progress.iterations`` as it was read, every 0.5 s."""

    twin: Twin
    seen: dict[str, list[int]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, name="faults-progress", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        while not self.stop.wait(0.5):
            try:
                for job, done in _progress(self.twin).items():
                    self.seen.setdefault(job, []).append(done)
            except (httpx.HTTPError, ValueError):
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def _resumes(twin: Twin) -> list[str]:
    """Every worker start that trained from less than its job's last checkpoint before
    it (the kubelet's events: ``training from N``, ``checkpointed at N``)."""
    assert twin.kubelet is not None
    last: dict[str, int] = {}
    wrong = []
    for _, pod, what in twin.kubelet.stats.events:
        match = POD_NAME.match(pod)
        if match is None:
            continue
        job = match["job"]
        if what.startswith("checkpointed at "):
            last[job] = max(last.get(job, 0), int(what.rsplit(" ", 1)[1]))
        elif what.startswith("training from "):
            base = int(what.rsplit(" ", 1)[1])
            if base < last.get(job, 0):
                wrong.append(f"{pod} trained from {base} after a checkpoint at {last[job]}")
    return wrong


@pytest.mark.timeout(900)
def test_operator_killed_20_times_loses_nothing(tmp_path: Path) -> None:
    """20 kills of the operator (10 SIGKILL, 10 SIGTERM, seeded order and moments: one in
    five 0.5-3 s after it serves, the others 0-8 s after it was launched) while
    8 short jobs of the default trace run on 8 GPUs: all succeed, every slot's pod was
    created once, and no job went back in progress."""
    scale = TimeScale(0.02)
    jobs = mini_trace(8, scale, max_duration_s=3000)
    rng = random.Random(SEED)
    signals = [signal.SIGKILL] * 10 + [signal.SIGTERM] * 10
    rng.shuffle(signals)
    kills: list[tuple[float, str]] = []
    with Twin(tmp_path, nodes=1, gpus_per_node=8, scale=scale, seed=SEED) as twin:
        operator = twin.operator
        assert operator is not None and operator.proc is not None
        # One replica under a stable name (a StatefulSet's pod name, or --leader-identity
        # given): a restarted operator takes its own Lease back at once, where a new name
        # waits for a SIGKILLed leader's Lease to expire (60 s here, 20 times).
        operator.args += ["--leader-identity", "twin-operator"]
        watch = Watch(twin.url)
        progress = ProgressLog(twin)

        began = time.monotonic()
        # The faults come from this thread and the trace runs in another: a child
        # process dies with the thread that started it (PR_SET_PDEATHSIG).
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(twin.run, jobs, timeout_s=700)
            try:
                for i, sig in enumerate(signals):
                    if i % 5 == 4:  # an operator at work: up, its passes running
                        operator.wait_ready(timeout_s=300)
                        pause = rng.uniform(0.5, 3.0)
                    else:  # any moment of its life, its start-up included (a crash loop)
                        pause = rng.uniform(0.0, 8.0)
                    time.sleep(pause)
                    if running.done():
                        break
                    operator.signal(sig)
                    operator.proc.wait(60)
                    kills.append((time.monotonic(), signal.Signals(sig).name))
                    operator.launch()
                operator.wait_ready(timeout_s=300)
                result = running.result()
            finally:
                watch.close()
                progress.close()
        took = time.monotonic() - began
        final = _progress(twin)
        assert twin.kubelet is not None
        stats = twin.kubelet.stats
    kills_in_run = sum(1 for at, _ in kills if at - began <= took)
    print(
        f"kills {len(kills)} ({kills_in_run} during the run), run {took:.0f} s, "
        f"workers started {stats.started}, checkpoints {stats.checkpoints}, "
        f"lost iterations {stats.lost_iterations}, operator starts {operator.starts}"
    )
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert len(kills) == 20, f"only {len(kills)} kills before the trace ended"
    assert {name for _, name in kills} == {"SIGKILL", "SIGTERM"}
    twice = {name: n for name, n in watch.created.items() if n > 1}
    assert not twice, f"pods created more than once: {twice}"
    assert watch.created, "the watch saw no pod"
    assert stats.lost_iterations == 0
    assert _resumes(twin) == []
    for job in jobs:
        seen = progress.seen.get(job.name, [])
        assert seen == sorted(seen), f"{job.name}'s progress went back: {seen}"
        assert final[job.name] == job.job.iterations


@pytest.mark.timeout(600)
def test_extender_restarted_mid_gang_rebuilds_its_reservations(tmp_path: Path) -> None:
    """The extender SIGKILLed while a gang is partly bound (up to 3 times), started
    again: each gang's pods all carry the one block (its reservation, rebuilt by the
    new process from the pods already bound), no two live gangs hold one GPU, every
    worker got a GPU of its block, and the jobs succeed."""
    scale = TimeScale(0.02)
    jobs = mini_trace(3, scale, max_duration_s=3000)
    restarts: list[str] = []
    done = threading.Event()
    with Twin(tmp_path, nodes=1, gpus_per_node=8, scale=scale, seed=SEED) as twin:
        extender = twin.extender
        assert extender is not None and twin.kubelet is not None
        watch = Watch(twin.url)
        outside: list[str] = []

        def workers() -> None:
            """The kubelet's GPU for each worker, against its pod's block."""
            assert twin.kubelet is not None
            while not done.wait(0.2):
                for w in list(twin.kubelet.workers.values()):
                    pod = watch.live.get(w.pod)
                    block = _block(pod) if pod is not None else None
                    if block is not None and (w.node, w.gpu) not in block:
                        outside.append(f"{w.pod} on {w.node} GPU {w.gpu}, block {block}")

        checker = threading.Thread(target=workers, daemon=True)
        checker.start()
        # Restarts from this thread (a child dies with the thread that started it).
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(twin.run, jobs, timeout_s=450)
            try:
                while len(restarts) < 3 and not running.done():
                    if not watch.partial.wait(1.0):
                        continue
                    assert extender.proc is not None
                    extender.signal(signal.SIGKILL)
                    extender.proc.wait(60)
                    restarts.append(", ".join(sorted(watch.live)))
                    extender.start(timeout_s=300)
                    time.sleep(5.0)
                result = running.result()
            finally:
                done.set()
                checker.join(30)
                watch.close()
        binds = twin.scheduler.stats.bound if twin.scheduler is not None else 0
    print(f"extender restarts {len(restarts)}, binds {binds}, gangs {len(watch.blocks)}")
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert restarts, "no gang was ever seen partly bound"
    assert extender.starts == len(restarts) + 1
    assert watch.overlaps == []
    assert outside == []
    split = {gang: blocks for gang, blocks in watch.blocks.items() if len(blocks) > 1}
    assert split == {}, f"gangs bound to more than one block: {split}"


def _pod(name: str, world: int, node: str | None = None, block: str | None = None) -> Obj:
    annotations = {contract.PLACEMENT_ANNOTATION: block} if block else {}
    env = [{"name": "WORLD_SIZE", "value": str(world)}]
    spec: Obj = {"containers": [{"name": "w", "image": "i", "env": env}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


def test_the_watch_sees_a_slot_created_twice_a_gpu_held_twice_and_a_partial_gang() -> None:
    """The checks above can fail: a pod name created, deleted and created again counts
    2; two gangs' blocks on one GPU are an overlap; a gang with 1 of its 2 pods bound
    is partial, and no longer once both are."""
    with ApiServer() as server, httpx.Client(base_url=server.url) as client:
        watch = Watch(server.url)
        pods = "/api/v1/namespaces/ml/pods"
        try:
            block = '{"node": "n", "block": [["n", 0], ["n", 1]]}'
            client.post(pods, json=_pod("a-g1-w0", 2, "n", block)).raise_for_status()
            assert _eventually(watch.partial.is_set)
            client.post(pods, json=_pod("a-g1-w1", 2, "n", block)).raise_for_status()
            assert _eventually(lambda: not watch.partial.is_set())
            other = '{"node": "n", "block": [["n", 1]]}'
            client.post(pods, json=_pod("b-g1-w0", 1, "n", other)).raise_for_status()
            client.delete(f"{pods}/b-g1-w0").raise_for_status()
            client.post(pods, json=_pod("b-g1-w0", 1)).raise_for_status()
            assert _eventually(lambda: watch.created.get("b-g1-w0") == 2)
            assert watch.overlaps and "('n', 1)" in watch.overlaps[0]
            assert watch.created["a-g1-w0"] == 1
        finally:
            watch.close()


def _eventually(check: Any, limit_s: float = 30.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
