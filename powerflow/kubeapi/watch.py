"""LIST then WATCH one selection of objects in a thread, as an informer does.

- LIST (paginated: ``limit``/``continue``), hand the items over, then WATCH
  from the list's ``resourceVersion``;
- when the server ends a watch (``timeoutSeconds``), resume from the last
  ``resourceVersion`` seen, bookmarks included: no relist, no replay;
- a ``410 Gone`` (the version is older than the server's history, as an
  HTTP status or an ``ERROR`` event in the stream) relists, at most once a
  second; a relist within 30 s of the last one (the server's history keeps
  nothing, a watch cache that keeps failing) waits the same back-off as an
  error, from 1 s up, so that relists, which the API server may serve from
  etcd, do not come once a second from every node;
- other errors (unreachable, stream cut, 5xx, 429) are logged and retried from
  where the watch was after a back-off (``backoff.Backoff``: 1 s doubling to 30 s,
  each wait up to half longer at random, or the answer's ``Retry-After`` if
  longer), not each second: a thousand nodes' agents must not keep an
  overloaded API server down; a LIST or a watch that went through, or a try that
  lasted longer than the back-off's ceiling (30 s), starts it over;
- a server that ends watches at once costs at most one watch a second.

The ``kubernetes`` client is synchronous: the watch streams in a daemon
thread of its own (not the event loop's executor, which would wait for an
open stream at shutdown) and hands results to the event loop that called
``start`` with ``call_soon_threadsafe``, so the caller's state is only ever
touched there. ``stop`` shuts the open stream down; the thread also ends on
its own once that event loop has closed, so a component that ended without
``stop`` leaves no thread polling its API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast

import kubernetes
from kubernetes.watch.watch import iter_resp_lines

from powerflow.kubeapi.backoff import Backoff, asked_wait_s

log = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 300
"""``timeoutSeconds`` of each watch by default (the server ends it; the watch resumes)."""
LIST_PAGE = 500
"""Objects per page of the LIST."""

Obj = dict[str, Any]
T = TypeVar("T")
"""The type the caller gives the objects (a ``TypedDict`` of its own): JSON as sent."""


class ListWatch(Generic[T]):
    """LIST then WATCH one selection (see the module).

    ``call`` is a list method of the ``kubernetes`` client (for instance
    ``CoreV1Api.list_node``), called with ``selection`` (``label_selector``,
    ``field_selector``) for the LIST (unless ``lister`` does the LIST) and the
    WATCH. ``on_list(items)`` after each LIST and ``on_event(type, obj)`` for
    each ``ADDED``, ``MODIFIED`` or ``DELETED`` run on the event loop that
    called ``start``. ``lister``, when given, makes the LIST instead: all the
    items of the selection and the list's ``resourceVersion``.
    """

    def __init__(
        self,
        name: str,
        call: Callable[..., Any],
        on_list: Callable[[list[T]], None],
        on_event: Callable[[str, T], None],
        *,
        selection: Mapping[str, str] | None = None,
        lister: Callable[[], tuple[list[T], str]] | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self.backoff = backoff or Backoff(first_s=1.0, max_s=30.0, jitter=0.5)
        """The waits after errors (see the module)."""
        self.relists = Backoff(
            first_s=self.backoff.first_s, max_s=self.backoff.max_s, jitter=self.backoff.jitter
        )
        """The waits between relists in a row (see the module)."""
        self._call = call
        self._selection = dict(selection or {})
        self._lister = lister or self._list_pages
        self._on_list = on_list
        self._on_event = on_event
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.lists = 0
        """How many LISTs were handed over (the first and each relist)."""

    def start(self) -> None:
        """Start listing and watching; call from the event loop that gets the results."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"powerflow-watch-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop: nothing more is handed over; the open stream is shut down and the
        thread ends on its own."""
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # interrupts the blocked read (urllib3 >= 2.3)

    def running(self) -> bool:
        """Whether the thread is still there (it ends soon after ``stop``)."""
        return self._thread is not None and self._thread.is_alive()

    # -- the thread ----------------------------------------------------------------------

    def _alive(self) -> bool:
        """Not stopped, and the event loop that gets the results still runs."""
        loop = self._loop
        return not self._stopped.is_set() and loop is not None and not loop.is_closed()

    def _run(self) -> None:
        version: str | None = None
        listed = -1.0
        relist_s = 1.0
        while self._alive():
            began = time.monotonic()
            try:
                if version is None:
                    # At most one LIST a second; relists after 410s in a row back off.
                    self._stopped.wait(max(0.0, listed + relist_s - time.monotonic()))
                    listed = began = time.monotonic()
                    items, version = self._lister()
                    self.lists += 1
                    self.backoff.succeeded()
                    self._post(self._on_list, items)
                began = time.monotonic()
                version = self._watch(version)
                self.backoff.succeeded()
                if version is None:  # an ERROR event: 410 Gone
                    relist_s = self._relist_s(listed)
                if version is not None:  # a server that ends watches at once: no busy loop
                    self._stopped.wait(max(0.0, 1.0 - (time.monotonic() - began)))
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:
                    version = None
                    relist_s = self._relist_s(listed)
                    continue
                self._failed(began, f"{exc.status} {exc.reason}", asked_wait_s(exc))
            except Exception as exc:  # unreachable, stream cut: retry from where it was
                self._failed(began, f"{type(exc).__name__}: {exc}", None)

    def _relist_s(self, listed: float) -> float:
        """The least time between the last LIST (at ``listed``) and the relist a 410
        asks for: a second, or a back-off when the last LIST was a relist too recent
        for its watch to have done its work (see the module)."""
        if time.monotonic() - listed < self.relists.max_s:
            return max(1.0, self.relists.failed())
        self.relists.succeeded()
        return 1.0

    def _failed(self, began: float, what: str, asked_s: int | None) -> None:
        """Log a failed try (begun at ``began``) and wait out the back-off."""
        if time.monotonic() - began > self.backoff.max_s:
            self.backoff.succeeded()  # it worked for a while: a first failure, not the nth
        wait = self.backoff.failed(asked_s)
        if not self._stopped.is_set():
            log.warning("watch %s: %s; trying again in %.1f s", self.name, what, wait)
        self._stopped.wait(wait)

    def _list_pages(self) -> tuple[list[T], str]:
        """The LIST, page by page; a continue token the server forgot is 410: relist."""
        items: list[T] = []
        token: str | None = None
        while True:
            page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
            response = self._call(**self._selection, **page, _preload_content=False)
            try:
                raw = json.loads(response.data or b"{}")
            finally:
                response.release_conn()
            items.extend(raw.get("items") or [])
            meta = raw.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str | None:
        """Stream events from ``version``; the version to resume from, ``None``: relist."""
        response: Any = self._call(
            **self._selection,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=self.timeout_s,
            _preload_content=False,
            _request_timeout=(10, self.timeout_s + 30),
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
                    self._post(self._on_event, kind, cast(T, obj))
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
        except RuntimeError:  # the loop has closed: the component ended
            self._stopped.set()
