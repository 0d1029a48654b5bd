"""Faults on the twin, with nothing lost (``docs/twin.md``, "Faults").

One run of a mini trace takes the process faults and the API server's (one twin
boot, every fault seeded):

- The operator killed 4 times, SIGKILL and SIGTERM each once during its start-up and
  once at work, in a seeded order at seeded moments, during the trace
  (``tests/test_operator_restarts.py`` restarts it 20 times against the emulator in a
  fraction of the time; this one kills the real process, so what only a kill shows is
  checked: a SIGKILL mid-write, a SIGTERM's shutdown, a kill during start-up, the
  Lease taken back, workers resumed from their checkpoints): every job completes, no
  worker pod is created twice for one slot (``JOB-gGEN-wRANK``, from a watch of every
  pod event), no job's progress goes back (the DLJob's
  ``status.progress.iterations`` never decreases; every restart of a worker trains
  from the job's last checkpoint, and no iteration reached is lost).
- The extender killed while a gang is partly bound (3 times), and started again: the rest of
  the gang goes to the block its first pods were bound to (the reservation rebuilt
  from the cluster), no GPU is held by two gangs at once (the extender's placement
  blocks of the live pods, and the GPU the kubelet gave each worker), the gang runs
  to completion.
- The API server's faults, from the trace's start to its end: the twin's API server
  (a process of its own, started with ``--fault-control``) gets its fault rules
  through ``/_twin/faults`` (``apiserver.FaultControl``): 409 conflicts, 429 with
  ``Retry-After``, 500s before and after a committed write, watches that end with a
  410 ``ERROR`` event, and answers seconds late, each with a seeded probability,
  aimed at the product's clients only (by ``User-Agent``: the operator's two,
  ``powerflow-operator/*`` and ``kopf/*``, the node agents' ``powerflow-nodeagent/*``
  and the extender's ``powerflow-extender/*``); the twin's own kubelet, scheduler and
  user (``twin-*``) and the test's observers are spared, as a test of the product
  must not test the stand-ins. Each kind answered requests of the product
  (``hits``), so the test cannot pass with nothing injected; no gang stays partly
  bound past the extender's reservation TTL.
- The watch behind these checks, on its own: it does see a slot created twice, a GPU
  in two gangs' blocks and a partly bound gang.

The trace runs on one node of 8 GPUs: on 2 x 8, 16-GPU gangs can stall in the
extender (docs/twin.md, "Not done yet"), which another change fixes; gangs here are
up to 8 GPUs. Real time: limits are generous, nothing is timed.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.twin_checks import (
    OBSERVER,
    RESERVATION_TTL_S,
    SEED,
    Obj,
    PartialGangs,
    ProgressLog,
    Watch,
    api_fault_kinds,
    bad_resumes,
    block,
    eventually,
    job_progress,
)

from powerflow.core import contract
from powerflow.lab.twin.apiserver import ApiServer, FaultControl
from powerflow.lab.twin.harness import Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import mini_trace

KILLS = tuple(
    (sig, moment) for sig in (signal.SIGKILL, signal.SIGTERM) for moment in ("start-up", "work")
)
"""The operator's kills: each signal once during its start-up (a crash loop's) and once
at work (up, its passes running). What only a kill of the real
process shows needs each kind once; the counting of many restarts is the emulator's
restart test's (``tests/test_operator_restarts.py``: 20 during 20 jobs)."""
STARTUP_KILL_S = 1.5
"""A start-up kill comes 0 to this many seconds after the launch, before the operator
serves: its start-up (imports, login, the Lease, its first list) took 1.7 s of CPU, so at
least as long in real time, from launch to serving in a twin's boot."""
EXTENDER_KILLS = 3
"""The extender's SIGKILLs, each while a gang is partly bound."""
EXTENDER_SPACING_S = 5.0
"""A restarted extender binds for this long before it may be killed again."""


