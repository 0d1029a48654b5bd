"""kopf handlers: login, and watches whose news are triggers for the one allocation loop.

The handlers are ``on.event`` only: kopf then keeps no progress annotations
or finalizers on our objects, and all state stays in DLJob status and pods.
They are registered into a registry of their own, so the CLI runs an
operator with exactly these handlers, login included (kopf's default login
handlers live only in its global registry).

Watch scale: the API server filters. Pods are watched with the label
selector ``powerflow.io/job`` and the budget ConfigMap with a field selector
on its name and namespace (``settings.watching.{label,field}_selectors``, sent
as ``labelSelector``/``fieldSelector`` on kopf's list and watch), and initial
lists come in pages (``settings.watching.chunk_size``). Nodes are all
watched (every GPU node matters) but only changes that a pass decides on
trigger one (``triggers``): heartbeats do not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf
from powerflow.operator.controller import Controller, OperatorConfig
from powerflow.operator.kube import LIST_PAGE
from powerflow.operator.triggers import (
    Seen,
    configmap_fingerprint,
    dljob_fingerprint,
    node_fingerprint,
    pod_fingerprint,
)

from powerflow.core import contract

API_BACKOFFS_S: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0) + (10.0,) * 60
"""kopf's delays between retries of a failed API request (its lists and watches, and
its discovery): quick at first, then every 10 s, for about ten and a half minutes.

kopf gives up on a request once these run out, and a watcher that gives up stops
the whole operator (the process exits; its Deployment restarts it). With the four
retries it had (6.6 s), an API server that answered 500 or 429, or could not be
reached, for a few seconds more (a restart, an etcd leader election, an upgrade)
stopped it. Ten minutes rides through those; what lasts longer (a missing RBAC
rule: kopf retries a 403 too) still ends in a visible restart, not a silent stall."""


log = logging.getLogger(__name__)


def build_registry(
    make_controller: Callable[[], Controller],
    config: OperatorConfig,
    login: Callable[[], kopf.ConnectionInfo],
    *,
    on_ready: Callable[[Controller], None] | None = None,
) -> kopf.OperatorRegistry:
    """Login, and handlers for DLJobs, worker pods, Nodes and the budget ConfigMap.

    ``login`` gives kopf the credentials (the same configuration as the
    controller's client). ``make_controller`` runs inside the operator's
    event loop at startup (the controller's asyncio primitives belong to it).
    """
    registry = kopf.OperatorRegistry()
    holder: dict[str, Controller] = {}
    seen = Seen()

    def trigger(reason: str, immediate: bool = False) -> None:
        controller = holder.get("c")
        if controller is not None:
            controller.trigger(reason, immediate=immediate)

    @kopf.on.login(registry=registry)
    def login_handler(**_: Any) -> kopf.ConnectionInfo:
        return login()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.chunk_size = LIST_PAGE
        settings.watching.label_selectors["", "v1", "pods"] = contract.JOB_LABEL
        settings.watching.field_selectors["", "v1", "configmaps"] = (
            f"metadata.name={config.budget_name},metadata.namespace={config.budget_namespace}"
        )
        settings.networking.error_backoffs = API_BACKOFFS_S
        controller = make_controller()
        holder["c"] = controller
        controller.start()
        controller.trigger("startup")
        if on_ready is not None:
            on_ready(controller)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        controller = holder.pop("c", None)
        if controller is not None:
            await controller.stop()

    @kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL, registry=registry)
    def dljob_changed(type: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        if seen.changed("dljob", type, body, dljob_fingerprint(body)):
            # A new job is the event users wait on: no debounce before its first pass.
            trigger(f"dljob {name} {type}", immediate=type == "ADDED")

    @kopf.on.event("", "v1", "pods", labels={contract.JOB_LABEL: kopf.PRESENT}, registry=registry)
    def pod_changed(type: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        if seen.changed("pod", type, body, pod_fingerprint(body)):
            trigger(f"pod {name} {type}")

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node_changed(type: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        if seen.changed("node", type, body, node_fingerprint(body)):
            trigger(f"node {name} {type}")

    def is_budget(name: str, namespace: str | None, **_: Any) -> bool:
        return name == config.budget_name and namespace == config.budget_namespace

    @kopf.on.event("", "v1", "configmaps", when=is_budget, registry=registry)
    def budget_changed(type: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        if seen.changed("budget", type, body, configmap_fingerprint(body)):
            trigger(f"budget {name} {type}")

    return registry
