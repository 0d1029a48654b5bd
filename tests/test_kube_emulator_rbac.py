"""The emulated API server authenticates and authorizes as kube-apiserver does
(``KubeEmulator.enforce_rbac``), and serves the TokenRequest API.

Each test pins one documented behaviour, over real HTTP, against the RBAC objects
the test writes into the emulator as ``helm install`` would (an administrator's
requests: no token):

- authentication (https://kubernetes.io/docs/reference/access-authn-authz/authentication/):
  a bearer token the server does not accept is 401 ``Unauthorized``; a request
  without one is anonymous (here: the administrator, as the tests' client is);
- RBAC (https://kubernetes.io/docs/reference/access-authn-authz/rbac/): a Role's
  rules hold in its namespace through a RoleBinding there, a ClusterRole's
  everywhere through a ClusterRoleBinding; ``resourceNames`` limit rules to
  those objects; subresources are named ``pods/status``; the request's verb is
  ``list``, ``watch`` (``?watch=true``), ``get``... as
  https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb
  says; discovery is open to everyone (``system:discovery``,
  ``system:public-info-viewer``); changes to roles and bindings take effect at once;
- a denied request is 403 with the ``Status`` that k8s.io/apiserver writes
  (pkg/endpoints/handlers/responsewriters/errors.go ``forbiddenMessage``, then
  ``apierrors.NewForbidden``), with the RBAC authorizer's reason for bindings to
  roles that do not exist (plugin/pkg/auth/authorizer/rbac/rbac.go);
- TokenRequest
  (https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-request-v1/,
  pkg/registry/core/serviceaccount/storage/token.go): ``create`` on
  ``serviceaccounts/token``, a token whose user is the ServiceAccount, which
  TokenReview then authenticates and RBAC then authorizes.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from powerflow.lab.twin import rbac
from powerflow.lab.twin.apiserver import ApiServer
from powerflow.lab.twin.components import Process
from powerflow.lab.twin.emulator import API_AUDIENCES, KubeEmulator
from powerflow.lab.twin.ports import free_port

pytestmark = pytest.mark.kmock(cls=KubeEmulator, enforce_rbac=True)

RBAC = "/apis/rbac.authorization.k8s.io/v1"
READER = "system:serviceaccount:a:reader"
TOKEN = "reader-token"
SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:a", "system:authenticated")
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def admin(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    """The administrator's client (no token), after the ServiceAccount ``a/reader`` is
    created and its token ``reader-token`` known to the server."""
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        made = await client.post(
            "/api/v1/namespaces/a/serviceaccounts", json={"metadata": {"name": "reader"}}
        )
        assert made.status_code == 201, made.text
        kmock.register_token(TOKEN, READER, groups=SA_GROUPS)
        yield client


@pytest.fixture
async def reader(admin: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """The ServiceAccount ``a/reader``'s client."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=admin.base_url, headers=headers) as client:
        yield client


def rule(resources: list[str], verbs: list[str], group: str = "", **more: Any) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs, **more}


async def grant(
    admin: httpx.AsyncClient,
    name: str,
    *rules: dict[str, Any],
    namespace: str | None = "a",
    cluster_role: bool = False,
    subject: dict[str, Any] | None = None,
) -> str:
    """A role with ``rules`` bound to ``a/reader`` (or ``subject``): a Role and a
    RoleBinding in ``namespace``, a ClusterRole and a RoleBinding there with
    ``cluster_role``, a ClusterRole and a ClusterRoleBinding without a namespace.
    Returns the binding's path."""
    who = subject or {"kind": "ServiceAccount", "name": "reader", "namespace": "a"}
    role_kind = "ClusterRole" if cluster_role or namespace is None else "Role"
    where = f"{RBAC}/namespaces/{namespace}" if namespace else RBAC
    role_where = RBAC if role_kind == "ClusterRole" else where
    plural = "clusterroles" if role_kind == "ClusterRole" else "roles"
    role = {"kind": role_kind, "metadata": {"name": name}, "rules": list(rules)}
    made = await admin.post(f"{role_where}/{plural}", json=role)
    assert made.status_code == 201, made.text
    return await bind(admin, name, role_kind, namespace=namespace, subject=who)


