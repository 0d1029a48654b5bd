"""What the twin's fault tests check, shared by tests/test_twin_faults*.py: a ``Watch``
of every pod event (a slot created twice, a GPU in two gangs' blocks, a gang partly
bound), a ``ProgressLog`` of each DLJob's progress, ``resumes`` (a worker that trained
from before its job's last checkpoint), ``PartialGangs`` (how long a gang stayed partly
bound) and ``eventually``. Checked on their own in ``tests/test_twin_faults.py``. And
the API-server faults those tests inject (``api_fault_kinds``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerflow.core import contract
from powerflow.lab.twin.harness import Twin
from powerflow.lab.twin.trace import NAMESPACE

SEED = 16
POD_NAME = re.compile(r"^(?P<job>.+)-g(?P<gen>\d+)-w(?P<rank>\d+)$")
Obj = dict[str, Any]


def world(pod: Obj) -> int:
    (container, *_) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    return int(env.get("WORLD_SIZE") or 1)


def block(pod: Obj) -> list[tuple[str, int]] | None:
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
        # The server ends the watch every second (``timeoutSeconds``, as a client-go
        # reflector asks for a bounded one) and it resumes from the last event's version:
        # nothing is missed, and ``close`` takes at most that second, where a watch held
        # open blocked its reading thread, and the server's shutdown, for 10 s each.
        params = {"watch": "true", "resourceVersion": self.version, "timeoutSeconds": "1"}
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
        held: dict[tuple[str, int], tuple[tuple[str, str], Obj]] = {}
        bound: dict[tuple[str, str], list[Obj]] = {}
        for name, pod in self.live.items():
            match = POD_NAME.match(name)
            if match is None or not pod["spec"].get("nodeName"):
                continue
            gang = (match["job"], match["gen"])
            bound.setdefault(gang, []).append(pod)
            raw = (pod["metadata"].get("annotations") or {}).get(contract.PLACEMENT_ANNOTATION)
            self.blocks.setdefault(gang, set()).add(str(raw))
            for gpu in block(pod) or []:
                other, first = held.setdefault(gpu, (gang, pod))
                if other != gang:
                    # Both pods' story, for a failure that does not come back on demand: the
                    # operator's planned block, the extender's placement, the versions.
                    self.overlaps.append(
                        f"{gpu} held by {other} and {gang}: {_story(first)}; {_story(pod)}"
                    )
        if any(0 < len(pods) < world(pods[0]) for pods in bound.values()):
            self.partial.set()
        else:
            self.partial.clear()


def _story(pod: Obj) -> str:
    """A pod's name, resource version and phase, and the blocks the operator planned
    and the extender placed it on."""
    meta = pod["metadata"]
    notes = meta.get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return (
        f"{meta['name']} v{meta.get('resourceVersion')} {phase} on {pod['spec'].get('nodeName')}"
        f" planned {notes.get(contract.PLANNED_BLOCK_ANNOTATION)}"
        f" placed {notes.get(contract.PLACEMENT_ANNOTATION)}"
    )


def job_progress(twin: Twin) -> dict[str, int]:
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
                for job, done in job_progress(self.twin).items():
                    self.seen.setdefault(job, []).append(done)
            except (httpx.HTTPError, ValueError):
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def bad_resumes(twin: Twin) -> list[str]:
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


def eventually(check: Callable[[], bool], limit_s: float = 30.0, every_s: float = 0.05) -> bool:
    """Whether ``check()`` held at some poll within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every_s)
    return False


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


def api_fault_kinds() -> dict[str, list[Rule]]:
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
