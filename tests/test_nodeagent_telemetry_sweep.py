"""Profiling sweeps: clocks step only at iteration boundaries, each slice tagged.

On the simulated node, the sweep's clocks are locked by the test's control
loop stand-in (``SimNode.apply_clocks``, called through ``on_clock_change``),
and the samples of each slice are checked against the ground truth at that
slice's clock.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nodeagent_telemetry_cases import SimNode, truth_per_gpu, worker
from powerflow.nodeagent.pods import ProfilePlan
from powerflow.nodeagent.sweep import Sweeps

PLAN = {"clocksMhz": [900, 1200, 1410], "sliceSeconds": 6.0}


def test_a_sweep_steps_at_boundaries_and_tags_each_slice() -> None:
    node = SimNode(window_s=5.0, seed=21)
    view = worker("gpt", 0, n=2, per_node=2, frequency=1005, profile=PLAN)
    node.place(view, 0)
    node.place(worker("gpt", 1, n=2, per_node=2, frequency=1005, profile=PLAN), 1)
    assert node.telemetry.clock_for(view.key) is None  # nothing before the first boundary
    seen: list[tuple[float, int | None]] = []
    steps: list[float] = []
    end = node.now_s + 25.0
    while node.now_s < end:
        before = node.telemetry.clock_for(view.key)
        reports = node.run(0.01)
        after = node.telemetry.clock_for(view.key)
        if after != before:
            # a step happens in a report of the lead worker, never between reports
            assert (node.now_s, view.key) in reports
            steps.append(node.now_s)
        seen.append((node.now_s, after))
    clocks = [c for _, c in seen]
    assert [c for i, c in enumerate(clocks) if i == 0 or c != clocks[i - 1]] == [
        900,
        1200,
        1410,
        None,
    ]
    # clock k from the first boundary at or after 6 k s into the sweep
    step_s, _ = truth_per_gpu(view, 900)
    for k, at in enumerate(steps):
        assert 6.0 * k <= at - steps[0] <= 6.0 * k + 2 * step_s
    assert node.locked == {0: 1005, 1: 1005}  # back to frequency-mhz after the sweep
    by_clock: dict[int, list[float]] = {}
    for s in node.samples():
        by_clock.setdefault(s.frequency_mhz, []).append(s.energy_j)
    assert set(by_clock) == {900, 1200, 1410, 1005}
    for clock, energies in by_clock.items():
        _, energy_j = truth_per_gpu(view, clock)
        for e in energies:
            assert abs(e - 2 * energy_j) <= 0.05 * 2 * energy_j, (clock, e, 2 * energy_j)
    # a 6 s slice: one 5 s window, then one cut short by the step
    assert len(by_clock[900]) == len(by_clock[1200]) == len(by_clock[1410]) == 2


def test_a_changed_plan_restarts_and_a_removed_plan_ends_at_once() -> None:
    node = SimNode(seed=22)
    view = worker("gpt", 0, n=1, per_node=1, profile=PLAN)
    node.place(view, 0)
    node.run(7.0)
    assert node.telemetry.clock_for(view.key) == 1200
    new_plan = {"clocksMhz": [600, 700], "sliceSeconds": 2.0}
    node.update(worker("gpt", 0, n=1, per_node=1, profile=new_plan))
    assert node.telemetry.clock_for(view.key) is None  # restarts at the next boundary
    node.run(0.5)
    assert node.telemetry.clock_for(view.key) == 600
    # the same plan again (a watch replay) changes nothing
    node.update(worker("gpt", 0, n=1, per_node=1, profile=new_plan))
    assert node.telemetry.clock_for(view.key) == 600
    node.update(worker("gpt", 0, n=1, per_node=1))
    assert node.telemetry.clock_for(view.key) is None
    assert node.locked[0] == 1200  # the pod's frequency-mhz, applied on the sync


def test_a_finished_sweep_is_not_rerun_by_a_replayed_annotation() -> None:
    node = SimNode(seed=23)
    plan = {"clocksMhz": [900], "sliceSeconds": 1.0}
    view = worker("gpt", 0, n=1, per_node=1, profile=plan)
    node.place(view, 0)
    node.run(3.0)
    assert node.telemetry.clock_for(view.key) is None
    node.update(worker("gpt", 0, n=1, per_node=1, profile=plan))
    node.run(3.0)
    assert node.telemetry.clock_for(view.key) is None
    assert {s.frequency_mhz for s in node.samples()} <= {900, 1200}


@settings(max_examples=200, deadline=None)
@given(
    clocks=st.lists(st.integers(100, 2000), min_size=1, max_size=5),
    slice_s=st.floats(0.1, 10.0),
    gaps=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=60),
)
def test_sweeps_visit_every_clock_in_order_on_the_plans_schedule(
    clocks: list[int], slice_s: float, gaps: list[float]
) -> None:
    """Clock k from the first boundary after the previous step at or after
    ``start + k * slice_s``: one step per boundary at most, never early."""
    sweeps = Sweeps()
    sweeps.sync({"job": ProfilePlan(tuple(clocks), slice_s)})
    now, held, boundaries = 0.0, [], []
    for gap in gaps:
        now += gap
        boundaries.append(now)
        if sweeps.on_boundary("job", now):
            held.append((len(boundaries) - 1, sweeps.frequency_mhz("job")))
    visited = [c for _, c in held]
    assert visited == ([*clocks, None])[: len(visited)]
    for k in range(1, min(len(held), len(clocks)) + 1):
        start, previous = boundaries[held[0][0]], held[k - 1][0]
        due = [
            i for i in range(previous + 1, len(boundaries)) if boundaries[i] - start >= k * slice_s
        ]
        step = [i for i, _ in held[k : k + 1]]
        assert step == due[:1]  # the first boundary it was due at, and not before
    assert sweeps.active("job") == (len(visited) <= len(clocks))


def test_a_step_applied_late_mislabels_no_sample() -> None:
    """The control loop applies a step within a second, not inside the report:
    the window that straddles the late change is dropped, never sent tagged
    with the wrong clock."""
    node = SimNode(window_s=1.0, seed=24)
    view = worker("gpt", 0, n=1, per_node=1, frequency=1005, profile=PLAN)
    node.place(view, 0)
    asked: list[float] = []
    node.telemetry.on_clock_change = lambda: asked.append(node.now_s)
    pending_since: float | None = None
    end = node.now_s + 24.0
    while node.now_s < end:
        node.run(0.05)
        if asked and pending_since is None:
            pending_since = asked.pop()
        if pending_since is not None and node.now_s - pending_since >= 0.5:
            node.apply_clocks()  # half a second after the step was asked for
            pending_since = None
    by_clock: dict[int, list[float]] = {}
    for s in node.samples():
        by_clock.setdefault(s.frequency_mhz, []).append(s.energy_j)
    assert set(by_clock) == {900, 1200, 1410, 1005}
    for clock, energies in by_clock.items():
        _, energy_j = truth_per_gpu(view, clock)
        assert all(abs(e - energy_j) <= 0.05 * energy_j for e in energies), (clock, energies)


def test_late_boundaries_do_not_push_the_sweep_past_the_operators_window() -> None:
    """The operator removes the plan ``len(clocks) * slice_s`` after writing it
    (``operator.profile_plan``). Steps happen at boundaries, so each comes a little
    late; timed on a schedule from the sweep's start (clock k from the first boundary
    at or after ``start + k * slice_s``), a late step shortens the next slice instead
    of delaying every later one, and the top clocks are not cut off."""
    clocks = tuple(range(210, 1411, 60))  # the A100 profile: 21 clocks
    sweeps = Sweeps()
    sweeps.sync({"job": ProfilePlan(clocks, 1.0)})
    steps: list[tuple[float, int | None]] = []
    now = 0.0
    while sweeps.active("job"):
        if sweeps.on_boundary("job", now):
            steps.append((now, sweeps.frequency_mhz("job")))
        now = round(now + 0.3, 6)  # a boundary every 0.3 s: each step up to 0.3 s late
    assert [c for _, c in steps] == [*clocks, None]
    assert steps[-1][0] < len(clocks) * 1.0 + 0.3  # was 25.2 s, timed slice by slice


def test_a_late_first_iteration_fits_every_clock_before_the_window_ends() -> None:
    """The operator's window starts when the workers run; the first iteration comes
    after the framework's start-up. With the window's end in the plan the agent
    shrinks the slices to the time left, so the top clocks are still measured."""
    clocks = tuple(range(210, 1411, 60))  # 21 clocks, 1 s each: a 21 s window
    until_wall = 1.8e9 + 21.0
    sweeps = Sweeps()
    sweeps.sync({"job": ProfilePlan(clocks, 1.0, until_wall)})
    steps: list[tuple[float, int | None]] = []
    now = 12.0  # the first iteration, 12 s into the window (monotonic = wall - 1.8e9)
    while sweeps.active("job"):
        if sweeps.on_boundary("job", now, wall_s=1.8e9 + now):
            steps.append((now, sweeps.frequency_mhz("job")))
        now = round(now + 0.05, 6)
    assert [c for _, c in steps] == [*clocks, None]
    assert steps[-1][0] <= 21.0 + 0.05  # every clock measured before the plan goes


def test_no_time_left_means_no_sweep() -> None:
    sweeps = Sweeps()
    sweeps.sync({"job": ProfilePlan((900, 1410), 5.0, 1.8e9)})
    assert not sweeps.on_boundary("job", 50.0, wall_s=1.8e9 + 1.0)
    assert sweeps.frequency_mhz("job") is None and not sweeps.active("job")
