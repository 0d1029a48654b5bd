"""Run ``powerflow operator`` against the emulator as a user does, in a thread of its own.

The operator is started through ``powerflow.commands.operator.serve``, the
function ``powerflow operator`` runs, with arguments parsed by the real
command-line parser and a kubeconfig file that points at the emulator: the
operator logs in with its own login handler, as on a cluster. The only seams
are ``serve``'s documented ones: a test policy and model factory, the
controller handed back once it runs (to count passes), and the ingest's sample
sink.

kopf in pytest's loop costs seconds per test at teardown; in a thread with a
stop flag it stops in milliseconds (TESTING.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from powerflow.cli import build_parser
from powerflow.commands.operator import serve
from powerflow.lab.twin.ports import free_port

if TYPE_CHECKING:
    from powerflow.operator.controller import Controller
    from powerflow.operator.ingest import SampleSink
    from powerflow.operator.learning import SampleStore
    from powerflow.operator.pass_snapshot import ModelFactory

    from powerflow.core.policy.snapshot import Policy


def write_kubeconfig(path: Path, server: str, token: str | None = None) -> Path:
    """A kubeconfig with one cluster (plain HTTP, as the emulator serves) and one user."""
    user = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "user"}}],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


log = logging.getLogger(__name__)
STOP_GRACE_S = 30.0
"""A pod's default ``terminationGracePeriodSeconds``."""


def operator_args(kubeconfig: Path, *options: str) -> argparse.Namespace:
    """``powerflow operator --kubeconfig FILE OPTIONS``, with free ports for liveness and
    metrics (several operators may run in one test), and no ingest unless OPTIONS ask."""
    argv = ["operator", "--kubeconfig", str(kubeconfig), "--metrics-port", "0"]
    argv += ["--ingest-port", "0"]  # off unless a test turns it on (OPTIONS come later, win)
    argv += ["--liveness", f"http://127.0.0.1:{free_port()}/healthz", *options]
    return build_parser().parse_args(argv)


def stacks() -> str:
    """Where every thread of the process is now (the operator's loop and its workers):
    what a stop that does not finish waits for."""
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is not None:
            out.append(f"--- thread {thread.name}:\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def task_stacks(loop: asyncio.AbstractEventLoop | None) -> str:
    """Where every task of the operator's event loop waits: a stop that does not finish
    waits on one of them (read from another thread, so it may miss a task that changes
    meanwhile; it is a diagnosis, not a check)."""
    if loop is None:
        return "(no event loop seen)"
    tasks: set[asyncio.Task[object]] = set()
    for _ in range(5):  # the loop's task set may change while it is read
        with contextlib.suppress(RuntimeError):
            tasks = asyncio.all_tasks(loop)
            break
    out = []
    for task in tasks:
        text = io.StringIO()
        task.print_stack(limit=12, file=text)
        out.append(f"--- {task.get_name()} ({task.get_coro()!r}):\n{text.getvalue()}")
    return "\n".join(out)


class Operator:
    """``async with Operator(args):`` runs ``serve(args)`` until the block ends."""

    def __init__(
        self,
        args: argparse.Namespace,
        policy: Policy | None = None,
        models: ModelFactory | None = None,
        *,
        wait_for_pass: bool = True,
        sink: SampleSink | None = None,
        store: SampleStore | None = None,
    ) -> None:
        self.args = args
        self.policy = policy
        self.models = models
        self.wait_for_pass = wait_for_pass
        self.sink = sink
        self.store = store
        self.controller: Controller | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _started(self, controller: Controller) -> None:
        self.controller = controller
        with contextlib.suppress(RuntimeError):  # called outside the loop: nothing to see
            self.loop = asyncio.get_running_loop()

    def _main(self) -> None:
        try:
            serve(
                self.args,
                stop_flag=self._stop,
                ready_flag=self._ready,
                policy=self.policy,
                models=self.models,
                on_start=self._started,
                sink=self.sink,
                store=self.store,
            )
        except BaseException as exc:  # surfaced by __aenter__
            self.error = exc
            self._ready.set()

    @property
    def passes(self) -> int:
        return 0 if self.controller is None else self.controller.passes

    async def __aenter__(self) -> Operator:
        """Start, and return once the first allocation pass is done (``wait_for_pass``).

        Waits in a worker thread: the emulator serves from the caller's loop,
        which must stay free while the operator talks to it.
        """
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, 60):
            raise RuntimeError("operator did not start")
        if self.error is not None:
            raise RuntimeError(f"operator failed: {self.error!r}") from self.error
        for _ in range(500):
            if not self.wait_for_pass or self.passes > 0:
                break
            await asyncio.sleep(0.01)
        return self

    async def stop(self, *, failing: bool = False) -> None:
        """Stop as SIGTERM does, and fail if it takes longer than a pod's default grace
        period (30 s: the kubelet would SIGKILL it) rather than pass silently with an
        operator still running (its thread cannot be killed; the failure names it).
        ``failing``: the test already failed; its error stays the one reported."""
        self._stop.set()
        await asyncio.to_thread(self._thread.join, STOP_GRACE_S)
        if self._thread.is_alive():
            message = f"the operator did not stop within {STOP_GRACE_S} s\n{stacks()}"
            message += f"\nits tasks:\n{task_stacks(self.loop)}"
            if not failing:
                raise AssertionError(message)
            log.error("%s (while the test failed)", message)

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.stop(failing=exc_type is not None)