@dataclass
class ExtenderKills:
    """The extender SIGKILLed while a gang is partly bound and started again, from the
    thread that started it (``during``), and the kubelet's GPU of each worker checked
    against its pod's block all along (``outside``)."""

    twin: Twin
    watch: Watch
    restarts: list[str] = field(default_factory=list)
    """The live pods at each kill."""
    outside: list[str] = field(default_factory=list)
    """Workers given a GPU outside their pod's block."""
    last_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.checker = threading.Thread(target=self._workers, daemon=True)
        self.checker.start()

    def _workers(self) -> None:
        """The kubelet's GPU for each worker, against its pod's block."""
        assert self.twin.kubelet is not None
        while not self.done.wait(0.2):
            for w in list(self.twin.kubelet.workers.values()):
                pod = self.watch.live.get(w.pod)
                held = block(pod) if pod is not None else None
                if held is not None and (w.node, w.gpu) not in held:
                    self.outside.append(f"{w.pod} on {w.node} GPU {w.gpu}, block {held}")

    def during(self, seconds: float) -> None:
        """Wait ``seconds`` (at least), restarting the extender whenever a gang is seen
        partly bound, up to ``EXTENDER_KILLS`` times, ``EXTENDER_SPACING_S`` apart."""
        extender = self.twin.extender
        assert extender is not None
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            wanted = len(self.restarts) < EXTENDER_KILLS
            if not wanted or time.monotonic() - self.last_s < EXTENDER_SPACING_S:
                time.sleep(min(left, 0.2))
            elif self.watch.partial.wait(min(left, 0.2)):
                assert extender.proc is not None
                extender.signal(signal.SIGKILL)
                extender.proc.wait(60)
                self.restarts.append(", ".join(sorted(self.watch.live)))
                extender.start(timeout_s=300)
                self.last_s = time.monotonic()

    def close(self) -> None:
        self.done.set()
        self.checker.join(30)


