"""RBAC as the API server evaluates it, for checking a chart's rules against real requests.

``call_of`` turns one HTTP request into the attributes RBAC authorizes
(``RequestInfoFactory.NewRequestInfo`` in k8s.io/apiserver): API group,
resource (``plural`` or ``plural/subresource``), verb, namespace and name.
``grants_of`` collects what a ServiceAccount is granted by rendered
manifests: ClusterRoles through ClusterRoleBindings (everywhere), Roles and
ClusterRoles through RoleBindings (in the binding's namespace only), as
``rbac/v1`` defines them. ``Grant.allows`` is the RBAC authorizer's rule
match (``RuleAllows``), wildcards and ``resourceNames`` included.

Only what the tests meet is modelled: no aggregation rules, no
``nonResourceURLs`` rules (a request to a non-resource URL gives ``None``),
no impersonation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True, order=True)
class Call:
    """One request as RBAC sees it; ``namespace`` ``None``: cluster-scoped or all namespaces."""

    group: str
    resource: str
    verb: str
    namespace: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else " (cluster-wide)"
        group = self.group or "core"
        return f"{self.verb} {group}/{self.resource}{where}"


def call_of(method: str, path: str, params: Mapping[str, str]) -> Call | None:
    """The RBAC attributes of a request, ``None`` for a non-resource URL (discovery
    ``/api``, ``/apis``, ``/apis/GROUP[/VERSION]``, ``/version``, ``/healthz``...)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    verb = "delete" if method.upper() == "DELETE" else VERBS[method.upper()]
    if rest[0] == "watch":  # the deprecated /watch/ paths
        verb, rest = "watch", rest[1:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        rest = rest[2:] if len(rest) > 2 else ["namespaces", rest[1]]
        if rest[0] == "namespaces":
            namespace = None  # the namespace object itself is cluster-scoped
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if name is None:
        if verb == "get":
            verb = "watch" if params.get("watch") in ("true", "1") else "list"
        elif verb == "delete":
            verb = "deletecollection"
        # a list or watch of one object by field selector names it (resourceNames rules)
        for term in (params.get("fieldSelector") or "").split(","):
            key, _, value = term.partition("=")
            if key.strip() == "metadata.name" and verb in ("list", "watch"):
                name = value.lstrip("=").strip()
    return Call(group, resource, verb, namespace, name)


@dataclass(frozen=True, order=True)
class Grant:
    """One (group, resource, verb) of one rule, where the binding makes it hold."""

    group: str
    resource: str
    verb: str
    namespace: str | None
    """``None``: through a ClusterRoleBinding, everywhere; else only in this namespace."""
    role: str
    names: tuple[str, ...] = ()

    def allows(self, call: Call) -> bool:
        if self.namespace is not None and call.namespace != self.namespace:
            return False
        if self.names and (call.name not in self.names or call.verb == "create"):
            return False
        return (
            self.group in ("*", call.group)
            and self.resource in ("*", call.resource)
            and self.verb in ("*", call.verb)
        )

    def __str__(self) -> str:
        where = f" bound in namespace {self.namespace}" if self.namespace else ""
        names = f" {list(self.names)}" if self.names else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{names} ({self.role}{where})"


def _subject(binding: Mapping[str, Any], namespace: str, name: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount"
        and s.get("name") == name
        and s.get("namespace") == namespace
        for s in binding.get("subjects") or ()
    )


def _rules(role: Mapping[str, Any]) -> Iterable[tuple[str, str, str, tuple[str, ...]]]:
    """Each (group, resource, verb, resourceName) a role's rules grant, one by one (so
    that a name no call uses shows as an unused grant of its own)."""
    for rule in role.get("rules") or ():
        names: list[tuple[str, ...]] = [(n,) for n in rule.get("resourceNames") or ()] or [()]
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    for name in names:
                        yield group, resource, verb, name


def grants_of(
    docs: Iterable[Mapping[str, Any]], namespace: str, account: str
) -> tuple[list[Grant], list[str]]:
    """What the ServiceAccount ``namespace/account`` is granted by the roles in ``docs``,
    and the names of bound roles that ``docs`` do not define (upstream's, e.g.
    ``system:kube-scheduler``)."""
    docs = list(docs)
    cluster_roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    roles = {
        (d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] == "Role"
    }
    grants: list[Grant] = []
    missing: list[str] = []
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not _subject(binding, namespace, account):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if ref["kind"] == "ClusterRole":
            role = cluster_roles.get(ref["name"])
        else:
            role = roles.get((where, ref["name"]))
        if role is None:
            missing.append(f"{ref['kind']} {ref['name']}")
            continue
        label = f"{ref['kind']} {ref['name']}"
        for group, resource, verb, names in _rules(role):
            grants.append(Grant(group, resource, verb, where, label, names))
    return grants, missing


def role_grants(docs: Iterable[Mapping[str, Any]], kind: str, name: str) -> list[Grant]:
    """The grants of one role of ``docs`` as if bound everywhere (a ClusterRole the chart
    leaves for the user to bind, such as the workers')."""
    (role,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return [Grant(g, r, v, None, f"{kind} {name}", n) for g, r, v, n in _rules(role)]
