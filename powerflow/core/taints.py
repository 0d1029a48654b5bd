"""Node taints against pod tolerations, matched as the Kubernetes API defines it.

Shared by the operator (which nodes to plan on) and the scheduler extender
(which nodes a pod may get a block on); plain dicts in, no client library, so
the core's contracts hold. Only the effects that keep a pod off a node count
(``NoSchedule``, ``NoExecute``); ``PreferNoSchedule`` is a preference that
kube-scheduler's own scoring weighs. Mistyped fields read as empty strings, so
a malformed object gives an answer, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep pods without a matching toleration off the node."""


def _text(entry: Any, key: str) -> str:
    value = entry.get(key) if isinstance(entry, dict) else None
    return value if isinstance(value, str) else ""


def tolerates(toleration: Any, taint: Any) -> bool:
    """``v1.Toleration.ToleratesTaint``: effect, key, then the operator.

    An empty effect matches every effect; an empty key (with ``Exists``)
    matches every key; ``Equal`` (also an empty operator) compares values;
    any other operator matches nothing.
    """
    effect = _text(toleration, "effect")
    if effect and effect != _text(taint, "effect"):
        return False
    key = _text(toleration, "key")
    if key and key != _text(taint, "key"):
        return False
    operator = _text(toleration, "operator")
    if operator in ("", "Equal"):
        return _text(toleration, "value") == _text(taint, "value")
    return operator == "Exists"


def hard_taints(node: Any) -> tuple[dict[str, Any], ...]:
    """The node's ``spec.taints`` that keep pods off it (``NoSchedule``/``NoExecute``)."""
    spec = node.get("spec") if isinstance(node, dict) else None
    taints = spec.get("taints") if isinstance(spec, dict) else None
    if not isinstance(taints, list):
        return ()
    return tuple(t for t in taints if isinstance(t, dict) and _text(t, "effect") in HARD_EFFECTS)


def untolerated(taints: Iterable[Any], tolerations: Iterable[Any]) -> list[str]:
    """The hard taints no toleration matches, as ``key=value:Effect`` (empty: all tolerated)."""
    allowed = [t for t in tolerations if isinstance(t, dict)]
    out = []
    for taint in taints:
        if _text(taint, "effect") in HARD_EFFECTS and not any(tolerates(t, taint) for t in allowed):
            value = _text(taint, "value")
            text = _text(taint, "key") + (f"={value}" if value else "")
            out.append(f"{text}:{_text(taint, 'effect')}")
    return out


def pod_tolerations(pod: Any) -> tuple[dict[str, Any], ...]:
    """A pod's ``spec.tolerations`` (the entries that are objects)."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    tolerations = spec.get("tolerations") if isinstance(spec, dict) else None
    if not isinstance(tolerations, list):
        return ()
    return tuple(t for t in tolerations if isinstance(t, dict))


def node_ready(node: Any) -> bool:
    """The node's ``Ready`` condition is ``True`` (a node that reports none counts as ready).

    The last ``Ready`` entry wins, as a kubelet keeps one per type.
    """
    status = node.get("status") if isinstance(node, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return True
    ready = [c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"]
    return not ready or ready[-1].get("status") == "True"


def node_cordoned(node: Any) -> bool:
    """``spec.unschedulable`` (``kubectl cordon``)."""
    spec = node.get("spec") if isinstance(node, dict) else None
    return isinstance(spec, dict) and spec.get("unschedulable") is True


GPU_TOLERATIONS: tuple[dict[str, str], ...] = ({"key": "nvidia.com/gpu", "operator": "Exists"},)
"""What PowerFlow's pools tolerate by default (``--tolerate`` replaces it).

Managed GPU node pools (GKE, AKS) taint their nodes ``nvidia.com/gpu:NoSchedule``,
and the API server's ``ExtendedResourceToleration`` admission plugin gives
every pod that requests ``nvidia.com/gpu`` exactly this toleration; any other
hard taint keeps a node out of the pools unless the admin tolerates it.
"""

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
TOLERATION_SYNTAX = "KEY[=VALUE]:EFFECT, KEY=VALUE or KEY"


def parse_toleration(text: str) -> dict[str, str]:
    """A toleration from kubectl's taint syntax: ``KEY=VALUE:EFFECT`` (``Equal``),
    ``KEY:EFFECT`` or ``KEY`` (``Exists``), ``KEY=VALUE`` (``Equal``, every effect).

    Raises ``ValueError`` with a one-line reason: a mistyped toleration would
    silently leave nodes out of the pools (or let PowerFlow plan on nodes its
    pods cannot use).
    """
    rest, sep, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, eq, value = rest.partition("=")
    problem = ""
    if not _KEY.fullmatch(key):
        problem = f"key {key!r} is not a valid label key"
    elif eq and not _VALUE.fullmatch(value):
        problem = f"value {value!r} is not a valid label value"
    elif sep and effect not in EFFECTS:
        problem = f"effect {effect!r} is not one of {', '.join(EFFECTS)}"
    if problem:
        raise ValueError(f"toleration {text!r}: {problem} (syntax: {TOLERATION_SYNTAX})")
    toleration = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def pool_tolerations(texts: Sequence[str] | None) -> tuple[dict[str, str], ...]:
    """The ``--tolerate`` options as tolerations; ``GPU_TOLERATIONS`` when none is given."""
    if not texts:
        return GPU_TOLERATIONS
    return tuple(parse_toleration(text) for text in texts)
