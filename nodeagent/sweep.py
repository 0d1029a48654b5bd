"""Profiling sweeps: which clock each profiling job runs now (pure, time injected).

The operator writes a ``ProfilePlan`` on a job's pods
(``contract.PROFILE_ANNOTATION``); the agent locks each of its clocks in
turn for ``slice_s`` and then goes back to ``frequency-mhz``. Every step,
the first one included, happens at an iteration boundary (a report of the
job's lead worker on this node): a window of samples must run at one clock
from boundary to boundary, so a step mid-iteration would waste the window.
Slices follow a schedule from the sweep's start (the boundary where the
first clock was asked for): clock k from the first boundary at or after
``start + k * slice_s``. The operator removes the plan ``len(clocks) *
slice_s`` after it wrote it (``operator.profile_plan``); were each slice timed
from its own (late) step, every step's lateness (up to an iteration plus the
worker's report interval) would add up over the clocks and push the sweep past
the window, cutting off the top clocks. On the schedule a late step shortens
the next slice instead, and the sweep ends within one boundary of its plan.

A plan with an end (``ProfilePlan.until_s``, Unix time) is fitted into the
time left at the first boundary: the operator starts its window when the
workers run, the first iteration comes after the framework's start-up, and
the slices shrink to ``(until - start) / len(clocks)`` (never longer than
planned) so that every clock is measured before the operator takes the plan
back; with no time left the sweep is over before it starts.

One sweep per job (``PodView.job_key``: a new generation is a new job):
a new or changed plan restarts it from the first clock, a removed plan ends
it at once (the operator took it back; no boundary to wait for), and a
finished sweep stays finished while the plan is unchanged, so a restarted
watch that replays the same annotation does not profile again.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from powerflow.nodeagent.pods import ProfilePlan


@dataclass
class _Sweep:
    plan: ProfilePlan
    index: int = -1
    """Clock being swept; -1 before the first boundary, ``len(clocks)`` when done."""
    start_s: float = 0.0
    """The boundary where the first clock was asked for: the schedule's origin."""
    slice_s: float = 0.0
    """Each clock's share of the schedule (the plan's, or less: see the module doc)."""

    @property
    def frequency_mhz(self) -> int | None:
        clocks = self.plan.clocks_mhz
        return clocks[self.index] if 0 <= self.index < len(clocks) else None


class Sweeps:
    """The sweeps of the jobs on this node, keyed by any job key."""

    def __init__(self) -> None:
        self._sweeps: dict[Hashable, _Sweep] = {}

    def sync(self, plans: Mapping[Hashable, ProfilePlan | None]) -> None:
        """The plans on the node's jobs now; jobs absent or with None end their sweep."""
        for job in [j for j in self._sweeps if plans.get(j) is None]:
            del self._sweeps[job]
        for job, plan in plans.items():
            if plan is None:
                continue
            current = self._sweeps.get(job)
            if current is None or current.plan != plan:
                self._sweeps[job] = _Sweep(plan)

    def on_boundary(self, job: Hashable, now_s: float, wall_s: float | None = None) -> bool:
        """An iteration boundary of ``job`` at ``now_s`` (``wall_s``: the same moment
        in Unix time, for a plan's end); True when its clock steps."""
        sweep = self._sweeps.get(job)
        if sweep is None:
            return False
        n = len(sweep.plan.clocks_mhz)
        if sweep.index < 0:
            sweep.slice_s = sweep.plan.slice_s
            if sweep.plan.until_s is not None and wall_s is not None:
                left_s = sweep.plan.until_s - wall_s
                if left_s <= 0:
                    sweep.index = n  # the window is over: nothing to sweep
                    return False
                sweep.slice_s = min(sweep.slice_s, left_s / n)
            sweep.index, sweep.start_s = 0, now_s
            return True
        if sweep.index < n and now_s - sweep.start_s >= (sweep.index + 1) * sweep.slice_s:
            sweep.index += 1
            return True
        return False

    def frequency_mhz(self, job: Hashable) -> int | None:
        """The clock the sweep holds ``job`` at now; None: follow ``frequency-mhz``."""
        sweep = self._sweeps.get(job)
        return sweep.frequency_mhz if sweep is not None else None

    def active(self, job: Hashable) -> bool:
        """Whether ``job`` has a sweep that has not finished (started or not)."""
        sweep = self._sweeps.get(job)
        return sweep is not None and sweep.index < len(sweep.plan.clocks_mhz)
