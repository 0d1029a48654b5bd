"""Budget schedules: the format, the budget in force at a time, and the next edge."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from powerflow.errors import BudgetError
from powerflow.policy.budget_schedule import (
    BudgetSchedule,
    parse_schedule_data,
    parse_windows,
)
from powerflow.policy.snapshot import Budget

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
    assert schedule.default == Budget(eta=0.6, p_max_watts=300.0)
    assert schedule.timezone == "UTC"
    first, second = schedule.windows
    assert (first.start_s, first.end_s) == (8 * 3600, 20 * 3600 + 30)
    assert first.budget == Budget(limit_watts=300000.0, p_max_watts=300.0)
    assert first.label == "08:00-20:00:30"
    assert (second.start_s, second.end_s) == (22 * 3600, 6 * 3600)
    assert second.budget == Budget(eta=1.0, p_max_watts=300.0)


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
        ({"eta": "0.5", "schedule": "[8, 9"}, "schedule: not YAML or JSON"),
        ({"eta": "0.5", "schedule": "[8]"}, "schedule window 1: a mapping"),
        ({"eta": "0.5", "timezone": "Mars/Olympus"}, "timezone: 'Mars/Olympus' is not a known"),
        ({"eta": "2"}, "eta 2 outside [0, 1]"),
    ],
)
def test_bad_schedules_are_refused_naming_the_window(data: dict[str, Any], words: str) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_schedule_data(data)
    assert words in str(caught.value)


def test_the_budget_in_force_and_the_next_edge_around_the_day() -> None:
    schedule = peak_and_night()
    plain = Budget(eta=0.6, p_max_watts=300.0)
    peak = Budget(limit_watts=300000.0, p_max_watts=300.0)
    night = Budget(eta=1.0, p_max_watts=250.0)
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
    assert schedule.budget_at(12345.0) == Budget(limit_watts=5000.0)
    assert schedule.window_at(12345.0) is None
    assert schedule.next_edge_s(12345.0) is None


def test_a_timezone_moves_the_edges_with_the_wall_clock_and_daylight_saving() -> None:
    schedule = peak_and_night(timezone="Europe/Paris")
    summer = dt.datetime(2026, 7, 1, tzinfo=dt.UTC).timestamp()  # CEST, UTC+2
    winter = dt.datetime(2026, 1, 15, tzinfo=dt.UTC).timestamp()  # CET, UTC+1
    assert schedule.next_edge_s(summer + 5 * H) == summer + 6 * H  # 08:00 in Paris
    assert schedule.budget_at(summer + 6 * H).limit_watts == 300000.0
    assert schedule.budget_at(summer + 6 * H - 1).eta == 0.6
    assert schedule.next_edge_s(winter + 5 * H) == winter + 7 * H
    assert schedule.budget_at(winter + 6.5 * H).eta == 0.6
    # the sim clock reads the same windows in UTC from 00:00 of day one
    assert schedule.on_sim_clock().next_edge_s(5 * H) == 6 * H


def test_describe_names_each_window_and_the_clock() -> None:
    text = peak_and_night(timezone="Europe/Paris").describe()
    assert text == ("08:00-20:00 powerLimitWatts 300000 W; 22:00-06:00 eta 1 (Europe/Paris)")
