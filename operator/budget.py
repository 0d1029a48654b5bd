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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from powerflow.errors import ResourceError
from powerflow.policy.snapshot import Budget

KEYS = ("eta", "powerLimitWatts", "pMaxWatts", "schedulingIntervalSeconds")
DEFAULT_INTERVAL_S = 60.0
IN_FORCE_CONFIGMAP = "powerflow-budget-in-force"
SOURCE_VERSION_ANNOTATION = "powerflow.io/source-resource-version"
RECORDED_AT_ANNOTATION = "powerflow.io/recorded-at"


@dataclass(frozen=True)
class BudgetConfig:
    budget: Budget
    interval_s: float = DEFAULT_INTERVAL_S


DEFAULT = BudgetConfig(Budget())


def _number(data: dict[str, str], key: str) -> float | None:
    if key not in data:
        return None
    try:
        value = float(str(data[key]).strip())
    except ValueError:
        raise ResourceError("InvalidBudget", f"{key}: {data[key]!r} is not a number") from None
    if not math.isfinite(value):
        raise ResourceError("InvalidBudget", f"{key}: {data[key]!r} is not finite")
    return value


def parse_budget(data: dict[str, str] | None) -> BudgetConfig:
    """Validate the ConfigMap's ``data``; ``ResourceError("InvalidBudget", ...)`` if bad."""
    data = dict(data or {})
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ResourceError("InvalidBudget", f"unknown keys {unknown}; known: {list(KEYS)}")
    eta = _number(data, "eta")
    limit = _number(data, "powerLimitWatts")
    p_max = _number(data, "pMaxWatts")
    interval = _number(data, "schedulingIntervalSeconds")
    if eta is None and limit is None:
        raise ResourceError("InvalidBudget", "set eta or powerLimitWatts")
    if eta is not None and not 0.0 <= eta <= 1.0:
        raise ResourceError("InvalidBudget", f"eta {eta} outside [0, 1]")
    if limit is not None and limit < 0:
        raise ResourceError("InvalidBudget", f"powerLimitWatts {limit} < 0")
    if p_max is not None and p_max <= 0:
        raise ResourceError("InvalidBudget", f"pMaxWatts {p_max} must be > 0")
    if interval is not None and interval <= 0:
        raise ResourceError("InvalidBudget", f"schedulingIntervalSeconds {interval} must be > 0")
    return BudgetConfig(
        Budget(eta=eta, limit_watts=limit, p_max_watts=p_max),
        DEFAULT_INTERVAL_S if interval is None else interval,
    )


def budget_warnings(config: BudgetConfig) -> list[tuple[str, str]]:
    """(reason, message) for each surprising choice of a valid budget."""
    out = []
    budget = config.budget
    if budget.limit_watts is not None and budget.eta is not None:
        out.append(
            (
                "BudgetKeysConflict",
                f"both eta and powerLimitWatts are set: powerLimitWatts "
                f"({budget.limit_watts:g} W) is in force, eta ({budget.eta:g}) is ignored",
            )
        )
    if budget.limit_watts == 0 or (budget.limit_watts is None and budget.eta == 0):
        key = "powerLimitWatts" if budget.limit_watts == 0 else "eta"
        out.append(("BudgetStopsAllJobs", f"{key} is 0: every job is stopped until it is raised"))
    return out


def describe(config: BudgetConfig) -> str:
    """The budget in words, for logs and Events."""
    budget = config.budget
    if budget.limit_watts is not None:
        what = f"powerLimitWatts {budget.limit_watts:g} W"
    elif budget.eta is not None:
        what = f"eta {budget.eta:g}"
    else:
        what = "the default (eta 1, no power saving)"
    return f"{what}, every {config.interval_s:g} s"
