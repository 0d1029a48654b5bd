"""Budget schedules: the format, the budget in force at a time, and the next edge."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
import yaml

from powerflow.core.budget_schedule import (
    MAX_SCHEDULE_BYTES,
    MAX_WINDOWS,
    BudgetSchedule,
    clock_text,
    parse_schedule_data,
    parse_windows,
)
from powerflow.core.errors import BudgetError
from powerflow.core.policy.snapshot import Budget

H = 3600.0
PEAK_AND_NIGHT = """
- {start: "08:00", end: "20:00", powerLimitWatts: 300000}
- {start: "22:00", end: "06:00", eta: 1.0, pMaxWatts: 250}
"""


def peak_and_night(**extra: str) -> BudgetSchedule:
    return parse_schedule_data(
        {"eta": "0.6", "pMaxWatts": "300", "schedule": PEAK_AND_NIGHT, **extra}
    )


def test_a_configmap_schedule_parses_into_sorted_windows_with_inherited_p_max() -> None:
    schedule = parse_schedule_data(
        {
            "eta": "0.6",
            "pMaxWatts": "300",
            # JSON too (YAML's subset), out of order
            "schedule": '[{"start": "22:00", "end": "06:00", "eta": 1},'
            ' {"start": "8:00", "end": "20:00:30", "powerLimitWatts": "300000"}]',
        }
    )
    assert schedule.default == Budget(eta=0.6, p_max_w=300.0)
    assert schedule.timezone == "UTC"
    first, second = schedule.windows
    assert (first.start_s, first.end_s) == (8 * 3600, 20 * 3600 + 30)
    assert first.budget == Budget(limit_w=300000.0, p_max_w=300.0)
    assert first.label == "08:00-20:00:30"
    assert (second.start_s, second.end_s) == (22 * 3600, 6 * 3600)
    assert second.budget == Budget(eta=1.0, p_max_w=300.0)


def test_a_window_ending_at_midnight_and_one_starting_there_do_not_overlap() -> None:
    spec = [
        {"start": "18:00", "end": "24:00", "eta": 0.5},
        {"start": "00:00", "end": "06:00", "eta": 0.7},
    ]
    early, late = parse_windows(spec, Budget(eta=0.9))
    schedule = BudgetSchedule(Budget(eta=0.9), (early, late))
    assert schedule.budget_at(24 * H - 1) == Budget(eta=0.5)
    assert schedule.budget_at(24 * H) == Budget(eta=0.7)
    assert schedule.next_edge_s(20 * H) == 24 * H


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"schedule": PEAK_AND_NIGHT}, "set eta or powerLimitWatts"),
        (
            {
                "eta": "0.5",
                "schedule": "[{start: '08:00', end: '20:00', eta: 0.3},"
                " {start: '19:00', end: '21:00', eta: 0.4}]",
            },
            "schedule windows 1 (08:00-20:00) and 2 (19:00-21:00) overlap",
        ),
        (
            {
                "eta": "0.5",
                "schedule": "[{start: '22:00', end: '06:00', eta: 0.3},"
                " {start: '05:00', end: '07:00', eta: 0.4}]",
            },
            "schedule windows 1 (22:00-06:00) and 2 (05:00-07:00) overlap",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '25:00', end: '06:00', eta: 0.3}]"},
            "schedule window 1: start: '25:00' is not a time of day",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:61', end: '09:00', eta: 0.3}]"},
            "schedule window 1: start: '08:61' is not a time of day",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: 'noon', end: '09:00', eta: 0.3}]"},
            "schedule window 1: start: 'noon' is not a time 'HH:MM' or 'HH:MM:SS'",
        ),
        (  # unquoted in YAML: 20:00 is the sexagesimal number 1200
            {"eta": "0.5", "schedule": "[{start: '08:00', end: 20:00, eta: 0.3}]"},
            "schedule window 1: end: 1200 is a number, not a time; quote times",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', eta: 0.3}]"},
            "schedule window 1: end is missing",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '20:00', etaa: 0.3}]"},
            "schedule window 1 (08:00-20:00): unknown keys ['etaa']",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '20:00'}]"},
            "schedule window 1 (08:00-20:00): set exactly one of eta or powerLimitWatts",
        ),
        (
            {
                "eta": "0.5",
                "schedule": "[{start: '08:00', end: '20:00', eta: 0.3, powerLimitWatts: 100}]",
            },
            "schedule window 1 (08:00-20:00): set exactly one of eta or powerLimitWatts",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '08:00', eta: 0.3}]"},
            "schedule window 1 (08:00-08:00): start equals end",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '20:00', eta: 1.5}]"},
            "schedule window 1 (08:00-20:00): eta 1.5 outside [0, 1]",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '20:00', eta: 'half'}]"},
            "schedule window 1 (08:00-20:00): eta: 'half' is not a number",
        ),
        (
            {"eta": "0.5", "schedule": "[{start: '08:00', end: '20:00', powerLimitWatts: -5}]"},
            "schedule window 1 (08:00-20:00): powerLimitWatts -5 < 0",
        ),
        ({"eta": "0.5", "schedule": "start: '08:00'"}, "schedule: a list of windows"),
        (  # one line, for the Event: where and what, not PyYAML's drawing of it
            {"eta": "0.5", "schedule": "[8, 9"},
            "schedule: not YAML or JSON: did not find expected ',' or ']' (line 2, column 1)",
        ),
        ({"eta": "0.5", "schedule": "[8]"}, "schedule window 1: a mapping"),
        ({"eta": "0.5", "timezone": "Mars/Olympus"}, "timezone: 'Mars/Olympus' is not a known"),
        # a region of the database, a folder there (zoneinfo raises IsADirectoryError)
        ({"eta": "0.5", "timezone": "Europe"}, "timezone: 'Europe' is not a known"),
        ({"eta": "2"}, "eta 2 outside [0, 1]"),
    ],
)
def test_bad_schedules_are_refused_naming_the_window(data: dict[str, Any], words: str) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_schedule_data(data)
    assert words in str(caught.value)


def window_text(count: int, step_s: int = 1) -> str:
    """``count`` windows of ``step_s`` seconds from midnight, one after the other."""
    return json.dumps(
        [
            {"start": clock_text(i * step_s), "end": clock_text((i + 1) * step_s), "eta": 0.5}
            for i in range(count)
        ]
    )


def test_a_schedule_over_the_size_bounds_is_refused_before_it_is_read() -> None:
    """10,000 one-second windows (about 630 KB, under the ConfigMap limit), and an aliased
    list that expands without bound, are refused by their size, in milliseconds, saying
    the bounds. CPU time, not wall time: a loaded machine must not fail it."""
    huge = window_text(10_000)
    assert len(huge) > MAX_SCHEDULE_BYTES
    started = time.process_time()
    with pytest.raises(BudgetError, match=f"at most {MAX_SCHEDULE_BYTES}"):
        parse_schedule_data({"eta": "1", "schedule": huge})
    aliases = "a: &w {start: '08:00', end: '09:00', eta: 0.5}\nb: [" + "*w, " * 5000 + "*w]"
    with pytest.raises(BudgetError, match=f"at most {MAX_WINDOWS}"):
        parse_windows(yaml.safe_load(aliases)["b"], Budget())
    assert time.process_time() - started < 1.0
    # At the bound: accepted, and checked in O(n log n) (a second is ample here).
    started = time.process_time()
    schedule = parse_schedule_data({"eta": "1", "schedule": window_text(MAX_WINDOWS, 60)})
    assert len(schedule.windows) == MAX_WINDOWS
    assert time.process_time() - started < 1.0


def test_overlaps_are_found_among_many_windows_and_named() -> None:
    """Sorting finds an overlap anywhere, also over midnight, naming both windows."""
    windows = [{"start": clock_text(i * 60), "end": clock_text(i * 60 + 60), "eta": 1}
               for i in range(1000)]  # fmt: skip
    windows.insert(500, {"start": "23:59:30", "end": "00:00:10", "eta": 1})  # over midnight
    with pytest.raises(BudgetError, match=r"windows 1 \(00:00-00:01\) and 501 "):
        parse_windows(windows, Budget())
    ok = [w for i, w in enumerate(windows) if i != 0]
    ok[499] = {"start": "23:59:30", "end": "24:00", "eta": 1}
    assert len(parse_windows(ok, Budget())) == 1000


def test_the_budget_in_force_and_the_next_edge_around_the_day() -> None:
    schedule = peak_and_night()
    plain = Budget(eta=0.6, p_max_w=300.0)
    peak = Budget(limit_w=300000.0, p_max_w=300.0)
    night = Budget(eta=1.0, p_max_w=250.0)
    day = 5 * 24 * H  # any day: the windows recur
    expected = [
        (0.0, night, 6 * H),  # midnight, inside the wrapping window
        (6 * H - 1, night, 6 * H),
        (6 * H, plain, 8 * H),  # an end is exclusive
        (8 * H, peak, 20 * H),  # a start inclusive
        (19.5 * H, peak, 20 * H),
        (20 * H, plain, 22 * H),
        (23 * H, night, 30 * H),  # the next edge is on the next day
    ]
    for at, budget, edge in expected:
        assert schedule.budget_at(day + at) == budget, at
        assert schedule.next_edge_s(day + at) == day + edge, at


def test_without_windows_the_default_is_always_in_force_and_nothing_changes() -> None:
    schedule = parse_schedule_data({"powerLimitWatts": "5000"})
    assert schedule.budget_at(12345.0) == Budget(limit_w=5000.0)
    assert schedule.window_at(12345.0) is None
    assert schedule.next_edge_s(12345.0) is None


def test_a_timezone_moves_the_edges_with_the_wall_clock_and_daylight_saving() -> None:
    schedule = peak_and_night(timezone="Europe/Paris")
    summer = dt.datetime(2026, 7, 1, tzinfo=dt.UTC).timestamp()  # CEST, UTC+2
    winter = dt.datetime(2026, 1, 15, tzinfo=dt.UTC).timestamp()  # CET, UTC+1
    assert schedule.next_edge_s(summer + 5 * H) == summer + 6 * H  # 08:00 in Paris
    assert schedule.budget_at(summer + 6 * H).limit_w == 300000.0
    assert schedule.budget_at(summer + 6 * H - 1).eta == 0.6
    assert schedule.next_edge_s(winter + 5 * H) == winter + 7 * H
    assert schedule.budget_at(winter + 6.5 * H).eta == 0.6
    # the sim clock reads the same windows in UTC from 00:00 of day one
    assert schedule.on_sim_clock().next_edge_s(5 * H) == 6 * H


def test_describe_names_each_window_and_the_clock() -> None:
    text = peak_and_night(timezone="Europe/Paris").describe()
    assert text == ("08:00-20:00 powerLimitWatts 300000 W; 22:00-06:00 eta 1 (Europe/Paris)")


@pytest.mark.parametrize(
    ("window", "day"),
    [
        ("{start: '02:15', end: '02:45', eta: 0.2}", "2026-10-25"),  # 02:xx happens twice
        ("{start: '01:30', end: '02:30', eta: 0.2}", "2026-10-25"),
        ("{start: '02:15', end: '05:00', eta: 0.2}", "2026-03-29"),  # 02:xx never happens
        ("{start: '22:00', end: '02:30', eta: 0.2}", "2026-03-29"),
    ],
)
def test_every_change_of_the_budget_is_an_edge_across_daylight_saving(
    window: str, day: str
) -> None:
    """In Paris the clock goes back from 03:00 to 02:00 on 2026-10-25 and forward from
    02:00 to 03:00 on 2026-03-29. The budget follows the wall clock (``budget_at``), so
    each instant it changes must be an edge: a pass comes then, not up to an interval
    later."""
    schedule = parse_schedule_data(
        {"eta": "0.6", "timezone": "Europe/Paris", "schedule": f"[{window}]"}
    )
    start = dt.datetime.fromisoformat(f"{day}T00:00:00+00:00").timestamp() - 3 * H
    changes = [
        t
        for t in range(int(start) + 60, int(start + 9 * H), 60)
        if schedule.budget_at(t) != schedule.budget_at(t - 60)
    ]
    edges, t = [], start
    while t < start + 9 * H:
        t = schedule.next_edge_s(t)
        edges.append(t)
    assert changes and set(changes) <= set(edges), (changes, edges)
