"""Which pod annotation changes lower a job's power, so that a pass writes them first.

A pass changes many jobs at once: one job's clock goes down so that another's
can go up, a cap is set on one job while a new gang starts. The node agents
apply each pod's annotations as they see them, so if the raises went out
first the cluster could pass the budget between two writes of one pass. The
pass therefore writes the changes that only lower power together with the
deletions, before the creations and the changes that may raise power
(``actions.Actions.writes``).

A patch lowers power when each key it changes does:

* ``contract.FREQUENCY_ANNOTATION``: a clock below the pod's current one;
* ``contract.POWER_LIMIT_ANNOTATION``: a cap where there was none, or a lower one;
* ``contract.PROFILE_ANNOTATION``: removed (the sweep ends and the GPU returns
  to its planned clock, never above the top one the sweep reaches).

Anything else, or a value that does not parse, counts as a raise: written
last, it can only be late, never early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from powerflow.core import contract


def cap_annotation(cap_w: float | None) -> str | None:
    """``contract.POWER_LIMIT_ANNOTATION``'s value for a plan's per-GPU cap.

    Rounded down to a tenth of a watt (a cap may only get stricter in
    writing, so the plan's sum stays within the limit) and written the same
    way every time, so an unchanged cap is never rewritten.
    """
    if cap_w is None:
        return None
    if not (math.isfinite(cap_w) and cap_w > 0):
        raise ValueError(f"power cap {cap_w} W must be finite and > 0")
    tenths = math.floor(cap_w * 10 + 1e-9)
    tenths = tenths if tenths > 1 else 1  # ``max(1, tenths)``, without the call
    return f"{tenths // 10}.{tenths % 10}"


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _lowers_one(key: str, old: str | None, new: str | None) -> bool:
    if key == contract.PROFILE_ANNOTATION:
        return new is None
    if key == contract.FREQUENCY_ANNOTATION:
        before, after = _number(old), _number(new)
        return before is not None and after is not None and after < before
    if key == contract.POWER_LIMIT_ANNOTATION:
        before, after = _number(old), _number(new)
        return after is not None and (old is None or (before is not None and after < before))
    return False


def lowers(annotations: Mapping[str, str], patch: Mapping[str, str | None]) -> bool:
    """Whether applying ``patch`` to a pod with ``annotations`` only lowers its power."""
    return bool(patch) and all(
        _lowers_one(key, annotations.get(key), new) for key, new in patch.items()
    )
