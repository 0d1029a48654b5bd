"""The extender wire format of k8s.io/kube-scheduler ``extender/v1``, exactly.

The Go structs carry no json tags, so kube-scheduler sends and expects the Go
field names (``Pod``, ``NodeNames``, ``FailedNodes``, ``Host``, ...), and Go's
``encoding/json`` matches keys case-insensitively when decoding (an exact match
first) and ignores unknown keys. The models below do the same, so a body that
kube-scheduler (or a hand-written client) would accept decodes here too. The
Kubernetes objects inside (``Pod``, ``Nodes``) keep their normal lowercase keys
and stay plain dicts: the extender reads a handful of fields, and validating a
full NodeList of a thousand nodes on every call would cost more than deciding.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_EXTENDER_PRIORITY = 10
"""``extenderv1.MaxExtenderPriority``: the highest score an extender may give."""


class _GoStruct(BaseModel):
    """A Go struct without json tags: Go field names, decoded case-insensitively."""

    model_config = ConfigDict(populate_by_name=False, extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _fold_keys(cls, data: Any) -> Any:
        """Map keys onto field names as ``encoding/json`` does: exact, then any case.

        Later duplicates win, as in Go. ``null`` leaves the zero value, as Go
        does for a non-pointer field.
        """
        if not isinstance(data, dict):
            return data
        exact = {f.alias or name: f.alias or name for name, f in cls.model_fields.items()}
        folded = {key.lower(): key for key in exact}
        out: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                continue
            target = exact.get(key) or folded.get(key.lower())
            if target is None:
                continue
            if value is None:
                out.pop(target, None)
                continue
            out[target] = value
        return out


class NodeList(BaseModel):
    """A ``v1.NodeList`` as kube-scheduler builds it: ``items`` matter, the rest rides along."""

    model_config = ConfigDict(extra="allow", frozen=True)

    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_GoStruct):
    """The body of ``filter`` and ``prioritize``.

    ``Nodes`` is set when the scheduler is configured with
    ``nodeCacheCapable: false``, ``NodeNames`` when it is ``true``.
    """

    Pod: dict[str, Any] | None = None
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def candidate_names(self) -> list[str]:
        """The candidate nodes by name, whichever cache mode sent them."""
        if self.NodeNames is not None:
            return list(self.NodeNames)
        if self.Nodes is not None:
            return [_node_name(node) for node in self.Nodes.items]
        return []


class ExtenderFilterResult(_GoStruct):
    """The answer to ``filter``; a non-empty ``Error`` fails the pod's scheduling cycle."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] | None = None
    FailedAndUnresolvableNodes: dict[str, str] | None = None
    Error: str = ""


class HostPriority(_GoStruct):
    """One entry of ``HostPriorityList``: ``Score`` from 0 to ``MaxExtenderPriority``."""

    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_PRIORITY)


class ExtenderBindingArgs(_GoStruct):
    """The body of ``bind``."""

    PodName: str = ""
    PodNamespace: str = ""
    PodUID: str = ""
    Node: str = ""


class ExtenderBindingResult(_GoStruct):
    """The answer to ``bind``; a non-empty ``Error`` makes the scheduler retry the pod."""

    Error: str = ""


def _node_name(node: Any) -> str:
    meta = node.get("metadata") if isinstance(node, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def filter_result(
    args: ExtenderArgs, admitted: list[str], failed: dict[str, str]
) -> ExtenderFilterResult:
    """Answer in the mode the scheduler asked in: names back for names, objects for objects."""
    if args.NodeNames is None and args.Nodes is not None:
        keep = set(admitted)
        items = [node for node in args.Nodes.items if _node_name(node) in keep]
        extra = args.Nodes.model_extra or {}
        return ExtenderFilterResult(
            Nodes=NodeList(items=items, **extra), FailedNodes=failed or None
        )
    return ExtenderFilterResult(NodeNames=admitted, FailedNodes=failed or None)


def dump(model: BaseModel) -> dict[str, Any]:
    """Serialise as kube-scheduler's Go structs do: every field, nil pointers as ``null``."""
    return model.model_dump(mode="json")
