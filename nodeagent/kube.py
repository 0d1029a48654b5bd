"""The node agent's Kubernetes I/O: its configuration, two watches, pod Events.

Configuration, in the operator's order (the agent cannot import the
operator, so this is its own small copy of the rules): ``--kubeconfig FILE``
when given; else the pod's service account when running in a pod
(``KUBERNETES_SERVICE_HOST`` set: the DaemonSet); else ``$KUBECONFIG``
(``:``-separated list merged), else ``~/.kube/config``. No usable
configuration is a ``KubeConfigError`` with one line.

Watches (``Watch``), as an informer does: LIST, then WATCH from the list's
``resourceVersion``, resuming from the last version seen (bookmarks
included) when the server ends a watch, relisting on ``410 Gone``, retrying
other errors after a second. Two of them: the PowerFlow pods bound to this
node (label ``powerflow.io/job``, field ``spec.nodeName=<node>``: the API
server filters, so the agent sees only its node's few pods) and its own Node
(field ``metadata.name=<node>``, for the powered-down mark).

The ``kubernetes`` client is synchronous: each watch streams in a daemon
thread and hands results to the event loop with ``call_soon_threadsafe``,
so the agent's state is only touched there.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines
from powerflow.nodeagent.apply import PodEvent

from powerflow import __version__, contract
from powerflow.errors import PowerFlowError

log = logging.getLogger(__name__)
DEFAULT_KUBECONFIG = "~/.kube/config"
WATCH_TIMEOUT_S = 300
"""``timeoutSeconds`` of each watch (the server ends it; the watch resumes)."""
COMPONENT = "powerflow-nodeagent"

Obj = dict[str, Any]


class KubeConfigError(PowerFlowError):
    """No usable Kubernetes configuration (in-cluster or kubeconfig)."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_configuration(
    kubeconfig: str | None, environ: dict[str, str] | None = None
) -> kubernetes.client.Configuration:
    """The client configuration for ``--kubeconfig`` (None: not given), or one clear error."""
    env = dict(os.environ) if environ is None else environ
    cfg = kubernetes.client.Configuration()
    source = kubeconfig or (
        None
        if env.get("KUBERNETES_SERVICE_HOST")
        else env.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG)
    )
    where = source or "in-cluster service account"
    try:
        if source is None:
            kubernetes.config.load_incluster_config(client_configuration=cfg)
        else:
            paths = [p for p in source.split(os.pathsep) if p]
            if not any(Path(p).is_file() for p in paths):
                raise KubeConfigError(f"kubeconfig {source}: no such file")
            kubernetes.config.load_kube_config(
                config_file=source, client_configuration=cfg, persist_config=False
            )
    except KubeConfigError:
        raise
    except Exception as exc:  # the loaders raise config, YAML, type and OS errors
        raise KubeConfigError(f"{where}: not a usable configuration ({_one_line(exc)})") from None
    if not cfg.host or cfg.host == "http://localhost":
        raise KubeConfigError(f"{where}: no cluster server in the configuration")
    return cfg


class Watch:
    """LIST then WATCH one selection; ``on_list(items)`` and ``on_event(type, obj)``
    run on the event loop that called ``start``."""

    def __init__(
        self,
        name: str,
        call: Callable[..., Any],
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        **selection: str,
    ) -> None:
        self.name = name
        self._call = call
        self._selection = selection
        self._on_list = on_list
        self._on_event = on_event
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"powerflow-watch-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # interrupts the blocked read (urllib3 >= 2.3)

    def _alive(self) -> bool:
        loop = self._loop
        return not self._stopped.is_set() and loop is not None and not loop.is_closed()

    def _run(self) -> None:
        version: str | None = None
        listed = -1.0
        while self._alive():
            try:
                if version is None:
                    self._stopped.wait(max(0.0, listed + 1.0 - time.monotonic()))
                    listed = time.monotonic()
                    version = self._list()
                began = time.monotonic()
                version = self._watch(version)
                if version is not None:  # a server that ends watches at once: no busy loop
                    self._stopped.wait(max(0.0, 1.0 - (time.monotonic() - began)))
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                if not self._stopped.is_set():
                    log.warning("watch %s: %s %s", self.name, exc.status, exc.reason)
                self._stopped.wait(1.0)
            except Exception as exc:  # unreachable, stream cut: retry from where it was
                if not self._stopped.is_set():
                    log.warning("watch %s: %s: %s", self.name, type(exc).__name__, exc)
                self._stopped.wait(1.0)

    def _list(self) -> str:
        items: list[Obj] = []
        token: str | None = None
        while True:
            page = {"limit": 500, **({"_continue": token} if token else {})}
            response = self._call(**self._selection, **page, _preload_content=False)
            try:
                raw = json.loads(response.data or b"{}")
            finally:
                response.release_conn()
            items.extend(raw.get("items") or [])
            meta = raw.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self._post(self._on_list, items)
                return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str | None:
        """Stream events from ``version``; the version to resume from, None: relist."""
        response: Any = self._call(
            **self._selection,
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
                    self._post(self._on_event, kind, obj)
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
        except RuntimeError:  # the loop has closed: the agent ended
            self._stopped.set()


class AgentKube:
    """The API calls of one node's agent."""

    def __init__(self, cfg: kubernetes.client.Configuration, node: str) -> None:
        self.node = node
        self.api = kubernetes.client.ApiClient(cfg)
        self.api.user_agent = f"{COMPONENT}/{__version__} ({node})"
        self.core = kubernetes.client.CoreV1Api(self.api)

    def pod_watch(
        self, on_list: Callable[[list[Obj]], None], on_event: Callable[[str, Obj], None]
    ) -> Watch:
        return Watch(
            "pods",
            self.core.list_pod_for_all_namespaces,
            on_list,
            on_event,
            label_selector=contract.JOB_LABEL,
            field_selector=f"spec.nodeName={self.node}",
        )

    def node_watch(
        self, on_list: Callable[[list[Obj]], None], on_event: Callable[[str, Obj], None]
    ) -> Watch:
        return Watch(
            "node",
            self.core.list_node,
            on_list,
            on_event,
            field_selector=f"metadata.name={self.node}",
        )

    def post_event(self, event: PodEvent, uid: str) -> None:
        """Create the Event (best effort: a failure is logged, never raised)."""
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
                namespace, body, _preload_content=False
            )
            response.release_conn()
        except Exception as exc:  # events are best effort
            log.warning("could not post event %s on %s/%s: %s", event.reason, namespace, name, exc)

    def close(self) -> None:
        self.api.close()
