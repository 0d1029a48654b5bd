"""RBAC as the API server evaluates it: the emulated API server's authorizer
(``KubeEmulator.enforce_rbac``) and the tests that check a chart's rules against
the requests its components make.

``call_of`` turns one HTTP request into the attributes RBAC authorizes
(``RequestInfoFactory.NewRequestInfo`` in k8s.io/apiserver): API group,
resource (``plural`` or ``plural/subresource``), verb, namespace and name.
``user_grants`` collects what a user is granted by RBAC objects: ClusterRoles
through ClusterRoleBindings (everywhere), Roles and ClusterRoles through
RoleBindings (in the binding's namespace only), for the bindings whose
subjects name the user, one of its groups or its ServiceAccount, as ``rbac/v1``
defines them (``appliesTo`` in plugin/pkg/auth/authorizer/rbac/rbac.go);
``grants_of`` is that for one ServiceAccount. ``Grant.allows`` is the RBAC
authorizer's rule match (``RuleAllows``), wildcards, ``*/subresource`` and
``resourceNames`` included.

Only what the emulator and the tests meet is modelled: no aggregation rules, no
``nonResourceURLs`` rules (a request to a non-resource URL gives ``None``),
no impersonation, no escalation check on writes of roles and bindings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
"""A ServiceAccount's username is ``system:serviceaccount:NAMESPACE:NAME``
(k8s.io/apiserver pkg/authentication/serviceaccount ``MakeUsername``)."""
NAMESPACE_SUBRESOURCES = ("status", "finalize")
"""What follows ``/namespaces/NAME/`` as a subresource of the namespace itself, not as a
resource in it (``namespaceSubresources`` in the request-info resolver)."""


def service_account_user(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def service_account_of(username: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a ServiceAccount's username, ``None`` for any other user."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, sep, name = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    if not (namespace and sep and name) or ":" in name:
        return None
    return namespace, name


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
    ``/api``, ``/apis``, ``/apis/GROUP[/VERSION]``, ``/version``, ``/healthz``...).

    A request for the namespace object itself (``/api/v1/namespaces/NAME``, its
    ``status`` and ``finalize``) is cluster-scoped here; the API server also sets
    its namespace to ``NAME``, which ``Authorizer.allows`` takes into account."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    verb = "delete" if method.upper() == "DELETE" else VERBS.get(method.upper(), method.lower())
    if rest[0] == "watch":  # the deprecated /watch/ paths
        verb, rest = "watch", rest[1:]
        if not rest:
            return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
        else:
            namespace = None  # the namespace object itself is cluster-scoped
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if name is None:
        if verb == "get":
            verb = "watch" if (params.get("watch") or "").lower() in ("true", "1") else "list"
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
        # resourceNames never allow a create of an object (its name is not in the URL);
        # a create on a named object's subresource (pods/binding, serviceaccounts/token)
        # has the name, and RBAC matches it.
        if self.names and (
            call.name not in self.names or (call.verb == "create" and "/" not in call.resource)
        ):
            return False
        return (
            self.group in ("*", call.group)
            and self._resource_matches(call.resource)
            and self.verb in ("*", call.verb)
        )

    def _resource_matches(self, resource: str) -> bool:
        """``ResourceMatches``: ``*``, the resource itself, or ``*/SUB`` for any
        resource's subresource ``SUB``."""
        if self.resource in ("*", resource):
            return True
        _, slash, sub = resource.partition("/")
        return bool(slash) and self.resource == f"*/{sub}"

    def __str__(self) -> str:
        where = f" bound in namespace {self.namespace}" if self.namespace else ""
        names = f" {list(self.names)}" if self.names else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{names} ({self.role}{where})"


@dataclass(frozen=True, order=True)
class Missing:
    """A role a binding of the user refers to and the objects lack."""

    kind: str
    name: str
    namespace: str | None
    """The binding's namespace (``None``: a ClusterRoleBinding)."""

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def error(self) -> str:
        """The RBAC authorizer's words for it (the role lister's NotFound), which the
        API server adds to a 403's message as ``RBAC: ...``."""
        return f'{self.kind.lower()}.rbac.authorization.k8s.io "{self.name}" not found'


def applies_to(
    binding: Mapping[str, Any], username: str, groups: Iterable[str], namespace: str | None
) -> bool:
    """Whether a subject of ``binding`` (a RoleBinding in ``namespace``, or a
    ClusterRoleBinding: ``None``) is the user: by name, by one of its groups, or
    as its ServiceAccount (a RoleBinding's subject without a namespace is in the
    binding's)."""
    groups = set(groups)
    for subject in binding.get("subjects") or ():
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == username:
            return True
        if kind == "Group" and name in groups:
            return True
        if kind == "ServiceAccount":
            where = subject.get("namespace") or namespace
            if where and isinstance(name, str) and username == service_account_user(where, name):
                return True
    return False


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


