"""The chart twin's kubelet and controllers for the chart's own pods.

``Controllers`` does what kube-controller-manager and the default scheduler do
for the chart's workloads: a Deployment gets ``replicas`` pods (owned by the
Deployment itself: no ReplicaSet in between), a DaemonSet one pod on every
node its ``nodeSelector`` matches and whose ``NoSchedule``/``NoExecute``
taints it tolerates; a pod of the default scheduler (no ``schedulerName`` or
``default-scheduler``) is bound to the matching node with the fewest pods.

``PodKubelet`` does a node's kubelet's part for those pods (the workers, which
request ``nvidia.com/gpu``, are the worker kubelet's, ``kubelet``): each pod in
a thread of its own, from its volumes (``emptyDir``; ``configMap`` and
``secret``, keys or ``items``; ``projected`` with service-account tokens from
the API server's TokenRequest, ``configMap``, ``secret`` and ``downwardAPI``;
``hostPath`` in a folder of the node's; the service-account volume at
``/var/run/secrets/kubernetes.io/serviceaccount`` unless automounting is off)
and environment (``value``, ``fieldRef``, ``configMapKeyRef``,
``secretKeyRef``, ``$(VAR)``, ``KUBERNETES_SERVICE_HOST``/``_PORT``), through its
init containers in order, to its containers (``runtime``), with its
readiness and liveness probes (``httpGet`` at the pod's IP, ``exec`` in the
container) run on their schedules and thresholds. What it reports in the pod's
status is what ``kubectl get pods`` reads (``pod_status_text``): a failing init
container is ``Init:Error`` then ``Init:CrashLoopBackOff``, restarted with
the kubelet's back-off (10 s doubling up to 5 min), a container that exits
or fails its liveness probe is restarted likewise (``restartPolicy:
Always``). A pod being deleted has its containers stopped (SIGTERM, SIGKILL
after its grace period) and is then deleted for good.

Not imitated: startup probes, ``tcpSocket`` and ``grpc`` probes, lifecycle
hooks, ephemeral containers, resource limits (``runtime``), image pulls.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from powerflow.core.timefmt import format_time
from powerflow.lab.twin.kubelet import requests_gpu
from powerflow.lab.twin.runtime import Container, Image, Mount, Spec, argv_of, expand
from powerflow.lab.twin.scheduler import bind, tolerated

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE = {"Content-Type": "application/merge-patch+json"}
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
BACKOFF_S, MAX_BACKOFF_S = 10.0, 300.0


def now() -> str:
    return format_time(time.time())


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def fits(spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """The default scheduler's NodeSelector and TaintToleration filters (and the
    DaemonSet controller's, which uses them too)."""
    if not matches(spec.get("nodeSelector") or {}, node["metadata"].get("labels") or {}):
        return False
    tolerations = spec.get("tolerations") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return all(
        tolerated(t, tolerations) for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
    )


def container_ports(spec: Mapping[str, Any]) -> set[int]:
    """The ports a pod's containers declare (``containerPort``)."""
    return {
        int(port["containerPort"])
        for container in spec.get("containers") or []
        for port in container.get("ports") or []
        if isinstance(port.get("containerPort"), int)
    }


