"""The node agent's Kubernetes I/O: its configuration, two watches, pod Events.

Configuration: ``powerflow.kubeapi.config``'s rules, the operator's
(``--kubeconfig FILE``; else the pod's service account in a pod: the
DaemonSet; else ``$KUBECONFIG``, else ``~/.kube/config``). No usable
configuration is a ``KubeConfigError`` with one line.

Two watches (``powerflow.kubeapi.watch.ListWatch``: LIST then WATCH in a
thread, resumed and relisted as an informer does, results handed to the
event loop, so the agent's state is only touched there): the PowerFlow pods
bound to this node (label ``powerflow.io/job``, field
``spec.nodeName=<node>``: the API server filters, so the agent sees only its
node's few pods) and its own Node (field ``metadata.name=<node>``, for the
powered-down mark).
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable
from typing import Any

import kubernetes
from powerflow.nodeagent.apply import PodEvent

from powerflow import __version__
from powerflow.core import contract
from powerflow.kubeapi import config
from powerflow.kubeapi.client import TimedApiClient
from powerflow.kubeapi.config import KubeConfigError
from powerflow.kubeapi.watch import ListWatch, Obj

__all__ = ["COMPONENT", "AgentKube", "KubeConfigError", "load_configuration"]

log = logging.getLogger(__name__)
COMPONENT = "powerflow-nodeagent"


def load_configuration(
    kubeconfig: str | None, environ: dict[str, str] | None = None
) -> kubernetes.client.Configuration:
    """The client configuration for ``--kubeconfig`` (None: not given), or one clear error."""
    return config.load_configuration(config.resolve_source(kubeconfig, environ))


EVENT_TIMEOUT_S = 5.0
"""The longest an Event post may take (connect and answer): an Event is worth less
than the clocks the pass that waits for it would apply meanwhile."""


class AgentKube:
    """The API calls of one node's agent."""

    def __init__(self, cfg: kubernetes.client.Configuration, node: str) -> None:
        self.node = node
        self.api = TimedApiClient(cfg)  # every call times out (powerflow.kubeapi.client)
        self.api.user_agent = f"{COMPONENT}/{__version__} ({node})"
        self.core = kubernetes.client.CoreV1Api(self.api)

    def pod_watch(
        self, on_list: Callable[[list[Obj]], None], on_event: Callable[[str, Obj], None]
    ) -> ListWatch[Obj]:
        return ListWatch(
            "pods",
            self.core.list_pod_for_all_namespaces,
            on_list,
            on_event,
            selection={
                "label_selector": contract.JOB_LABEL,
                "field_selector": f"spec.nodeName={self.node}",
            },
        )

    def node_watch(
        self, on_list: Callable[[list[Obj]], None], on_event: Callable[[str, Obj], None]
    ) -> ListWatch[Obj]:
        return ListWatch(
            "node",
            self.core.list_node,
            on_list,
            on_event,
            selection={"field_selector": f"metadata.name={self.node}"},
        )

    def post_event(self, event: PodEvent, uid: str) -> None:
        """Create the Event (best effort: a failure is logged, never raised), within
        ``EVENT_TIMEOUT_S``: the agent's pass waits for its Events before it applies
        anything more, and the client's own limit for a call is a minute."""
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace, name = event.pod
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            response: Any = self.core.create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=EVENT_TIMEOUT_S
            )
            response.release_conn()
        except Exception as exc:  # events are best effort
            log.warning("could not post event %s on %s/%s: %s", event.reason, namespace, name, exc)

    def successor_coming(self, namespace: str, name: str) -> bool:
        """Whether the DaemonSet ``namespace/name`` exists and is not being deleted: its
        controller then starts another agent here (a rolling update, a restart). Any
        failure to tell is False (the caller then resets every GPU, as it always did)."""
        try:
            response: Any = kubernetes.client.AppsV1Api(self.api).read_namespaced_daemon_set(
                name, namespace, _preload_content=False, _request_timeout=5
            )
            try:
                body = json.loads(response.data or b"{}")
            finally:
                response.release_conn()
        except Exception as exc:  # 404 (uninstalled), 403, unreachable: not known
            log.info("DaemonSet %s/%s: no successor known (%s)", namespace, name, exc)
            return False
        return isinstance(body, dict) and not (body.get("metadata") or {}).get("deletionTimestamp")

    def close(self) -> None:
        self.api.close()
