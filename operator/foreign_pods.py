"""A watch-fed cache of the cluster's foreign GPU pods (``ForeignGpuPods``).

GPUs are cluster-wide: a bound, non-terminal pod that requests
``nvidia.com/gpu`` and is not PowerFlow's (no ``powerflow.io/job`` label)
occupies its GPUs, and every pass must plan around it. Listing those pods in
every pass would page through all of the cluster's bound pods (a field
selector cannot see resources) at up to one pass per debounce; on a big
cluster that is the heaviest request the operator makes. So, as an informer
does, the operator lists them once and then watches:

- LIST then WATCH of pods with the label selector ``!powerflow.io/job`` and
  the field selector ``spec.nodeName!=`` (a bound pod never becomes unbound,
  so no pod silently leaves the selection; the phase is checked here, on each
  event, since a pod that finishes is a MODIFIED event), in all namespaces;
- only pods that request GPUs and are not finished are kept: memory is one
  body per foreign GPU pod, not per pod;
- the watch resumes from the last ``resourceVersion`` seen (bookmarks
  included) when the server ends it (``timeoutSeconds``); a ``410 Gone``
  (too old) relists; other errors retry after a second;
- a foreign GPU pod arriving or leaving the set is a scheduling event
  (``on_change``); other pods' changes are not.

The synchronous ``kubernetes`` client streams in a daemon thread of its own
(not the event loop's executor, which would wait for a stream at shutdown);
results go to the event loop with ``call_soon_threadsafe``, so the set is
only ever touched there. Until the first LIST has arrived, ``pods`` is
``None`` and the caller lists directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines
from powerflow.operator.bodies import PodBody

from powerflow import contract

log = logging.getLogger(__name__)
LABELS = f"!{contract.JOB_LABEL}"
FIELDS = "spec.nodeName!="
TERMINAL = frozenset({"Succeeded", "Failed"})
WATCH_TIMEOUT_S = 300
"""``timeoutSeconds`` of each watch (the server ends it; the cache resumes)."""


class ForeignGpuPods:
    """The foreign GPU pods, kept current by a LIST and a WATCH (see the module)."""

    def __init__(
        self,
        core: kubernetes.client.CoreV1Api,
        list_pages: Callable[..., tuple[list[PodBody], str]],
        is_gpu_pod: Callable[[PodBody], bool],
    ) -> None:
        self.core = core
        self._list_pages = list_pages
        self._is_gpu_pod = is_gpu_pod
        self._pods: dict[tuple[str, str], PodBody] | None = None
        self._on_change: Callable[[str], None] = lambda _reason: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.lists = 0
        """How many times the pods were listed (the first LIST and each relist)."""

    def pods(self) -> tuple[PodBody, ...] | None:
        """The foreign GPU pods now; ``None`` before the first LIST arrived."""
        return None if self._pods is None else tuple(self._pods.values())

    def start(self, on_change: Callable[[str], None]) -> None:
        """Start listing and watching (call from the event loop that gets the news)."""
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="powerflow-foreign-pods")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop watching: the open stream is shut down, the thread ends on its own."""
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # interrupts the blocked read (urllib3 >= 2.3)

    # -- the thread --------------------------------------------------------------------------

    def _alive(self) -> bool:
        """Not stopped, and the event loop that gets the news still runs (an operator
        that ended without ``stop`` must not leave a thread polling its API server)."""
        loop = self._loop
        return not self._stopped.is_set() and loop is not None and not loop.is_closed()

    def _run(self) -> None:
        version: str | None = None
        listed = -1.0
        while self._alive():
            try:
                if version is None:
                    # At most one LIST a second, whatever the server answers the watch.
                    self._stopped.wait(max(0.0, listed + 1.0 - time.monotonic()))
                    listed = time.monotonic()
                    items, version = self._list_pages()
                    self.lists += 1
                    self._post(self._replace, items)
                began = time.monotonic()
                version = self._watch(version)
                if version is not None:  # a server that ends watches at once: no busy loop
                    self._stopped.wait(max(0.0, 1.0 - (time.monotonic() - began)))
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                if not self._stopped.is_set():
                    log.warning("foreign GPU pods: %s %s", exc.status, exc.reason)
                self._stopped.wait(1.0)
            except Exception as exc:  # unreachable, stream cut: retry from where it was
                if not self._stopped.is_set():
                    log.warning("foreign GPU pods: %s: %s", type(exc).__name__, exc)
                self._stopped.wait(1.0)

    def _watch(self, version: str) -> str | None:
        """Stream events from ``version``; the version to resume from, ``None``: relist."""
        response: Any = self.core.list_pod_for_all_namespaces(
            label_selector=LABELS,
            field_selector=FIELDS,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(10, WATCH_TIMEOUT_S + 30),
        )
        self._response = response
        try:
            if self._stopped.is_set():
                return version
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                meta = obj.get("metadata")
                if isinstance(meta, dict) and meta.get("resourceVersion"):
                    version = str(meta["resourceVersion"])
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._event, kind, obj)
        finally:
            self._response = None
            response.release_conn()
        return version

    def _post(self, handler: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or self._stopped.is_set():
            return
        try:
            loop.call_soon_threadsafe(handler, *args)
        except RuntimeError:  # the loop has closed: the operator ended
            self._stopped.set()

    # -- the event loop ----------------------------------------------------------------------

    def _keeps(self, pod: PodBody) -> bool:
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        return phase not in TERMINAL and self._is_gpu_pod(pod)

    def _replace(self, items: list[PodBody]) -> None:
        new = {_key(p): p for p in items if self._keeps(p)}
        before = self._pods
        self._pods = new
        if before is not None and set(before) != set(new):
            self._on_change("foreign GPU pods relisted")

    def _event(self, kind: str, pod: PodBody) -> None:
        if self._pods is None:
            return
        key = _key(pod)
        had = key in self._pods
        if kind != "DELETED" and self._keeps(pod):
            self._pods[key] = pod
        else:
            self._pods.pop(key, None)
        if had != (key in self._pods):
            self._on_change(f"foreign GPU pod {key[0]}/{key[1]} {kind}")


def _key(pod: PodBody) -> tuple[str, str]:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
