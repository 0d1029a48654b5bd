"""The budget ConfigMap -> the core's ``Budget`` and the scheduling interval.

An invalid ConfigMap raises ``ResourceError``; the caller keeps the last good
budget (a typo must never stop scheduling). A missing ConfigMap means the
default budget: no power saving (``eta`` 1.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from powerflow.errors import ResourceError
from powerflow.policy.snapshot import Budget

KEYS = ("eta", "powerLimitWatts", "pMaxWatts", "schedulingIntervalSeconds")
DEFAULT_INTERVAL_S = 60.0


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
