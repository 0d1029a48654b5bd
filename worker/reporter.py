"""Iteration reports to the node agent: fire and forget from one background thread.

A training step must never wait for the agent, so ``offer`` only hands the
count to the thread and returns; if the thread is still busy with the last
report (a slow or unreachable agent) the new one is dropped, never queued:
the agent reads its energy counters when a report *arrives*, so a report
sent late would pair an old boundary with a later reading. The thread keeps
one HTTP/1.1 connection open to the agent (``http.client``: a report is one
small round trip on the node). Failures are logged once per kind until the
next success and never reach the caller.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading

from powerflow.core import contract

log = logging.getLogger("powerflow.worker")


class AgentReporter:
    """Posts ``contract.ITERATIONS_PATH`` reports of one pod to its node's agent."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        namespace: str,
        pod: str,
        uid: str,
        gpu_uuids: tuple[str, ...] = (),
        timeout_s: float = 1.0,
    ) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._base: dict[str, object] = {"namespace": namespace, "pod": pod, "uid": uid}
        if gpu_uuids:
            self._base["gpuUuids"] = list(gpu_uuids)
        self._cond = threading.Condition()
        self._pending: int | None = None
        self._busy = False
        self._closed = False
        self._conn: http.client.HTTPConnection | None = None
        self._complained: set[str] = set()
        self.sent = 0
        """Reports the agent accepted."""
        self.dropped = 0
        """Reports not sent because the previous one was still in flight."""
        self.last_sent: int | None = None
        """The count of the last report the agent accepted."""
        self._thread = threading.Thread(target=self._loop, name="powerflow-report", daemon=True)
        self._thread.start()

    def offer(self, iterations: int) -> bool:
        """Send ``iterations`` now if the thread is free (True), else drop it (False)."""
        with self._cond:
            if self._busy or self._closed:
                self.dropped += 1
                return False
            self._pending, self._busy = iterations, True
            self._cond.notify()
            return True

    def close(self, timeout_s: float = 1.0, final: int | None = None) -> None:
        """Stop the thread (after the report in flight, waiting at most ``timeout_s``);
        then, when ``final`` is a count the agent has not accepted yet, report it from
        this thread: a count dropped while a report was in flight, or held back by the
        interval, would otherwise never reach the operator, and it is the job's
        progress (a trainer that reaches its iterations and hangs in teardown is done).
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)
        if final is not None and final != self.last_sent and not self._thread.is_alive():
            self._post(final)
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    break
                iterations, self._pending = self._pending, None
            try:
                self._post(iterations)
            finally:
                with self._cond:
                    self._busy = False
        if self._conn is not None:
            self._conn.close()

    def _post(self, iterations: int) -> None:
        body = json.dumps({**self._base, "iterations": iterations}).encode()
        headers = {"Content-Type": "application/json"}
        for attempt in (1, 2):  # a kept-alive connection the agent closed: reconnect once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, self.timeout_s)
            try:
                self._conn.request("POST", contract.ITERATIONS_PATH, body, headers)
                resp = self._conn.getresponse()
                text = resp.read(500).decode(errors="replace")
            except (OSError, http.client.HTTPException) as e:
                self._conn.close()
                self._conn = None
                if attempt == 2 or not isinstance(
                    e, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError
                ):
                    self._complain("unreachable", f"agent {self.host}:{self.port}: {e}")
                    return
                continue
            if resp.status < 300:
                self.sent += 1
                self.last_sent = iterations
                self._complained.clear()
            elif resp.status == 404:  # the agent has not seen this pod yet: it will
                self._complain("404", f"the agent does not know this pod (yet): {text}")
            else:
                self._complain(
                    str(resp.status), f"the agent refused a report ({resp.status}): {text}"
                )
            return

    def _complain(self, kind: str, message: str) -> None:
        if kind not in self._complained:
            self._complained.add(kind)
            log.warning("powerflow: %s", message)
