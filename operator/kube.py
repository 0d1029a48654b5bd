"""The operator's I/O: read the cluster state, carry out ``Actions``.

The official ``kubernetes`` client is synchronous; every call runs in a
worker thread so the operator's event loop (kopf's) never blocks. Conflicts
are expected and harmless here: a pod that already exists was created by an
earlier pass (names are deterministic), a pod already gone was deleted.

Errors of writes, by kind (``apply``):

- a refusal, a 4xx answer about the object itself (403 from admission such
  as PodSecurity or a ResourceQuota, 422 invalid, 400, and 409 on the
  rendezvous Service when the Service of that name is not this DLJob's): it
  will not go away by retrying at once. It is returned as a ``Refusal`` for
  its job (by the ``powerflow.io/job`` label, the worker pod's name or the
  DLJob's name) and the next pass reports it on that job and backs off
  (``refusals``). Every other write of the pass is still carried out.
- anything else (5xx, 429 throttling, 401, the API server unreachable): a
  transient fault of the cluster, not of one job. Every write of the pass is
  still attempted (the other jobs' pods and status patches go out), then
  ``WritesFailed`` is raised (with the refusals), so the pass fails and the
  loop retries it.

Node marks (powered down, ``parking``) are no job's: a refusal is logged once
per node and reason, a conflict is re-read and retried (``_mark_node``), and a
transient error fails the pass like any other. GPU records (``record_gpus``,
``discovered``) are best effort: a failure is logged once per node and reason,
never fails the pass, and a refused record is not sent again (a newer one is).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes
from powerflow.operator import foreign_pods, parking
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.bodies import ConfigMapBody, DLJobBody, NodeBody, PodBody, ServiceBody
from powerflow.operator.refusals import Refusal

from powerflow.core import contract

log = logging.getLogger(__name__)
MERGE = "application/merge-patch+json"
TRANSIENT = frozenset({401, 404, 408, 409, 429})
"""4xx answers that are not a refusal of the object (404 and 409 are handled per call)."""
GONE = object()
"""A generation record found its DLJob deleted (``apply`` skips that job's writes)."""
WORKER = re.compile(r"^(?P<job>.+)-g\d+-w\d+$")


class WritesFailed(Exception):
    """Some writes of a pass failed transiently (the first error is the cause); the
    refusals of the same pass ride along so that they are reported all the same, and
    ``written`` counts the writes the API server answered without an error (one that
    found its work done, a pod already there or gone, counts: the server is up)."""

    def __init__(self, errors: list[Exception], refusals: list[Refusal], written: int = 0) -> None:
        super().__init__(f"{len(errors)} write(s) failed; first: {errors[0]}")
        self.errors = errors
        self.refusals = refusals
        self.written = written


def _refusal(
    exc: kubernetes.client.ApiException, verb: str, kind: str, namespace: str, name: str, job: str
) -> Refusal | None:
    """The refusal ``exc`` says, or ``None`` when it is no refusal (transient)."""
    if not 400 <= (exc.status or 0) < 500 or exc.status in TRANSIENT:
        return None
    reason, message = str(exc.reason or ""), ""
    try:
        status = json.loads(exc.body or "")
    except (ValueError, TypeError):
        status = None
    if isinstance(status, dict):  # the API server's Status: reason and message
        reason = str(status.get("reason") or reason)
        message = str(status.get("message") or "")
    return Refusal(namespace, job, verb, kind, name, int(exc.status), reason, message or reason)


def _job_of_pod(name: str) -> str:
    match = WORKER.match(name)
    return match["job"] if match else name


LIST_PAGE = 500
"""Items per LIST page (``limit``/``continue``): bounds each answer's size on big clusters."""
NON_TERMINAL = "status.phase!=Succeeded,status.phase!=Failed"
NODE_PATCH_TRIES = 3
"""Tries of one node mark that meets a conflict (409) each time; then the next pass retries."""


def call_json(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call without the client's model (de)serialisation: plain JSON in and out.

    ``_preload_content=False`` skips building ``V1Pod`` objects from every
    response only to turn them back into dicts: most of a pass's I/O time
    on the client side. Non-2xx answers still raise ``ApiException``.
    """
    response = call(*args, _preload_content=False, **kwargs)
    try:
        data = response.data
    finally:
        response.release_conn()
    return json.loads(data) if data else None


def requests_gpus(pod: PodBody) -> bool:
    """Whether any container (or init container) asks for ``nvidia.com/gpu``."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for c in containers if isinstance(containers, list) else ():
            resources = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(resources, dict):
                continue
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if isinstance(amounts, dict) and str(
                    amounts.get(contract.GPU_RESOURCE, "0")
                ) not in (
                    "0",
                    "",
                ):
                    return True
    return False


def owned_by(pod: PodBody, uid: object) -> bool:
    """Whether ``pod`` is a worker of the DLJob with ``uid``: its controller is that
    DLJob (``contract.dljob_controller``)."""
    ref = contract.dljob_controller(pod.get("metadata") or {})
    return ref is not None and isinstance(uid, str) and bool(uid) and ref.get("uid") == uid


def holds_gpus(pod: PodBody) -> bool:
    """A bound, unfinished pod that requests GPUs: they are taken, whoever it is."""
    phase = (pod.get("status") or {}).get("phase")
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    return bound and phase not in foreign_pods.TERMINAL and requests_gpus(pod)


def _pod_key(pod: PodBody) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


@dataclass(frozen=True)
class ClusterState:
    jobs: tuple[Observed, ...]
    nodes: tuple[NodeBody, ...]
    budget: ConfigMapBody | None
    foreign_gpu_pods: tuple[PodBody, ...] = ()
    """Bound, non-terminal pods that request ``nvidia.com/gpu`` and are not PowerFlow's
    (no ``powerflow.io/job`` label, or the label on a pod no DLJob owns: ``owned_by``):
    their GPUs are occupied."""


class Kube:
    """Thin wrapper over the ``kubernetes`` client for what the operator does.

    Reads are paginated LISTs filtered by the API server (label and field
    selectors). Foreign GPU pods come from a watch-fed cache
    (``foreign_pods``, started by ``watch_foreign``) rather than a LIST per
    pass: such a LIST pages through every bound pod of the cluster (a field
    selector cannot see GPU requests), at up to one pass per debounce, where
    the watch costs one event per change of a bound non-PowerFlow pod and
    keeps only the GPU pods. A pass before the cache's first LIST (or a
    ``Kube`` whose cache was not started) lists them once, directly.
    """

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str | None) -> None:
        self.api = api
        self.namespace = namespace
        self.cluster_events_namespace = "default"
        """Where Events about cluster-scoped objects (Nodes) go: an operator serving one
        namespace may post Events only there and in its release namespace."""
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.foreign = foreign_pods.ForeignGpuPods(self.core, self._list_foreign, requests_gpus)
        """Foreign GPU pods, once ``watch_foreign`` started the cache."""
        self._squatters: set[tuple[str, str]] = set()
        """Labelled pods no DLJob owns, as the last pass saw them (``_note_squatters``)."""
        self._node_failures: dict[str, str] = {}
        """Why each node's last mark failed (``_mark_node`` logs each new reason once)."""
        self._record_failures: dict[str, tuple[str, str, bool]] = {}
        """Each node's last GPU record that failed: (record, why, refused) (``record_gpus``)."""

    # -- reads ---------------------------------------------------------------------------

    _json = staticmethod(call_json)

    def _list(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """All items of a LIST, page by page (``limit``/``continue``).

        A continue token the server has forgotten (410) fails the pass, and the
        loop retries it a second later from the first page.
        """
        return self._list_versioned(call, *args, **kwargs)[0]

    def _list_versioned(
        self, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> tuple[list[Any], str]:
        """All items of a LIST and its ``resourceVersion`` (to watch from)."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
            raw = self._json(call, *args, **kwargs, **page) or {}
            items.extend(raw.get("items") or [])
            meta = raw.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _jobs(self) -> list[DLJobBody]:
        args = (contract.GROUP, contract.VERSION)
        if self.namespace:
            return self._list(
                self.custom.list_namespaced_custom_object, *args, self.namespace, contract.PLURAL
            )
        return self._list(self.custom.list_cluster_custom_object, *args, contract.PLURAL)

    def _pods(self, label_selector: str, field_selector: str | None = None) -> list[PodBody]:
        kwargs = {"label_selector": label_selector}
        if field_selector:
            kwargs["field_selector"] = field_selector
        if self.namespace:
            return self._list(self.core.list_namespaced_pod, self.namespace, **kwargs)
        return self._list(self.core.list_pod_for_all_namespaces, **kwargs)

    def _foreign_gpu_pods(self) -> list[PodBody]:
        """Everyone's GPU pods but PowerFlow's, in every namespace (GPUs are cluster-wide):
        one LIST, for passes before the cache's first LIST has arrived."""
        pods = self._list(
            self.core.list_pod_for_all_namespaces,
            label_selector=foreign_pods.LABELS,
            field_selector=f"{foreign_pods.FIELDS},{NON_TERMINAL}",
        )
        return [p for p in pods if requests_gpus(p)]

    def _list_foreign(self) -> tuple[list[PodBody], str]:
        """The cache's LIST: every bound pod that is not PowerFlow's (phase and GPUs are
        checked by the cache, on each event too)."""
        return self._list_versioned(
            self.core.list_pod_for_all_namespaces,
            label_selector=foreign_pods.LABELS,
            field_selector=foreign_pods.FIELDS,
        )

    def watch_foreign(self, on_change: Callable[[str], None]) -> None:
        """Keep the foreign GPU pods in a watch-fed cache from now on; their arrival or
        departure calls ``on_change`` (a scheduling event). Call from the event loop."""
        self.foreign.start(on_change)

    def stop(self) -> None:
        self.foreign.stop()

    def _nodes(self) -> list[NodeBody]:
        return self._list(self.core.list_node)

    def _budget(self, namespace: str, name: str) -> ConfigMapBody | None:
        try:
            cm: ConfigMapBody = self._json(self.core.read_namespaced_config_map, name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return cm

    async def read(self, budget_namespace: str, budget_name: str) -> ClusterState:
        """The lists at once, each in a worker thread (the client is synchronous)."""
        cached = self.foreign.pods()
        jobs_raw, pods_raw, nodes, cm, foreign = await asyncio.gather(
            asyncio.to_thread(self._jobs),
            asyncio.to_thread(self._pods, contract.JOB_LABEL),
            asyncio.to_thread(self._nodes),
            asyncio.to_thread(self._budget, budget_namespace, budget_name),
            asyncio.sleep(0, cached)
            if cached is not None
            else asyncio.to_thread(self._foreign_gpu_pods),
        )
        uids = {
            (meta.get("namespace", ""), meta.get("name", "")): meta.get("uid")
            for meta in (body.get("metadata", {}) for body in jobs_raw)
        }
        pods: dict[tuple[str, str], list[PodBody]] = defaultdict(list)
        squatters: list[PodBody] = []
        for pod in pods_raw:
            meta = pod.get("metadata", {})
            label = (meta.get("labels") or {}).get(contract.JOB_LABEL, "")
            key = (meta.get("namespace", ""), label)
            if owned_by(pod, uids.get(key)):
                pods[key].append(pod)
            elif holds_gpus(pod):
                squatters.append(pod)
        self._note_squatters(squatters)
        jobs = []
        for body in jobs_raw:
            meta = body.get("metadata", {})
            key = (meta.get("namespace", ""), meta.get("name", ""))
            jobs.append(Observed(body, tuple(pods.get(key, ()))))
        return ClusterState(tuple(jobs), tuple(nodes), cm, (*foreign, *squatters))

    def _note_squatters(self, squatters: list[PodBody]) -> None:
        """Log once each pod that carries the job label but no DLJob of ours owns."""
        keys = {_pod_key(p) for p in squatters}
        for ns, name in sorted(keys - self._squatters):
            log.warning(
                "pod %s/%s has the label %s but no DLJob owns it: its GPUs count as "
                "another workload's, and it is none of PowerFlow's",
                ns,
                name,
                contract.JOB_LABEL,
            )
        self._squatters = keys

    async def read_config_map(self, namespace: str, name: str) -> ConfigMapBody | None:
        """One ConfigMap, ``None`` if absent (the persisted budget in force)."""
        return await asyncio.to_thread(self._budget, namespace, name)

    # -- writes --------------------------------------------------------------------------

    def _save_config_map(self, body: ConfigMapBody) -> ConfigMapBody:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        saved: ConfigMapBody
        try:
            saved = self._json(self.core.create_namespaced_config_map, namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
            # Ours alone: an unconditional replace (no resourceVersion) is right.
            saved = self._json(self.core.replace_namespaced_config_map, name, namespace, body)
        return saved

    async def save_config_map(self, body: ConfigMapBody) -> ConfigMapBody | str:
        """Create or replace a ConfigMap the operator alone writes; the stored object,
        or why the API server refused (the caller retries later, and logs each new
        failure once: a missing RBAC rule would otherwise log on every pass)."""
        try:
            return await asyncio.to_thread(self._save_config_map, body)
        except kubernetes.client.ApiException as exc:
            name = body["metadata"]["name"]
            return f"could not write ConfigMap {name}: {exc.status} {exc.reason}"

    def _delete_pod(self, namespace: str, name: str, grace_s: int) -> Refusal | None:
        try:
            self._json(
                self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace_s
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            refusal = _refusal(exc, "delete", "Pod", namespace, name, _job_of_pod(name))
            if refusal is None:
                raise
            return refusal
        return None

    def _create(self, body: PodBody | ServiceBody) -> Refusal | None:
        meta = body["metadata"]
        namespace, name, kind = meta["namespace"], meta["name"], body["kind"]
        job = (meta.get("labels") or {}).get(contract.JOB_LABEL, name)
        create = (
            self.core.create_namespaced_pod
            if body["kind"] == "Pod"
            else self.core.create_namespaced_service
        )
        try:
            self._json(create, namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:  # AlreadyExists: an earlier pass or operator made it...
                return self._foreign_service(body, job) if kind == "Service" else None
            refusal = _refusal(exc, "create", kind, namespace, name, job)
            if refusal is None:
                raise
            return refusal
        return None

    def _foreign_service(self, body: ServiceBody, job: str) -> Refusal | None:
        """...unless a Service of that name belongs to someone else: then the job's
        workers would rendezvous through a Service that does not select them.
        Tells ours by the DLJob's uid in its ``ownerReferences`` (needs ``get``
        on services besides ``create``)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            existing = self._json(self.core.read_namespaced_service, name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:  # gone meanwhile: the next pass creates it
                return None
            raise
        uid = next((r.get("uid") for r in meta.get("ownerReferences") or []), None)
        owners = (existing.get("metadata") or {}).get("ownerReferences") or []
        if any(r.get("uid") == uid for r in owners):
            return None
        message = (
            f'Service "{name}" already exists in namespace {namespace} and was not created '
            f"by this DLJob: the workers cannot rendezvous through it. Delete or rename that "
            f"Service, or rename the DLJob"
        )
        return Refusal(namespace, job, "create", "Service", name, 409, "AlreadyExists", message)

    def _annotate(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> Refusal | None:
        body = {"metadata": {"annotations": annotations}}
        try:
            self._json(self.core.patch_namespaced_pod, name, namespace, body, _content_type=MERGE)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            refusal = _refusal(exc, "patch", "Pod", namespace, name, _job_of_pod(name))
            if refusal is None:
                raise
            return refusal
        return None

    def _status_first(self, namespace: str, name: str, patch: dict[str, Any]) -> object:
        """A generation record: ``GONE`` when the DLJob is gone (404), so that ``apply``
        writes none of its pods (new ones would be orphans for the garbage collector
        to delete; the old ones it deletes by their owner reference)."""
        return self._status(namespace, name, patch, missing=GONE)

    def _status(
        self, namespace: str, name: str, patch: dict[str, Any], missing: object = None
    ) -> Refusal | object:
        try:
            self._json(
                self.custom.patch_namespaced_custom_object_status,
                contract.GROUP,
                contract.VERSION,
                namespace,
                contract.PLURAL,
                name,
                {"status": patch},
                _content_type=MERGE,
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return missing
            refusal = _refusal(exc, "patch", contract.KIND, namespace, name, name)
            if refusal is None:
                raise
            return refusal
        return None

    def _mark_node(self, mark: parking.NodeMark) -> None:
        """Mark or unmark one node as powered down (``parking``).

        The patch carries the resourceVersion it was computed from: on 409 (the
        node changed since the pass read it: a kubelet status update, another
        controller's taint) the node is read again and the patch computed anew
        from it, so no taint written meanwhile is lost. A node gone (404) needs
        nothing. A refusal (403 without RBAC ``patch`` on nodes, 422) is logged
        once per node and reason and does not fail the pass; a transient error
        fails it (the loop retries).
        """
        patch: dict[str, Any] | None = mark.patch
        what = "mark" if mark.powered_down else "unmark"
        for _ in range(NODE_PATCH_TRIES):
            if patch is None:  # already as wanted
                return
            try:
                self._json(self.core.patch_node, mark.node, patch, _content_type=MERGE)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status == 409:
                    try:
                        body = self._json(self.core.read_node, mark.node)
                    except kubernetes.client.ApiException as again:
                        if again.status == 404:
                            return
                        raise
                    patch = parking.mark_patch(body, mark.powered_down, mark.since)
                    continue
                if _refusal(exc, "patch", "Node", "", mark.node, "") is None:
                    raise
                reason = f"{exc.status} {exc.reason}"
                if self._node_failures.get(mark.node) != reason:
                    self._node_failures[mark.node] = reason
                    log.warning("could not %s node %s as powered down: %s", what, mark.node, reason)
                return
            self._node_failures.pop(mark.node, None)
            log.info("%sed node %s as powered down", what, mark.node)
            return
        log.info("node %s changed under every try to %s it: the next pass retries", mark.node, what)

    def _record_gpu(self, node: str, record: str) -> None:
        """Write one node's GPU record (``record_gpus``); a node gone (404) needs none."""
        patch = {"metadata": {"annotations": {contract.GPU_REPORT_ANNOTATION: record}}}
        try:
            self._json(self.core.patch_node, node, patch, _content_type=MERGE)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return
            refused = _refusal(exc, "patch", "Node", "", node, "") is not None
            self._record_failed(node, record, f"{exc.status} {exc.reason}", refused)
            return
        except Exception as exc:  # unreachable, timed out: the next pass tries again
            self._record_failed(node, record, f"{type(exc).__name__}: {exc}", False)
            return
        self._record_failures.pop(node, None)

    def _record_failed(self, node: str, record: str, why: str, refused: bool) -> None:
        last = self._record_failures.get(node)
        if last is None or last[1] != why:
            log.warning("could not record the GPU report of node %s: %s", node, why[:300])
        self._record_failures[node] = (record, why, refused)

    async def record_gpus(self, records: list[tuple[str, str]]) -> None:
        """Write ``(node, record)`` GPU records (``discovered``), best effort: a failure is
        logged once per node and reason and never fails the pass; a record the API server
        refused (403 without RBAC, 422) is not sent again, a newer one is."""
        wanted = []
        for node, record in records:
            last = self._record_failures.get(node)
            if last is None or not (last[2] and last[0] == record):
                wanted.append((node, record))
        await asyncio.gather(*(asyncio.to_thread(self._record_gpu, n, r) for n, r in wanted))

    def _post_event(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = ref["metadata"].get("namespace") or self.cluster_events_namespace
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "powerflow-", "namespace": namespace},
            "involvedObject": {
                "apiVersion": ref.get("apiVersion"),
                "kind": ref.get("kind"),
                "name": ref["metadata"].get("name"),
                "namespace": namespace,
                "uid": ref["metadata"].get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "powerflow-operator"},
            "reportingComponent": "powerflow-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._json(self.core.create_namespaced_event, namespace, body)
        except kubernetes.client.ApiException as exc:  # events are best effort
            log.warning("could not post event %s: %s", reason, exc.reason)

    async def post_events(self, events: list[tuple[dict[str, Any], str, str, str]]) -> None:
        await asyncio.gather(*(asyncio.to_thread(self._post_event, *e) for e in events))

    async def apply(self, actions: Actions) -> list[Refusal]:
        """Carry out the pass's writes phase by phase, in ``Actions.writes`` order.

        Within a phase the writes go out together; a phase starts when the
        previous one is done, so a job's generation is recorded before its pods
        are created or deleted, and old workers are gone before new ones come.
        A job whose first-phase status write failed, was refused or found the
        DLJob gone (404) gets none of its later writes this pass: its pods would
        be unexplained by its status after a crash (the next pass retries, or
        reports the refusal), and a deleted DLJob's pods are the garbage
        collector's (its ownerReferences).
        Returns the writes the API server refused (see the module docstring);
        raises ``WritesFailed`` on transient errors once every write was attempted.
        """
        refusals: list[Refusal] = []
        errors: list[Exception] = []
        written = 0
        verbs: dict[str, Callable[..., object]] = {
            "status": self._status,
            "delete": self._delete_pod,
            "create": self._create,
            "annotate": self._annotate,
            "node": self._mark_node,
        }
        unrecorded: set[tuple[str, str]] = set()
        for number, phase in enumerate(actions.writes()):
            if number > 0 and unrecorded:
                phase = [w for w in phase if _job_of_write(w) not in unrecorded]
            table = {**verbs, "status": self._status_first} if number == 0 else verbs
            results = await asyncio.gather(
                *(asyncio.to_thread(table[verb], *args) for verb, args in phase),
                return_exceptions=True,
            )
            for (_, args), result in zip(phase, results, strict=True):
                if result is GONE:  # the DLJob was deleted: nothing to write for it
                    pass
                elif isinstance(result, Refusal):
                    log.warning(
                        "%s %s %s/%s refused: %s %s",
                        result.verb, result.kind, result.namespace, result.name,
                        result.code, result.message,
                    )  # fmt: skip
                    refusals.append(result)
                elif isinstance(result, Exception):
                    errors.append(result)
                elif isinstance(result, BaseException):  # cancellation: stop now
                    raise result
                else:
                    written += 1
                    continue
                if number == 0:
                    unrecorded.add((args[0], args[1]))
        if errors:
            for extra in errors[1:]:
                log.warning("write failed as well: %s", extra)
            raise WritesFailed(errors, refusals, written) from errors[0]
        return refusals


def _job_of_write(write: tuple[str, tuple[Any, ...]]) -> tuple[str, str]:
    """(namespace, DLJob name) a write is about: a status patch names its DLJob, a pod
    write its worker (``<job>-g<generation>-w<index>``), a creation its label."""
    verb, args = write
    if verb == "node":  # no job's: a node mark is written whatever a job's record did
        return ("", "")
    if verb == "status":
        return (args[0], args[1])
    if verb == "create":
        meta = args[0]["metadata"]
        return (meta["namespace"], (meta.get("labels") or {}).get(contract.JOB_LABEL, ""))
    match = WORKER.match(args[1])
    return (args[0], match["job"] if match else "")
