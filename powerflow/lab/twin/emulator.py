"""kmock's Kubernetes emulator with the API-server semantics a real operator relies on.

kmock 0.8 stores objects as plain dicts: no ``resourceVersion``, watches that
replay everything and lose events between snapshot and subscription, no pod
binding, no ``PUT``, no selectors and no garbage collection. kopf stalls on
each of these. This subclass owns every write and
every list/watch and imitates what kube-apiserver does; reads of single
objects and discovery stay kmock's. Select it with
``@pytest.mark.kmock(cls=KubeEmulator)``.

What it imitates (each pinned by ``tests/test_kube_emulator.py``):

- ``apiVersion`` and ``kind`` on every object stored, whatever the create sent;
- one cluster-wide, strictly increasing ``resourceVersion``, bumped by every
  effective write (a no-op patch changes nothing); ``uid``,
  ``creationTimestamp`` and ``generation`` set on create, ``generation``
  bumped only when something outside ``metadata`` and ``status`` changes;
- the ``status`` subresource: the main endpoint ignores ``status``, the
  ``/status`` endpoint ignores everything else, ``status`` is dropped when
  creating custom resources and pods (nodes keep theirs, as kubelets register);
- optimistic concurrency: a stale ``metadata.resourceVersion`` in a merge
  patch or a ``PUT`` answers 409, a failed JSON-patch ``test`` answers 422;
- ``generateName``; 409 ``AlreadyExists`` on create;
- list with the current ``resourceVersion``; watch from ``?resourceVersion=``
  without replaying seen objects (410 when too old), atomically subscribed;
  label and field selectors (equality and set-based; a field the object
  lacks reads as ``""``, as the server's field sets do) and ``timeoutSeconds``;
  a watch ends when its client closes the connection (``open_watches``);
- paginated lists (``limit``/``continue``): pages in key order
  (namespace/name) from one snapshot at the first page's
  ``resourceVersion``, ``metadata.continue`` while more remain, and
  ``remainingItemCount`` only without selectors; an unknown token is 410;
- ``POST pods/{name}/binding``: sets ``spec.nodeName`` and copies the
  binding's annotations to the pod (as ``setPodHostAndAnnotations`` does),
  201, 409 if already bound;
- delete with finalizers (``deletionTimestamp``), ``preconditions``, and
  graceful deletion of pods (``_grace_period_s``): ``deletionTimestamp`` is the
  request time plus the grace period and ``deletionGracePeriodSeconds`` says it
  (0 for an object that is not a pod), options from the body or, without one,
  the query (``?gracePeriodSeconds=``, as the ``kubernetes`` client sends it), and
  background garbage collection of objects whose ``ownerReferences`` name a
  deleted ``uid``, and of an object created with owners none of which exists
  (a dangling reference: the garbage collector looks its owners up and deletes
  it, as it does the pods a controller creates for an owner deleted meanwhile);
- discovery as client-go reads it (the core group's ``groupVersion`` is ``v1``),
  ``/version`` reporting ``KUBE_VERSION``, and a new CRD established: its
  resource served and its status ``NamesAccepted`` and ``Established``, as
  ``helm install`` waits for (``_establish``);
- ``TokenReview`` (``POST /apis/authentication.k8s.io/v1/tokenreviews``) as
  ``pkg/registry/authentication/tokenreview/storage.go`` answers it, for tokens a
  test registers (``register_token``): nothing stored, 201 with the review's
  ``status``; an empty token is 400 ``BadRequest``; an unknown token, or one
  whose audiences do not meet ``spec.audiences`` (default: the API server's
  own), is ``authenticated`` false (omitted, as Go's ``omitempty`` does) with an
  ``error``; else ``authenticated: true``, ``user`` (username, uid, groups,
  extra) and ``audiences``: the intersection;
- with ``enforce_rbac``, authentication and RBAC as kube-apiserver applies them
  to every request (``_authorized``): a bearer token the server does not know,
  or not for its audiences, is 401 ``Unauthorized``; a ServiceAccount's request
  is allowed only as the Roles, ClusterRoles and bindings stored here grant it
  (``powerflow.lab.twin.rbac``), else 403 ``Forbidden`` with the server's message;
  and the ``TokenRequest`` API (``POST serviceaccounts/{name}/token``,
  ``_token_request``), whose tokens then authenticate (TokenReview, requests);
  pinned by ``tests/test_kube_emulator_rbac.py``;
- writes refused for chosen objects (``refuse``): the ``Status`` body
  kube-apiserver sends when admission (PodSecurity, ResourceQuota, a webhook)
  or validation denies a request, and nothing stored;
- faults (``faults``, ``powerflow.lab.twin.api_faults``): 409, 429 with ``Retry-After``,
  500 (before or after the write), slow answers, watches that end with a 410
  ``ERROR`` event, per verb, resource, name, count or seeded probability; and
  etcd compaction (``compact``): watches, continue tokens and exact lists from
  before it are 410 ``Expired``; with ``fault_control`` the rules are reachable
  over HTTP under ``/_twin/`` (``KubeEmulator._control``: the twin's API server
  is another process), refused (404, as any unknown path) without it.

- with ``kubelets``, graceful deletion of a bound pod as the server does it: it
  stays terminating until a delete with grace 0 (its kubelet's, or a force
  delete); with ``not_ready_toleration_s``/``unreachable_toleration_s``, the
  ``DefaultTolerationSeconds`` admission plugin (the twin turns both on).

Not imitated: without ``kubelets``, the kubelet's part of graceful termination (a pod without
finalizers goes at once, as an unscheduled one does; a finalizer keeps it
terminating, as an unreachable node's kubelet does), shortening the grace
period of a pod already terminating, defaulting (a pod without
``terminationGracePeriodSeconds`` gets the server's default 30 s here),
schema validation, strategic merge (treated as merge patch), synthetic
DELETED events when an object stops matching a label selector.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import fnmatch
import gzip
import importlib.resources
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import dicts, k8s

from . import rbac, reactions
from .api_faults import ApiFaults, Injected

Obj = dict[str, Any]
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
_HISTORY = 10_000  # watch events kept per resource for ?resourceVersion= resumes
KUBE_VERSION = "v1.31.4"
"""The release ``/version`` reports: the one the chart is validated against."""
CONTROL = "/_twin/"
"""The fault-control routes' prefix (``KubeEmulator._control``): no API group's path."""
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_KINDS = {
    "roles": "Role",
    "clusterroles": "ClusterRole",
    "rolebindings": "RoleBinding",
    "clusterrolebindings": "ClusterRoleBinding",
}
AUTHENTICATED = "system:authenticated"
"""The group kube-apiserver adds to every authenticated user (``AuthenticatedGroupAdder``)."""
TOKEN_EXPIRATION_S = 3600
"""A TokenRequest's ``spec.expirationSeconds`` when it sets none
(``SetDefaults_TokenRequestSpec``)."""
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"
CREDENTIAL_EXTRA = "authentication.kubernetes.io/credential-id"
"""The ``extra`` of a ServiceAccount token's user (pkg/serviceaccount/claims.go): the
bound pod and its node, the bound node, and the token's ID (``JTI=...``)."""


