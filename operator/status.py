"""DLJob status helpers: conditions and the merge patch of what changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from powerflow.operator.bodies import Condition


def set_condition(
    conditions: list[Condition] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[Condition]:
    """The conditions with ``type_`` set; the transition time moves only on a flip.

    Returns ``conditions`` itself when the condition already reads so (the
    common case on every pass, and cheaper than rebuilding it).
    """
    value = "True" if status else "False"
    if not conditions:  # a new job's: the one condition, as the loop below would add it
        return [_condition(type_, value, reason, message, now, generation)]
    current = next((c for c in conditions or [] if c.get("type") == type_), None)
    if (
        conditions is not None
        and current is not None
        and current.get("status") == value
        and current.get("reason") == reason
        and current.get("message") == message
        and current.get("observedGeneration") == generation
    ):
        return conditions
    out: list[Condition] = []
    found = False
    for cond in conditions or []:
        if cond.get("type") != type_:
            out.append(cond)
            continue
        found = True
        since = now if cond.get("status") != value else cond.get("lastTransitionTime", now)
        out.append(_condition(type_, value, reason, message, since, generation))
    if not found:
        out.append(_condition(type_, value, reason, message, now, generation))
    return out


def _condition(
    type_: str, value: str, reason: str, message: str, since: Any, generation: int | None
) -> Condition:
    """One condition as ``set_condition`` writes it (``since``: its transition time)."""
    out: Condition = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) turning ``old`` into ``new``, keys of ``new`` only.

    Keys absent from ``new`` are left alone (a status patch never removes what
    another writer, e.g. a trainer, put there); ``None`` in ``new`` deletes.
    Lists are replaced whole, as merge patches do.
    """
    if not old:  # a new job's status: everything but the deletions (the loop's result)
        return {key: value for key, value in new.items() if value is not None}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        # dict, not Mapping: bodies are JSON dicts, and the ABC check cost more than the rest.
        if isinstance(value, dict) and isinstance(before, dict):
            sub = merge_diff(before, value)
            if sub:
                patch[key] = sub
        elif value is None:
            if key in old:
                patch[key] = None
        elif before != value:
            patch[key] = value
    return patch
