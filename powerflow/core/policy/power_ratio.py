"""The cluster ratio a backend reports to the power loop (``Snapshot.power_ratio``).

Both backends (the simulator and the operator) measure the jobs that run as
planned, sum their measured power and the power the plan counted for them,
and report the LARGEST ratio over the last hour: a model error that showed
once is planned for until it has been gone an hour, because a ratio that
drops the moment a plan fits again would let the next plan pass the limit
again (``powerflow.core.policy.power_loop`` says how the policy uses it). One
class so that the simulator's numbers are the operator's behaviour.

The ratio steers every job of the cluster (the planning limit is
``limit / ratio``), and the measured power comes from node agents, any of
which may be broken or lying. So it is bounded twice:

- a job measured outside ``BELIEVED`` times its planned power (the range the
  policy's per-job correction is clamped to, ``power_loop.SCALE_RANGE``) is an
  *outlier*: left out of the ratio and returned to the caller, which records
  it (the operator: an Event on the DLJob and ``powerflow_power_outliers_total``)
  instead of believing it;
- the ratio is at most ``MAX_RATIO``: whatever any sender says, the plan keeps
  at least ``1 / MAX_RATIO`` of the limit (the power caps, not the ratio, are
  what holds the budget when the models are wrong: ``power_loop``).

Honest runs stay inside both: over the whole default trace at eta 0.6
(fitted models), the jobs' true over planned power lay in 0.83-1.18 and the
cluster ratio reached 1.007.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from powerflow.core.policy.power_loop import SCALE_RANGE

WINDOW_S = 3600.0
"""How far back the ratio looks: long enough to remember a systematic error
across the hour's scheduling passes, short enough to forget one that is gone."""
BELIEVED = SCALE_RANGE
"""Measured over planned power of one job believed as a model error (module docstring)."""
MAX_RATIO = 1.25
"""The largest ratio reported: the plan keeps at least 80 % of the limit."""


class RatioWindow:
    """Recent (time, measured / planned) samples; the largest of them is the ratio."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now_s: float, pairs: Iterable[tuple[float, float]]) -> list[int]:
        """Record ``sum(measured) / sum(planned)`` over ``(measured_w, planned_w)``
        pairs of the jobs running as planned (nothing when none has planned power).
        A pair that is not finite and positive is left out (one bad reading must not
        shrink the whole cluster's budget), and so is an outlier (``BELIEVED``),
        whose position in ``pairs`` is returned."""
        measured = planned = 0.0
        outliers = []
        lo, hi = BELIEVED
        inf = math.inf
        for i, (m, p) in enumerate(pairs):
            if not (0 < m < inf and 0 < p < inf):
                continue
            if not lo <= m / p <= hi:
                outliers.append(i)
                continue
            measured += m
            planned += p
        self.add_sums(now_s, measured, planned)
        return outliers

    def add_sums(self, now_s: float, measured_w: float, planned_w: float) -> None:
        """Record ``measured_w / planned_w``, the sums ``add`` forms of the pairs it
        keeps (nothing when ``planned_w`` is not positive): for a backend that sums
        them itself (the simulator, over arrays of its jobs)."""
        if planned_w > 0:
            self._samples.append((now_s, measured_w / planned_w))

    def ratio(self, now_s: float) -> float:
        """The largest ratio of the last ``window_s`` (1.0 with none), at most
        ``MAX_RATIO``."""
        cut = now_s - self.window_s
        samples = self._samples
        while samples and samples[0][0] < cut:
            samples.popleft()
        return min(MAX_RATIO, max((r for _, r in samples), default=1.0))
