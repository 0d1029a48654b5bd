"""The three verbs: from kube-scheduler's arguments to the state's answers, and the bind call.

Pods without the ``powerflow.io/job`` label (or without GPUs) are none of
PowerFlow's business: every candidate passes and every score is neutral, and
bind still binds them because ``bindVerb`` applies to every pod of the
scheduler. Anything that cannot be decided raises a ``PowerFlowError``; the
app turns it into the verb's answer with ``Error`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from powerflow.core.contract import PLACEMENT_ANNOTATION
from powerflow.core.errors import PlacementError, PowerFlowError

from .kube import ApiError, ApiUnreachable, KubeApi
from .metrics import Metrics
from .mirror import Mirror
from .objects import PodInfo, placement_annotation, pod_info, workers_of
from .state import ClusterState
from .wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    filter_answer,
)

log = logging.getLogger(__name__)


class UndecidableError(PowerFlowError):
    """The extender cannot answer this call; the text goes into the answer's ``Error``."""


class Extender:
    """State, API and metrics of one running extender."""

    def __init__(
        self,
        state: ClusterState,
        api: KubeApi | None,
        metrics: Metrics,
        *,
        mirror: bool = True,
    ) -> None:
        self.state = state
        self.api = api
        self.metrics = metrics
        self._mirror = Mirror(api, state) if api is not None and mirror else None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start mirroring the cluster in the background (no-op without an API)."""
        if self._mirror is not None and self._task is None:
            self._task = asyncio.create_task(self._mirror.run(), name="powerflow-extender-mirror")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.api is not None:
            await self.api.aclose()

    # -- filter and prioritize -------------------------------------------------------------

    def _powerflow_pod(self, args: ExtenderArgs) -> PodInfo | None:
        if args.Pod is None:
            raise UndecidableError("ExtenderArgs carries no Pod")
        info = pod_info(args.Pod)
        if info.gang is None or info.gpus < 1:
            return None
        workers_of(args.Pod)  # a malformed gang size is an error, not a gang of one
        return info

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """The ``ExtenderFilterResult`` as a plain dict (``wire.filter_answer``: no model to
        validate a thousand names into on every call)."""
        candidates = args.candidate_names()
        info = self._powerflow_pod(args)
        if info is None:
            return filter_answer(args, candidates, {})
        answer = self.state.filter(info, candidates)
        return filter_answer(args, answer.admitted, answer.failed, answer.unresolvable)

    def priorities(self, args: ExtenderArgs) -> tuple[list[str], dict[str, int]]:
        """The candidates and their nonzero scores, for ``wire.encode_priorities`` (the
        state guarantees ``0 <= Score <= MaxExtenderPriority``). A pod PowerFlow does not
        place scores 0 everywhere: no preference at all."""
        candidates = args.candidate_names()
        info = self._powerflow_pod(args)
        scores = {} if info is None else self.state.block_scores(info, candidates)
        return candidates, scores

    # -- bind ------------------------------------------------------------------------------

    async def _pod(self, namespace: str, name: str) -> PodInfo:
        cached = self.state.pods.get((namespace, name))
        if cached is not None:
            return cached
        if self.api is None:
            raise ApiUnreachable(f"cannot bind {namespace}/{name}: no Kubernetes API configured")
        return pod_info(await self.api.get_pod(namespace, name))

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        if not args.PodName or not args.Node:
            raise UndecidableError("ExtenderBindingArgs needs PodName and Node")
        namespace = args.PodNamespace or "default"
        where = f"pod {namespace}/{args.PodName} to node {args.Node}"
        if self.api is None:
            raise ApiUnreachable(f"cannot bind {where}: no Kubernetes API configured")
        info = await self._pod(namespace, args.PodName)
        if args.PodUID and info.uid and info.uid != args.PodUID and self.api is not None:
            # The cache may hold a pod deleted and re-created under the same name: ask the API.
            info = pod_info(await self.api.get_pod(namespace, args.PodName))
        if args.PodUID and info.uid != args.PodUID:
            self.metrics.binds.labels("refused").inc()
            raise UndecidableError(
                f"cannot bind {where}: the scheduler asked for pod uid {args.PodUID}, but the pod "
                f"{namespace}/{args.PodName} now has uid {info.uid or 'none'} (deleted and "
                "re-created?); nothing was bound"
            )
        if info.bound:
            return self._already_bound(info, args.Node, where)
        annotations: dict[str, str] = {}
        placing = info.gang is not None and info.gpus > 0
        if placing:
            gang = self.state.begin_bind(info, args.Node)
            annotations[PLACEMENT_ANNOTATION] = placement_annotation(args.Node, gang.block)
        bound_to: str | None = None
        try:
            status = await self.api.bind(
                namespace, args.PodName, args.PodUID, args.Node, annotations
            )
            if status == 409:
                current = pod_info(await self.api.get_pod(namespace, args.PodName))
                if not current.node:  # a conflict that bound nothing (a precondition, a race)
                    self.metrics.binds.labels("failed").inc()
                    raise UndecidableError(
                        f"cannot bind {where}: the API server answered 409 Conflict and the "
                        "pod is bound to no node; nothing was bound (the scheduler retries)"
                    )
                if current.node != args.Node:
                    self.metrics.binds.labels("refused").inc()
                    raise UndecidableError(
                        f"cannot bind {where}: it is already bound to {current.node}"
                    )
                # Bound where the scheduler wants it, by someone else: done. Its placement
                # is not written after the fact (the chart grants the extender no pod
                # writes); the gang's other workers carry the block for a restart.
                self.metrics.binds.labels("already_bound").inc()
            else:
                self.metrics.binds.labels("bound").inc()
            bound_to = args.Node
        except ApiError:
            self.metrics.binds.labels("failed").inc()
            raise
        finally:
            self.state.end_bind(info, bound_to)
        return ExtenderBindingResult()

    def _already_bound(self, info: PodInfo, node: str, where: str) -> ExtenderBindingResult:
        if info.node == node:
            self.metrics.binds.labels("already_bound").inc()
            return ExtenderBindingResult()
        self.metrics.binds.labels("refused").inc()
        raise PlacementError(f"cannot bind {where}: it is already bound to {info.node}")

    def ready(self) -> tuple[bool, str]:
        if self.state.synced:
            return True, "cache synced with the Kubernetes API"
        return False, self.state.unsynced_reason

    def describe(self) -> dict[str, Any]:
        return dict(self.state.gauges())