class Conflict(kmock.KubernetesError):
    def __init__(self, message: str, reason: str = "Conflict") -> None:
        super().__init__(status=409, reason=reason, message=message)


class Invalid(kmock.KubernetesError):
    def __init__(self, message: str) -> None:
        super().__init__(status=422, reason="Invalid", message=message)


class Gone(kmock.KubernetesError):
    def __init__(self, message: str) -> None:
        super().__init__(status=410, reason="Expired", message=message)


@attrs.define
class Refusal:
    """One rule of ``KubeEmulator.refuse``; ``hits`` counts the requests it answered."""

    verb: str
    resource: str
    name: str
    namespace: str | None
    status: int
    reason: str
    message: str | None
    times: int | None
    hits: int = 0

    def matches(self, verb: str, resource: str, namespace: str | None, name: str) -> bool:
        return (
            (self.times is None or self.hits < self.times)
            and verb == self.verb
            and resource == self.resource
            and self.namespace in (None, namespace)
            and fnmatch.fnmatchcase(name, self.name)
        )


_WATCH_POLL_S = 0.2
"""How often an idle watch checks that its client is still there."""


def _disconnected(request: kmock.Request) -> bool:
    """Whether the client closed the connection (kube-apiserver then ends the watch: the
    request's context is cancelled)."""
    raw = getattr(request, "_raw_request", None)
    transport = None if raw is None else raw.transport
    return transport is None or transport.is_closing()


def _now(after_s: int = 0) -> str:
    at = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=after_s)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _grace_period_s(resource: Any, obj: Obj, options: Mapping[str, Any]) -> int:
    """The grace period of a delete, as ``podStrategy.CheckGracefulDelete`` decides it:
    the options' ``gracePeriodSeconds``, else the pod's ``terminationGracePeriodSeconds``
    (defaulted to 30 s by the server); 0 for a pod not scheduled or already finished,
    and for every object that is not a pod (no graceful deletion)."""
    if getattr(resource, "group", None) or getattr(resource, "plural", None) != "pods":
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return 0
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds", 30)
    return max(int(grace), 0)


def _selector(text: str | None) -> list[tuple[str, str, set[str]]]:
    """Parse a label/field selector into (key, op, values) terms."""
    terms: list[tuple[str, str, set[str]]] = []
    for raw in re.split(r",(?![^()]*\))", text or ""):
        term = raw.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            terms.append((m[1], m[2], {v.strip() for v in m[3].split(",")}))
        elif m := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", term):
            terms.append((m[1], "!=" if m[2] == "!=" else "=", {m[3]}))
        elif term.startswith("!"):
            terms.append((term[1:], "!", set()))
        else:
            terms.append((term, "exists", set()))
    return terms


def _matches(terms: list[tuple[str, str, set[str]]], values: Mapping[str, Any]) -> bool:
    for key, op, wanted in terms:
        present = key in values
        value = str(values.get(key, ""))
        ok = {
            "=": present and value in wanted,
            "!=": not present or value not in wanted,
            "in": present and value in wanted,
            "notin": not present or value not in wanted,
            "exists": present,
            "!": not present,
        }[op]
        if not ok:
            return False
    return True


