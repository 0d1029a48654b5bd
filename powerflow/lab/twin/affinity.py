"""kube-scheduler's NodeAffinity filter, for the twin's scheduler: a pod's
``spec.nodeSelector`` and its required node affinity against a node's labels.

The operator pins a gang planned on one GPU type to that type's nodes with a required
node affinity on the GPU product label (``operator/workers.py``, ``pool_affinity``); a
real kube-scheduler never binds such a pod elsewhere, whatever the extender says, so
the twin's stand-in must not either. The semantics are the Kubernetes API's
(``NodeSelectorTerm``, ``NodeSelectorRequirement``; the ``nodeaffinity`` package of
``k8s.io/component-helpers``):

- every ``nodeSelector`` label must be on the node with that value;
- ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` are ORed; a
  term's ``matchExpressions`` and ``matchFields`` are ANDed; a term with neither
  matches no node;
- ``In`` / ``NotIn``: the label's value is (not) one of ``values`` (a node without the
  label matches ``NotIn``); ``Exists`` / ``DoesNotExist``; ``Gt`` / ``Lt``: the label's
  value and the one ``values`` entry read as integers (a node whose value is not one
  does not match);
- ``matchFields`` knows ``metadata.name`` only, with ``In`` and ``NotIn``.

Preferred affinity only scores nodes, which the stand-in does not do (its extender
does), so it is not read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REASON = "node(s) didn't match Pod's node affinity/selector"
"""kube-scheduler's message for the nodes this filter refuses."""


def _integer(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _requirement(value: str | None, expression: Mapping[str, Any]) -> bool:
    """One ``NodeSelectorRequirement`` against the node's ``value`` for its key (None:
    the node has no such label)."""
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _integer(value), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator the API would have refused


def _term(term: Any, labels: Mapping[str, str], name: str) -> bool:
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(
        isinstance(e, Mapping) and _requirement(labels.get(str(e.get("key"))), e)
        for e in expressions
    ) and all(
        isinstance(f, Mapping)
        and f.get("key") == "metadata.name"
        and f.get("operator") in ("In", "NotIn")
        and _requirement(name, f)
        for f in fields
    )


def matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``node`` passes ``pod``'s node selector and required node affinity."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(str(k)) != str(v) for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    name = str(meta.get("name", ""))
    return any(_term(t, labels, name) for t in required.get("nodeSelectorTerms") or [])
