"""Keeps the extender's ``ClusterState`` equal to the cluster: list, watch, relist.

The informer pattern without client-go: list DLJobs, nodes and pods, replace
the state, then watch all three from the lists' resourceVersions; a watch that the
server ends is resumed from the last version seen (at most one a second per
resource), a 410 or a broken connection leads to a fresh list. While the API
cannot be reached the state is marked not synced (``/readyz`` fails and PowerFlow
pods get an ``Error``). An object that cannot be applied is logged by name and
skipped, never fatal: one poisoned pod must not keep the whole cache unsynced.

Each relist reads every node, DLJob and pod of the cluster, so relists back off
as client-go's reflector does (``powerflow.kubeapi.backoff``): after a failure,
0.5 s doubling to 10 s (each wait up to half longer at random), or the answer's
``Retry-After`` if longer; the first 410 after a good run relists at once, 410s
in a row wait as failures do, and mark the mirror unsynced meanwhile (no watch
is open). A run of list and watches that ended with a watch that had brought an
event, or whose watches ran longer than the longest wait (10 s), starts the back-off
over; one that a watch ended at once (a watch that the server or a proxy
refuses, throttles or cuts, a watch cache that answers every watch with 410)
does not, whatever the other watches brought, so it cannot relist the cluster
twice a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from powerflow.kubeapi.backoff import Backoff

from .kube import DLJOBS_PATH, NODES_PATH, PODS_PATH, ApiError, KubeApi, WatchExpired
from .objects import describe
from .state import ClusterState

log = logging.getLogger(__name__)

Apply = Callable[[Any], None]
CRD_POLL_S = 30.0
"""While the DLJob resource is missing, how often the mirror asks for it again: a CRD
installed after the extender (``crds.install=false`` and the CRD applied later) is
mirrored within this, not at the next relist, which a quiet cluster may not need for
hours."""
WATCH_REOPEN_S = 1.0
"""The least time between two watches of one resource: a server (or proxy) that ends
every watch at once gets one a second, not one per round trip."""


class CrdAppeared(Exception):
    """The DLJob resource exists now: list again, to mirror and watch it."""


class Mirror:
    """The background task that feeds the state from the API server."""

    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        *,
        watch_timeout_s: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        self.api = api
        self.state = state
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff(first_s=0.5, max_s=10.0, jitter=0.5)
        """The waits between relists (see the module). A ceiling of 10 s, not the node
        agents' 30 s: one or a few extenders relist, not a thousand agents, and while
        the mirror waits no PowerFlow pod is scheduled."""
        self.relists = 0
        self._told_no_crd = False
        self._watching_since: float | None = None
        """When the current run's watches started (None: still listing)."""
        self._ended: tuple[str, int] | None = None
        """The watch that ended the current run, and how many events it had brought."""
        self._brought: dict[str, int] = {}
        """Events each watch of the current run brought."""

    async def run(self) -> None:
        """Mirror forever; cancel the task to stop."""
        clock = asyncio.get_running_loop().time
        while True:
            try:
                await self._list_and_watch()
            except Exception as exc:
                first = _first(exc)
                if isinstance(first, CrdAppeared):
                    log.info("the DLJob resource exists now; relisting")
                    self._told_no_crd = False
                    continue
                since, ended = self._watching_since, self._ended
                if (ended is not None and ended[1] > 0) or (
                    since is not None and clock() - since > self.backoff.max_s
                ):
                    self.backoff.succeeded()  # it worked: a first failure, not the nth
                if isinstance(first, WatchExpired) and not self.backoff.failures:
                    self.backoff.failed()  # the next 410 soon after waits
                    log.info("watch expired; relisting")
                    continue
                asked = first.retry_after_s if isinstance(first, ApiError) else None
                delay = self.backoff.failed(asked)
                reason = str(first) if isinstance(first, ApiError) else f"{first!r}"
                self.state.mark_unsynced(reason)
                log.warning("Kubernetes API: %s; relisting in %.1f s", reason, delay)
                await asyncio.sleep(delay)

    async def _list_and_watch(self) -> None:
        self._watching_since, self._ended = None, None
        self._brought.clear()
        # DLJobs first: a pod's gang is adopted only as the worker of a DLJob it knows.
        jobs, job_version = await self._dljobs()
        nodes, node_version = await self.api.list(NODES_PATH)
        pods, pod_version = await self.api.list(PODS_PATH)
        self.state.replace(nodes, pods, jobs)
        self.relists += 1
        self._watching_since = asyncio.get_running_loop().time()
        async with asyncio.TaskGroup() as group:
            if job_version is not None:
                group.create_task(
                    self._watch(
                        DLJOBS_PATH, job_version, self.state.upsert_job, self.state.delete_job
                    )
                )
            else:
                group.create_task(self._await_crd())
            group.create_task(
                self._watch(
                    NODES_PATH, node_version, self.state.upsert_node, self.state.delete_node
                )
            )
            group.create_task(
                self._watch(PODS_PATH, pod_version, self.state.upsert_pod, self.state.delete_pod)
            )

    async def _dljobs(self) -> tuple[list[dict[str, Any]], str | None]:
        """The DLJobs and their list's version; none, and no version to watch from, when
        the API server has no such resource (the CRD is not installed: no DLJob exists,
        no gang is adopted; ``_await_crd`` looks again every ``CRD_POLL_S``)."""
        try:
            return await self.api.list(DLJOBS_PATH)
        except ApiError as exc:
            if exc.status != 404:
                raise
            if not self._told_no_crd:
                self._told_no_crd = True
                log.warning("%s: no DLJob resource (CRD not installed?): no gang adopted", exc)
            return [], None

    async def _await_crd(self) -> None:
        """Ask for the DLJob resource every ``CRD_POLL_S``; once it answers, end the
        watches with ``CrdAppeared`` (``run`` lists again, without marking the state
        unsynced)."""
        while True:
            await asyncio.sleep(CRD_POLL_S)
            try:
                await self.api.list(DLJOBS_PATH)
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise
            raise CrdAppeared

    async def _watch(self, path: str, version: str, upsert: Apply, delete: Apply) -> None:
        """Watch ``path`` for ever; the first watch to fail records how many events it
        brought (``run``: one that brought some worked, one that failed at once did not,
        whatever the other watches brought)."""
        try:
            await self._watch_events(path, version, upsert, delete)
        except Exception:  # a cancel (another watch failed) is no BaseException's here
            if self._ended is None:
                self._ended = (path, self._brought.get(path, 0))
            raise

    async def _watch_events(self, path: str, version: str, upsert: Apply, delete: Apply) -> None:
        clock = asyncio.get_running_loop().time
        opened = -WATCH_REOPEN_S
        while True:
            await asyncio.sleep(max(0.0, opened + WATCH_REOPEN_S - clock()))
            opened = clock()
            async for kind, obj in self.api.watch(path, version, self.watch_timeout_s):
                self._brought[path] = self._brought.get(path, 0) + 1
                meta = obj.get("metadata")
                seen = meta.get("resourceVersion") if isinstance(meta, dict) else None
                version = str(seen or version)
                try:
                    if kind in ("ADDED", "MODIFIED"):
                        upsert(obj)
                    elif kind == "DELETED":
                        delete(obj)
                except Exception as exc:  # one bad object must not stop the mirror
                    log.warning(
                        "skipping %s event for %s: %s: %s",
                        kind,
                        describe(obj),
                        type(exc).__name__,
                        exc,
                    )


def _first(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (the task group wraps the watches' errors)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
