"""The budget ConfigMap -> the core's ``Budget`` and the scheduling interval.

An invalid ConfigMap raises ``ResourceError``; the caller keeps the budget in
force (a typo must never stop scheduling or lift the cap). A missing
ConfigMap means the default budget: no power saving (``eta`` 1.0). Deleting
it is an explicit act (``kubectl delete``) and the way to lift a cap; an
operator started without it must decide the same, so nothing else is kept.

The budget in force survives restarts in a second ConfigMap,
``powerflow-budget-in-force`` in the budget's namespace, written only by the
operator whenever the budget in force changes: the validated ``data`` (empty
for the default), the ``resourceVersion`` it came from and when. An operator
that starts while the admin's ConfigMap is invalid starts from it instead of
the default (otherwise a restart during a typo lifts a 300 W cap to the whole
cluster). It is read only then: a budget put in force since, even one whose
record could not be written (a 5xx, a missing RBAC rule), is newer and stays;
the write is retried on every pass. A second object rather than an annotation on the admin's
ConfigMap: that one is the admin's (``kubectl apply`` and GitOps tools own
it and would fight the operator's writes, and its deletion would take the
record with it), while this one has a single writer.

``budget_warnings`` lists what a valid budget does that may surprise: a zero budget
stops every job, and with both ``eta`` and ``powerLimitWatts`` the absolute
limit wins (``Budget``'s precedence); each becomes a Warning Event.

A schedule (keys ``schedule`` and ``timezone``, format in
``powerflow.core.budget_schedule``) gives time windows budgets of their own;
the plain keys are the budget outside them. ``BudgetConfig.at(now)`` is the
plain budget in force, the one a pass plans against, and ``next_edge_s`` the
next window start or end, at which the controller runs a pass. The record of
the budget in force holds the whole data, schedule included: an operator that
starts while the ConfigMap is invalid reads the window in force off its own
clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerflow.core.budget_schedule import (
    BudgetSchedule,
    BudgetWindow,
    describe_budget,
    parse_schedule_data,
    scheduling_interval_s,
    stops_every_job,
)
from powerflow.core.errors import BudgetError, ResourceError
from powerflow.core.policy.snapshot import Budget

KEYS = (
    "eta",
    "powerLimitWatts",
    "pMaxWatts",
    "schedulingIntervalSeconds",
    "schedule",
    "timezone",
)
DEFAULT_INTERVAL_S = 60.0
IN_FORCE_CONFIGMAP = "powerflow-budget-in-force"
SOURCE_VERSION_ANNOTATION = "powerflow.io/source-resource-version"
RECORDED_AT_ANNOTATION = "powerflow.io/recorded-at"


@dataclass(frozen=True)
class BudgetConfig:
    """The ConfigMap's budget: ``budget`` outside any window of ``schedule`` (None: no
    windows), and the scheduling interval."""

    budget: Budget
    interval_s: float = DEFAULT_INTERVAL_S
    schedule: BudgetSchedule | None = None

    def window_at(self, now_s: float) -> BudgetWindow | None:
        return None if self.schedule is None else self.schedule.window_at(now_s)

    def at(self, now_s: float) -> BudgetConfig:
        """The plain budget in force at ``now_s`` (what ``reconcile`` plans against)."""
        if self.schedule is None:
            return self
        return BudgetConfig(self.schedule.budget_at(now_s), self.interval_s)

    def next_edge_s(self, now_s: float) -> float | None:
        """The next window start or end after ``now_s`` (None: no windows)."""
        return None if self.schedule is None else self.schedule.next_edge_s(now_s)


DEFAULT = BudgetConfig(Budget())


def parse_budget(data: dict[str, str] | None) -> BudgetConfig:
    """Validate the ConfigMap's ``data``; ``ResourceError("InvalidBudget", ...)`` if bad."""
    data = dict(data or {})
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ResourceError("InvalidBudget", f"unknown keys {unknown}; known: {list(KEYS)}")
    try:
        schedule = parse_schedule_data(data)
        interval = scheduling_interval_s(data)
    except BudgetError as exc:
        raise ResourceError("InvalidBudget", str(exc)) from None
    return BudgetConfig(
        schedule.default,
        DEFAULT_INTERVAL_S if interval is None else interval,
        schedule if "schedule" in data or "timezone" in data else None,
    )


def budget_warnings(config: BudgetConfig) -> list[tuple[str, str]]:
    """(reason, message) for each surprising choice of a valid budget (and window)."""
    out = _warnings(config.budget, "")
    for window in config.schedule.windows if config.schedule is not None else ():
        out += _warnings(window.budget, f"schedule window {window.label}: ")
    return out


def _warnings(budget: Budget, where: str) -> list[tuple[str, str]]:
    out = []
    if budget.limit_w is not None and budget.eta is not None:
        out.append(
            (
                "BudgetKeysConflict",
                f"{where}both eta and powerLimitWatts are set: powerLimitWatts "
                f"({budget.limit_w:g} W) is in force, eta ({budget.eta:g}) is ignored",
            )
        )
    if stops_every_job(budget):
        key = "powerLimitWatts" if budget.limit_w == 0 else "eta"
        out.append(
            ("BudgetStopsAllJobs", f"{where}{key} is 0: every job is stopped until it is raised")
        )
    return out


def describe(config: BudgetConfig) -> str:
    """The budget in words, for logs and Events."""
    text = f"{describe_budget(config.budget)}, every {config.interval_s:g} s"
    if config.schedule is not None and config.schedule.windows:
        text += f"; windows {config.schedule.describe()}"
    return text


def describe_in_force(config: BudgetConfig, now_s: float) -> str:
    """Which of the schedule's budgets is in force at ``now_s``, for the edge's Event."""
    window = config.window_at(now_s)
    edge = config.next_edge_s(now_s)
    schedule = config.schedule
    tz = schedule.timezone if schedule is not None else "UTC"
    where = f"window {window.label} ({tz})" if window is not None else "outside the windows"
    budget = config.at(now_s).budget
    return f"{where}: {describe_budget(budget)} in force" + (
        "" if edge is None else f" until the next edge in {edge - now_s:.0f} s"
    )