@pytest.mark.timeout(900)
def test_operator_kills_extender_restarts_and_api_faults_in_one_run_lose_nothing(
    tmp_path: Path,
) -> None:
    """4 kills of the operator (SIGKILL and SIGTERM each during its start-up, 0-1.5 s
    after its launch, and at work, 0.5-3 s after it serves; seeded order and moments), 3 of
    the extender (SIGKILL while a gang is partly bound, started again; 5 s apart at
    least) and the API server's faults (every kind, seeded, from the trace's start to
    its end) while 8 short jobs of the default trace run on 8 GPUs: all succeed, every
    slot's pod was created once, no job went back in progress; each gang's pods all
    carry the one block (its reservation, rebuilt by each new extender from the pods
    already bound), no two live gangs hold one GPU, every worker got a GPU of its block,
    no gang stayed partly bound past the reservation's TTL; and every kind of API fault
    was served to the product (a count per kind)."""
    scale = TimeScale(0.01)
    jobs = mini_trace(8, scale, max_duration_s=3000)
    rng = random.Random(SEED)
    # At work, then during the start-up of the operator that kill launched, twice; each
    # moment's two signals in a seeded order.
    at_work = [sig for sig, moment in KILLS if moment == "work"]
    at_startup = [sig for sig, moment in KILLS if moment == "start-up"]
    rng.shuffle(at_work)
    rng.shuffle(at_startup)
    order = [
        kill
        for work, startup in zip(at_work, at_startup, strict=True)
        for kill in ((work, "work"), (startup, "start-up"))
    ]
    kills: list[tuple[float, str]] = []
    by_kind = api_fault_kinds()
    # The twin's operator runs under a stable --leader-identity (one replica, as a
    # StatefulSet's pod): started again after a kill, it takes its own Lease back at
    # once, where a new name waits for a SIGKILLed leader's Lease to expire (60 s here).
    with Twin(
        tmp_path, nodes=1, gpus_per_node=8, scale=scale, seed=SEED, fault_control=True
    ) as twin:
        operator, extender = twin.operator, twin.extender
        assert operator is not None and operator.proc is not None
        assert extender is not None and twin.kubelet is not None and twin.client is not None
        control = FaultControl(twin.client)
        watch = Watch(twin.url)
        watch.client.headers.update(OBSERVER)  # its first list is done: the rest is spared
        progress = ProgressLog(twin)  # reads through twin.client: twin-harness, spared
        partial = PartialGangs(watch)
        extender_kills = ExtenderKills(twin, watch)
        control.inject(*(rule for rules in by_kind.values() for rule in rules), seed=SEED)

        began = time.monotonic()
        # The faults come from this thread and the trace runs in another: a child
        # process dies with the thread that started it (PR_SET_PDEATHSIG).
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(twin.run, jobs, timeout_s=700)
            try:
                for sig, moment in order:
                    if moment == "work":  # up, its passes running
                        operator.wait_ready(timeout_s=300)
                        extender_kills.during(rng.uniform(0.5, 3.0))
                    else:  # during its start-up, as in a crash loop (nothing else meanwhile)
                        time.sleep(rng.uniform(0.0, STARTUP_KILL_S))
                    if running.done():
                        break
                    operator.signal(sig)
                    operator.proc.wait(60)
                    kills.append((time.monotonic(), f"{signal.Signals(sig).name} at {moment}"))
                    operator.launch()
                operator.wait_ready(timeout_s=300)
                while len(extender_kills.restarts) < EXTENDER_KILLS and not running.done():
                    extender_kills.during(1.0)
                result = running.result()
                served = control.clear()
            finally:
                extender_kills.close()
                partial.close()
                watch.close()
                progress.close()
        took = time.monotonic() - began
        final = job_progress(twin)
        stats = twin.kubelet.stats
        binds = twin.scheduler.stats.bound if twin.scheduler is not None else 0
    kills_in_run = sum(1 for at, _ in kills if at - began <= took)
    restarts = extender_kills.restarts
    hits: Counter[str] = Counter()
    position = 0
    for kind, rules in by_kind.items():
        hits[kind] += sum(answered["hits"] for answered in served[position : position + len(rules)])
        position += len(rules)
    print(
        f"kills {[name for _, name in kills]} ({kills_in_run} during the run), run {took:.0f} s, "
        f"workers started {stats.started}, checkpoints {stats.checkpoints}, "
        f"lost iterations {stats.lost_iterations}, operator starts {operator.starts}; "
        f"extender restarts {len(restarts)}, binds {binds}, gangs {len(watch.blocks)}; "
        f"API faults served {dict(hits)}; longest partly bound gang {partial.longest_s:.1f} s"
    )
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert len(kills) == len(KILLS), f"only {len(kills)} kills before the trace ended"
    assert sorted(name for _, name in kills) == sorted(
        f"{signal.Signals(sig).name} at {moment}" for sig, moment in KILLS
    )
    twice = {name: n for name, n in watch.created.items() if n > 1}
    assert not twice, f"pods created more than once: {twice}"
    assert watch.created, "the watch saw no pod"
    assert stats.lost_iterations == 0
    assert bad_resumes(twin) == []
    for job in jobs:
        seen = progress.seen.get(job.name, [])
        assert seen == sorted(seen), f"{job.name}'s progress went back: {seen}"
        assert final[job.name] == job.job.iterations
    assert restarts, "no gang was ever seen partly bound"
    assert extender.starts == len(restarts) + 1
    assert not watch.overlaps, "GPUs held by two gangs at once:\n" + "\n".join(
        list(dict.fromkeys(watch.overlaps))[:8]
    )
    assert extender_kills.outside == []
    split = {gang: blocks for gang, blocks in watch.blocks.items() if len(blocks) > 1}
    assert split == {}, f"gangs bound to more than one block: {split}"
    assert partial.longest_s < RESERVATION_TTL_S, f"a gang partly bound {partial.longest_s} s"
    assert len(served) == sum(len(rules) for rules in by_kind.values())
    missing = [kind for kind in by_kind if hits[kind] == 0]
    assert not missing, f"API fault kinds never served: {missing} ({dict(hits)})"


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
            assert eventually(watch.partial.is_set)
            client.post(pods, json=_pod("a-g1-w1", 2, "n", block)).raise_for_status()
            assert eventually(lambda: not watch.partial.is_set())
            other = '{"node": "n", "block": [["n", 1]]}'
            client.post(pods, json=_pod("b-g1-w0", 1, "n", other)).raise_for_status()
            client.delete(f"{pods}/b-g1-w0").raise_for_status()
            client.post(pods, json=_pod("b-g1-w0", 1)).raise_for_status()
            assert eventually(lambda: watch.created.get("b-g1-w0") == 2)
            assert watch.overlaps and "('n', 1)" in watch.overlaps[0]
            assert watch.created["a-g1-w0"] == 1
        finally:
            watch.close()
