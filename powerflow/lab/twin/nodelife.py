"""The twin's node lifecycle: what kube-controller-manager does when a node fails.

Three controllers of kube-controller-manager, as Kubernetes documents them
(https://kubernetes.io/docs/concepts/architecture/nodes/#node-controller,
https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/#taint-based-evictions,
https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#non-graceful-node-shutdown),
in one thread:

- **node lifecycle**: a node whose Lease (``kube-node-lease``, renewed by its
  kubelet) is older than ``grace_s`` (``--node-monitor-grace-period``, 40 s)
  gets ``Ready`` ``Unknown`` (``NodeStatusUnknown``, "Kubelet stopped posting
  node status."); a node is tainted ``node.kubernetes.io/unreachable``
  (``Ready`` ``Unknown``) or ``node.kubernetes.io/not-ready`` (``False``), each
  with ``NoSchedule`` and ``NoExecute``, and untainted once its kubelet posts
  ``Ready`` ``True`` again;
- **taint eviction**: a pod on a node with a ``NoExecute`` taint it does not
  tolerate is deleted (gracefully: its own grace period) at once; one that
  tolerates every such taint is deleted when its shortest ``tolerationSeconds``
  (the ``DefaultTolerationSeconds`` admission gives every pod 300 s; the twin's
  API server gives it scaled) has passed since the taint was added; never
  without a ``tolerationSeconds``;
- **pod garbage collection**: a terminating pod on a node that is not ``Ready``
  and carries ``node.kubernetes.io/out-of-service`` (put there by an admin who
  knows the machine is off: non-graceful node shutdown) is force-deleted (grace
  0), and so is any pod bound to a node that no longer exists.

A pod evicted from a dead node stays terminating: its kubelet is the one that
finishes a graceful deletion. That is the point: the processes may still run,
so nothing may take their place until the node answers or is fenced.

The grace period does not shrink with the trace below ``MIN_GRACE_S``: on a
loaded 2-core machine a kubelet thread can miss a second or two of renewals,
and a false ``NotReady`` would evict healthy workers.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerflow.core.taints import tolerates
from powerflow.lab.twin.kubelet import LEASES
from powerflow.lab.twin.timescale import TimeScale

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE = {"Content-Type": "application/merge-patch+json"}
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
NODE_MONITOR_GRACE_S = 40.0
"""kube-controller-manager's ``--node-monitor-grace-period`` default."""
MIN_GRACE_S = 8.0
DEFAULT_TOLERATION_S = 300
"""kube-apiserver's ``--default-not-ready-toleration-seconds`` (and unreachable) default."""


def grace_s(scale: TimeScale) -> float:
    """The twin's node monitor grace period: the default, scaled, not below ``MIN_GRACE_S``."""
    return max(scale(NODE_MONITOR_GRACE_S), MIN_GRACE_S)


