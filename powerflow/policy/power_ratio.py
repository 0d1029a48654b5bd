"""The cluster ratio a backend reports to the power loop (``Snapshot.power_ratio``).

Both backends (the simulator and the operator) measure the jobs that run as
planned, sum their measured power and the power the plan counted for them,
and report the LARGEST ratio over the last hour: a model error that showed
once is planned for until it has been gone an hour, because a ratio that
drops the moment a plan fits again would let the next plan pass the limit
again (``powerflow.policy.power_loop`` says how the policy uses it). One
class so that the simulator's numbers are the operator's behaviour.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

WINDOW_S = 3600.0
"""How far back the ratio looks: long enough to remember a systematic error
across the hour's scheduling passes, short enough to forget one that is gone."""


class RatioWindow:
    """Recent (time, measured / planned) samples; the largest of them is the ratio."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now_s: float, pairs: Iterable[tuple[float, float]]) -> None:
        """Record ``sum(measured) / sum(planned)`` over ``(measured_w, planned_w)``
        pairs of the jobs running as planned (nothing when none has planned power,
        and a pair that is not finite and positive is left out: one bad reading
        must not shrink the whole cluster's budget)."""
        measured = planned = 0.0
        for m, p in pairs:
            if 0 < m < float("inf") and 0 < p < float("inf"):
                measured += m
                planned += p
        if planned > 0:
            self._samples.append((now_s, measured / planned))

    def ratio(self, now_s: float) -> float:
        """The largest ratio of the last ``window_s`` (1.0 with none)."""
        cut = now_s - self.window_s
        samples = self._samples
        while samples and samples[0][0] < cut:
            samples.popleft()
        return max((r for _, r in samples), default=1.0)