def _name(doc: Mapping[str, Any]) -> str:
    return str((doc.get("metadata") or {}).get("name") or "")


def _namespace(doc: Mapping[str, Any]) -> str | None:
    namespace = (doc.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None


def user_grants(
    docs: Iterable[Mapping[str, Any]], username: str, groups: Iterable[str] = ()
) -> tuple[list[Grant], list[Missing]]:
    """What the user ``username`` (with ``groups``) is granted by the roles in ``docs``,
    and the roles its bindings refer to that ``docs`` do not define (upstream's,
    e.g. ``system:kube-scheduler``). ClusterRoleBindings come first, then
    RoleBindings, each in name order (the RBAC authorizer's visiting order)."""
    docs = list(docs)
    groups = tuple(groups)
    cluster_roles = {_name(d): d for d in docs if d.get("kind") == "ClusterRole"}
    roles = {(_namespace(d), _name(d)): d for d in docs if d.get("kind") == "Role"}

    def order(d: Mapping[str, Any]) -> tuple[int, str, str]:
        return (0 if d.get("kind") == "ClusterRoleBinding" else 1, _namespace(d) or "", _name(d))

    grants: list[Grant] = []
    missing: list[Missing] = []
    bindings = [d for d in docs if d.get("kind") in ("ClusterRoleBinding", "RoleBinding")]
    for binding in sorted(bindings, key=order):
        where = _namespace(binding) if binding["kind"] == "RoleBinding" else None
        if binding["kind"] == "RoleBinding" and where is None:
            continue
        if not applies_to(binding, username, groups, where):
            continue
        ref = binding.get("roleRef") or {}
        kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        if kind == "ClusterRole":
            role = cluster_roles.get(name)
        elif kind == "Role" and where is not None:
            role = roles.get((where, name))
        else:
            role = None
        if role is None:
            missing.append(Missing(kind, name, where))
            continue
        label = f"{kind} {name}"
        for group, resource, verb, names in _rules(role):
            grants.append(Grant(group, resource, verb, where, label, names))
    return grants, missing


def grants_of(
    docs: Iterable[Mapping[str, Any]], namespace: str, account: str
) -> tuple[list[Grant], list[str]]:
    """What the ServiceAccount ``namespace/account`` is granted by the roles in ``docs``
    (through bindings that name it; its groups left out), and the names of bound
    roles that ``docs`` do not define (upstream's, e.g. ``system:kube-scheduler``)."""
    grants, missing = user_grants(docs, service_account_user(namespace, account))
    return grants, [str(m) for m in missing]


def role_grants(docs: Iterable[Mapping[str, Any]], kind: str, name: str) -> list[Grant]:
    """The grants of one role of ``docs`` as if bound everywhere (a ClusterRole the chart
    leaves for the user to bind, such as the workers')."""
    (role,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return [Grant(g, r, v, None, f"{kind} {name}", n) for g, r, v, n in _rules(role)]


@dataclass
class Authorizer:
    """One user's grants from a set of RBAC objects, answering calls (``allows``) and
    naming the roles its bindings miss (``reason``), as the 403 does."""

    username: str
    grants: list[Grant]
    missing: list[Missing]

    @classmethod
    def of(
        cls, docs: Iterable[Mapping[str, Any]], username: str, groups: Iterable[str]
    ) -> Authorizer:
        grants, missing = user_grants(docs, username, groups)
        return cls(username, grants, missing)

    def allows(self, call: Call) -> bool:
        if any(g.allows(call) for g in self.grants):
            return True
        # A request for a namespace object (``/api/v1/namespaces/NAME``) is in that
        # namespace too for the API server: a RoleBinding there can grant it.
        if call.resource.split("/")[0] == "namespaces" and call.name and call.namespace is None:
            inside = Call(call.group, call.resource, call.verb, call.name, call.name)
            return any(g.allows(inside) for g in self.grants if g.namespace is not None)
        return False

    def reason(self, call: Call) -> str:
        """``RBAC: ...`` naming the missing roles of the bindings the authorizer visited
        for ``call`` (ClusterRoleBindings, and RoleBindings of the call's namespace),
        or ``""`` when none is missing (``RBACAuthorizer.Authorize``)."""
        errors: list[str] = []
        for missing in self.missing:
            if missing.namespace in (None, call.namespace) and missing.error() not in errors:
                errors.append(missing.error())
        if not errors:
            return ""
        return "RBAC: " + (errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