def _field(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


class _Fields(Mapping[str, Any]):
    """An object's fields addressed by dotted path, for field selectors.

    Every selectable field exists, unset ones as ``""`` (the API server's
    field sets: ``spec.nodeName!=`` selects bound pods only)."""

    def __init__(self, obj: Obj) -> None:
        self._obj = obj

    def __getitem__(self, key: str) -> Any:
        value = _field(self._obj, key)
        return "" if value is None else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


API_AUDIENCES = ("https://kubernetes.default.svc.cluster.local",)
"""The API server's own audiences (``--api-audiences``, default its issuer)."""


@attrs.define(frozen=True)
class TokenUser:
    """What the API server knows of a registered token (``register_token``)."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]
    audiences: tuple[str, ...]


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """An in-memory API server close enough to kube-apiserver for kopf and the extender."""

    _revision: int = attrs.field(default=0, init=False)
    _history: dict[Any, collections.deque[tuple[int, Obj]]] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=_HISTORY)),
        init=False,
    )
    _results: dict[int, Any] = attrs.field(factory=dict, init=False)
    """Write results by the request object's ``id`` (alive while it is served; kmock's
    ``request.id`` is its index in the log, which ``keep_requests`` trims)."""
    keep_requests: int | None = None
    """Keep only the last this many requests in kmock's log (None: all, for tests that
    assert on them). kmock matches each request against its reactions by scanning the
    whole log, so a long-running emulator (the twin's: thousands of requests a minute)
    slows down quadratically without a bound."""
    _serving: set[int] = attrs.field(factory=set, init=False)
    """The ``id`` of every request being served now (``_trim`` keeps them in the log)."""
    _refusals: list[Refusal] = attrs.field(factory=list, init=False)
    _pages: dict[str, tuple[str, list[Obj]]] = attrs.field(factory=dict, init=False)
    """Continue token -> (the list's resourceVersion, the items not yet sent)."""
    _tokens: dict[str, TokenUser] = attrs.field(factory=dict, init=False)
    open_watches: int = attrs.field(default=0, init=False)
    """Watch streams being served now (one ends when its client goes away)."""
    faults: ApiFaults = attrs.field(factory=ApiFaults, init=False)
    """Injected faults (``powerflow.lab.twin.api_faults``): ``kmock.faults.inject(...)``."""
    kubelets: bool = False
    """Bound pods terminate as kube-apiserver keeps them: a graceful delete of a pod on a
    node (not finished) only marks it (``deletionTimestamp``), and it goes when a delete
    with ``gracePeriodSeconds=0`` comes: its kubelet's, once the containers stopped, or
    a force delete. Off by default, for tests without kubelets (a pod then goes at
    once); the twin's kubelet finishes its pods' deletions, and a node that died keeps
    them terminating, as a real one does."""
    not_ready_toleration_s: int | None = None
    unreachable_toleration_s: int | None = None
    """The ``DefaultTolerationSeconds`` admission plugin (kube-apiserver's
    ``--default-not-ready-toleration-seconds``/``--default-unreachable-toleration-seconds``,
    300 s there): a pod created without a ``NoExecute`` toleration of the
    ``node.kubernetes.io/not-ready`` (``unreachable``) taint gets one for this long,
    which is how long it stays on a failed node before the taint evicts it. None: no
    such admission (the pod is evicted at once)."""

    extended_resource_toleration: bool = False
    """The ``ExtendedResourceToleration`` admission plugin (off in kube-apiserver by
    default, on where GPU node pools are tainted with their resource's name, as GKE's
    are): a pod that requests an extended resource (``nvidia.com/gpu``) gets a
    ``NoSchedule`` toleration of the taint with that key
    (``plugin/pkg/admission/extendedresourcetoleration``)."""

    fault_control: bool = False
    """Serve ``/_twin/faults`` and ``/_twin/compact`` (``_control``): off unless the
    server's owner asks (``python -m powerflow.lab.twin.apiserver --fault-control``), so
    that no client of a twin started for a demo can break it by accident."""

    enforce_rbac: bool = False
    """Authenticate bearer tokens and authorize every request as kube-apiserver does
    with ``--authorization-mode=RBAC`` (``_authorized``): a token the server does not
    know (``register_token``, ``TokenRequest``), or whose audiences miss the server's,
    is 401; a ServiceAccount (``system:serviceaccount:NS:NAME``) gets exactly what
    the RBAC objects stored here grant it, else 403; a request without a token, or
    with the token of any other user, stands for the cluster's administrator
    (``system:masters``: the tests' own client, helm) and is allowed, and so are
    the non-resource URLs (discovery, ``/version``: ``system:discovery`` and
    ``system:public-info-viewer`` grant them to everyone; the fault-control routes,
    ``/_twin/``, are the test's and outside both). RBAC objects count from their
    write through the API (create, update, patch, delete: at once, as the server's
    informers see them a moment later); objects put into ``objects`` directly count
    from the next such write. Off by default (everything allowed, tokens unchecked):
    ``python -m powerflow.lab.twin.apiserver --enforce-rbac``,
    ``ApiServer(enforce_rbac=True)``, ``@pytest.mark.kmock(enforce_rbac=True)``."""
    _rbac_writes: int = attrs.field(default=0, init=False)
    """Bumped by each write of an RBAC object: the authorizers' cache is of this count."""
    _authorizers: dict[tuple[str, tuple[str, ...]], rbac.Authorizer] = attrs.field(
        factory=dict, init=False
    )
    _authorizers_of: int = attrs.field(default=-1, init=False)
    """The ``_rbac_writes`` the cached ``_authorizers`` (by username and groups) are of."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Writes kmock's routing does not classify: PUT and subresource POSTs (binding).
        self.fallback[kmock.method.PUT] << self._serve_result
        self.fallback[kmock.method.POST] << self._serve_result

    def load_builtins(self) -> None:
        """Declare the built-in resources (pods, nodes, events, ...) kmock bundles.

        ``kmock.resources.load_bundled()`` uses the deprecated
        ``importlib.resources.read_binary``, an error under ``-W error``.
        """
        blob = importlib.resources.files("kmock._internal").joinpath("resources.json.gz")
        self.resources.load_data(gzip.decompress(blob.read_bytes()))

    def declare(self, plural: str, kind: str, *, namespaced: bool = True) -> None:
        """Declare a custom resource (``group/version/plural``) with a status subresource."""
        self.resources[plural] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            subresources={"status"},
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )

    def refuse(
        self,
        verb: str,
        resource: str,
        name: str = "*",
        *,
        namespace: str | None = None,
        status: int = 403,
        reason: str = "Forbidden",
        message: str | None = None,
        times: int | None = None,
    ) -> Refusal:
        """Refuse ``verb`` (create, update, patch, delete) on ``resource`` (a plural,
        ``pods/status`` for a subresource, as RBAC names them) for objects whose name
        matches the ``fnmatch`` pattern ``name``, ``times`` times (``None``: always).

        The answer is what kube-apiserver sends when admission or validation denies
        a request: a ``Status`` (``status: Failure``, ``code``, ``reason``,
        ``message``, ``details`` naming the object), and nothing is written. The
        default message is the API server's wording for a forbidden request.
        """
        rule = Refusal(verb, resource, name, namespace, status, reason, message, times)
        self._refusals.append(rule)
        return rule

    def compact(self) -> int:
        """etcd compaction at the current revision (the API server compacts every 5
        minutes): watches from an older ``resourceVersion`` end with a 410 ``ERROR``
        event, lists under way lose their continue tokens (410). Returns the revision."""
        self.faults.compacted = self._revision
        self._pages.clear()
        return self._revision

    async def _render_error(self, exc: Exception) -> Any:
        if isinstance(exc, Injected):
            return exc.response()
        return await super()._render_error(exc)

    def register_token(
        self,
        token: str,
        username: str,
        *,
        groups: tuple[str, ...] = (),
        extra: Mapping[str, list[str]] | None = None,
        audiences: tuple[str, ...] = API_AUDIENCES,
        uid: str | None = None,
    ) -> TokenUser:
        """Make ``token`` a valid token of ``username`` for ``audiences`` (what the token's
        ``aud`` claim says); ``extra`` as the ServiceAccount authenticator fills it
        (``authentication.kubernetes.io/pod-name`` ..., ``.../node-name`` from 1.30)."""
        user = TokenUser(
            username, uid or str(uuid.uuid4()), tuple(groups), dict(extra or {}), tuple(audiences)
        )
        self._tokens[token] = user
        return user

    def _token_review(self, request: kmock.Request) -> kmock.Response:
        """``tokenreview.REST.Create``: authenticate ``spec.token`` for ``spec.audiences``."""
        review: Obj = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        spec = review.get("spec") if isinstance(review.get("spec"), dict) else {}
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message="token is required for TokenReview in authentication",
            )
        wanted = [str(a) for a in spec.get("audiences") or ()] or list(API_AUDIENCES)
        user = self._tokens.get(token)
        status: Obj = {"user": {}}
        if user is None:
            status["error"] = "[invalid bearer token, token lookup failed]"
        elif not set(wanted) & set(user.audiences):
            status["error"] = (
                f"[invalid bearer token, token audiences {list(user.audiences)!r} is invalid "
                f"for the target audiences {wanted!r}]"
            )
        else:
            status = {
                "authenticated": True,
                "user": {
                    "username": user.username,
                    "uid": user.uid,
                    "groups": list(user.groups),
                    "extra": copy.deepcopy(user.extra),
                },
                "audiences": [a for a in wanted if a in user.audiences],
            }
        review.setdefault("apiVersion", "authentication.k8s.io/v1")
        review.setdefault("kind", "TokenReview")
        review.setdefault("metadata", {})
        review["status"] = status
        return kmock.Response(status=201, payload=review)

    # -- authentication and RBAC (``enforce_rbac``) -------------------------------------

    def _authorized(self, request: kmock.Request) -> aiohttp.web.Response | None:
        """The refusal of a request the server does not serve to its sender, or ``None``.

        Authentication (k8s.io/apiserver pkg/authentication/request/bearertoken):
        ``Authorization: Bearer TOKEN`` (scheme in any case) names a token; none, or
        an empty one, is the anonymous user's request, which this server grants
        everything as it does the administrator's. A token it does not know, or not
        for its audiences (``API_AUDIENCES``), fails the request: 401 ``Unauthorized``
        (``filters.WithAuthentication``: no anonymous fallback after an error).

        Authorization (plugin/pkg/auth/authorizer/rbac): a ServiceAccount's resource
        request (``rbac.call_of``) must be allowed by a rule of a role bound to it,
        its groups (``system:serviceaccounts``...) or ``system:authenticated``; else
        403 (``_forbidden``)."""
        parts = _header(request, "Authorization").strip().split(" ", 2)
        if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
            return None
        token = parts[1]
        user = self._tokens.get(token)
        if user is None or not set(user.audiences) & set(API_AUDIENCES):
            return _status(401, "Unauthorized", "Unauthorized")
        if rbac.service_account_of(user.username) is None:
            return None  # users other than ServiceAccounts: the tests' admins
        call = rbac.call_of(str(request.method.value), request.url.path, request.params)
        if call is None:
            return None  # non-resource URLs: discovery, /version, for everyone
        authorizer = self._authorizer(user)
        if authorizer.allows(call):
            return None
        return _forbidden(user.username, call, authorizer.reason(call))

    def _authorizer(self, user: TokenUser) -> rbac.Authorizer:
        """``user``'s grants from the RBAC objects stored now, computed once per user
        between two writes of RBAC objects (the server serves many requests a second,
        RBAC objects change seldom)."""
        if self._authorizers_of != self._rbac_writes:
            self._authorizers.clear()
            self._authorizers_of = self._rbac_writes
        groups = user.groups if AUTHENTICATED in user.groups else (*user.groups, AUTHENTICATED)
        cached = self._authorizers.get((user.username, groups))
        if cached is None:
            cached = rbac.Authorizer.of(self._rbac_objects(), user.username, groups)
            self._authorizers[user.username, groups] = cached
        return cached

    def _rbac_objects(self) -> list[Obj]:
        """The live Roles, ClusterRoles and their bindings, each with its ``kind`` and
        its namespace (the key's: the store's, whatever the body said)."""
        found = []
        for key, stored in list(self.objects.items()):
            res, namespace, _ = key
            kind = RBAC_KINDS.get(getattr(res, "plural", "")) if _is_rbac(res) else None
            if kind is None or stored.deleted:
                continue
            obj = dict(stored.raw, kind=kind)
            meta = dict(obj.get("metadata") or {})
            meta.pop("namespace", None)
            if namespace:
                meta["namespace"] = namespace
            obj["metadata"] = meta
            found.append(obj)
        return found

    def _token_request(self, request: kmock.Request, key: Any) -> kmock.Response:
        """``TokenREST.Create`` (pkg/registry/core/serviceaccount/storage/token.go): a
        token of the ServiceAccount ``key`` for ``spec.audiences`` (default: the API
        server's, ``API_AUDIENCES``), valid ``spec.expirationSeconds`` (default
        3600, at least 600), bound to ``spec.boundObjectRef`` if given (a Pod, whose
        ServiceAccount it must be, a Node or a Secret, which must exist; a pod's and
        a node's name and uid go into the user's ``extra``, a pod's node's too).

        201 with the request echoed (``metadata`` the ServiceAccount's name and
        namespace), ``status.token`` and ``status.expirationTimestamp``; the token is
        registered (``register_token``) as ``system:serviceaccount:NS:NAME`` with the
        ServiceAccount's uid, its groups and the audiences. A missing ServiceAccount
        (or bound object) is 404 ``NotFound``; a body naming another ServiceAccount,
        or too short an expiration, 422 ``Invalid``. Expiry is reported, not
        enforced: a test does not outlive a token's ten minutes."""
        namespace, name = str(request.namespace), str(request.name)
        body: Obj = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        invalid = 'TokenRequest.authentication.k8s.io "{}" is invalid: {}'
        for field, value, mine in (
            ("name", meta.get("name"), name),
            ("namespace", meta.get("namespace"), namespace),
        ):
            if value and value != mine:
                raise Invalid(
                    invalid.format(
                        name,
                        f'metadata.{field}: Invalid value: "{value}": must match the service '
                        f"account {field} if specified",
                    )
                )
        account = self._live(key)
        if account is None:
            raise _not_found("serviceaccounts", name)
        audiences = [str(a) for a in spec.get("audiences") or ()] or list(API_AUDIENCES)
        expiration = spec.get("expirationSeconds")
        expiration = TOKEN_EXPIRATION_S if expiration is None else expiration
        bad = f"spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration"
        if not isinstance(expiration, int) or expiration < 600:
            raise Invalid(invalid.format("", f"{bad} less than 10 minutes"))
        if expiration > 2**32:
            raise Invalid(invalid.format("", f"{bad} larger than 2^32 seconds"))
        extra = self._bound_extra(namespace, name, spec.get("boundObjectRef"))
        jti = str(uuid.uuid4())
        extra[CREDENTIAL_EXTRA] = [f"JTI={jti}"]
        token = secrets.token_urlsafe(32)
        self.register_token(
            token,
            rbac.service_account_user(namespace, name),
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
            extra=extra,
            audiences=tuple(audiences),
            uid=str(account.get("metadata", {}).get("uid") or uuid.uuid4()),
        )
        answer: Obj = {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": _now()},
            "spec": {**spec, "audiences": audiences, "expirationSeconds": expiration},
            "status": {"token": token, "expirationTimestamp": _now(expiration)},
        }
        return kmock.Response(status=201, payload=answer)

    def _bound_extra(self, namespace: str, account: str, ref: Any) -> dict[str, list[str]]:
        """The ``extra`` of a token bound to ``ref`` (a ``BoundObjectReference``), after
        checking the object as ``TokenREST.Create`` does."""
        if not isinstance(ref, dict):
            return {}
        kind, version = str(ref.get("kind") or ""), str(ref.get("apiVersion") or "")
        name = str(ref.get("name") or "")
        plural = {"Pod": "pods", "Node": "nodes", "Secret": "secrets"}.get(kind)
        if "/" in version or plural is None:
            raise kmock.KubernetesError(
                status=400,
                reason="BadRequest",
                message=f"cannot bind token to object of type {version}, Kind={kind}",
            )
        where = None if plural == "nodes" else namespace
        obj = self._live((_core(plural), where, name))
        if obj is None:
            raise _not_found(plural, name)
        uid = str(obj.get("metadata", {}).get("uid") or "")
        if ref.get("uid") and ref["uid"] != uid:
            raise Conflict(
                f'Operation cannot be fulfilled on {kind} "{name}": the UID in the bound '
                f"object reference ({ref['uid']}) does not match the UID in record. The "
                "object might have been deleted and then recreated"
            )
        extra: dict[str, list[str]] = {}
        if plural == "pods":
            spec = obj.get("spec") or {}
            if (
                spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
            ) != account:
                raise kmock.KubernetesError(
                    status=400,
                    reason="BadRequest",
                    message=f'cannot bind token for serviceaccount "{account}" to pod running '
                    "with different serviceaccount name.",
                )
            extra = {POD_NAME_EXTRA: [name], POD_UID_EXTRA: [uid]}
            node_name = spec.get("nodeName")
            node = self._live((_core("nodes"), None, node_name)) if node_name else None
            if node is not None:
                extra[NODE_NAME_EXTRA] = [str(node_name)]
                extra[NODE_UID_EXTRA] = [str(node.get("metadata", {}).get("uid") or "")]
        elif plural == "nodes":
            extra = {NODE_NAME_EXTRA: [name], NODE_UID_EXTRA: [uid]}
        return extra

    def _refused(self, request: kmock.Request) -> None:
        """Raise the chosen refusal for this write, if any rule matches it."""
        if not self._refusals or request.resource is None:
            return
        method, sub = request.method, request.subresource
        if request.action == kmock.action.CREATE:
            verb = "create"
        elif method == kmock.method.PATCH:
            verb = "patch"
        elif method == kmock.method.PUT:
            verb = "update"
        elif method == kmock.method.DELETE:
            verb = "delete"
        else:
            return
        name = request.name
        if verb == "create":
            meta = request.data.get("metadata") if isinstance(request.data, dict) else None
            name = (meta or {}).get("name") if isinstance(meta, dict) else None
        plural = request.resource.plural + (f"/{sub}" if sub else "")
        for rule in self._refusals:
            if rule.matches(verb, plural, request.namespace, str(name or "")):
                rule.hits += 1
                group = request.resource.group or ""
                message = rule.message or (
                    f'{plural} "{name}" is forbidden: {rule.reason}'
                    if rule.status == 403
                    else f'{plural} "{name}" is invalid: {rule.reason}'
                )
                details = {"name": name, "kind": request.resource.plural}
                if group:
                    details["group"] = group
                raise kmock.KubernetesError(
                    status=rule.status, reason=rule.reason, message=message, details=details
                )

    # -- helpers ---------------------------------------------------------------------------

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        # not .get(): ResourcesArray.__getitem__ creates missing entries
        return self.resources[resource] if resource in self.resources else None  # noqa: SIM401

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return info is not None and "status" in info.subresources

    def _bump(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _live(self, key: Any) -> Obj | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        raw = self.objects[key].raw
        if not raw.get("metadata", {}).get("resourceVersion"):  # seeded via kmock.objects[...]
            raw = self._stamp_new(copy.deepcopy(raw))
            self._put(key, raw)
        return raw

    def _put(self, key: Any, obj: Obj) -> None:
        """Store a new version, keeping the history for assertions."""
        if _is_rbac(key[0]):
            self._rbac_writes += 1
        if key in self.objects:
            self.objects[key].history.append(obj)
        else:
            self.objects[key] = obj

    def _stamp_new(self, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta["resourceVersion"] = self._bump()
        return obj

    async def _emit(self, resource: Any, kind: str, obj: Obj) -> None:
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self._history[resource].append((int(obj["metadata"]["resourceVersion"]), event))
        await self._buses[resource].put(event)

    async def _store(self, resource: Any, key: Any, old: Obj, new: Obj) -> Obj:
        """Write a changed object: server-managed fields, generation, version, event."""
        if self._has_status(resource):
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        return await self._commit(resource, key, old, new)

    async def _commit(self, resource: Any, key: Any, old: Obj, new: Obj) -> Obj:
        meta, old_meta = new.setdefault("metadata", {}), old.get("metadata", {})
        for field in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if field in old_meta:
                meta[field] = old_meta[field]
        meta["generation"] = old_meta.get("generation", 1)
        meta["resourceVersion"] = old_meta.get("resourceVersion")

        def content(o: Obj) -> Obj:
            return {k: v for k, v in o.items() if k not in ("metadata", "status")}

        if new == old:
            return old  # no-op writes change nothing, not even the version
        if content(new) != content(old):
            meta["generation"] += 1
        meta["resourceVersion"] = self._bump()
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not (self.kubelets and meta.get("deletionGracePeriodSeconds"))
        ):  # the last finalizer went (a pod its kubelet holds goes with the kubelet's delete)
            await self._remove(resource, key, new)
        else:
            self._put(key, new)
            await self._emit(resource, "MODIFIED", new)
        return new

    async def _remove(self, resource: Any, key: Any, obj: Obj) -> None:
        self._put(key, obj)
        self.objects[key].delete()
        if _is_rbac(resource):
            self._rbac_writes += 1
        await self._emit(resource, "DELETED", obj)
        await self._collect_garbage(obj["metadata"]["uid"])

    async def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascading deletion of dependents, as the garbage collector does:
        a dependent of ``owner_uid`` goes once none of its owners exists."""
        for okey in list(self.objects):
            dependent = self._live(okey)
            refs = (dependent or {}).get("metadata", {}).get("ownerReferences", [])
            if (
                dependent is not None
                and any(r.get("uid") == owner_uid for r in refs)
                and self._owners_absent(dependent)
            ):
                await self._delete(okey[0], okey, dependent, {})

    def _owners_absent(self, obj: Obj) -> bool:
        """Whether ``obj`` has owners and none of them exists: an owner counts when an
        object with its uid lives in ``obj``'s namespace or is cluster-scoped (a
        namespaced owner elsewhere is treated as absent, as the garbage collector does)."""
        meta = obj.get("metadata", {})
        uids = {r.get("uid") for r in meta.get("ownerReferences") or []}
        if not uids:
            return False
        namespace = meta.get("namespace")
        for stored in list(self.objects.values()):
            if stored.deleted:
                continue
            owner_meta = stored.raw.get("metadata", {})
            if owner_meta.get("uid") in uids and owner_meta.get("namespace") in (None, namespace):
                return False
        return True

    async def _delete(self, resource: Any, key: Any, obj: Obj, options: Mapping[str, Any]) -> Obj:
        pre = options.get("preconditions") or {}
        meta = obj["metadata"]
        if pre.get("uid") not in (None, meta.get("uid")):
            raise Conflict(f"Precondition failed: UID in precondition: {pre['uid']}")
        if pre.get("resourceVersion") not in (None, meta.get("resourceVersion")):
            raise Conflict("Precondition failed: resourceVersion in precondition")
        grace = _grace_period_s(resource, obj, options)
        if meta.get("deletionTimestamp") and (meta.get("finalizers") or grace > 0):
            return obj  # already terminating (a shorter grace period is not imitated)
        if meta.get("finalizers") or (self.kubelets and grace > 0):
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now(grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            new["metadata"]["resourceVersion"] = self._bump()
            self._put(key, new)
            await self._emit(resource, "MODIFIED", new)
            return new
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = self._bump()
        await self._remove(resource, key, final)
        return final

    # -- fault control ---------------------------------------------------------------------

    def _control(self, request: kmock.Request) -> aiohttp.web.Response:
        """``/_twin/faults``: ``GET`` the rules with their hits, ``POST`` rules to add
        (``ApiFaults.add_json``; 201, or 400 with the reason and nothing added),
        ``DELETE`` them all (answering them as they were, hits included);
        ``POST /_twin/compact``: etcd compaction now (``compact``). Never faulted
        itself; 404 (kube-apiserver's answer to an unknown path) unless
        ``fault_control``."""
        path, method = request.url.path.rstrip("/"), request.method
        if not self.fault_control:
            return _status(404, "NotFound", "the server could not find the requested resource")
        if path == f"{CONTROL}faults" and method == kmock.method.GET:
            return aiohttp.web.json_response(self.faults.as_json())
        if path == f"{CONTROL}faults" and method == kmock.method.POST:
            try:
                self.faults.add_json(request.data)
            except ValueError as exc:
                return _status(400, "BadRequest", str(exc))
            return aiohttp.web.json_response(self.faults.as_json(), status=201)
        if path == f"{CONTROL}faults" and method == kmock.method.DELETE:
            answer = self.faults.as_json()
            self.faults.clear()
            return aiohttp.web.json_response(answer)
        if path == f"{CONTROL}compact" and method == kmock.method.POST:
            return aiohttp.web.json_response({"revision": self.compact()}, status=201)
        return _status(404, "NotFound", "the server could not find the requested resource")

    # -- writes ----------------------------------------------------------------------------

    def _trim(self) -> None:
        """Bound kmock's log (``keep_requests``), keeping the requests still being served:
        kmock finds a request's reaction by looking for the request itself in the log,
        so one dropped while it waits (a slow answer, a lock, a busy loop) would find none
        and be answered 500 ``NotImplementedError``."""
        keep = self.keep_requests
        if keep is not None and len(self._requests) > 2 * keep:
            older, recent = self._requests[:-keep], self._requests[-keep:]
            self._requests[:] = [r for r in older if id(r) in self._serving] + recent

    async def _handle(self, request: kmock.Request) -> Any:
        self._trim()
        self._serving.add(id(request))
        try:
            return await self._answer(request)
        finally:
            self._serving.discard(id(request))

    async def _answer(self, request: kmock.Request) -> Any:
        if request.url.path.startswith(CONTROL):
            return self._control(request)
        if self.enforce_rbac and (refused := self._authorized(request)) is not None:
            return refused
        after = await self.faults.before(request)  # delays, and errors served instead
        if request.resource is not None:
            async with self._lock:
                self._refused(request)
                result = await self._write(request)
            if after is not None:  # done, but the client hears of an error
                raise after
            if result is not None:
                self._results[id(request)] = result
        # Skip KubernetesEmulator._handle (its naive writes); user reactions still apply,
        # found as kmock's RawHandler._handle finds them, without its log scan.
        return await reactions.react(self, request)

    async def _write(self, request: kmock.Request) -> Any:
        res, data = request.resource, request.data
        method, action, sub = request.method, request.action, request.subresource
        if action == kmock.action.CREATE:
            if res.group == "authentication.k8s.io" and res.plural == "tokenreviews":
                return self._token_review(request)
            return await self._create(request)
        if request.name is None:
            return None
        key = (res, request.namespace, request.name)
        if method == kmock.method.POST and sub == "binding":
            return await self._bind(request, key)
        if method == kmock.method.POST and sub == "token" and _is_core(res, "serviceaccounts"):
            return self._token_request(request, key)
        if method not in (kmock.method.PATCH, kmock.method.PUT, kmock.method.DELETE):
            return None
        old = self._live(key)
        if old is None:
            raise kmock.KubernetesObjectNotFoundError()
        if method == kmock.method.DELETE:
            # DeleteOptions from the body, else from the query (as kube-apiserver decodes them).
            options = data if isinstance(data, dict) and data else dict(request.params)
            return await self._delete(res, key, old, options)
        if sub not in (None, "status"):
            return None
        if isinstance(data, list):  # application/json-patch+json
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(old), data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise Invalid(f"the server rejected our request due to an error: {exc}") from exc
        else:
            body: Obj = data if isinstance(data, dict) else {}
            stated = body.get("metadata", {}).get("resourceVersion")
            if stated is not None and stated != old["metadata"]["resourceVersion"]:
                raise Conflict(
                    f"Operation cannot be fulfilled on {res.plural} {request.name!r}: "
                    "the object has been modified; please apply your changes to the latest version"
                )
            if method == kmock.method.PUT:
                new = copy.deepcopy(body)
            else:
                new = dict(dicts.merge_patch_dict(copy.deepcopy(old), body))
        if sub == "status":
            status = new.get("status")
            new = copy.deepcopy(old)
            new.pop("status", None)
            if status is not None:
                new["status"] = status
            return await self._commit(res, key, old, new)
        return await self._store(res, key, old, new)

    async def _create(self, request: kmock.Request) -> Any:
        res = request.resource
        obj: Obj = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        info = self._info(res)
        if request.namespace and (info is None or info.namespaced is not False):
            meta["namespace"] = request.namespace
        key = (res, meta.get("namespace"), meta.get("name"))
        if self._live(key) is not None:
            raise Conflict(f"{res.plural} {meta.get('name')!r} already exists", "AlreadyExists")
        if self._has_status(res) and (res.group or res.plural == "pods"):
            obj.pop("status", None)  # CRDs and pods; nodes keep what the kubelet registers
        if not res.group and res.plural == "pods":
            self._default_tolerations(obj)
            if self.extended_resource_toleration:
                _extended_resource_tolerations(obj)
        if res.group == "apiextensions.k8s.io" and res.plural == "customresourcedefinitions":
            self._establish(obj)
        # The server answers every object with its type (client-go's decoders, and so
        # helm's lookup, refuse one without ``kind``), whatever the client sent.
        obj["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        if info is not None and info.kind:
            obj["kind"] = info.kind
        self._stamp_new(obj)
        self._put(key, obj)
        await self._emit(res, "ADDED", obj)
        if self._owners_absent(obj):
            await self._delete(res, key, obj, {})  # the garbage collector's, after the 201
        return kmock.Response(status=201, payload=obj)

    def _establish(self, crd: Obj) -> None:
        """A new CRD as the apiextensions controllers leave it a moment later: its
        resource served (``declare``, every served version) and its status
        ``NamesAccepted`` and ``Established`` (``helm install`` waits for that)."""
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
        if not (isinstance(group, str) and isinstance(plural, str) and isinstance(kind, str)):
            return
        for version in spec.get("versions") or []:
            if isinstance(version, dict) and version.get("served") and version.get("name"):
                self.declare(
                    f"{group}/{version['name']}/{plural}",
                    kind,
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                )
        stamp = _now()
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": stamp, "reason": r}
                for t, r in (
                    ("NamesAccepted", "NoConflicts"),
                    ("Established", "InitialNamesAccepted"),
                )
            ],
        }

    async def _serve_version(self, request: Any) -> Any:
        """A group version's ``APIResourceList``; the core group's ``groupVersion`` is
        ``v1`` (kmock writes ``/v1``, which client-go, so kubectl and helm, cannot map)."""
        listing = await super()._serve_version(request)
        if isinstance(listing, dict) and listing.get("groupVersion", "").startswith("/"):
            listing["groupVersion"] = listing["groupVersion"][1:]
        return listing

    async def _serve_server_version(self, request: Any) -> Any:
        """``/version``: the Kubernetes release the emulator stands for (``KUBE_VERSION``;
        kmock says 1.26, older than the chart's ``kubeVersion``)."""
        major, minor, _ = KUBE_VERSION.removeprefix("v").split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": KUBE_VERSION,
            "gitTreeState": "clean",
            "goVersion": "go1.22.9",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _default_tolerations(self, pod: Obj) -> None:
        """``DefaultTolerationSeconds``: a ``NoExecute`` toleration of each node-failure
        taint the pod does not tolerate already (one with that key, or with no key,
        and the ``NoExecute`` effect or none)."""
        if self.not_ready_toleration_s is None and self.unreachable_toleration_s is None:
            return  # no such admission: the pod as it came
        spec = pod.setdefault("spec", {})
        tolerations = spec.get("tolerations") or []
        for key, seconds in (
            (NOT_READY_TAINT, self.not_ready_toleration_s),
            (UNREACHABLE_TAINT, self.unreachable_toleration_s),
        ):
            if seconds is None or any(
                t.get("key") in (None, "", key) and t.get("effect") in (None, "", "NoExecute")
                for t in tolerations
            ):
                continue
            added = {"key": key, "operator": "Exists", "effect": "NoExecute"}
            tolerations = [*tolerations, {**added, "tolerationSeconds": seconds}]
        if tolerations:
            spec["tolerations"] = tolerations

    async def _bind(self, request: kmock.Request, key: Any) -> Any:
        pod = self._live(key)
        if pod is None:
            raise kmock.KubernetesObjectNotFoundError()
        node = pod.get("spec", {}).get("nodeName")
        if node:
            raise Conflict(f"pod {request.name} is already assigned to node {node!r}")
        binding: Obj = request.data if isinstance(request.data, dict) else {}
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise Invalid("Binding target name is required")
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = target
        annotations = binding.get("metadata", {}).get("annotations") or {}
        if annotations:
            new["metadata"].setdefault("annotations", {}).update(annotations)
        conditions = new.setdefault("status", {}).setdefault("conditions", [])
        conditions.append({"type": "PodScheduled", "status": "True"})
        await self._commit(key[0], key, pod, new)
        status = {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}
        return kmock.Response(status=201, payload=status)

    async def _serve_result(self, request: kmock.Request) -> Any:
        if id(request) in self._results:
            return self._results.pop(id(request))
        raise k8s.KubernetesEndpointNotFoundError()

    _serve_create = _serve_update = _serve_delete = _serve_result

    async def _stream_error(self, exc: Exception, raw_response: Any) -> None:
        """Errors inside a watch go out as an ERROR event with the real status code."""
        if not isinstance(exc, kmock.KubernetesError):
            return await super()._stream_error(exc, raw_response)
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        status.update(code=exc.status, reason=exc.reason, message=exc.message)
        await raw_response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        return None

    # -- reads -----------------------------------------------------------------------------

    def _select(self, request: kmock.Request) -> list[tuple[Any, Obj]]:
        labels = _selector(request.params.get("labelSelector"))
        fields = _selector(request.params.get("fieldSelector"))
        found = []
        for key in list(self.objects):
            res, namespace, name = key
            if res != request.resource or (request.namespace not in (None, namespace)):
                continue
            if request.name is not None and request.name != name:
                continue
            obj = self._live(key)
            if obj is not None and self._selected(obj, labels, fields):
                found.append((key, obj))
        return found

    @staticmethod
    def _selected(obj: Obj, labels: Any, fields: Any) -> bool:
        meta_labels = obj.get("metadata", {}).get("labels") or {}
        return _matches(labels, meta_labels) and _matches(fields, _Fields(obj))

    async def _serve_list(self, request: kmock.Request) -> Any:
        if request.resource not in self.resources and not self._select(request):
            raise k8s.KubernetesResourceNotFoundError()
        token = request.params.get("continue")
        version_asked = request.params.get("resourceVersion") or ""
        exact = request.params.get("resourceVersionMatch") == "Exact" or (
            request.params.get("limit") and not request.params.get("resourceVersionMatch")
        )
        if exact and version_asked not in ("", "0") and int(version_asked) < self.faults.compacted:
            raise Gone("The resourceVersion for the provided list is too old.")
        if token:
            if token not in self._pages:
                raise Gone("The provided continue parameter is too old or invalid")
            version, items = self._pages.pop(token)
        else:
            async with self._lock:
                found = sorted(self._select(request), key=lambda ko: (ko[0][1] or "", ko[0][2]))
                items = [copy.deepcopy(obj) for _, obj in found]
                version = str(self._revision)
        meta: Obj = {"resourceVersion": version}
        limit = int(request.params.get("limit") or 0)
        if 0 < limit < len(items):
            items, rest = items[:limit], items[limit:]
            token = secrets.token_urlsafe(12)
            self._pages[token] = (version, rest)
            meta["continue"] = token
            if not request.params.get("labelSelector") and not request.params.get("fieldSelector"):
                meta["remainingItemCount"] = len(rest)
        info = self._info(request.resource)
        kind = f"{info.kind}List" if info is not None and info.kind else "List"
        return {"kind": kind, "metadata": meta, "items": items}

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""  # send the headers at once, as a real server does
        since = request.params.get("resourceVersion") or "0"
        timeout = request.params.get("timeoutSeconds")
        deadline = None if timeout is None else asyncio.get_running_loop().time() + float(timeout)
        labels = _selector(request.params.get("labelSelector"))
        fields = _selector(request.params.get("fieldSelector"))
        bus = self._buses[request.resource]
        async with self._lock:  # writers hold the lock too: nothing slips between the two
            if since == "0":
                backlog = [{"type": "ADDED", "object": obj} for _, obj in self._select(request)]
            else:
                history = self._history[request.resource]
                oldest = history[0][0] if history else self._revision + 1
                if int(since) < oldest - 1 and len(history) == history.maxlen:
                    raise Gone(f"too old resource version: {since} ({oldest - 1})")
                if int(since) < self.faults.compacted:
                    raise Gone(f"too old resource version: {since} ({self.faults.compacted})")
                backlog = [event for rv, event in history if rv > int(since)]
            mark = await bus.mark()
            self.open_watches += 1
        end: tuple[int, Exception] | None = None  # events still to send, then the ERROR
        pending: asyncio.Future[Any] | None = None  # the next event, awaited

        def ending() -> tuple[int, Exception] | None:
            """An injected 410 ends this watch: one matched when it began or since."""
            if end is not None:
                return end
            return self.faults.watch_end(request, self._revision)

        try:
            stream = bus.stream(since=mark)
            end = ending()
            for event in backlog:
                if (end := ending()) is not None and end[0] <= 0:
                    raise end[1]
                if self._event_selected(request, event, labels, fields):
                    yield event
                    end = None if end is None else (end[0] - 1, end[1])
            loop = asyncio.get_running_loop()
            while deadline is None or loop.time() < deadline:
                if end is not None and end[0] <= 0:
                    raise end[1]
                left = _WATCH_POLL_S if deadline is None else deadline - loop.time()
                pending = pending or asyncio.ensure_future(anext(stream))
                await asyncio.wait({pending}, timeout=max(min(left, _WATCH_POLL_S), 0))
                if not pending.done():
                    if _disconnected(request):  # the client went away: the watch ends
                        return
                    continue
                event, pending = pending.result(), None
                if (end := ending()) is not None and end[0] <= 0:
                    raise end[1]
                if self._event_selected(request, event, labels, fields):
                    yield event
                    end = None if end is None else (end[0] - 1, end[1])
        finally:
            if pending is not None:
                pending.cancel()
            self.open_watches -= 1
            await bus.unmark(mark)

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        async with self._lock:
            obj = self._live((request.resource, request.namespace, request.name))
        if obj is None:
            raise kmock.KubernetesObjectNotFoundError()
        return obj

    def _event_selected(self, request: kmock.Request, event: Obj, labels: Any, fields: Any) -> bool:
        meta = event["object"].get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        return self._selected(event["object"], labels, fields)


def _status(
    code: int, reason: str, message: str, details: Obj | None = None
) -> aiohttp.web.Response:
    """A ``Status`` as kube-apiserver writes a failure (``details`` omitted when empty)."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body.update(message=message, reason=reason)
    if details:
        body["details"] = details
    body["code"] = code
    return aiohttp.web.json_response(body, status=code)


def _forbidden(username: str, call: rbac.Call, reason: str) -> aiohttp.web.Response:
    """403 as ``responsewriters.Forbidden`` writes it (k8s.io/apiserver
    pkg/endpoints/handlers/responsewriters/errors.go ``forbiddenMessage``, then
    ``apierrors.NewForbidden``): ``pods "p1" is forbidden: User "..." cannot get
    resource "pods" in API group "" in the namespace "ns"``, the resource qualified by
    its group (``leases.coordination.k8s.io``), subresources as ``pods/binding``,
    ``at the cluster scope`` without a namespace, the authorizer's reason after a
    colon; ``details`` name the object, the plural (``kind``) and the group."""
    plural = call.resource.split("/")[0]
    namespace = call.namespace
    if namespace is None and plural == "namespaces" and call.name:
        namespace = call.name  # the request-info resolver's namespace of a namespace
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    said = (
        f'User "{username}" cannot {call.verb} resource "{call.resource}" in API group '
        f'"{call.group}" {where}'
    )
    if reason:
        said = f"{said}: {reason}"
    qualified = f"{plural}.{call.group}" if call.group else plural
    subject = f'{qualified} "{call.name}"' if call.name else qualified
    details: Obj = {"name": call.name} if call.name else {}
    if call.group:
        details["group"] = call.group
    details["kind"] = plural
    return _status(403, "Forbidden", f"{subject} is forbidden: {said}", details)


def _not_found(plural: str, name: str) -> kmock.KubernetesError:
    """``apierrors.NewNotFound`` of a core resource's object."""
    return kmock.KubernetesError(
        status=404,
        reason="NotFound",
        message=f'{plural} "{name}" not found',
        details={"name": name, "kind": plural},
    )


def _header(request: kmock.Request, name: str) -> str:
    """A request header by name, in any case (kmock keeps them as sent)."""
    wanted = name.lower()
    for key, value in request.headers.items():
        if key.lower() == wanted:
            return str(value)
    return ""


def _is_rbac(resource: Any) -> bool:
    return getattr(resource, "group", None) == RBAC_GROUP


def _is_core(resource: Any, plural: str) -> bool:
    return not getattr(resource, "group", None) and getattr(resource, "plural", None) == plural


def _core(plural: str) -> Any:
    """The key resource of a core (``v1``) plural, as a request's path gives it."""
    return kmock.resource(group="", version="v1", plural=plural)


def dump(obj: Any) -> str:
    """Compact JSON for assertion messages."""
    return json.dumps(obj, sort_keys=True, default=str)


def _extended_resource_tolerations(pod: Obj) -> None:
    """``ExtendedResourceToleration``: for each extended resource a container requests
    (a domain-qualified name outside ``kubernetes.io``: ``IsExtendedResourceName``),
    the toleration ``{key: NAME, operator: Exists, effect: NoSchedule}`` unless the pod
    has it already."""
    spec = pod.setdefault("spec", {})
    names: set[str] = set()
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = (c or {}).get("resources") or {}
        for part in ("requests", "limits"):  # limits default the requests of these
            for name in resources.get(part) or {}:
                domain = str(name).split("/")[0] if "/" in str(name) else ""
                if (
                    domain
                    and not domain.endswith("kubernetes.io")
                    and not name.startswith("requests.")
                ):
                    names.add(str(name))
    tolerations = list(spec.get("tolerations") or [])
    for name in sorted(names):
        wanted = {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        if wanted not in tolerations:
            tolerations.append(wanted)
    if tolerations:
        spec["tolerations"] = tolerations
