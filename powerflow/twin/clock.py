"""The twin's clock: real time, sped up by a constant factor.

The operator and the extender are separate processes that read the real clock
(kopf's timers, ``time.monotonic``), so the twin cannot step time for them.
Instead the simulated parts (GPUs, workers, node agents' telemetry) read
``TwinClock.now_s``: real time since start times ``speed``. The components'
own durations are given in real seconds, the simulated ones divided by
``speed`` (``TwinClock.real_s``): a 240 s profiling window runs 240/speed real
seconds, and a 30 s checkpoint-restart of a worker too. What stays real is the
latency of the software itself (API round trips, debounces, watch delivery):
each real millisecond of it costs ``speed`` simulated milliseconds, which is
the price of the speed-up (``docs/twin.md`` measures it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TwinClock:
    """Simulated seconds since the twin started: ``(monotonic - start) * speed``."""

    speed: float = 1.0
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"the twin's speed must be > 0, got {self.speed!r}")

    def now_s(self) -> float:
        return (time.monotonic() - self.start) * self.speed

    def real_s(self, simulated_s: float) -> float:
        """How long ``simulated_s`` simulated seconds take in real time."""
        return simulated_s / self.speed

    def sleep(self, simulated_s: float) -> None:
        time.sleep(self.real_s(simulated_s))
