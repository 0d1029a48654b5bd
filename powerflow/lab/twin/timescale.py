"""Why the twin runs in real time, and how it shrinks time instead.

The operator and the extender are processes that read the real clock (kopf's
timers, ``time.monotonic``, Unix time in the profiling plan's ``untilS``), and
durations cross component boundaries in their units (the plan's
``sliceSeconds`` is timed by the node agent's clock, sample windows by the
agent's, the budget's interval by the operator's). A clock sped up for some of
them would put two units on one wire. So every part of the twin reads the one
real clock, and the *trace* is made smaller instead: ``TimeScale(f)`` multiplies
by ``f`` every duration that the simulator also has (iterations, hence
training time, submission times, the profiling window, the checkpoint-restart
cost, the scheduling interval and the agents' sample window), in the twin
and in the ``powerflow simulate`` run it is compared with.
The schedule keeps its shape; what does not shrink is the software's own
latency (API round trips, watch delivery, debounces, a bind), which is then
``1/f`` times larger next to the jobs than on a real cluster. ``docs/twin.md``
measures what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILE_WINDOW_S = 240.0
"""The operator's default ``--profiling-window`` and the simulator's ``profile_s``."""
SAMPLE_WINDOW_S = 5.0
"""The node agent's ``--window`` and the simulator's ``SimConfig.sample_window_s``
(``tests/test_sim_engine.py`` keeps the three equal)."""


@dataclass(frozen=True)
class TimeScale:
    """``factor`` (0, 1]: the twin's seconds per second of the full-size system."""

    factor: float = 0.02

    def __post_init__(self) -> None:
        if not 0 < self.factor <= 1:
            raise ValueError(f"the time scale must be in (0, 1], got {self.factor!r}")

    def __call__(self, seconds: float) -> float:
        return seconds * self.factor


DEFAULT = TimeScale()
"""The twin's default: 1/50 of the full-size durations."""
