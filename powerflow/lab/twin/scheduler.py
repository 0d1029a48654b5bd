"""A small kube-scheduler for the pods with ``schedulerName: powerflow-scheduler``.

What kube-scheduler does for such a pod with the Helm chart's configuration
(``helm/powerflow/files/kube-scheduler-config.yaml``: one extender with
``filterVerb``, ``prioritizeVerb`` and ``bindVerb``, ``nodeCacheCapable: true``,
``ignorable: false``, ``weight: 5``, ``percentageOfNodesToScore: 100``), in its
order (``pkg/scheduler/schedule_one.go``):

1. pods leave the active queue in order of creation (equal priority);
2. in-tree filters: the node is Ready and schedulable, its ``NoSchedule`` and
   ``NoExecute`` taints are tolerated, its labels pass the pod's node selector and
   required node affinity (``NodeAffinity``: ``powerflow.lab.twin.affinity``), and
   ``NodeResourcesFit``: the pod's
   ``nvidia.com/gpu`` fits the node's allocatable minus what its bound pods,
   and the pods this scheduler assumed on it, request;
3. no feasible node: unschedulable, retried after the back-off;
4. the extender's ``filter`` with ``NodeNames`` (the feasible nodes; ``Nodes``
   null, as ``nodeCacheCapable`` sends it): an ``Error``, an HTTP failure or
   a timeout (``httpTimeout`` 10 s) is a scheduling error (not ignorable: the
   pod is retried after the back-off); the nodes left are ``NodeNames``;
   ``FailedNodes`` and ``FailedAndUnresolvableNodes`` are dropped (the latter
   also from preemption, which this scheduler never tries: PowerFlow's pods
   carry no priority);
5. one node left: it is the host, scoring is skipped (``len(feasibleNodes) == 1``);
   several: the extender's ``prioritize`` on them; each score times
   ``weight`` times ``MaxNodeScore / MaxExtenderPriority`` (100/10) is added
   to the in-tree scores (taken as equal here: they do not depend on the
   extender's choice for pods that differ only in GPUs); the highest total
   wins, ties broken at random (seeded, as ``selectHost`` samples);
6. the pod is assumed on the host and bound by the extender's ``bind``
   (``ExtenderBindingArgs``); an ``Error`` or an HTTP failure forgets the
   assumption and retries the pod after the back-off.

Back-off: ``podInitialBackoffSeconds`` 1 s doubling per failed attempt up to
``podMaxBackoffSeconds`` 10 s (kube-scheduler's defaults, real seconds: the
scheduler's own latency, not a duration of the trace).
kube-scheduler also moves unschedulable pods back to the active queue on
cluster events that may make them fit; here a pod deleted or a node changed
does the same.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerflow.core import contract
from powerflow.lab.twin import affinity

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
EXTENDER_WEIGHT = 5
HTTP_TIMEOUT_S = 10.0
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class SchedulerConfig:
    """What the loop takes from a ``KubeSchedulerConfiguration`` (``from_config``): the
    profile's ``schedulerName`` and its one extender. The defaults are the chart's."""

    scheduler_name: str = contract.SCHEDULER_NAME
    url_prefix: str = ""
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    bind_verb: str = "bind"
    weight: int = EXTENDER_WEIGHT
    http_timeout_s: float = HTTP_TIMEOUT_S
    node_cache_capable: bool = True
    ignorable: bool = False
    managed_resources: tuple[str, ...] = ()
    """Pods that request none of these skip the extender (empty: every pod asks it)."""
    percentage_of_nodes_to_score: int = 100

    @classmethod
    def from_config(cls, doc: Mapping[str, Any]) -> SchedulerConfig:
        """The loop's settings from a ``kubescheduler.config.k8s.io/v1`` document.
        Refuses what the loop does not imitate (several profiles or extenders, a node
        sample under 100 %, HTTPS to the extender), so a config that would make
        kube-scheduler behave otherwise never passes unnoticed."""
        if doc.get("kind") != "KubeSchedulerConfiguration":
            raise ValueError(f"not a KubeSchedulerConfiguration: {doc.get('kind')!r}")
        profiles = doc.get("profiles") or []
        extenders = doc.get("extenders") or []
        if len(profiles) != 1 or len(extenders) != 1:
            raise ValueError("the twin's scheduler imitates one profile with one extender")
        ext = extenders[0]
        if ext.get("enableHTTPS"):
            raise ValueError("the twin's scheduler calls its extender over plain HTTP only")
        percentage = int(doc.get("percentageOfNodesToScore", 0) or 0)
        if percentage != 100:
            raise ValueError(
                f"percentageOfNodesToScore {percentage}: kube-scheduler would send the "
                "extender a sample of the feasible nodes, which the twin does not imitate"
            )
        timeout = str(ext.get("httpTimeout", "30s"))
        seconds = float(timeout[:-1]) if timeout.endswith("s") else float(timeout)
        return cls(
            scheduler_name=str(profiles[0].get("schedulerName", "default-scheduler")),
            url_prefix=str(ext["urlPrefix"]).rstrip("/"),
            filter_verb=str(ext.get("filterVerb", "")),
            prioritize_verb=str(ext.get("prioritizeVerb", "")),
            bind_verb=str(ext.get("bindVerb", "")),
            weight=int(ext.get("weight", 1)),
            http_timeout_s=seconds,
            node_cache_capable=bool(ext.get("nodeCacheCapable", False)),
            ignorable=bool(ext.get("ignorable", False)),
            managed_resources=tuple(str(r["name"]) for r in ext.get("managedResources") or []),
            percentage_of_nodes_to_score=percentage,
        )


@dataclass
class Attempts:
    """What the scheduler remembers of one pod (by uid)."""

    failures: int = 0
    retry_at: float = 0.0
    last_reason: str = ""


@dataclass
class SchedulerStats:
    """Counts for tests and the demo: attempts by outcome."""

    bound: int = 0
    unschedulable: int = 0
    errors: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Real seconds spent in each verb (and in reading the cluster), for ``docs/twin.md``."""

    def timed(self, verb: str, since: float) -> None:
        self.calls[verb] = self.calls.get(verb, 0) + 1
        self.seconds[verb] = self.seconds.get(verb, 0.0) + time.monotonic() - since

    def note(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def gpu_request(pod: Mapping[str, Any], resource: str = contract.GPU_RESOURCE) -> int:
    """The pod's ``nvidia.com/gpu`` (limits, which the device plugin's resource equals),
    or another extended ``resource``."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        total += int(value or 0)
    return total


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def tolerated(taint: Mapping[str, Any], tolerations: list[Obj]) -> bool:
    """Whether ``tolerations`` tolerate ``taint`` (``ToleratesTaint`` in k8s.io/api):
    an effect given must be the taint's; ``Exists`` matches any value (and, without a
    key, every taint); otherwise key and value must be equal."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists":
            if t.get("key") in (None, "", taint.get("key")):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def feasible(pod: Obj, nodes: list[Obj], used: Mapping[str, int]) -> tuple[list[str], str]:
    """The in-tree filters: names of the nodes that pass, and why none did (if so)."""
    want = gpu_request(pod)
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    out: list[str] = []
    reasons: dict[str, int] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        taints = [
            t
            for t in (node.get("spec") or {}).get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
        ]
        allocatable = int(
            ((node.get("status") or {}).get("allocatable") or {}).get(contract.GPU_RESOURCE, 0)
        )
        if not _ready(node) or (node.get("spec") or {}).get("unschedulable"):
            reason = "node(s) were unschedulable or not ready"
        elif not all(tolerated(t, tolerations) for t in taints):
            reason = "node(s) had untolerated taint"
        elif not affinity.matches(pod, node):
            reason = affinity.REASON
        elif allocatable - used.get(name, 0) < want:
            reason = f"Insufficient {contract.GPU_RESOURCE}"
        else:
            out.append(name)
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
    why = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return out, f"0/{len(nodes)} nodes are available: {why}."