async def bind(
    admin: httpx.AsyncClient,
    role: str,
    role_kind: str = "Role",
    *,
    namespace: str | None = "a",
    subject: dict[str, Any] | None = None,
    name: str | None = None,
) -> str:
    who = subject or {"kind": "ServiceAccount", "name": "reader", "namespace": "a"}
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    where = f"{RBAC}/namespaces/{namespace}" if namespace else RBAC
    plural = "rolebindings" if namespace else "clusterrolebindings"
    binding = {
        "kind": kind,
        "metadata": {"name": name or role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [who],
    }
    made = await admin.post(f"{where}/{plural}", json=binding)
    assert made.status_code == 201, made.text
    return f"{where}/{plural}/{name or role}"


def forbidden(message: str, kind: str, name: str | None = None, group: str = "") -> dict[str, Any]:
    """The 403 ``Status`` of ``apierrors.NewForbidden`` (``details`` omit empty fields)."""
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = kind
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    }


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}], **spec}}


# -- RBAC ------------------------------------------------------------------------------------


async def test_a_role_grants_in_its_namespace_only(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """A Role bound by a RoleBinding grants in the binding's namespace: ``list`` pods
    in ``a``; in ``b`` and across all namespaces (``/api/v1/pods``, cluster scope)
    the answer is the API server's 403, word for word."""
    await grant(admin, "pod-lister", rule(["pods"], ["list"]))
    listed = await reader.get("/api/v1/namespaces/a/pods")
    assert listed.status_code == 200, listed.text
    assert listed.json()["kind"] == "PodList"
    elsewhere = await reader.get("/api/v1/namespaces/b/pods")
    assert elsewhere.status_code == 403
    assert elsewhere.json() == forbidden(
        f'pods is forbidden: User "{READER}" cannot list resource "pods" in API group "" '
        'in the namespace "b"',
        "pods",
    )
    everywhere = await reader.get("/api/v1/pods")
    assert everywhere.status_code == 403
    assert everywhere.json() == forbidden(
        f'pods is forbidden: User "{READER}" cannot list resource "pods" in API group "" '
        "at the cluster scope",
        "pods",
    )
    # Only the verbs granted: no get, no create.
    assert (await reader.get("/api/v1/namespaces/a/pods/p1")).status_code == 403
    assert (await reader.post("/api/v1/namespaces/a/pods", json=pod("p1"))).status_code == 403


async def test_resource_names_limit_a_rule_to_those_objects(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """``resourceNames``: ``get`` of ``p1`` only; ``p2`` is 403 naming the object
    (``pods "p2" is forbidden``, ``details.name``); a list is not a named request,
    unless its field selector picks that one name (``metadata.name=p1``, as the
    request-info resolver names it)."""
    for name in ("p1", "p2"):
        assert (await admin.post("/api/v1/namespaces/a/pods", json=pod(name))).status_code == 201
    await grant(admin, "p1-reader", rule(["pods"], ["get", "list"], resourceNames=["p1"]))
    assert (await reader.get("/api/v1/namespaces/a/pods/p1")).json()["metadata"]["name"] == "p1"
    other = await reader.get("/api/v1/namespaces/a/pods/p2")
    assert other.status_code == 403
    assert other.json() == forbidden(
        f'pods "p2" is forbidden: User "{READER}" cannot get resource "pods" in API group "" '
        'in the namespace "a"',
        "pods",
        "p2",
    )
    assert (await reader.get("/api/v1/namespaces/a/pods")).status_code == 403
    one = await reader.get(
        "/api/v1/namespaces/a/pods", params={"fieldSelector": "metadata.name=p1"}
    )
    assert one.status_code == 200, one.text
    assert [p["metadata"]["name"] for p in one.json()["items"]] == ["p1"]


async def test_a_cluster_role_binding_grants_everywhere(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """A ClusterRole bound by a ClusterRoleBinding: in every namespace, across all of
    them, and cluster-scoped resources (nodes)."""
    await grant(admin, "viewer", rule(["pods"], ["list"]), rule(["nodes"], ["get"]), namespace=None)
    for path in ("/api/v1/namespaces/a/pods", "/api/v1/namespaces/b/pods", "/api/v1/pods"):
        assert (await reader.get(path)).status_code == 200, path
    assert (await admin.post("/api/v1/nodes", json={"metadata": {"name": "n1"}})).is_success
    assert (await reader.get("/api/v1/nodes/n1")).status_code == 200
    listed = await reader.get("/api/v1/nodes")
    assert listed.status_code == 403
    assert listed.json()["message"].endswith(
        'cannot list resource "nodes" in API group "" at the cluster scope'
    )


async def test_a_cluster_role_through_a_role_binding_holds_in_that_namespace(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """A RoleBinding may refer to a ClusterRole: its rules then hold in the binding's
    namespace only, never for cluster-scoped resources."""
    await grant(
        admin,
        "viewer",
        rule(["pods"], ["list"]),
        rule(["nodes"], ["list"]),
        namespace="b",
        cluster_role=True,
    )
    assert (await reader.get("/api/v1/namespaces/b/pods")).status_code == 200
    assert (await reader.get("/api/v1/namespaces/a/pods")).status_code == 403
    assert (await reader.get("/api/v1/pods")).status_code == 403
    assert (await reader.get("/api/v1/nodes")).status_code == 403


async def test_bindings_and_roles_take_effect_at_once_and_revoke(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """A binding created later grants from the next request on; a changed role's rules
    hold at once; a deleted binding revokes."""
    path = "/api/v1/namespaces/a/configmaps"
    assert (await reader.get(path)).status_code == 403
    binding = await grant(admin, "cm", rule(["configmaps"], ["list"]))
    assert (await reader.get(path)).status_code == 200
    new_rules = {"rules": [rule(["configmaps"], ["list", "create"])]}
    patched = await admin.patch(f"{RBAC}/namespaces/a/roles/cm", json=new_rules, headers=MERGE)
    assert patched.status_code == 200, patched.text
    made = await reader.post(path, json={"metadata": {"name": "c1"}})
    assert made.status_code == 201, made.text
    assert (await admin.delete(binding)).status_code == 200
    assert (await reader.get(path)).status_code == 403


async def test_watch_is_a_verb_of_its_own(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """``GET`` of a collection with ``?watch=true`` is ``watch``: ``list`` does not grant
    it; once granted, the stream is served."""
    await grant(admin, "lister", rule(["pods"], ["list"]))
    params = {"watch": "true", "timeoutSeconds": "1"}
    refused = await reader.get("/api/v1/namespaces/a/pods", params=params)
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        f'pods is forbidden: User "{READER}" cannot watch resource "pods" in API group "" '
        'in the namespace "a"'
    )
    await grant(admin, "watcher", rule(["pods"], ["watch"]))
    async with reader.stream("GET", "/api/v1/namespaces/a/pods", params=params) as stream:
        assert stream.status_code == 200


async def test_a_subresource_is_authorized_as_resource_slash_subresource(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """``PATCH pods/p1/status`` is ``patch`` on ``pods/status``: ``patch`` on ``pods`` does
    not grant it (the message names ``pods/status``, ``details.kind`` the resource);
    a ``pods/status`` rule does."""
    assert (await admin.post("/api/v1/namespaces/a/pods", json=pod("p1"))).status_code == 201
    await grant(admin, "patcher", rule(["pods"], ["patch"]))
    status = {"status": {"phase": "Running"}}
    path = "/api/v1/namespaces/a/pods/p1"
    assert (
        await reader.patch(path, json={"metadata": {"labels": {"x": "1"}}}, headers=MERGE)
    ).status_code == 200
    refused = await reader.patch(f"{path}/status", json=status, headers=MERGE)
    assert refused.json() == forbidden(
        f'pods "p1" is forbidden: User "{READER}" cannot patch resource "pods/status" '
        'in API group "" in the namespace "a"',
        "pods",
        "p1",
    )
    await grant(admin, "status-patcher", rule(["pods/status"], ["patch"]))
    patched = await reader.patch(f"{path}/status", json=status, headers=MERGE)
    assert patched.status_code == 200, patched.text
    assert patched.json()["status"]["phase"] == "Running"


async def test_a_group_resource_is_qualified_by_its_group(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """Outside the core group the 403 names ``leases.coordination.k8s.io`` and its
    ``details.group``; a rule of another group grants nothing."""
    await grant(admin, "core-leases", rule(["leases"], ["get"]))
    path = "/apis/coordination.k8s.io/v1/namespaces/a/leases/l"
    refused = await reader.get(path)
    assert refused.json() == forbidden(
        f'leases.coordination.k8s.io "l" is forbidden: User "{READER}" cannot get resource '
        '"leases" in API group "coordination.k8s.io" in the namespace "a"',
        "leases",
        "l",
        "coordination.k8s.io",
    )
    await grant(admin, "leases", rule(["leases"], ["get"], group="coordination.k8s.io"))
    assert (await reader.get(path)).status_code == 404  # allowed: and there is no such Lease


async def test_group_subjects_and_wildcards(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """A binding to a group of the user (``system:serviceaccounts:a``) applies to it; ``*``
    matches any verb and resource, ``*/status`` any resource's status."""
    group = {
        "kind": "Group",
        "name": "system:serviceaccounts:a",
        "apiGroup": "rbac.authorization.k8s.io",
    }
    await grant(admin, "all-status", rule(["*/status"], ["get"]), namespace=None, subject=group)
    assert (await admin.post("/api/v1/namespaces/a/pods", json=pod("p1"))).status_code == 201
    assert (await reader.get("/api/v1/namespaces/a/pods/p1/status")).status_code == 200
    assert (await reader.get("/api/v1/namespaces/a/pods/p1")).status_code == 403
    await grant(admin, "everything", rule(["*"], ["*"]), namespace="b")
    made = await reader.post("/api/v1/namespaces/b/configmaps", json={"metadata": {"name": "c"}})
    assert made.status_code == 201, made.text
    assert (await reader.get("/api/v1/namespaces/b/configmaps")).status_code == 200
    assert (await reader.get("/api/v1/namespaces/a/configmaps")).status_code == 403


async def test_a_binding_to_a_missing_role_is_the_reason(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """The RBAC authorizer reports the roles its user's bindings refer to and that do not
    exist: the 403 message ends with ``RBAC: role.rbac.authorization.k8s.io "gone" not
    found`` (for the bindings it visited: the request's namespace's and the cluster's)."""
    await bind(admin, "gone")
    refused = await reader.get("/api/v1/namespaces/a/pods")
    assert refused.json()["message"] == (
        f'pods is forbidden: User "{READER}" cannot list resource "pods" in API group "" '
        'in the namespace "a": RBAC: role.rbac.authorization.k8s.io "gone" not found'
    )
    elsewhere = await reader.get("/api/v1/namespaces/b/pods")
    assert elsewhere.json()["message"].endswith('in the namespace "b"')


# -- authentication --------------------------------------------------------------------------


UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


async def test_a_token_the_server_does_not_accept_is_401(
    kmock: KubeEmulator, admin: httpx.AsyncClient
) -> None:
    """A bearer token the server does not know, or whose audiences are not the API
    server's (a token for the ingest), fails authentication: 401 on any path,
    discovery included."""
    kmock.register_token("for-ingest", READER, audiences=("ingest",))
    for token in ("nope", "for-ingest"):
        headers = {"Authorization": f"Bearer {token}"}
        for path in ("/api/v1/namespaces/a/pods", "/api", "/version"):
            answer = await admin.get(path, headers=headers)
            assert answer.status_code == 401, (token, path)
            assert answer.json() == UNAUTHORIZED


async def test_without_a_token_or_as_another_user_everything_is_allowed(
    kmock: KubeEmulator, admin: httpx.AsyncClient
) -> None:
    """No token (the tests', helm's requests) and users other than ServiceAccounts (the
    administrators a test registers) are not subject to the stored RBAC objects."""
    kmock.register_token("alice-token", "alice", groups=("system:masters",))
    alice = {"Authorization": "Bearer alice-token"}
    for headers in ({}, alice):
        assert (await admin.get("/api/v1/pods", headers=headers)).status_code == 200
        made = await admin.post(
            "/api/v1/namespaces/b/configmaps",
            json={"metadata": {"generateName": "c-"}},
            headers=headers,
        )
        assert made.status_code == 201


async def test_discovery_is_open_to_every_service_account(reader: httpx.AsyncClient) -> None:
    """``system:discovery`` and ``system:public-info-viewer`` let every user read the
    non-resource URLs: a ServiceAccount with no grants reads discovery and /version."""
    for path in ("/api", "/api/v1", "/apis", "/apis/rbac.authorization.k8s.io/v1", "/version"):
        answer = await reader.get(path)
        assert answer.status_code == 200, (path, answer.text)


@pytest.mark.kmock(enforce_rbac=False)
async def test_off_by_default_nothing_is_checked(
    kmock: KubeEmulator, admin: httpx.AsyncClient
) -> None:
    """Without ``enforce_rbac`` (the default): tokens are not checked, nothing refused."""
    assert KubeEmulator().enforce_rbac is False
    headers = {"Authorization": "Bearer nope"}
    assert (await admin.get("/api/v1/pods", headers=headers)).status_code == 200
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert (await admin.get("/api/v1/namespaces/b/pods", headers=headers)).status_code == 200


async def test_grants_are_computed_once_per_user_between_rbac_writes(
    monkeypatch: pytest.MonkeyPatch, admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """The server serves many requests a second: a user's grants are computed once, and
    again only after a write of an RBAC object (not of any other object)."""
    await grant(admin, "lister", rule(["pods"], ["list", "create"]))
    computed: list[str] = []
    real = rbac.Authorizer.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[rbac.Authorizer], docs: Any, username: str, groups: Any) -> Any:
        computed.append(username)
        return real(cls, docs, username, groups)

    monkeypatch.setattr(rbac.Authorizer, "of", classmethod(counted))
    for i in range(20):
        assert (await reader.get("/api/v1/namespaces/a/pods")).status_code == 200
        made = await reader.post("/api/v1/namespaces/a/pods", json=pod(f"p{i}"))
        assert made.status_code == 201
    assert computed == [READER]
    await grant(admin, "other", rule(["nodes"], ["get"]))
    assert (await reader.get("/api/v1/namespaces/a/pods")).status_code == 200
    assert computed == [READER, READER]


# -- TokenRequest ----------------------------------------------------------------------------


def token_request(*audiences: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": list(audiences), **spec},
    }


def review(token: str, *audiences: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token, "audiences": list(audiences)}
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def seconds_until(stamp: str) -> float:
    at = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (at - datetime.datetime.now(tz=datetime.UTC)).total_seconds()


async def test_a_token_request_issues_a_token_of_the_service_account(
    admin: httpx.AsyncClient,
) -> None:
    """201 with the TokenRequest echoed (``metadata`` the ServiceAccount's, ``spec``
    defaulted: the API server's audiences, 3600 s), ``status.token`` and
    ``status.expirationTimestamp`` (RFC 3339). TokenReview authenticates the token as
    the ServiceAccount (its uid, its groups and ``system:authenticated``); RBAC then
    authorizes it as the ServiceAccount."""
    made = await admin.post(
        "/api/v1/namespaces/a/serviceaccounts", json={"metadata": {"name": "issued"}}
    )
    uid = made.json()["metadata"]["uid"]
    answer = await admin.post(
        "/api/v1/namespaces/a/serviceaccounts/issued/token", json=token_request()
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["kind"] == "TokenRequest" and body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["metadata"]["name"] == "issued" and body["metadata"]["namespace"] == "a"
    assert body["spec"]["audiences"] == list(API_AUDIENCES)
    assert body["spec"]["expirationSeconds"] == 3600
    token = body["status"]["token"]
    assert token and 3500 < seconds_until(body["status"]["expirationTimestamp"]) <= 3600
    again = await admin.post(
        "/api/v1/namespaces/a/serviceaccounts/issued/token", json=token_request()
    )
    assert again.json()["status"]["token"] != token  # a new token each time
    status = (await admin.post(REVIEWS, json=review(token))).json()["status"]
    user = "system:serviceaccount:a:issued"
    assert status["authenticated"] is True
    assert status["user"]["username"] == user and status["user"]["uid"] == uid
    assert status["user"]["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:a",
        "system:authenticated",
    ]
    assert status["user"]["extra"]["authentication.kubernetes.io/credential-id"][0].startswith(
        "JTI="
    )
    assert status["audiences"] == list(API_AUDIENCES)
    headers = {"Authorization": f"Bearer {token}"}
    refused = await admin.get("/api/v1/namespaces/a/secrets", headers=headers)
    assert refused.status_code == 403
    assert f'User "{user}" cannot list resource "secrets"' in refused.json()["message"]
    account = {"kind": "ServiceAccount", "name": "issued", "namespace": "a"}
    await grant(admin, "secrets", rule(["secrets"], ["list"]), subject=account)
    assert (await admin.get("/api/v1/namespaces/a/secrets", headers=headers)).status_code == 200


async def test_a_token_for_other_audiences_is_for_them_only(admin: httpx.AsyncClient) -> None:
    """``spec.audiences``: TokenReview authenticates the token for those audiences and
    not for the API server's; the API server itself refuses it (401)."""
    path = "/api/v1/namespaces/a/serviceaccounts/reader/token"
    body = (await admin.post(path, json=token_request("ingest", expirationSeconds=600))).json()
    assert body["spec"]["expirationSeconds"] == 600
    token = body["status"]["token"]
    assert (await admin.post(REVIEWS, json=review(token, "ingest"))).json()["status"][
        "authenticated"
    ]
    assert not (await admin.post(REVIEWS, json=review(token))).json()["status"].get("authenticated")
    headers = {"Authorization": f"Bearer {token}"}
    assert (await admin.get("/api/v1/namespaces/a/pods", headers=headers)).status_code == 401


async def test_a_token_bound_to_a_pod_names_the_pod_and_its_node(admin: httpx.AsyncClient) -> None:
    """``spec.boundObjectRef`` to a Pod of the ServiceAccount: the user's ``extra`` has the
    pod's name and uid and its node's (as the kubelet's projected tokens do, 1.30+);
    a pod of another ServiceAccount is 400, a stale uid 409, a missing pod 404."""
    node = (await admin.post("/api/v1/nodes", json={"metadata": {"name": "n1"}})).json()
    made = await admin.post(
        "/api/v1/namespaces/a/pods", json=pod("agent", serviceAccountName="reader", nodeName="n1")
    )
    pod_uid = made.json()["metadata"]["uid"]
    path = "/api/v1/namespaces/a/serviceaccounts/reader/token"
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "agent", "uid": pod_uid}
    answer = await admin.post(path, json=token_request("ingest", boundObjectRef=ref))
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["boundObjectRef"] == ref
    token = answer.json()["status"]["token"]
    extra = (await admin.post(REVIEWS, json=review(token, "ingest"))).json()["status"]["user"][
        "extra"
    ]
    assert extra["authentication.kubernetes.io/pod-name"] == ["agent"]
    assert extra["authentication.kubernetes.io/pod-uid"] == [pod_uid]
    assert extra["authentication.kubernetes.io/node-name"] == ["n1"]
    assert extra["authentication.kubernetes.io/node-uid"] == [node["metadata"]["uid"]]
    await admin.post("/api/v1/namespaces/a/pods", json=pod("web"))  # ServiceAccount "default"
    wrong = await admin.post(
        path, json=token_request(boundObjectRef={**ref, "name": "web", "uid": ""})
    )
    assert wrong.status_code == 400 and wrong.json()["reason"] == "BadRequest"
    stale = await admin.post(path, json=token_request(boundObjectRef={**ref, "uid": "old"}))
    assert stale.status_code == 409
    gone = await admin.post(path, json=token_request(boundObjectRef={**ref, "name": "gone"}))
    assert gone.status_code == 404 and gone.json()["message"] == 'pods "gone" not found'


async def test_a_token_request_is_validated(admin: httpx.AsyncClient) -> None:
    """Less than ten minutes, or a body naming another ServiceAccount, is 422 Invalid."""
    path = "/api/v1/namespaces/a/serviceaccounts/reader/token"
    short = await admin.post(path, json=token_request(expirationSeconds=60))
    assert short.status_code == 422
    assert "may not specify a duration less than 10 minutes" in short.json()["message"]
    other = await admin.post(path, json={**token_request(), "metadata": {"name": "someone"}})
    assert other.status_code == 422
    assert "must match the service account name if specified" in other.json()["message"]


async def test_a_token_request_for_a_missing_service_account_is_404(
    admin: httpx.AsyncClient,
) -> None:
    answer = await admin.post(
        "/api/v1/namespaces/a/serviceaccounts/ghost/token", json=token_request()
    )
    assert answer.status_code == 404
    body = answer.json()
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'serviceaccounts "ghost" not found'
    assert body["details"] == {"name": "ghost", "kind": "serviceaccounts"}


async def test_a_token_request_is_create_on_serviceaccounts_token(
    admin: httpx.AsyncClient, reader: httpx.AsyncClient
) -> None:
    """RBAC authorizes a TokenRequest as ``create`` on ``serviceaccounts/token`` of the
    named ServiceAccount (``resourceNames`` apply: the name is in the URL); denied
    before the ServiceAccount is looked up (403, not 404)."""
    await admin.post("/api/v1/namespaces/a/serviceaccounts", json={"metadata": {"name": "agent"}})
    path = "/api/v1/namespaces/a/serviceaccounts/agent/token"
    refused = await reader.post(path, json=token_request())
    assert refused.json() == forbidden(
        f'serviceaccounts "agent" is forbidden: User "{READER}" cannot create resource '
        '"serviceaccounts/token" in API group "" in the namespace "a"',
        "serviceaccounts",
        "agent",
    )
    assert (
        await reader.post("/api/v1/namespaces/a/serviceaccounts/ghost/token", json=token_request())
    ).status_code == 403
    await grant(
        admin, "tokens", rule(["serviceaccounts/token"], ["create"], resourceNames=["agent"])
    )
    assert (await reader.post(path, json=token_request())).status_code == 201
    assert (
        await reader.post("/api/v1/namespaces/a/serviceaccounts/reader/token", json=token_request())
    ).status_code == 403


# -- the model, and the switch in ApiServer and the process ----------------------------------


def test_a_namespace_object_is_also_in_itself() -> None:
    """``/api/v1/namespaces/NAME`` and its ``status`` are the namespace object (the
    request-info resolver's ``namespaceSubresources``); the API server puts the request
    in that namespace, so a RoleBinding there can grant it."""
    assert rbac.call_of("GET", "/api/v1/namespaces/a/status", {}) == rbac.Call(
        "", "namespaces/status", "get", None, "a"
    )
    docs = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "ns"},
            "rules": [rule(["namespaces"], ["get"])],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "ns", "namespace": "a"},
            "roleRef": {"kind": "ClusterRole", "name": "ns"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader"}],  # the binding's namespace
        },
    ]
    authorizer = rbac.Authorizer.of(docs, READER, SA_GROUPS)
    assert authorizer.allows(rbac.Call("", "namespaces", "get", None, "a"))
    assert not authorizer.allows(rbac.Call("", "namespaces", "get", None, "b"))
    assert not authorizer.allows(rbac.Call("", "namespaces", "list"))


def test_api_server_and_its_process_take_the_switch(tmp_path: Path) -> None:
    """``ApiServer(enforce_rbac=True)`` and ``python -m powerflow.lab.twin.apiserver
    --enforce-rbac`` (with ``--tokens``) serve an enforcing emulator."""
    with ApiServer(enforce_rbac=True) as server, httpx.Client(base_url=server.url) as client:
        assert server.emulator is not None and server.emulator.enforce_rbac
        assert client.get("/api/v1/pods", headers={"Authorization": "Bearer x"}).status_code == 401
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps([{"token": TOKEN, "username": READER, "audiences": list(API_AUDIENCES)}])
    )
    port = free_port()
    args = ["--port", str(port), "--tokens", str(tokens), "--enforce-rbac"]
    ready = f"http://127.0.0.1:{port}/api/v1/nodes"
    process = Process(
        "apiserver", args, ready, tmp_path / "apiserver.log", "powerflow.lab.twin.apiserver"
    )
    process.start(60)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            as_reader = {"Authorization": f"Bearer {TOKEN}"}
            assert client.get("/api/v1/pods", headers=as_reader).status_code == 403
            assert (
                client.get("/api/v1/pods", headers={"Authorization": "Bearer x"}).status_code == 401
            )
            assert client.get("/api/v1/pods").status_code == 200
    finally:
        process.stop()