def toleration_s(scale: TimeScale) -> int:
    """The default toleration of a failed node's taints, scaled (whole seconds, >= 1)."""
    return max(round(scale(DEFAULT_TOLERATION_S)), 1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def _stamp(at: datetime.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(text))
    except ValueError:
        return None


def _ready(node: Obj) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return str(ready[-1].get("status", "Unknown")) if ready else "Unknown"


def wanted_taint(ready: str) -> str | None:
    """The node-failure taint key a node's ``Ready`` status calls for (None: healthy)."""
    return {"True": None, "False": NOT_READY}.get(ready, UNREACHABLE)


def eviction_at(pod: Obj, taints: list[Obj], now: datetime.datetime) -> datetime.datetime | None:
    """When the taint eviction controller deletes ``pod`` from a node with ``taints``:
    now if a ``NoExecute`` taint is not tolerated, else the shortest
    ``tolerationSeconds`` after the taint was added, None when never."""
    hard = [t for t in taints if t.get("effect") == "NoExecute"]
    if not hard:
        return None
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    at: datetime.datetime | None = None
    for taint in hard:
        used = [t for t in tolerations if tolerates(t, taint)]
        if not used:
            return now
        seconds = [t["tolerationSeconds"] for t in used if t.get("tolerationSeconds") is not None]
        if not seconds:
            continue  # tolerated for ever
        added = _parse(taint.get("timeAdded")) or now
        due = added + datetime.timedelta(seconds=max(min(int(s) for s in seconds), 0))
        at = due if at is None else min(at, due)
    return at


@dataclass
class NodeLifeStats:
    """What the controllers did: (``time.monotonic()``, object, what)."""

    events: list[tuple[float, str, str]] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    force_deleted: list[str] = field(default_factory=list)


class NodeLifecycle:
    """The controllers (see the module docstring), one thread: ``start()``, ``stop()``."""

    def __init__(self, api: str, *, grace_s: float, tick_s: float = 0.5) -> None:
        # A User-Agent of its own: the API-fault tests aim their faults at the product's
        # clients, never at the twin's stand-ins for Kubernetes itself.
        self.api = httpx.Client(base_url=api, timeout=30.0, headers={"User-Agent": "twin-nodelife"})
        self.grace_s, self.tick_s = grace_s, tick_s
        self.stats = NodeLifeStats()
        self._first_seen: dict[str, datetime.datetime] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="twin-nodelife", daemon=True)

    def start(self) -> NodeLifecycle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.api.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except httpx.HTTPError as exc:  # the API server away: again next tick
                log.warning("nodelife: %s", exc)
            self._stop.wait(self.tick_s)

    def _note(self, name: str, what: str) -> None:
        self.stats.events.append((time.monotonic(), name, what))

    def _items(self, path: str) -> list[Obj]:
        """A list's items; an error answer raises ``httpx.HTTPStatusError`` (the loop
        tries again next tick), never a body read as a list."""
        answer = self.api.get(path)
        answer.raise_for_status()
        items: list[Obj] = answer.json()["items"]
        return items

    def step(self) -> None:
        nodes = self._items("/api/v1/nodes")
        leases = self._items(LEASES)
        renewed = {
            lease["metadata"]["name"]: _parse((lease.get("spec") or {}).get("renewTime"))
            for lease in leases
        }
        now = _now()
        for node in nodes:
            self._monitor(node, renewed.get(node["metadata"]["name"]), now)
        nodes = self._items("/api/v1/nodes")
        pods = self._items("/api/v1/pods")
        self._evict(nodes, pods)
        self._collect(nodes, pods)

    def _monitor(
        self, node: Obj, renewed: datetime.datetime | None, now: datetime.datetime
    ) -> None:
        name = node["metadata"]["name"]
        seen = self._first_seen.setdefault(name, now)  # no Lease yet: grace from first sight
        heartbeat = max(renewed or seen, seen)
        ready = _ready(node)
        if (now - heartbeat).total_seconds() > self.grace_s and ready != "Unknown":
            condition = {
                "type": "Ready",
                "status": "Unknown",
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastTransitionTime": _stamp(now),
            }
            body = {"status": {"conditions": [condition]}}
            path = f"/api/v1/nodes/{name}/status"
            answer = self.api.patch(path, json=body, headers=MERGE)
            if answer.is_success:
                self._note(name, "Ready Unknown")
                ready, node = "Unknown", answer.json()  # its new version, for the taints
        want = wanted_taint(ready)
        taints: list[Obj] = (node.get("spec") or {}).get("taints") or []
        ours = {
            (t.get("key"), t.get("effect"))
            for t in taints
            if t.get("key") in (NOT_READY, UNREACHABLE)
        }
        goal = {(want, "NoSchedule"), (want, "NoExecute")} if want else set()
        if ours == goal:
            return
        kept = [
            t
            for t in taints
            if t.get("key") not in (NOT_READY, UNREACHABLE)
            or (t.get("key"), t.get("effect")) in goal
        ]
        for key, effect in sorted(goal - ours):
            kept.append({"key": key, "effect": effect, "timeAdded": _stamp(now)})
        patch: Obj = {
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": kept or None},
        }
        if self.api.patch(f"/api/v1/nodes/{name}", json=patch, headers=MERGE).is_success:
            self._note(name, f"taints {sorted(k for k, _ in goal) or 'removed'}")

    def _evict(self, nodes: list[Obj], pods: list[Obj]) -> None:
        taints = {n["metadata"]["name"]: (n.get("spec") or {}).get("taints") or [] for n in nodes}
        now = _now()
        for pod in pods:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            node = spec.get("nodeName")
            if not node or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            due = eviction_at(pod, taints.get(node, []), now)
            if due is None or due > now:
                continue
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            options = {"preconditions": {"uid": meta["uid"]}}
            if self.api.request("DELETE", path, json=options).is_success:
                self.stats.evicted.append(meta["name"])
                self._note(meta["name"], f"evicted from {node}")

    def _collect(self, nodes: list[Obj], pods: list[Obj]) -> None:
        by_name = {n["metadata"]["name"]: n for n in nodes}
        for pod in pods:
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                continue
            body = by_name.get(node)
            fenced = body is not None and meta.get("deletionTimestamp") and _ready(body) != "True"
            fenced = fenced and any(
                t.get("key") == OUT_OF_SERVICE
                for t in (body or {}).get("spec", {}).get("taints") or []
            )
            if body is not None and not fenced:
                continue
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            if self.api.request("DELETE", path, json=options).is_success:
                self.stats.force_deleted.append(meta["name"])
                self._note(meta["name"], f"force-deleted ({node} {'fenced' if body else 'gone'})")
