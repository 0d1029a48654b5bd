"""API-server faults on the twin itself, with nothing lost (docs/twin.md, "Faults").

The twin's API server (a process of its own, started with ``--fault-control``)
gets its fault rules through ``/_twin/faults`` (``apiserver.FaultControl``) while a
mini trace runs: 409 conflicts, 429 with ``Retry-After``, 500s before and after a
committed write, watches that end with a 410 ``ERROR`` event, and answers seconds
late, each with a seeded probability, aimed at the product's clients only (by
``User-Agent``: the operator's two, ``powerflow-operator/*`` and ``kopf/*``, the node
agents' ``powerflow-nodeagent/*`` and the extender's ``powerflow-extender/*``); the twin's
own kubelet, scheduler and user (``twin-*``) and the test's observers are spared,
as a test of the product must not test the stand-ins.

Nothing lost, as in ``test_twin_faults.py``: every DLJob ``Succeeded`` with all its
iterations, each worker slot's pod (``JOB-gGEN-wRANK``) created once (a watch of
every pod event), a job's progress never goes back, every worker start trains from
at least its job's last checkpoint and no iteration reached was lost. And the faults
were served: each kind answered requests of the product (``hits``), so the test
cannot pass with nothing injected. No gang stays partly bound past the extender's
reservation TTL (the stall of docs/twin.md, "Not done yet").
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.twin_checks import POD_NAME, SEED, ProgressLog, Watch, bad_resumes, job_progress, world

from powerflow.core import contract
from powerflow.lab.twin.apiserver import FaultControl
from powerflow.lab.twin.harness import Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import mini_trace

PRODUCT = ("powerflow-operator/*", "kopf/*", "powerflow-nodeagent/*", "powerflow-extender/*")
"""The product's clients: the operator's allocation loop and its kopf watches, the node
agents, the extender (``httpx``'s default agent; the twin's own clients say ``twin-*``)."""
OBSERVER = {"User-Agent": "twin-test-watch"}
RESERVATION_TTL_S = 120.0
"""The extender's gang reservation TTL: a gang partly bound for longer has lost it (the
16-GPU gang stall of docs/twin.md was a gang partly bound for good)."""

Rule = dict[str, Any]


def rule(verb: str, resource: str, **fault: Any) -> Rule:
    return {"verb": verb, "resource": resource, **fault}


def kinds() -> dict[str, list[Rule]]:
    """The API-server faults, by kind, each for every client of the product."""
    dljob_status = f"{contract.PLURAL}/status"
    per_client: dict[str, list[Rule]] = {
        "409 conflict": [
            rule("patch", "*", status=409, probability=0.15),
            rule("create", "pods", status=409, probability=0.15),
            rule("create", "pods/binding", status=409, probability=0.15),
        ],
        "429 Retry-After": [rule("*", "*", status=429, probability=0.05, retry_after_s=1)],
        "500 before the write": [
            rule("create", "*", status=500, probability=0.05),
            rule("patch", dljob_status, status=500, probability=0.1),
            rule("list", "*", status=500, probability=0.05),
        ],
        "500 after the write": [
            rule("create", "pods", status=500, committed=True, probability=0.15),
            rule("create", "pods/binding", status=500, committed=True, probability=0.15),
            rule("delete", "pods", status=500, committed=True, probability=0.2),
        ],
        "watch ended by 410": [rule("watch", "*", status=410, after_events=3, probability=0.2)],
        "slow answer (1.5 s)": [rule("*", "*", delay_s=1.5, probability=0.02)],
    }
    return {
        kind: [{**r, "user_agent": agent} for r in rules for agent in PRODUCT]
        for kind, rules in per_client.items()
    }


@dataclass
class PartialGangs:
    """How long each gang (job, generation) stayed partly bound (some of its pods on a
    node, not all), from the watch's live pods every 0.2 s: the longest stretch."""

    watch: Watch
    since: dict[tuple[str, str], float] = field(default_factory=dict)
    longest_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, name="partial-gangs", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        while not self.stop.wait(0.2):
            try:
                live = list(self.watch.live.items())
            except RuntimeError:  # changed while copied: the next tick
                continue
            bound: dict[tuple[str, str], list[Any]] = {}
            for name, pod in live:
                match = POD_NAME.match(name)
                if match is not None and pod["spec"].get("nodeName"):
                    bound.setdefault((match["job"], match["gen"]), []).append(pod)
            now = time.monotonic()
            partial = {g for g, pods in bound.items() if 0 < len(pods) < world(pods[0])}
            for gang in partial:
                self.longest_s = max(self.longest_s, now - self.since.setdefault(gang, now))
            for gang in set(self.since) - partial:
                del self.since[gang]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.mark.timeout(600)
def test_the_mini_trace_loses_nothing_under_api_faults(tmp_path: Path) -> None:
    """3 short jobs of the default trace on 8 GPUs, every fault kind at once from the
    moment the trace starts to its end: all succeed, nothing lost, and every kind of
    fault was served to the product (a count per kind)."""
    scale = TimeScale(0.02)
    jobs = mini_trace(3, scale, max_duration_s=3000)
    by_kind = kinds()
    with Twin(
        tmp_path, nodes=1, gpus_per_node=8, scale=scale, seed=SEED, fault_control=True
    ) as twin:
        assert twin.client is not None and twin.kubelet is not None
        control = FaultControl(twin.client)
        watch = Watch(twin.url)
        watch.client.headers.update(OBSERVER)  # its first list is done: the rest is spared
        progress = ProgressLog(twin)  # reads through twin.client: twin-harness, spared
        partial = PartialGangs(watch)
        began = time.monotonic()
        try:
            control.inject(*(rule for rules in by_kind.values() for rule in rules), seed=SEED)
            result = twin.run(jobs, timeout_s=450)
            served = control.clear()
        finally:
            partial.close()
            watch.close()
            progress.close()
        took = time.monotonic() - began
        final = job_progress(twin)
        stats = twin.kubelet.stats
        resumes = bad_resumes(twin)
    hits: Counter[str] = Counter()
    by_agent: Counter[str] = Counter()
    position = 0
    for kind, rules in by_kind.items():
        for answered in served[position : position + len(rules)]:
            hits[kind] += answered["hits"]
            by_agent[answered["user_agent"]] += answered["hits"]
        position += len(rules)
    print(
        f"run {took:.0f} s, faults served {dict(hits)}, by client {dict(by_agent)}, "
        f"workers started {stats.started}, checkpoints {stats.checkpoints}, "
        f"lost iterations {stats.lost_iterations}, pods created {len(watch.created)}, "
        f"longest partly bound gang {partial.longest_s:.1f} s"
    )
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert len(served) == sum(len(rules) for rules in by_kind.values())
    missing = [kind for kind in by_kind if hits[kind] == 0]
    assert not missing, f"fault kinds never served: {missing} ({dict(hits)})"
    twice = {name: n for name, n in watch.created.items() if n > 1}
    assert not twice, f"pods created more than once: {twice}"
    assert watch.created, "the watch saw no pod"
    assert stats.lost_iterations == 0
    assert resumes == []
    assert partial.longest_s < RESERVATION_TTL_S, f"a gang partly bound {partial.longest_s} s"
    for job in jobs:
        seen = progress.seen.get(job.name, [])
        assert seen == sorted(seen), f"{job.name}'s progress went back: {seen}"
        assert final[job.name] == job.job.iterations