def node_ports(pods: list[Mapping[str, Any]]) -> dict[str, set[int]]:
    """Per node, the ports its bound pods declare, terminating ones included (they
    hold their sockets until they exit)."""
    out: dict[str, set[int]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            out.setdefault(node, set()).update(container_ports(pod["spec"]))
    return out


HASH = "twin.powerflow.io/template-hash"
"""The pod template a pod was made from (what the ``pod-template-hash`` label of a
ReplicaSet's pods and the DaemonSet's ``controller-revision-hash`` tell)."""


def template_hash(owner: Mapping[str, Any]) -> str:
    text = json.dumps(owner["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _hash_of(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(HASH, ""))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A ``matchLabels`` selector's verdict (an empty one matches everything)."""
    return all(labels.get(k) == v for k, v in selector.items())


def ready_endpoints(
    selector: Mapping[str, str], target: int | str, pods: list[Obj]
) -> list[tuple[Obj, int]]:
    """The endpoints of a Service port (what the EndpointSlice controller lists): each
    ready, not terminating pod its ``selector`` matches, with the container port its
    ``targetPort`` is (a number, or a container port's name)."""
    out = []
    for pod in pods:
        if not selector or not matches(selector, pod["metadata"].get("labels") or {}):
            continue
        if not pod_ready(pod) or pod["metadata"].get("deletionTimestamp"):
            continue
        if not (pod.get("status") or {}).get("podIP"):
            continue
        named = [
            p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports") or []
            if p.get("name") == target
        ]
        number = int(target) if str(target).isdigit() else (named[0] if named else None)
        if number is not None:
            out.append((pod, int(number)))
    return out


class Controllers:
    """Deployments, DaemonSets and the default scheduler, one pass per ``tick``."""

    def __init__(self, api: httpx.Client, nodes: list[str]) -> None:
        self.api, self.nodes = api, nodes

    def tick(self) -> None:
        pods = self.api.get("/api/v1/pods").json()["items"]
        nodes = [
            n
            for n in self.api.get("/api/v1/nodes").json()["items"]
            if n["metadata"]["name"] in self.nodes
        ]
        for d in self.api.get("/apis/apps/v1/deployments").json()["items"]:
            self._deployment(d, [p for p in pods if owned_by(p, d["metadata"]["uid"])])
        for ds in self.api.get("/apis/apps/v1/daemonsets").json()["items"]:
            spec = ds["spec"]["template"]["spec"]
            mine = [
                p
                for p in pods
                if owned_by(p, ds["metadata"]["uid"]) and not p["metadata"].get("deletionTimestamp")
            ]
            terminating = [
                p
                for p in pods
                if owned_by(p, ds["metadata"]["uid"]) and p["metadata"].get("deletionTimestamp")
            ]
            have = {p["spec"].get("nodeName") for p in mine}
            stale = [p for p in mine if _hash_of(p) != template_hash(ds)]
            if stale and not terminating and all(pod_ready(p) for p in mine if p not in stale):
                self._delete(stale[0])  # RollingUpdate, one node at a time
            busy = {p["spec"].get("nodeName") for p in terminating}
            for node in nodes:
                name = node["metadata"]["name"]
                if name not in have and name not in busy and fits(spec, node):
                    self._create(ds, "DaemonSet", name)
        load = {n["metadata"]["name"]: 0 for n in nodes}
        for p in pods:
            if p["spec"].get("nodeName") in load:
                load[p["spec"]["nodeName"]] += 1
        # The twin's pods share their node's network namespace (on a cluster each pod
        # has an address of its own), so a pod never goes where a pod already declares
        # one of its ports: a Deployment's new pod would fail to bind beside the old one
        # it replaces.
        taken = node_ports(pods)
        for p in pods:
            spec = p["spec"]
            if spec.get("nodeName") or spec.get("schedulerName", "default-scheduler") != (
                "default-scheduler"
            ):
                continue
            ports = container_ports(spec)
            fitting = [
                n["metadata"]["name"]
                for n in nodes
                if fits(spec, n) and not ports & taken.get(n["metadata"]["name"], set())
            ]
            if not fitting:
                continue
            host = min(fitting, key=lambda n: (load[n], n))
            load[host] += 1
            taken.setdefault(host, set()).update(ports)
            bind(self.api, p, host)

    def _deployment(self, d: Obj, mine: list[Obj]) -> None:
        """The Deployment controller, one step: ``Recreate`` deletes every old pod and
        creates the new ones once none is left; ``RollingUpdate`` (one surge pod, none
        unavailable: the defaults for one replica) adds a new pod, then deletes an old
        one each time the ready pods would still be ``replicas`` without it."""
        replicas = int(d["spec"].get("replicas", 1))
        live = [p for p in mine if not p["metadata"].get("deletionTimestamp")]
        current = [p for p in live if _hash_of(p) == template_hash(d)]
        stale = [p for p in live if p not in current]
        if (d["spec"].get("strategy") or {}).get("type") == "Recreate":
            if stale:
                for p in stale:
                    self._delete(p)
            elif not [p for p in mine if p not in live]:
                for _ in range(replicas - len(current)):
                    self._create(d, "Deployment", None)
            return
        ready = sum(1 for p in live if pod_ready(p))
        if stale and ready - 1 >= replicas:
            self._delete(next((p for p in stale if not pod_ready(p)), stale[0]))
        if len(current) < replicas and len(live) < replicas + 1:
            self._create(d, "Deployment", None)

    def _delete(self, pod: Obj) -> None:
        meta = pod["metadata"]
        self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")

    def _create(self, owner: Obj, kind: str, node: str | None) -> None:
        meta, template = owner["metadata"], owner["spec"]["template"]
        pod_meta = json.loads(json.dumps(template.get("metadata") or {}))
        pod_meta.setdefault("annotations", {})[HASH] = template_hash(owner)
        pod_meta["generateName"] = f"{meta['name']}-"
        pod_meta["namespace"] = meta["namespace"]
        pod_meta["ownerReferences"] = [
            {
                "apiVersion": owner.get("apiVersion", "apps/v1"),
                "kind": kind,
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        spec = json.loads(json.dumps(template["spec"]))
        if node is not None:
            spec["nodeName"] = node
        answer = self.api.post(
            f"/api/v1/namespaces/{meta['namespace']}/pods",
            json={"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec},
        )
        if answer.status_code >= 300:
            log.warning("%s %s: pod refused: %s", kind, meta["name"], answer.text[:300])


@dataclass
class Node:
    """What the pod kubelet knows of one node."""

    name: str
    address: str
    netns: str | None
    folder: Path
    """The node's own files (``hostPath`` volumes are under it)."""
    device_mounts: tuple[Mount, ...] = ()
    """What the GPU runtime hook adds to a container that asks for the node's GPUs
    (``NVIDIA_VISIBLE_DEVICES`` in its environment), as the NVIDIA container toolkit
    adds the driver's library and device files."""


@dataclass
class Probe:
    spec: Obj
    failures: int = 0
    successes: int = 0
    next_at: float = 0.0


@dataclass
class Running:
    name: str
    container: Container
    spec: Obj
    restarts: int = 0
    ready: bool = False
    readiness: Probe | None = None
    liveness: Probe | None = None
    waiting_until: float = 0.0
    last_exit: int | None = None
    started_at: str = ""
    reason: str = ""
    state: str = "waiting"


@dataclass
class PodState:
    uid: str
    namespace: str
    name: str
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)


def pod_status_text(pod: Mapping[str, Any]) -> str:
    """The STATUS column of ``kubectl get pods`` (``printPod`` in kubectl's printers,
    the cases the chart twin produces)."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    inits = status.get("initContainerStatuses") or []
    total = len((pod.get("spec") or {}).get("initContainers") or [])
    for i, s in enumerate(inits):
        state = s.get("state") or {}
        if "terminated" in state and state["terminated"].get("exitCode") == 0:
            continue
        if "terminated" in state:
            return f"Init:{state['terminated'].get('reason') or 'Error'}"
        if "waiting" in state and state["waiting"].get("reason") not in (None, "PodInitializing"):
            return f"Init:{state['waiting']['reason']}"
        return f"Init:{i}/{total}"
    reason = status.get("phase", "Pending")
    for s in status.get("containerStatuses") or []:
        state = s.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            reason = state["terminated"].get("reason") or "Error"
    return str(reason)


@dataclass(frozen=True)
class Images:
    """The container images the pod kubelet runs, and how. ``own``: the chart's image
    references, run from the built image; ``standins``: image reference prefix -> the
    argv that stands in for that image's command in the PowerFlow image
    (kube-scheduler's), with ``serving`` (a folder with ``tls.crt`` and ``tls.key``)
    mounted at ``/run/powerflow-twin/serving`` and ``standin_mounts`` (what the
    stand-in runs that the image lacks). A container of any other image cannot be
    pulled (``ErrImagePull``)."""

    own: frozenset[str]
    standins: Mapping[str, Callable[[list[str]], list[str]]] = field(default_factory=dict)
    standin_mounts: tuple[Mount, ...] = ()
    serving: Path | None = None


class PodKubelet:
    """Runs the chart's pods on the twin's nodes (module docstring)."""

    def __init__(
        self,
        api: httpx.Client,
        image: Image,
        nodes: Mapping[str, Node],
        folder: Path,
        *,
        hosts: Callable[[], str],
        kubernetes_service: tuple[str, int],
        images: Images,
        tick_s: float = 0.5,
    ) -> None:
        """``image``: the built image the chart's own containers run from (``images``
        says which containers those are)."""
        self.images = images
        self.api, self.image, self.nodes, self.folder = api, image, nodes, folder
        self.hosts = hosts
        self.kubernetes_service = kubernetes_service
        self.tick_s = tick_s
        self.pods: dict[str, PodState] = {}
        self.controllers = Controllers(api, list(nodes))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="twin-pod-kubelet", daemon=True)
        self.ready: dict[str, bool] = {}
        """Pod uid -> ready (``Endpoints`` for the service mesh)."""
        self.addresses: dict[str, str] = {}

    def start(self) -> PodKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for state in list(self.pods.values()):
            state.stop.set()
        for state in list(self.pods.values()):
            state.thread.join(60)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.controllers.tick()
                self._sync()
            except httpx.HTTPError as exc:
                log.warning("pod kubelet: %s", exc)
            self._stop.wait(self.tick_s)

    def _sync(self) -> None:
        for pod in self.api.get("/api/v1/pods").json()["items"]:
            meta, spec = pod["metadata"], pod["spec"]
            if spec.get("nodeName") not in self.nodes or requests_gpu(pod):
                continue
            uid = meta["uid"]
            if uid not in self.pods:
                state = PodState(uid, meta["namespace"], meta["name"], threading.Thread())
                state.thread = threading.Thread(
                    target=self._run_pod, args=(pod, state), name=f"pod-{meta['name']}", daemon=True
                )
                self.pods[uid] = state
                state.thread.start()
            elif meta.get("deletionTimestamp"):
                self.pods[uid].stop.set()

    # -- one pod ---------------------------------------------------------------------
    def _run_pod(self, pod: Obj, state: PodState) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        node = self.nodes[spec["nodeName"]]
        folder = self.folder / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        self.addresses[meta["uid"]] = node.address
        status: Obj = {
            "phase": "Pending",
            "hostIP": node.address,
            "podIP": node.address,
            "podIPs": [{"ip": node.address}],
            "startTime": now(),
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        try:
            volumes = self._volumes(pod, node, folder)
        except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
            self._event(pod, "FailedMount", str(exc))
            self._patch_status(pod, {**status, "message": f"FailedMount: {exc}"})
            log.warning("pod %s: volumes: %s", meta["name"], exc)
            state.stop.wait()
            self._finish(pod, [], folder)
            return
        try:
            inits = [
                self._container(pod, c, node, volumes, folder)
                for c in spec.get("initContainers") or []
            ]
            mains = [self._container(pod, c, node, volumes, folder) for c in spec["containers"]]
        except (ValueError, KeyError, httpx.HTTPError) as exc:
            reason = "ErrImagePull" if "image" in str(exc) else "CreateContainerConfigError"
            waiting = {"waiting": {"reason": reason, "message": str(exc)}}
            status["containerStatuses"] = [
                {"name": c["name"], "ready": False, "restartCount": 0, "state": waiting}
                for c in spec["containers"]
            ]
            self._event(pod, "Failed", str(exc))
            self._patch_status(pod, status)
            log.warning("pod %s: %s", meta["name"], exc)
            state.stop.wait()
            self._finish(pod, [], folder)
            return
        status["initContainerStatuses"] = [self._status_of(r) for r in inits]
        status["containerStatuses"] = [self._status_of(r) for r in mains]
        self._patch_status(pod, status)
        for r in inits:  # in order, each to a successful exit
            while not state.stop.is_set():
                self._start(r)
                while (rc := r.container.exited()) is None and not state.stop.is_set():
                    time.sleep(0.1)
                if state.stop.is_set():
                    r.container.stop(0)
                    self._finish(pod, [], folder)
                    return
                r.last_exit, r.state = rc, "terminated"
                r.reason = "Completed" if rc == 0 else "Error"
                status["initContainerStatuses"] = [self._status_of(x) for x in inits]
                self._patch_status(pod, status)
                if rc == 0:
                    break
                log.warning(
                    "pod %s: init container %s exited %s: %s",
                    meta["name"],
                    r.name,
                    rc,
                    r.container.log_tail(5),
                )
                self._back_off(r)
                status["initContainerStatuses"] = [self._status_of(x) for x in inits]
                self._patch_status(pod, status)
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
        ]
        for r in mains:
            self._start(r)
        status["phase"] = "Running"
        last = ""
        while not state.stop.is_set():
            t = time.monotonic()
            for r in mains:
                self._watch(pod, r, t)
            ready = all(r.ready for r in mains)
            self.ready[meta["uid"]] = ready
            cond = "True" if ready else "False"
            status["conditions"] = [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": cond},
                {"type": "Ready", "status": cond},
            ]
            status["containerStatuses"] = [self._status_of(r) for r in mains]
            text = json.dumps(status, sort_keys=True)
            if text != last:
                self._patch_status(pod, status)
                last = text
            state.stop.wait(0.2)
        self.ready[meta["uid"]] = False
        self._finish(pod, mains, folder)

    def _finish(self, pod: Obj, mains: list[Running], folder: Path) -> None:
        """Stop the containers and delete the pod for good; ``folder`` (the containers'
        logs) stays, for a test's report."""
        meta = pod["metadata"]
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        for r in mains:
            r.container.stop(grace)
        with contextlib.suppress(httpx.HTTPError):
            self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                params={"gracePeriodSeconds": "0"},
            )

    def _start(self, r: Running) -> None:
        r.container.start()
        r.state, r.started_at, r.ready = "running", now(), False
        t = time.monotonic()
        for probe in (r.readiness, r.liveness):
            if probe is not None:
                probe.failures = probe.successes = 0
                probe.next_at = t + float(probe.spec.get("initialDelaySeconds", 0))

    def _back_off(self, r: Running) -> None:
        r.restarts += 1
        r.state, r.reason = "waiting", "CrashLoopBackOff"
        delay = min(BACKOFF_S * 2 ** (r.restarts - 1), MAX_BACKOFF_S)
        r.waiting_until = time.monotonic() + delay

    def _watch(self, pod: Obj, r: Running, t: float) -> None:
        if r.state == "waiting":
            if t >= r.waiting_until:
                self._start(r)
            return
        rc = r.container.exited()
        if rc is not None:
            log.warning(
                "pod %s: container %s exited %s: %s",
                pod["metadata"]["name"],
                r.name,
                rc,
                r.container.log_tail(10),
            )
            r.last_exit, r.ready = rc, False
            self._back_off(r)
            return
        if r.readiness is not None and t >= r.readiness.next_at:
            ok = self._probe(pod, r, r.readiness)
            if ok is not None:
                r.ready = ok
        elif r.readiness is None:
            r.ready = True
        live = r.liveness
        if live is not None and t >= live.next_at and self._probe(pod, r, live) is False:
            self._event(pod, "Unhealthy", f"Liveness probe failed: container {r.name}")
            r.container.stop(float(pod["spec"].get("terminationGracePeriodSeconds", 30)))
            r.last_exit, r.ready = 137, False
            self._back_off(r)

    def _probe(self, pod: Obj, r: Running, probe: Probe) -> bool | None:
        """Run ``probe`` once; its verdict after the thresholds (None: not decided yet)."""
        p = probe.spec
        probe.next_at = time.monotonic() + float(p.get("periodSeconds", 10))
        timeout = float(p.get("timeoutSeconds", 1))
        if "httpGet" in p:
            get = p["httpGet"]
            port = self._port(r.spec, get["port"])
            host = get.get("host") or self.addresses[pod["metadata"]["uid"]]
            scheme = str(get.get("scheme", "HTTP")).lower()
            try:
                code = httpx.get(
                    f"{scheme}://{host}:{port}{get.get('path', '/')}", timeout=timeout, verify=False
                ).status_code
                ok = 200 <= code < 400
            except httpx.HTTPError:
                ok = False
        elif "exec" in p:
            rc = r.container.exec(p["exec"]["command"], timeout)
            ok = rc == 0
            if not ok:
                log.info(
                    "pod %s: %s exec probe: exit %s: %s",
                    pod["metadata"]["name"],
                    r.name,
                    rc,
                    r.container.exec_output.decode(errors="replace")[-300:],
                )
        else:
            raise ValueError(f"probe kind not imitated: {sorted(p)}")
        if ok:
            probe.successes, probe.failures = probe.successes + 1, 0
            return True if probe.successes >= int(p.get("successThreshold", 1)) else None
        probe.failures, probe.successes = probe.failures + 1, 0
        return False if probe.failures >= int(p.get("failureThreshold", 3)) else None

    @staticmethod
    def _port(container: Obj, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {port!r}")

    def _status_of(self, r: Running) -> Obj:
        state: Obj
        if r.state == "running":
            state = {"running": {"startedAt": r.started_at}}
        elif r.state == "terminated":
            state = {"terminated": {"exitCode": r.last_exit, "reason": r.reason}}
        else:
            state = {"waiting": {"reason": r.reason or "PodInitializing"}}
        out: Obj = {
            "name": r.name,
            "image": r.spec.get("image", ""),
            "ready": r.ready,
            "restartCount": r.restarts,
            "started": r.state == "running",
            "state": state,
        }
        if r.last_exit is not None and r.state != "terminated":
            out["lastState"] = {"terminated": {"exitCode": r.last_exit}}
        return out

    # -- the pod's parts -------------------------------------------------------------
    def _container(
        self, pod: Obj, c: Obj, node: Node, volumes: Mapping[str, Path], folder: Path
    ) -> Running:
        pod_sc = pod["spec"].get("securityContext") or {}
        sc = c.get("securityContext") or {}
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        uid, gid = self.image.ids(user, group)
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and uid == 0:
            raise ValueError(
                f"container {c['name']}: container has runAsNonRoot and image will run as root"
            )
        env = dict(self.image.env)
        host, port = self.kubernetes_service
        env.update(
            KUBERNETES_SERVICE_HOST=host,
            KUBERNETES_SERVICE_PORT=str(port),
            KUBERNETES_SERVICE_PORT_HTTPS=str(port),
            KUBERNETES_PORT=f"tcp://{host}:{port}",
            HOSTNAME=pod["metadata"]["name"],
        )
        for e in c.get("env") or []:
            env[e["name"]] = self._env_value(pod, e, env)
        caps = sc.get("capabilities") or {}
        drop = {str(x).lower() for x in caps.get("drop") or []}
        kept = (
            ()
            if "all" in drop
            else (
                "chown",
                "dac_override",
                "fowner",
                "fsetid",
                "kill",
                "setgid",
                "setuid",
                "setpcap",
                "net_bind_service",
                "net_raw",
                "sys_chroot",
                "mknod",
                "audit_write",
                "setfcap",
            )
        )
        kept_caps: tuple[str, ...] = tuple(k for k in kept if k not in drop) + tuple(
            str(a).lower() for a in caps.get("add") or []
        )
        mounts = [
            Mount(volumes[m["name"]], m["mountPath"], bool(m.get("readOnly")))
            for m in c.get("volumeMounts") or []
        ]
        if SA_PATH not in {m.target for m in mounts} and "kube-api-access" in volumes:
            mounts.append(Mount(volumes["kube-api-access"], SA_PATH, True))
        hosts = folder / "etc-hosts"
        mounts.append(Mount(hosts, "/etc/hosts", True))
        if "NVIDIA_VISIBLE_DEVICES" in env:
            mounts.extend(node.device_mounts)
        argv = argv_of(self.image, c.get("command"), c.get("args"))
        image = str(c.get("image", ""))
        images = self.images
        standin = next((f for p, f in images.standins.items() if image.startswith(p)), None)
        if standin is not None:
            argv = standin(argv)
            mounts.extend(images.standin_mounts)
            if images.serving is not None:
                mounts.append(Mount(images.serving, "/run/powerflow-twin/serving", True))
        elif image not in images.own:
            raise ValueError(
                f"image {image!r} is not the chart's image {sorted(self.images.own)}: "
                "the twin pulls no image"
            )
        spec = Spec(
            c["name"],
            tuple(expand(a, env) for a in argv),
            tuple(env.items()),
            uid,
            gid,
            bool(sc.get("readOnlyRootFilesystem")),
            sc.get("allowPrivilegeEscalation") is False,
            kept_caps,
            tuple(mounts),
        )
        scratch = folder / "containers" / f"{c['name']}-{secrets.token_hex(2)}"
        run = Running(c["name"], Container(self.image, spec, node.netns, scratch), c)
        if c.get("readinessProbe"):
            run.readiness = Probe(c["readinessProbe"])
        if c.get("livenessProbe"):
            run.liveness = Probe(c["livenessProbe"])
        return run

    def _env_value(self, pod: Obj, e: Obj, env: Mapping[str, str]) -> str:
        if "value" in e:
            return expand(str(e["value"]), env)
        source = e.get("valueFrom") or {}
        meta, spec = pod["metadata"], pod["spec"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"],
                "spec.nodeName": spec["nodeName"],
                "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                "status.hostIP": self.nodes[spec["nodeName"]].address,
                "status.podIP": self.nodes[spec["nodeName"]].address,
            }
            if path not in fields:
                raise ValueError(f"fieldRef {path} not imitated")
            return str(fields[path])
        for key, kind in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if key in source:
                ref = source[key]
                data = self._object(meta["namespace"], kind, ref["name"])
                value = (data.get("data") or {})[ref["key"]]
                return base64.b64decode(value).decode() if kind == "secrets" else str(value)
        raise ValueError(f"env {e.get('name')}: source not imitated: {sorted(source)}")

    def _object(self, namespace: str, kind: str, name: str) -> Obj:
        answer = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if answer.status_code == 404:
            raise KeyError(f'{kind} "{name}" not found')
        answer.raise_for_status()
        body: Obj = answer.json()
        return body

    def _volumes(self, pod: Obj, node: Node, folder: Path) -> dict[str, Path]:
        meta, spec = pod["metadata"], pod["spec"]
        out: dict[str, Path] = {}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "etc-hosts").write_text(self.hosts() + f"{node.address}\t{meta['name']}\n")
        volumes = list(spec.get("volumes") or [])
        account = spec.get("serviceAccountName", "default")
        if spec.get("automountServiceAccountToken", True) is not False:
            volumes.append(
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ]
                    },
                }
            )
        for v in volumes:
            path = folder / "volumes" / v["name"]
            if "emptyDir" in v:
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)
            elif "hostPath" in v:
                path = node.folder / v["hostPath"]["path"].lstrip("/")
                kind = v["hostPath"].get("type", "")
                if kind == "DirectoryOrCreate":
                    path.mkdir(parents=True, exist_ok=True)
                elif kind == "Directory" and not path.is_dir():
                    raise ValueError(
                        f"hostPath type check failed: {v['hostPath']['path']} is not a directory"
                    )
            elif "configMap" in v or "secret" in v:
                self._write_keys(path, meta["namespace"], v)
            elif "projected" in v:
                path.mkdir(parents=True, exist_ok=True)
                for source in v["projected"]["sources"]:
                    if "serviceAccountToken" in source:
                        t = source["serviceAccountToken"]
                        token = self._token(meta, account, t)
                        _write(path / t["path"], token.encode())
                    elif "downwardAPI" in source:
                        for item in source["downwardAPI"]["items"]:
                            field_ = item["fieldRef"]["fieldPath"]
                            value = {
                                "metadata.namespace": meta["namespace"],
                                "metadata.name": meta["name"],
                            }[field_]
                            _write(path / item["path"], value.encode())
                    else:
                        self._write_keys(path, meta["namespace"], source)
            else:
                raise ValueError(f"volume {v['name']}: kind not imitated: {sorted(v)}")
            out[v["name"]] = path
        return out

    def _write_keys(self, path: Path, namespace: str, v: Obj) -> None:
        kind = "configMap" if "configMap" in v else "secret"
        ref = v[kind]
        name = ref.get("name") or ref.get("secretName")
        obj = self._object(namespace, "configmaps" if kind == "configMap" else "secrets", name)
        data = dict(obj.get("data") or {})
        path.mkdir(parents=True, exist_ok=True)
        items = ref.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            raw = data[item["key"]]
            value = base64.b64decode(raw) if kind == "secret" else str(raw).encode()
            _write(path / item["path"], value)

    def _token(self, meta: Obj, account: str, t: Obj) -> str:
        spec: Obj = {"expirationSeconds": int(t.get("expirationSeconds", 3600))}
        if t.get("audience"):
            spec["audiences"] = [t["audience"]]
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        }
        answer = self.api.post(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        answer.raise_for_status()
        return str(answer.json()["status"]["token"])

    def _patch_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        try:
            self.api.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                content=json.dumps({"status": status}),
                headers=MERGE,
            )
        except httpx.HTTPError as exc:
            log.warning("pod %s: status: %s", meta["name"], exc)

    def _event(self, pod: Obj, reason: str, message: str) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(httpx.HTTPError):
            self.api.post(
                f"/api/v1/namespaces/{meta['namespace']}/events",
                json={
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{meta['name']}."},
                    "involvedObject": {
                        "kind": "Pod",
                        "name": meta["name"],
                        "namespace": meta["namespace"],
                        "uid": meta["uid"],
                    },
                    "reason": reason,
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "kubelet"},
                },
            )


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)
