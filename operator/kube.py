"""The operator's I/O: read the cluster state, carry out ``Actions``.

The official ``kubernetes`` client is synchronous; every call runs in a
worker thread so the operator's event loop (kopf's) never blocks. Conflicts
are expected and harmless here: a pod that already exists was created by an
earlier pass (names are deterministic), a pod already gone was deleted.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import kubernetes
from powerflow.operator.bodies import ConfigMapBody, NodeBody, PodBody
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

    # -- reads (run in a thread) ---------------------------------------------------------

    def _read(self, budget_namespace: str, budget_name: str) -> ClusterState:
        serialize = self.api.sanitize_for_serialization
        selector = contract.JOB_LABEL
        if self.namespace:
            jobs_raw = self.custom.list_namespaced_custom_object(
                contract.GROUP, contract.VERSION, self.namespace, contract.PLURAL
            )
            pods_raw = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        else:
            jobs_raw = self.custom.list_cluster_custom_object(
                contract.GROUP, contract.VERSION, contract.PLURAL
            )
            pods_raw = self.core.list_pod_for_all_namespaces(label_selector=selector)
        pods: dict[tuple[str, str], list[PodBody]] = defaultdict(list)
        for pod in serialize(pods_raw.items):
            meta = pod.get("metadata", {})
            owner = (meta.get("labels") or {}).get(contract.JOB_LABEL)
            pods[meta.get("namespace", ""), owner].append(pod)
        jobs = []
        for body in jobs_raw.get("items", []):
            meta = body.get("metadata", {})
            key = (meta.get("namespace", ""), meta.get("name"))
            jobs.append(Observed(body, tuple(pods.get(key, ()))))
        nodes = tuple(serialize(self.core.list_node().items))
        try:
            cm = serialize(self.core.read_namespaced_config_map(budget_name, budget_namespace))
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            cm = None
        return ClusterState(tuple(jobs), nodes, cm)

    async def read(self, budget_namespace: str, budget_name: str) -> ClusterState:
        return await asyncio.to_thread(self._read, budget_namespace, budget_name)

    # -- writes --------------------------------------------------------------------------

    def _delete_pod(self, namespace: str, name: str, grace_s: int) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _create(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        try:
            if body["kind"] == "Pod":
                self.core.create_namespaced_pod(namespace, body)
            else:
                self.core.create_namespaced_service(namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:  # AlreadyExists: an earlier pass or operator made it
                raise

    def _annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(name, namespace, body, _content_type=MERGE)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
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
            self.core.create_namespaced_event(namespace, body)
        except kubernetes.client.ApiException as exc:  # events are best effort
            log.warning("could not post event %s: %s", reason, exc.reason)

    async def post_events(self, events: list[tuple[dict[str, Any], str, str, str]]) -> None:
        await asyncio.gather(*(asyncio.to_thread(self._post_event, *e) for e in events))

    async def apply(self, actions: Actions) -> None:
        """Deletions first (old workers stop before new ones start), then the rest."""

        async def each(fn: Any, calls: list[tuple[Any, ...]]) -> None:
            await asyncio.gather(*(asyncio.to_thread(fn, *args) for args in calls))

        await each(self._delete_pod, list(actions.delete_pods))
        services = [(b,) for b in actions.create if b["kind"] == "Service"]
        unique = {(b[0]["metadata"]["namespace"], b[0]["metadata"]["name"]): b for b in services}
        await each(self._create, list(unique.values()))
        await each(self._create, [(b,) for b in actions.create if b["kind"] == "Pod"])
        await each(self._annotate, list(actions.annotate_pods))
        await each(self._status, list(actions.status))
