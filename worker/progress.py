"""Progress to the pod's ``powerflow.io/iterations`` annotation, at a bounded rate.

The operator reads it (the most any worker wrote) for the job's progress and
to tell a finished job (``contract.PROGRESS_ANNOTATION``); without it the
operator estimates progress from the model. One merge patch of the worker's
own pod at most every ``interval_s`` (30 s by default: a thousand workers
then cost the API server tens of writes a second), from a background thread,
plus one final write when the worker stops.

It needs RBAC the operator does not grant user pods on its own: the pod's
service account needs ``patch`` on ``pods`` in the job's namespace (a Role
with ``apiGroups: [""]``, ``resources: ["pods"]``, ``verbs: ["patch"]``,
bound to it). A 403 logs one warning saying so and stops the writer; the
operator then falls back to its estimate. Credentials: the in-cluster
service account, or ``$KUBECONFIG`` outside a cluster; none found is also
one warning. Nothing here raises into training.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from powerflow import contract

log = logging.getLogger("powerflow.worker")


class ProgressWriter:
    """Writes one pod's iteration count to its annotation (see the module docstring)."""

    def __init__(
        self, namespace: str, pod: str, *, interval_s: float = 30.0, timeout_s: float = 5.0
    ) -> None:
        self.namespace, self.pod = namespace, pod
        self._key = (namespace, pod)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._latest: int | None = None
        self._written: int | None = None
        self._api: Any = None
        self._disabled = False
        self._lock = threading.Lock()  # one write at a time
        self._stop = threading.Event()
        self.writes = 0
        self._thread = threading.Thread(target=self._loop, name="powerflow-progress", daemon=True)
        self._thread.start()

    @property
    def disabled(self) -> bool:
        """Whether the writer gave up (403, no credentials, the pod is gone)."""
        return self._disabled

    def update(self, iterations: int) -> None:
        """The latest count; written at the next tick (never blocks)."""
        self._latest = iterations

    def flush(self) -> None:
        """Write the latest count now if it is not written yet (bounded by the timeout)."""
        self._write()

    def close(self) -> None:
        """Final write, then stop the thread."""
        self._stop.set()
        self._write()
        self._thread.join(self.timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def _write(self) -> None:
        with self._lock:
            value = self._latest
            if self._disabled or value is None or value == self._written:
                return
            api = self._client()
            if api is None:
                return
            body = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: str(value)}}}
            try:
                api.patch_namespaced_pod(
                    self.pod,
                    self.namespace,
                    body,
                    _content_type="application/merge-patch+json",
                    _request_timeout=self.timeout_s,
                )
            except Exception as e:  # the client raises ApiException, urllib3 and OS errors
                self._failed(e)
                return
            self._written = value
            self.writes += 1

    def _failed(self, e: Exception) -> None:
        status = getattr(e, "status", None)
        if status == 403:
            self._disabled = True
            log.warning(
                "powerflow: may not write progress to pod %s/%s (403): grant its service "
                'account `patch` on `pods` in namespace %s (Role rule apiGroups [""], '
                'resources ["pods"], verbs ["patch"]); the operator estimates progress '
                "meanwhile. Not trying again.",
                self.namespace,
                self.pod,
                self.namespace,
            )
        elif status == 404:
            self._disabled = True
            log.warning(
                "powerflow: pod %s/%s is gone; progress not written", self.namespace, self.pod
            )
        else:
            log.debug("powerflow: writing progress failed (will retry): %s", e)

    def _client(self) -> Any:
        if self._api is not None:
            return self._api
        try:
            import kubernetes  # here: ~0.5 s of import the training start need not pay

            cfg = kubernetes.client.Configuration()
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            else:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=os.environ.get("KUBECONFIG"),
                    client_configuration=cfg,
                    persist_config=False,
                )
            self._api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
        except Exception as e:  # no service account, no kubeconfig, a broken file
            self._disabled = True
            log.warning("powerflow: no Kubernetes credentials, progress not written: %s", e)
            return None
        return self._api
