"""Budgets over the day: windows with their own budget, recurring daily.

An admin pays more for power at some hours (a peak tariff) or has less of it
(a site-wide cap in the afternoon), so the budget may change with the time of
day. A schedule is the budget outside any window (``default``) plus windows,
each a daily time range ``[start, end)`` on the schedule's clock with a
budget of its own. Shared by the operator (the budget ConfigMap's
``schedule`` and ``timezone`` keys) and the simulator (``powerflow simulate
--budget-schedule FILE``), so both decide the budget in force and the next
change of it the same way.

The format (YAML or JSON; YAML is a superset of JSON), a list of windows::

    - {start: "08:00", end: "20:00", powerLimitWatts: 300000}
    - {start: "22:00", end: "06:00", eta: 1.0}   # wraps midnight

- ``start``, ``end``: ``"HH:MM"`` or ``"HH:MM:SS"``, 00:00 to 23:59:59;
  ``end`` may be ``"24:00"`` (midnight). ``start == end`` is refused (a
  window over the whole day is the plain budget). Quote them in YAML:
  YAML 1.1 reads an unquoted ``20:00`` as the number 1200.
- exactly one of ``eta`` (in [0, 1]) or ``powerLimitWatts`` (>= 0, watts);
  optional ``pMaxWatts`` (> 0), else the default budget's.
- windows must not overlap; any other key is refused.
- at most ``MAX_WINDOWS`` windows and ``MAX_SCHEDULE_BYTES`` of text: the
  ConfigMap is anyone's with edit rights in the operator's namespace, and a
  schedule is checked on the operator's passes; a larger one is refused with
  its size before it is parsed (YAML's aliases cannot blow it up either: the
  list's length is checked before its windows are read).

Times are read on the ``timezone`` clock (an IANA name, default ``UTC``;
``zoneinfo``, so a daylight-saving change moves the edges with the wall
clock). ``t_s`` everywhere is seconds since the Unix epoch. The simulator
has no calendar: it reads simulated time as UTC seconds from 00:00 of day
one, so simulated ``t = 0`` is the trace's day start and ``08:00`` is
``t = 28800`` (``BudgetSchedule.on_sim_clock``).

Every error is a ``BudgetError`` naming the key or the window (by its
1-based position and its times). No clock is read here (the caller passes
``t_s``); the only I/O is ``zoneinfo`` loading a time zone's rules, once
per zone (UTC needs none). Checking ``n`` windows costs ``O(n log n)``
(overlaps are found by sorting); ``next_edge_s`` remembers its last answer,
which holds until that edge (``BudgetSchedule``).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from powerflow.core.errors import BudgetError
from powerflow.core.policy.snapshot import Budget

DAY_S = 86_400
WINDOW_KEYS = ("start", "end", "eta", "powerLimitWatts", "pMaxWatts")
SCHEDULE_KEYS = ("eta", "powerLimitWatts", "pMaxWatts", "timezone", "schedule")
UTC = "UTC"
INTERVAL_KEY = "schedulingIntervalSeconds"

_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
MAX_WINDOWS = 1440
"""Windows a schedule may have: one a minute, more than any tariff has."""
MAX_SCHEDULE_BYTES = 128 << 10
"""Characters of the ``schedule`` text: 1,440 windows of about 60 each, twice over."""


@dataclass(frozen=True)
class BudgetWindow:
    """``budget`` in force each day from ``start_s`` to ``end_s`` (seconds after
    midnight on the schedule's clock); ``end_s < start_s`` wraps midnight."""

    start_s: int
    end_s: int
    budget: Budget

    @property
    def label(self) -> str:
        return f"{clock_text(self.start_s)}-{clock_text(self.end_s)}"

    def contains(self, second_of_day: float) -> bool:
        if self.start_s < self.end_s:
            return self.start_s <= second_of_day < self.end_s
        return second_of_day >= self.start_s or second_of_day < self.end_s


@dataclass(frozen=True)
class BudgetSchedule:
    """The budget outside windows, the windows, and the clock they are read on."""

    default: Budget = field(default_factory=Budget)
    windows: tuple[BudgetWindow, ...] = ()
    timezone: str = UTC

    def window_at(self, t_s: float) -> BudgetWindow | None:
        """The window in force at ``t_s`` (None: the default)."""
        if not self.windows:
            return None
        second = _second_of_day(t_s, self.timezone)
        for window in self.windows:
            if window.contains(second):
                return window
        return None

    def budget_at(self, t_s: float) -> Budget:
        window = self.window_at(t_s)
        return self.default if window is None else window.budget

    def next_edge_s(self, t_s: float) -> float | None:
        """The first instant strictly after ``t_s`` at which the budget may change (a
        window starts or ends); None without windows.

        Edges are wall-clock times of the schedule's clock, as ``window_at`` reads it:
        the candidates are the instants that clock reaches each edge on the local day
        of ``t_s`` and the two after (``_instants``: twice where a daylight-saving
        change turns it back over the edge, with the change itself, which can move it
        into or out of a window; the change where it jumps over the edge)."""
        if not self.windows:
            return None
        tz = _zone(self.timezone)
        day = dt.datetime.fromtimestamp(t_s, tz).date()
        edges = {s for w in self.windows for s in (w.start_s, w.end_s % DAY_S)}
        return min(
            at
            for offset in range(3)
            for second in edges
            for at in _instants(
                dt.datetime.combine(day + dt.timedelta(days=offset), dt.time())
                + dt.timedelta(seconds=second),
                tz,
            )
            if at > t_s
        )

    def on_sim_clock(self) -> BudgetSchedule:
        """The same windows read on the simulator's clock (UTC from 00:00 of day one)."""
        return replace(self, timezone=UTC)

    def describe(self) -> str:
        """The windows in words, for logs and Events."""
        parts = [f"{w.label} {describe_budget(w.budget)}" for w in self.windows]
        return f"{'; '.join(parts)} ({self.timezone})" if parts else "no windows"


def describe_budget(budget: Budget) -> str:
    if budget.limit_w is not None:
        return f"powerLimitWatts {budget.limit_w:g} W"
    if budget.eta is not None:
        return f"eta {budget.eta:g}"
    return "the default (eta 1, no power saving)"


def stops_every_job(budget: Budget) -> bool:
    """A zero budget (``powerLimitWatts`` 0, or ``eta`` 0 without it): valid, nothing runs."""
    return budget.limit_w == 0 or (budget.limit_w is None and budget.eta == 0)


def clock_text(second_of_day: int) -> str:
    h, rest = divmod(second_of_day, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")


# ---------------------------------------------------------------------- parsing


def number(data: Mapping[str, Any], key: str, where: str = "") -> float | None:
    """``data[key]`` as a finite float (a ConfigMap holds strings, a file numbers)."""
    if key not in data:
        return None
    raw = data[key]
    if isinstance(raw, bool):
        raise BudgetError(f"{where}{key}: {raw!r} is not a number")
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise BudgetError(f"{where}{key}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise BudgetError(f"{where}{key}: {raw!r} is not finite")
    return value


def check_budget(budget: Budget, where: str = "") -> None:
    """The ranges ``Budget``'s users rely on (``policy.budget``)."""
    if budget.eta is not None and not 0.0 <= budget.eta <= 1.0:
        raise BudgetError(f"{where}eta {budget.eta:g} outside [0, 1]")
    if budget.limit_w is not None and budget.limit_w < 0:
        raise BudgetError(f"{where}powerLimitWatts {budget.limit_w:g} < 0")
    if budget.p_max_w is not None and budget.p_max_w <= 0:
        raise BudgetError(f"{where}pMaxWatts {budget.p_max_w:g} must be > 0")


def parse_schedule_data(
    data: Mapping[str, Any], *, default: Budget | None = None
) -> BudgetSchedule:
    """A schedule from the budget keys of a mapping (``SCHEDULE_KEYS``; others are the
    caller's to check): the plain ``eta``/``powerLimitWatts``/``pMaxWatts`` are the budget
    outside windows, ``timezone`` the clock, ``schedule`` the windows (a YAML/JSON
    string, as a ConfigMap holds it, or a list). Without ``eta`` and
    ``powerLimitWatts`` the budget outside windows is ``default``; with no ``default``
    either, that is an error (the admin states it)."""
    eta = number(data, "eta")
    limit = number(data, "powerLimitWatts")
    p_max = number(data, "pMaxWatts")
    if eta is None and limit is None:
        if default is None:
            raise BudgetError("set eta or powerLimitWatts")
        base = default if p_max is None else replace(default, p_max_w=p_max)
    else:
        base = Budget(eta=eta, limit_w=limit, p_max_w=p_max)
    check_budget(base)
    timezone = data.get("timezone", UTC)
    if not isinstance(timezone, str):
        raise BudgetError(f"timezone: {timezone!r} is not a name such as 'Europe/Paris'")
    timezone = timezone.strip()
    _zone_checked(timezone)
    windows = parse_windows(data["schedule"], base) if "schedule" in data else ()
    return BudgetSchedule(base, windows, timezone)


def scheduling_interval_s(data: Mapping[str, Any]) -> float | None:
    """The ConfigMap's ``schedulingIntervalSeconds`` (> 0); None when absent."""
    interval = number(data, INTERVAL_KEY)
    if interval is not None and interval <= 0:
        raise BudgetError(f"{INTERVAL_KEY} {interval:g} must be > 0")
    return interval


def schedule_document(doc: Any, default: Budget) -> BudgetSchedule:
    """A schedule file (``powerflow simulate --budget-schedule``): the list of windows,
    as the ConfigMap's ``schedule`` key holds it (``default`` outside them), or the
    ConfigMap's data as a mapping (its plain keys, if any, in place of ``default``;
    its ``schedulingIntervalSeconds`` checked, then left to the caller, whose
    re-evaluation interval is its own)."""
    if isinstance(doc, Mapping):
        known = (*SCHEDULE_KEYS, INTERVAL_KEY)
        unknown = sorted(str(k) for k in set(doc) - set(known))
        if unknown:
            raise BudgetError(f"unknown keys {unknown}; known: {list(known)}")
        scheduling_interval_s(doc)
        return parse_schedule_data(doc, default=default)
    return BudgetSchedule(default, parse_windows(doc, default))


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are): the same
documents, read about ten times faster than the pure-Python one."""


def load_windows(text: str) -> Any:
    """The ``schedule`` key's text as YAML (JSON included), at most ``MAX_SCHEDULE_BYTES``."""
    if len(text) > MAX_SCHEDULE_BYTES:
        raise BudgetError(
            f"schedule: {len(text)} characters, at most {MAX_SCHEDULE_BYTES} "
            f"(at most {MAX_WINDOWS} windows)"
        )
    try:
        return yaml.load(text, Loader=_Loader)  # a safe loader (_Loader)
    except yaml.YAMLError as exc:
        raise BudgetError(f"schedule: not YAML or JSON: {yaml_problem(exc)}") from None
    except (ValueError, RecursionError) as exc:  # a lone surrogate; an int of 5,000 digits
        why = " ".join(str(exc).split())[:120]
        raise BudgetError(f"schedule: not YAML or JSON: {why}") from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line (an Event's message, a CLI's error line): what and
    where, without the excerpt and caret it draws over several lines."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem is not None:
        mark = exc.problem_mark
        where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        return f"{exc.problem}{where}"
    return " ".join(str(exc).split())


def parse_windows(spec: Any, default: Budget) -> tuple[BudgetWindow, ...]:
    """Validated windows from a list (or its YAML/JSON text), in start order."""
    if isinstance(spec, str):
        spec = load_windows(spec)
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise BudgetError(
            f"schedule: a list of windows like {{start: '08:00', end: '20:00', eta: 0.5}}, "
            f"not {type(spec).__name__}"
        )
    if len(spec) > MAX_WINDOWS:
        raise BudgetError(f"schedule: {len(spec)} windows, at most {MAX_WINDOWS}")
    windows = [_window(i, item, default) for i, item in enumerate(spec, 1)]
    _check_overlaps(windows)
    return tuple(sorted(windows, key=lambda w: w.start_s))


def _window(index: int, item: Any, default: Budget) -> BudgetWindow:
    where = f"schedule window {index}: "
    if not isinstance(item, Mapping):
        raise BudgetError(f"{where}a mapping with start, end and eta or powerLimitWatts")
    start = _time(item, "start", where)
    end = _time(item, "end", where)
    where = f"schedule window {index} ({clock_text(start)}-{clock_text(end)}): "
    unknown = sorted(str(k) for k in set(item) - set(WINDOW_KEYS))
    if unknown:
        raise BudgetError(f"{where}unknown keys {unknown}; known: {list(WINDOW_KEYS)}")
    if start == end % DAY_S:
        raise BudgetError(f"{where}start equals end; for the whole day use the plain keys")
    eta = number(item, "eta", where)
    limit = number(item, "powerLimitWatts", where)
    if (eta is None) == (limit is None):
        raise BudgetError(f"{where}set exactly one of eta or powerLimitWatts")
    p_max = number(item, "pMaxWatts", where)
    budget = Budget(eta, limit, default.p_max_w if p_max is None else p_max)
    check_budget(budget, where)
    return BudgetWindow(start, end, budget)


def _time(item: Mapping[str, Any], key: str, where: str) -> int:
    if key not in item:
        raise BudgetError(f"{where}{key} is missing (a time 'HH:MM')")
    raw = item[key]
    if isinstance(raw, int) and not isinstance(raw, bool):
        raise BudgetError(
            f"{where}{key}: {raw} is a number, not a time; quote times in YAML "
            "('20:00'): unquoted, YAML reads 20:00 as the number 1200"
        )
    match = _TIME.match(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise BudgetError(f"{where}{key}: {raw!r} is not a time 'HH:MM' or 'HH:MM:SS'")
    h, m, s = int(match[1]), int(match[2]), int(match[3] or 0)
    seconds = h * 3600 + m * 60 + s
    top = DAY_S if key == "end" else DAY_S - 1
    if m > 59 or s > 59 or seconds > top:
        raise BudgetError(f"{where}{key}: {raw!r} is not a time of day (00:00 to 24:00)")
    return seconds


def _check_overlaps(windows: Sequence[BudgetWindow]) -> None:
    """Refuse the first overlap in time order, naming both windows (``O(n log n)``):
    the spans of the day (a window over midnight is two), sorted by start; two
    overlap if and only if some span starts before the furthest end so far."""
    spans: list[tuple[int, int, int]] = []  # (start, end, window index)
    for i, w in enumerate(windows):
        if w.start_s < w.end_s:
            spans.append((w.start_s, w.end_s, i))
        else:
            spans += [(w.start_s, DAY_S, i), (0, w.end_s, i)]
    spans.sort()
    reach, holder = -1, -1
    for start, end, i in spans:
        if start < reach:
            a, b = sorted((holder, i))
            raise BudgetError(
                f"schedule windows {a + 1} ({windows[a].label}) and {b + 1} "
                f"({windows[b].label}) overlap"
            )
        if end > reach:
            reach, holder = end, i


# ------------------------------------------------------------------------ clock


def _zone(name: str) -> dt.tzinfo:
    """UTC without the time zone database; any other name from ``zoneinfo``."""
    if name == UTC:
        return dt.UTC
    return zoneinfo.ZoneInfo(name)


def _zone_checked(name: str) -> None:
    try:
        _zone(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: Python 3.11's zoneinfo opens a region's folder ('Europe') as a file
        raise BudgetError(
            f"timezone: {name!r} is not a known IANA time zone (such as 'Europe/Paris')"
        ) from None


def _instants(wall: dt.datetime, tz: dt.tzinfo) -> set[float]:
    """The epoch seconds at which the clock of ``tz`` shows ``wall`` (naive) or passes it:
    once; in a fold (the clock turned back over ``wall``) both times and the turn; in a
    gap (the clock jumping over ``wall``) the jump."""
    first = wall.replace(tzinfo=tz, fold=0).timestamp()
    second = wall.replace(tzinfo=tz, fold=1).timestamp()
    if first == second:
        return {first}
    turn = _offset_change(min(first, second), max(first, second), tz)
    return {first, turn, second} if first < second else {turn}


def _offset_change(lo: float, hi: float, tz: dt.tzinfo) -> float:
    """The first whole second in ``(lo, hi]`` with ``hi``'s UTC offset (one change
    between them: a daylight-saving transition), by bisection."""
    after = dt.datetime.fromtimestamp(hi, tz).utcoffset()
    low, high = math.floor(lo), math.ceil(hi)
    while high - low > 1:
        mid = (low + high) // 2
        if dt.datetime.fromtimestamp(mid, tz).utcoffset() == after:
            high = mid
        else:
            low = mid
    return float(high)


def _second_of_day(t_s: float, timezone: str) -> float:
    local = dt.datetime.fromtimestamp(t_s, _zone(timezone))
    return local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
