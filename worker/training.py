"""``Worker``: the one object a training script holds (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType, TracebackType

from powerflow.worker.env import WorkerEnv, read_env
from powerflow.worker.reporter import AgentReporter

log = logging.getLogger("powerflow.worker")

EXIT_ON_SIGTERM = 128 + signal.SIGTERM
"""The exit status of a worker stopped by SIGTERM (what the shell reports for one)."""


class Worker:
    """Reports iteration boundaries to the node agent and stops cleanly on SIGTERM.

    ``min_interval_s`` bounds how often the agent hears from this worker
    (reports are sent only at boundaries at least that far apart); the agent
    passes each job's latest count on to the operator as its progress.
    ``checkpoint``, when given, is called on SIGTERM at the
    next iteration boundary, after which the process exits with
    ``EXIT_ON_SIGTERM``; if no boundary comes before the grace period nearly
    ends (a hung collective), the process exits without it rather than be
    killed mid-write. ``start_iteration`` is where a resumed run starts
    counting.
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        min_interval_s: float = 0.1,
        checkpoint: Callable[[], None] | None = None,
        start_iteration: int = 0,
        agent_timeout_s: float = 1.0,
    ) -> None:
        self.env: WorkerEnv = read_env(env)
        self.min_interval_s = min_interval_s
        self.iterations = start_iteration
        self._last_offer_s = -float("inf")
        self._checkpoint = checkpoint
        self._terminating = False
        self._stopping = False
        self._closed = False
        self._previous_handler: Callable[[int, FrameType | None], object] | int | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        e = self.env
        self.reporter: AgentReporter | None = None
        if e.in_pod and e.agent_host:
            assert e.pod and e.namespace and e.uid
            self.reporter = AgentReporter(
                e.agent_host,
                e.agent_port,
                namespace=e.namespace,
                pod=e.pod,
                uid=e.uid,
                gpu_uuids=e.gpu_uuids,
                timeout_s=agent_timeout_s,
            )
        elif not e.in_pod:
            log.info("powerflow: not in a PowerFlow pod (no POWERFLOW_POD_* env): counting only")
        if checkpoint is not None:
            self._install_sigterm()

    # -- the training loop's calls ----------------------------------------------

    def report_iteration(self, iterations: int | None = None) -> None:
        """An iteration just ended: count it (or set the count to ``iterations``).

        Cheap and never blocking: at most one report handed to a background
        thread per ``min_interval_s``. Call it from the training thread: on
        SIGTERM this is where the checkpoint hook runs and the process exits.
        """
        self.iterations = self.iterations + 1 if iterations is None else iterations
        now = time.monotonic()
        reporter = self.reporter
        if (
            reporter is not None
            and now - self._last_offer_s >= self.min_interval_s
            and reporter.offer(self.iterations)
        ):
            self._last_offer_s = now
        if self._terminating:
            self._stop_at_boundary()

    @contextmanager
    def step(self) -> Iterator[None]:
        """``with worker.step(): ...`` around one training step (reports on success)."""
        yield
        self.report_iteration()

    def close(self) -> None:
        """The background thread stopped (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._uninstall_sigterm()
        if self.reporter is not None:
            self.reporter.close(final=self.iterations)

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- SIGTERM ----------------------------------------------------------------

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("powerflow: Worker made off the main thread: SIGTERM not handled")
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        # The C-level handler writes the signal number to this socket at once,
        # even while the main thread sits in a long C call (a collective), where
        # the Python handler would wait: the watchdog hears of SIGTERM through it.
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous: int | None = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            previous = None
        if previous != -1:  # someone (an asyncio loop) owns the wakeup fd: leave it to them
            if previous is not None:
                signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return
        self._wakeup = (reader, writer)
        watchdog = threading.Thread(
            target=self._watchdog, args=(reader,), name="powerflow-sigterm", daemon=True
        )
        watchdog.start()

    def _uninstall_sigterm(self) -> None:
        """After ``close`` no boundary comes: SIGTERM gets its old handler back."""
        if self._previous_handler is None or self._stopping:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._previous_handler)
        self._previous_handler = None
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for sock in self._wakeup:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the watchdog's recv
                sock.close()
            self._wakeup = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self._terminating:
            self._terminating = True
            log.warning("powerflow: SIGTERM: checkpoint and exit at the next iteration boundary")

    def _watchdog(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                break
        grace = self.env.grace_s
        deadline_s = max(0.5, grace - max(1.0, 0.1 * grace))
        time.sleep(deadline_s)
        if not self._stopping:
            log.error(
                "powerflow: no iteration boundary within %.1f s of SIGTERM (grace %.0f s): "
                "exiting without a checkpoint",
                deadline_s,
                grace,
            )
            os._exit(EXIT_ON_SIGTERM)

    def _stop_at_boundary(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._checkpoint is not None:
            try:
                self._checkpoint()
            except Exception:
                log.exception("powerflow: the checkpoint hook failed")
        self.close()
        raise SystemExit(EXIT_ON_SIGTERM)