def bind(api: httpx.Client, pod: Mapping[str, Any], host: str) -> httpx.Response:
    """``POST .../pods/NAME/binding`` to ``host``: how a scheduler binds a pod."""
    meta = pod["metadata"]
    return api.post(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
        json={
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": host},
        },
    )


class Scheduler:
    """The loop (a thread): ``start()``, ``stop()``. ``api`` is the API server's URL,
    ``extender`` the extender's ``urlPrefix``."""

    def __init__(
        self,
        api: str,
        extender: str,
        *,
        seed: int = 0,
        tick_s: float = 0.1,
        config: SchedulerConfig | None = None,
        token: str | None = None,
        verify: str | bool = True,
    ) -> None:
        self.config = config or SchedulerConfig(url_prefix=extender)
        headers = {"User-Agent": "twin-scheduler"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.api = httpx.Client(base_url=api, timeout=30.0, headers=headers, verify=verify)
        self.extender = httpx.Client(
            base_url=self.config.url_prefix or extender, timeout=self.config.http_timeout_s
        )
        self.tick_s = tick_s
        self.rng = random.Random(seed)
        self.stats = SchedulerStats()
        self.attempts: dict[str, Attempts] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="twin-scheduler", daemon=True)
        self._seen_pods: set[str] = set()
        self._node_versions: dict[str, str] = {}

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.api.close()
        self.extender.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.schedule_pending()
            except httpx.HTTPError as exc:  # the API server away: try again next tick
                log.warning("scheduler: %s", exc)
            self._stop.wait(self.tick_s)

    def schedule_pending(self) -> None:
        """One pass over the active queue: every pending pod whose back-off is over."""
        t0 = time.monotonic()
        unbound = self.api.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName="})
        if not unbound.json()["items"] and not self.attempts:
            return  # nothing pending: no need to read the rest
        pods: list[Obj] = self.api.get("/api/v1/pods").json()["items"]
        nodes: list[Obj] = self.api.get("/api/v1/nodes").json()["items"]
        self.stats.timed("read", t0)
        self._requeue_on_events(pods, nodes)
        used: dict[str, int] = {}
        pending = []
        for pod in pods:
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            if spec.get("nodeName"):
                used[spec["nodeName"]] = used.get(spec["nodeName"], 0) + gpu_request(pod)
            elif spec.get("schedulerName") == self.config.scheduler_name and not pod[
                "metadata"
            ].get("deletionTimestamp"):
                pending.append(pod)
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), _rv(p)))
        now = time.monotonic()
        for pod in pending:
            if self._stop.is_set():
                return
            state = self.attempts.setdefault(pod["metadata"]["uid"], Attempts())
            if state.retry_at > now:
                continue
            host = self.schedule_one(pod, nodes, used)
            if host is None:
                state.failures += 1
                backoff = min(INITIAL_BACKOFF_S * 2 ** (state.failures - 1), MAX_BACKOFF_S)
                state.retry_at = time.monotonic() + backoff
            else:
                used[host] = used.get(host, 0) + gpu_request(pod)
                self.attempts.pop(pod["metadata"]["uid"], None)

    def _requeue_on_events(self, pods: list[Obj], nodes: list[Obj]) -> None:
        """A pod gone or a node changed may make unschedulable pods fit: retry them now."""
        uids = {p["metadata"]["uid"] for p in pods}
        versions = {n["metadata"]["name"]: n["metadata"].get("resourceVersion", "") for n in nodes}
        if (self._seen_pods - uids) or versions != self._node_versions:
            for state in self.attempts.values():
                state.retry_at = 0.0
        self._seen_pods, self._node_versions = uids, versions
        for uid in list(self.attempts):
            if uid not in uids:
                del self.attempts[uid]

    def _fail(self, pod: Obj, reason: str, *, error: bool) -> None:
        if error:
            self.stats.errors += 1
        else:
            self.stats.unschedulable += 1
        self.stats.note(reason.split(":")[0])
        self.attempts[pod["metadata"]["uid"]].last_reason = reason
        log.debug(
            "scheduler: %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], reason
        )

    def schedule_one(self, pod: Obj, nodes: list[Obj], used: Mapping[str, int]) -> str | None:
        """Filter, prioritize, bind one pod; the host it was bound to, or None."""
        names, why = feasible(pod, nodes, used)
        if not names:
            self._fail(pod, f"Unschedulable: {why}", error=False)
            return None
        cfg = self.config
        interested = not cfg.managed_resources or any(
            gpu_request(pod, r) for r in cfg.managed_resources
        )
        if not interested:  # kube-scheduler asks an extender only about pods it manages
            return self._bind_by_api(pod, names[0] if len(names) == 1 else self.rng.choice(names))
        args = self._args(pod, names, nodes)
        result: Obj = {"NodeNames": names}
        try:
            if cfg.filter_verb:
                t0 = time.monotonic()
                response = self.extender.post(f"/{cfg.filter_verb}", json=args)
                self.stats.timed("filter", t0)
                response.raise_for_status()
                result = response.json()
                if result.get("Error"):
                    raise ValueError(str(result["Error"]))
        except (httpx.HTTPError, ValueError) as exc:
            if not cfg.ignorable:
                self._fail(pod, f"ExtenderError: filter: {exc}", error=True)
                return None
            result = {"NodeNames": names}  # an ignorable extender's failure is skipped
        failed = {
            **(result.get("FailedNodes") or {}),
            **(result.get("FailedAndUnresolvableNodes") or {}),
        }
        if not cfg.node_cache_capable:
            items = (result.get("Nodes") or {}).get("items") or []
            result["NodeNames"] = [n["metadata"]["name"] for n in items]
        left = [n for n in result.get("NodeNames") or [] if n in names and n not in failed]
        if not left:
            detail = "; ".join(f"{n}: {r}" for n, r in sorted(failed.items()))
            self._fail(pod, f"Unschedulable: the extender left no node ({detail})", error=False)
            return None
        host = left[0] if len(left) == 1 else self._prioritize(pod, left, nodes)
        if host is None:
            return None
        if not cfg.bind_verb:
            return self._bind_by_api(pod, host)
        binding = {
            "PodName": pod["metadata"]["name"],
            "PodNamespace": pod["metadata"]["namespace"],
            "PodUID": pod["metadata"]["uid"],
            "Node": host,
        }
        try:
            t0 = time.monotonic()
            response = self.extender.post(f"/{cfg.bind_verb}", json=binding)
            self.stats.timed("bind", t0)
            response.raise_for_status()
            error = response.json().get("Error")
        except (httpx.HTTPError, ValueError) as exc:
            error = str(exc)
        if error:
            self._fail(pod, f"BindError: {error}", error=True)
            return None
        self.stats.bound += 1
        return host

    def _args(self, pod: Obj, names: list[str], nodes: list[Obj]) -> Obj:
        """``ExtenderArgs``: node names for a ``nodeCacheCapable`` extender, else the
        nodes themselves."""
        if self.config.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": names}
        chosen = [n for n in nodes if n["metadata"]["name"] in names]
        return {"Pod": pod, "Nodes": {"items": chosen}, "NodeNames": None}

    def _bind_by_api(self, pod: Obj, host: str) -> str | None:
        """The default binder (no extender binds this pod): the pod's ``binding``."""
        answer = bind(self.api, pod, host)
        if answer.status_code >= 300:
            self._fail(pod, f"BindError: {answer.status_code} {answer.text[:200]}", error=True)
            return None
        self.stats.bound += 1
        return host

    def _prioritize(self, pod: Obj, names: list[str], nodes: list[Obj]) -> str | None:
        if not self.config.prioritize_verb:
            return self.rng.choice(names)
        args = self._args(pod, names, nodes)
        try:
            t0 = time.monotonic()
            response = self.extender.post(f"/{self.config.prioritize_verb}", json=args)
            self.stats.timed("prioritize", t0)
            response.raise_for_status()
            scores = {h["Host"]: int(h["Score"]) for h in response.json() or []}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._fail(pod, f"ExtenderError: prioritize: {exc}", error=True)
            return None
        factor = self.config.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        totals = {n: scores.get(n, 0) * factor for n in names}
        best = max(totals.values())
        return self.rng.choice([n for n in names if totals[n] == best])


def _rv(pod: Obj) -> int:
    try:
        return int(pod["metadata"].get("resourceVersion", 0))
    except ValueError:
        return 0
