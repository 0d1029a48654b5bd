"""A stop request set by a signal handler and waited on in a loop.

``threading.Event`` cannot be set from a signal handler. The handler runs in the
main thread between two bytecodes; if those are inside ``Event.wait``, after it took
its condition's lock and before the condition's wait released it, ``set()`` waits for
that lock, which its own thread holds, forever: a SIGTERM sent just as a process
starts to wait would hang it. A plain attribute takes no lock; the waiter polls it.
"""

from __future__ import annotations

import signal
import time

POLL_S = 0.05
"""How often ``wait`` looks at the flag: a stop is seen at most this late."""


class StopSignal:
    def __init__(self) -> None:
        self._stopped = False

    def set(self, *_: object) -> None:
        """Safe in a signal handler: one attribute write, no lock."""
        self._stopped = True

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout_s: float) -> bool:
        """True as soon as the stop is set (within ``POLL_S``), False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, POLL_S))
        return True


def on_sigterm() -> StopSignal:
    """A ``StopSignal`` that SIGTERM sets (the kubelet's stop, the twin's teardown)."""
    stop = StopSignal()
    signal.signal(signal.SIGTERM, stop.set)
    return stop
