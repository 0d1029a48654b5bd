"""kopf handlers: every watched change is a trigger for the one allocation loop.

The handlers are ``on.event`` only: kopf then keeps no progress annotations
or finalizers on our objects, and all state stays in DLJob status and pods.
They are registered into a registry of their own, so tests (and the CLI) can
run an operator with exactly these handlers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf
from powerflow.operator.controller import Controller

from powerflow import contract

log = logging.getLogger(__name__)


def build_registry(
    make_controller: Callable[[], Controller],
    *,
    peering: bool = False,
    on_ready: Callable[[Controller], None] | None = None,
) -> kopf.OperatorRegistry:
    """Handlers for DLJobs, worker pods, Nodes and the budget ConfigMap.

    ``make_controller`` runs inside the operator's event loop at startup (the
    controller's asyncio primitives belong to that loop).
    """
    registry = kopf.OperatorRegistry()
    holder: dict[str, Controller] = {}

    def trigger(reason: str, immediate: bool = False) -> None:
        controller = holder.get("c")
        if controller is not None:
            controller.trigger(reason, immediate=immediate)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [0.1, 0.5, 1, 5]
        if peering:
            settings.peering.mandatory = True
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
    def dljob_changed(type: str | None, name: str, **_: Any) -> None:
        # A new job is the event users wait on: no debounce before its first pass.
        trigger(f"dljob {name} {type}", immediate=type == "ADDED")

    @kopf.on.event("", "v1", "pods", labels={contract.JOB_LABEL: kopf.PRESENT}, registry=registry)
    def pod_changed(type: str | None, name: str, **_: Any) -> None:
        trigger(f"pod {name} {type}")

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node_changed(type: str | None, name: str, **_: Any) -> None:
        trigger(f"node {name} {type}")

    def is_budget(name: str, namespace: str | None, **_: Any) -> bool:
        controller = holder.get("c")
        if controller is None:
            return False
        cfg = controller.config
        return name == cfg.budget_name and namespace == cfg.budget_namespace

    @kopf.on.event("", "v1", "configmaps", when=is_budget, registry=registry)
    def budget_changed(type: str | None, name: str, **_: Any) -> None:
        trigger(f"budget {name} {type}")

    return registry
