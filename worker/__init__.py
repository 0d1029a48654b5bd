"""The worker library (``powerflow.worker``): training code talks to PowerFlow here.

Runs inside the user's training container; it needs the standard library
alone, and no right on the API server. It never imports PyTorch or anything
else of PowerFlow but ``powerflow.core.contract``::

    from powerflow.worker import Worker

    with Worker(checkpoint=save_checkpoint) as pf:
        for batch in loader:
            with pf.step():
                train_step(batch)

What it does (``Worker``):

- **Iteration reports to the node agent**: at iteration boundaries at least
  ``min_interval_s`` (0.1 s) apart, a POST of ``{"namespace", "pod", "uid",
  "iterations", "gpuUuids"}`` to ``http://$POWERFLOW_AGENT_HOST:$POWERFLOW_AGENT_PORT``
  ``/v1/iterations`` (``powerflow.core.contract.ITERATIONS_PATH``), fire and forget
  from a background thread: a training step never waits for it; ``close()``
  sends the last count once more if the agent has not had it. The agent
  measures energy per window of iterations from these boundaries and steps
  profiling clocks only at them.
  *Why HTTP and not a unix socket on a hostPath:* Pod Security "baseline" and
  "restricted" refuse hostPath volumes in user pods, and a socket would need
  a volume in every user's pod template; HTTP to the agent's hostPort on the
  node (``status.hostIP`` from the downward API) needs nothing in the pod but
  env, which the operator sets. The agent trusts a report only from a
  PowerFlow pod bound to its node whose UID matches.
- **Progress**: the counts are cumulative (from ``start_iteration``, where a
  resumed run starts), and the agent passes each job's latest on to the
  operator with its samples, as the job's progress: the pod writes nothing to
  the API server, so its service account needs no role.
- **SIGTERM**: with ``checkpoint=`` given, the hook runs at the next
  iteration boundary and the process exits (status 143) within the pod's
  grace period (``POWERFLOW_GRACE_SECONDS``).

The env it reads is documented in ``powerflow.worker.env``. Outside a
PowerFlow pod it only counts, so the same script runs on a laptop.

Module-level ``report_iteration()``/``step()``/``close()`` use one default
``Worker`` made on first use (``init(...)`` makes it with options).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from powerflow.worker.env import WorkerEnv, read_env
from powerflow.worker.training import EXIT_ON_SIGTERM, Worker

__all__ = [
    "EXIT_ON_SIGTERM",
    "Worker",
    "WorkerEnv",
    "close",
    "init",
    "read_env",
    "report_iteration",
    "step",
]

_default: Worker | None = None


def init(**options: Any) -> Worker:
    """Make (or replace) the default ``Worker`` with ``options``."""
    global _default
    if _default is not None:
        _default.close()
    _default = Worker(**options)
    return _default


def _worker() -> Worker:
    return _default if _default is not None else init()


def report_iteration(iterations: int | None = None) -> None:
    """``Worker.report_iteration`` on the default worker."""
    _worker().report_iteration(iterations)


@contextmanager
def step() -> Iterator[None]:
    """``Worker.step`` on the default worker."""
    with _worker().step():
        yield


def close() -> None:
    """Close the default worker (final progress write)."""
    global _default
    if _default is not None:
        _default.close()
        _default = None
