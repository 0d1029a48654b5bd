"""The operator's I/O: read the cluster state, carry out ``Actions``.

The official ``kubernetes`` client is synchronous; every call runs in a
worker thread so the operator's event loop (kopf's) never blocks. Conflicts
are expected and harmless here: a pod that already exists was created by an
earlier pass (names are deterministic), a pod already gone was deleted.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes
from powerflow.operator.bodies import ConfigMapBody, DLJobBody, NodeBody, PodBody, ServiceBody
from powerflow.operator.reconcile import Actions, Observed

from powerflow import contract

log = logging.getLogger(__name__)
MERGE = "application/merge-patch+json"


LIST_PAGE = 500
"""Items per LIST page (``limit``/``continue``): bounds each answer's size on big clusters."""
NON_TERMINAL = "status.phase!=Succeeded,status.phase!=Failed"


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


@dataclass(frozen=True)
class ClusterState:
    jobs: tuple[Observed, ...]
    nodes: tuple[NodeBody, ...]
    budget: ConfigMapBody | None
    foreign_gpu_pods: tuple[PodBody, ...] = ()
    """Bound, non-terminal pods that request ``nvidia.com/gpu`` and are not PowerFlow's
    (no ``powerflow.io/job`` label): their GPUs are occupied."""


class Kube:
    """Thin wrapper over the ``kubernetes`` client for what the operator does.

    Reads are paginated LISTs filtered by the API server (label and field
    selectors). Foreign GPU pods come from one more LIST per pass (bound,
    non-terminal pods without the ``powerflow.io/job`` label, GPU request
    checked here: a field selector cannot see resources) rather than a
    watch-fed cache of every pod: passes are rare (events that matter and the
    scheduling interval), the server filters out the cluster's finished and
    unbound pods and PowerFlow's own, and a cache of all pods would cost the
    operator memory and a watch event for every pod change in the cluster.
    """

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str | None) -> None:
        self.api = api
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    # -- reads ---------------------------------------------------------------------------

    _json = staticmethod(call_json)

    def _list(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """All items of a LIST, page by page (``limit``/``continue``).

        A continue token the server has forgotten (410) fails the pass, and the
        loop retries it a second later from the first page.
        """
        items: list[Any] = []
        token: str | None = None
        while True:
            page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
            raw = self._json(call, *args, **kwargs, **page) or {}
            items.extend(raw.get("items") or [])
            token = (raw.get("metadata") or {}).get("continue")
            if not token:
                return items

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
        """Everyone's GPU pods but PowerFlow's, in every namespace (GPUs are cluster-wide)."""
        selector = f"spec.nodeName!=,{NON_TERMINAL}"
        pods = self._list(
            self.core.list_pod_for_all_namespaces,
            label_selector=f"!{contract.JOB_LABEL}",
            field_selector=selector,
        )
        return [p for p in pods if requests_gpus(p)]

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
        jobs_raw, pods_raw, nodes, cm, foreign = await asyncio.gather(
            asyncio.to_thread(self._jobs),
            asyncio.to_thread(self._pods, contract.JOB_LABEL),
            asyncio.to_thread(self._nodes),
            asyncio.to_thread(self._budget, budget_namespace, budget_name),
            asyncio.to_thread(self._foreign_gpu_pods),
        )
        pods: dict[tuple[str, str], list[PodBody]] = defaultdict(list)
        for pod in pods_raw:
            meta = pod.get("metadata", {})
            owner = (meta.get("labels") or {}).get(contract.JOB_LABEL, "")
            pods[meta.get("namespace", ""), owner].append(pod)
        jobs = []
        for body in jobs_raw:
            meta = body.get("metadata", {})
            key = (meta.get("namespace", ""), meta.get("name", ""))
            jobs.append(Observed(body, tuple(pods.get(key, ()))))
        return ClusterState(tuple(jobs), tuple(nodes), cm, tuple(foreign))

    # -- writes --------------------------------------------------------------------------

    def _delete_pod(self, namespace: str, name: str, grace_s: int) -> None:
        try:
            self._json(
                self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace_s
            )
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _create(self, body: PodBody | ServiceBody) -> None:
        namespace = body["metadata"]["namespace"]
        create = (
            self.core.create_namespaced_pod
            if body["kind"] == "Pod"
            else self.core.create_namespaced_service
        )
        try:
            self._json(create, namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:  # AlreadyExists: an earlier pass or operator made it
                raise

    def _annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        try:
            self._json(self.core.patch_namespaced_pod, name, namespace, body, _content_type=MERGE)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
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
            if exc.status != 404:
                raise

    def _post_event(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = ref["metadata"].get("namespace") or "default"
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

    async def apply(self, actions: Actions) -> None:
        """Deletions first (old workers stop before new ones start), then the rest."""

        async def each(fn: Any, calls: list[tuple[Any, ...]]) -> None:
            await asyncio.gather(*(asyncio.to_thread(fn, *args) for args in calls))

        await each(self._delete_pod, list(actions.delete_pods))
        # Services and pods together: a worker may exist before its headless Service
        # (its DNS name resolves once the Service does; torchrun's rendezvous retries).
        unique = {(b["metadata"]["namespace"], b["kind"], b["metadata"]["name"]): b
                  for b in actions.create}  # fmt: skip
        await each(self._create, [(b,) for b in unique.values()])
        await each(self._annotate, list(actions.annotate_pods))
        await each(self._status, list(actions.status))
