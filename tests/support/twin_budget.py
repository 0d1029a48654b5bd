"""What the twin's budget check needs (``tests/test_twin_faults_agent.py``): the GPUs'
own power read all along (``PowerLog``), judged by one-second means against the budget's
limit (``settled_after``), and the admin's edit of the budget ConfigMap (``set_eta``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.lab.twin.harness import MERGE, Twin

TOLERANCE = 0.02
"""Relative slack on the limit for the power averaged over one second (``MEAN_S``): the
ground truth's power carries its measurement noise (each GPU's draw at each 0.1 s step
a few percent around its mean), so a plan whose caps sum exactly to the limit reads a
little above it now and then; over one second the sum of 8 GPUs varies by about 0.4 %
(one standard deviation), so 2 % is about five of them. A GPU over its cap, or a plan
over the limit by one GPU's share (1/8), is far beyond it."""
MEAN_S = 1.0
"""The power is judged as its mean over this: what NVML reports for an A100's power
draw is itself a one-second average, and the budget is about energy over time, not
one 0.1 s step."""


def limit_w(eta: float, gpus: int) -> float:
    """The budget's limit for ``eta`` on ``gpus`` A100s (``policy.budget``'s rule)."""
    return eta * gpus * A100.p_max_w


@dataclass
class PowerLog:
    """Every GPU's power on the twin, summed (W), every 0.1 s: ``(time.monotonic(), W)``."""

    twin: Twin
    readings: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, name="budget-power", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        gpus = range(self.twin.gpus_per_node)
        while not self.stop.wait(0.1):
            watts = sum(g.power_mw(i) / 1000.0 for g in self.twin.gpus.values() for i in gpus)
            self.readings.append((time.monotonic(), watts))

    def between(self, start: float, end: float) -> list[float]:
        """The one-second means (``MEAN_S``) ending in [``start``, ``end``)."""
        return [w for at, w in self.means() if start <= at < end]

    def means(self) -> list[tuple[float, float]]:
        """``(at, mean of the readings in (at - MEAN_S, at])`` for every reading."""
        readings = list(self.readings)
        out: list[tuple[float, float]] = []
        first = 0
        total = 0.0
        for i, (at, watts) in enumerate(readings):
            total += watts
            while readings[first][0] <= at - MEAN_S:
                total -= readings[first][1]
                first += 1
            out.append((at, total / (i - first + 1)))
        return out

    def recent(self) -> float:
        """The highest one-second mean of the last second (0 without one)."""
        now = time.monotonic()
        return max(self.between(now - 1.0, now), default=0.0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def settled_after(log: PowerLog, start: float, end: float, limit: float) -> float | None:
    """Seconds from ``start`` until the power (one-second means) stays at most ``limit``
    (with ``TOLERANCE``) up to ``end`` (None: it never does)."""
    readings = [(at, w) for at, w in log.means() if start <= at < end]
    last_over = None
    for at, watts in readings:
        if watts > limit * (1 + TOLERANCE):
            last_over = at
    if readings and last_over == readings[-1][0]:
        return None
    return 0.0 if last_over is None else last_over - start


def set_eta(twin: Twin, eta: float) -> None:
    """The admin's edit of the budget ConfigMap's ``eta``."""
    assert twin.client is not None
    path = f"/api/v1/namespaces/powerflow-system/configmaps/{contract.BUDGET_CONFIGMAP}"
    patch = {"data": {"eta": f"{eta:g}"}}
    twin.client.patch(path, json=patch, headers=MERGE).raise_for_status()


def describe(
    log: PowerLog, low: float, high: float, lowered: float, raised: float, end: float
) -> str:
    """The run's power around the two changes, in one line (the figures docs/twin.md cites)."""
    if not lowered:
        return "the budget was never lowered"
    settle_low = settled_after(log, lowered, raised, low)
    # From the first one-second mean that holds no reading from before the settling.
    under = log.between(lowered + (settle_low or 0.0) + MEAN_S, raised)
    after = log.between(raised, end)
    return (
        f"limits {low:.0f}/{high:.0f} W; before lowering: max "
        f"{max(log.between(lowered - 5.0, lowered), default=0):.0f} W; lowered: under the "
        f"limit after {settle_low} s, one second on max {max(under, default=0):.0f} W, mean "
        f"{sum(under) / max(1, len(under)):.0f} W; raised: max {max(after, default=0):.0f} W, "
        f"over the limit for {settled_after(log, raised, end, high)} s; budget phase "
        f"{end - lowered:.0f} s"
    )
