"""What the studies run on the tuning windows (``powerflow sweep``) share in their tests."""

from __future__ import annotations

from collections.abc import Sequence

from powerflow.lab.sim.runner import RunSpec
from powerflow.lab.sim.windows import EVALUATION_WINDOWS, TUNING_WINDOWS


def assert_tuning_windows_only(specs: Sequence[RunSpec]) -> None:
    """Every tuning window has runs, and no run is on an evaluation window (a knob
    chosen there would be tuned on the test set)."""
    evaluation = {w.name for w in EVALUATION_WINDOWS}
    assert {s.trace.window for s in specs} == {w.name for w in TUNING_WINDOWS}
    assert not any(s.trace.window in evaluation for s in specs)
