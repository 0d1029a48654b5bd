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


@dataclass(frozen=True)
class ClusterState:
    jobs: tuple[Observed, ...]
    nodes: tuple[NodeBody, ...]
    budget: ConfigMapBody | None


class Kube:
    """Thin wrapper over the ``kubernetes`` client for what the operator does."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str | None) -> None:
        self.api = api
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def _json(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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

    def _jobs(self) -> list[DLJobBody]:
        args = (contract.GROUP, contract.VERSION)
        if self.namespace:
            raw = self._json(
                self.custom.list_namespaced_custom_object, *args, self.namespace, contract.PLURAL
            )
        else:
            raw = self._json(self.custom.list_cluster_custom_object, *args, contract.PLURAL)
        items: list[DLJobBody] = raw.get("items") or []
        return items

    def _pods(self) -> list[PodBody]:
        selector = contract.JOB_LABEL
        if self.namespace:
            raw = self._json(self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        else:
            raw = self._json(self.core.list_pod_for_all_namespaces, label_selector=selector)
        items: list[PodBody] = raw.get("items") or []
        return items

    def _nodes(self) -> list[NodeBody]:
        items: list[NodeBody] = self._json(self.core.list_node).get("items") or []
        return items

    def _budget(self, namespace: str, name: str) -> ConfigMapBody | None:
        try:
            cm: ConfigMapBody = self._json(self.core.read_namespaced_config_map, name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return cm

    async def read(self, budget_namespace: str, budget_name: str) -> ClusterState:
        """The four lists at once, each in a worker thread (the client is synchronous)."""
        jobs_raw, pods_raw, nodes, cm = await asyncio.gather(
            asyncio.to_thread(self._jobs),
            asyncio.to_thread(self._pods),
            asyncio.to_thread(self._nodes),
            asyncio.to_thread(self._budget, budget_namespace, budget_name),
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
        return ClusterState(tuple(jobs), tuple(nodes), cm)

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

    async def save_config_map(self, body: ConfigMapBody) -> ConfigMapBody | None:
        """Create or replace a ConfigMap the operator alone writes; the stored object,
        or ``None`` (logged) when the API server refuses: the caller retries later."""
        try:
            return await asyncio.to_thread(self._save_config_map, body)
        except kubernetes.client.ApiException as exc:
            name = body["metadata"]["name"]
            log.warning("could not write ConfigMap %s: %s %s", name, exc.status, exc.reason)
            return None

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
        """Carry out the pass's writes phase by phase, in ``Actions.writes`` order.

        Within a phase the writes go out together; a phase starts when the
        previous one is done, so a job's generation is recorded before its pods
        are created or deleted, and old workers are gone before new ones come.
        """
        verbs: dict[str, Callable[..., None]] = {
            "status": self._status,
            "delete": self._delete_pod,
            "create": self._create,
            "annotate": self._annotate,
        }
        for phase in actions.writes():
            await asyncio.gather(*(asyncio.to_thread(verbs[verb], *args) for verb, args in phase))
