"""Who is posting samples: a bearer token checked with a ``TokenReview``, and the sender's node.

The node agents present their projected ServiceAccount token (audience
``contract.INGEST_AUDIENCE``). The operator does not verify the JWT itself:
it asks the API server (``authentication.k8s.io/v1`` ``TokenReview``, with
``spec.audiences: [INGEST_AUDIENCE]``) through its own client, the same
configuration kopf and the allocation loop use (``connection``). That needs
``create`` on ``tokenreviews`` in the operator's ClusterRole, and ``get`` on
``pods`` for the fallback below. A review passes only when it is
authenticated, names the agent's ServiceAccount (``--ingest-service-account``)
and its ``status.audiences`` contains ours (a server that ignores audiences
would return none: refused, as the API reference asks clients to check).

The sender's node: Kubernetes >= 1.30 puts it in the token
(``status.user.extra["authentication.kubernetes.io/node-name"]``); before
that, the token names its pod (``.../pod-name``, ``.../pod-uid``), and the
pod's ``spec.nodeName`` says the node (one GET; the pod must still have the
token's uid). Neither: refused, with why.

Passing reviews are cached for ``ttl_s`` (default 30 s, well under a
projected token's lifetime; a deleted pod's token stops passing within it),
keyed by the SHA-256 of the token (never the token), at most ``max_entries``
(least recently used go first). Refusals are not cached: a fixed token must
pass at once. Concurrent requests with one uncached token share one review,
and at most ``max_reviews`` reviews (with their pod GETs) are in flight at
once, so a flood of bad tokens cannot turn into a flood of API requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes
from powerflow.operator.kube import call_json

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
MAX_TOKEN_BYTES = 16 * 1024
"""Longer is no ServiceAccount token (they are a few hundred bytes to a few KiB)."""


@dataclass(frozen=True)
class Sender:
    """An authenticated agent: its account and the node it runs on."""

    username: str
    node: str


class Denied(Exception):
    """The token does not identify a node agent: 401 (not authenticated) or 403."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        """The ``powerflow_ingest_refused_total`` label."""
        self.message = message


class ReviewUnavailable(Exception):
    """The API server could not answer (down, throttling, RBAC missing): not the sender's
    fault, the agent retries later (503)."""


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer`` header, or ``Denied`` 401."""
    if not header:
        raise Denied(401, "unauthenticated", "no Authorization header")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Denied(401, "unauthenticated", "expected Authorization: Bearer <token>")
    if len(token) > MAX_TOKEN_BYTES or not token.isascii() or not token.isprintable():
        raise Denied(401, "unauthenticated", "not a bearer token")
    return token


class TokenReviewer:
    """``sender(token)``: the agent behind a token, or ``Denied``/``ReviewUnavailable``."""

    def __init__(
        self,
        api: Callable[[], kubernetes.client.ApiClient | None],
        audience: str,
        account: str,
        *,
        ttl_s: float = 30.0,
        max_entries: int = 4096,
        max_reviews: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.audience = audience
        self.account = account
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._cache: OrderedDict[bytes, tuple[float, Sender]] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[Sender]] = {}
        self._slots = asyncio.Semaphore(max_reviews)
        self.reviews = 0
        """TokenReviews sent (the cache's misses)."""
        self.in_flight = 0
        self.peak_in_flight = 0
        """Most reviews in flight at once (at most ``max_reviews``)."""

    async def sender(self, token: str) -> Sender:
        key = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(key)
        now = self._clock()
        if hit is not None:
            if hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
            del self._cache[key]
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Sender] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            async with self._slots:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    sender = await self._review(token)
                finally:
                    self.in_flight -= 1
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._inflight[key]
        future.set_result(sender)
        self._cache[key] = (self._clock() + self.ttl_s, sender)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return sender

    async def _review(self, token: str) -> Sender:
        api = self._api()
        if api is None:
            raise ReviewUnavailable("the operator's Kubernetes client is not ready")
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        self.reviews += 1
        auth = kubernetes.client.AuthenticationV1Api(api)
        review = await asyncio.to_thread(self._call, auth.create_token_review, body)
        status = _dict(review.get("status") if isinstance(review, dict) else None)
        if status.get("authenticated") is not True:
            why = str(status.get("error") or "not authenticated")
            raise Denied(401, "unauthenticated", f"token refused by the API server: {why}"[:300])
        if self.audience not in (status.get("audiences") or ()):
            raise Denied(401, "unauthenticated", f"token not issued for audience {self.audience}")
        user = _dict(status.get("user"))
        username = str(user.get("username") or "")
        if username != self.account:
            raise Denied(403, "wrong_account", f"{username or 'anonymous'} is not {self.account}")
        extra = _dict(user.get("extra"))
        node = _first(extra, NODE_NAME_EXTRA)
        if node:
            return Sender(username, node)
        pod = _first(extra, POD_NAME_EXTRA)
        if not pod:
            raise Denied(
                403, "no_node", "the token names neither a node nor a pod (not a projected token)"
            )
        namespace = username[len(SA_PREFIX) :].split(":", 1)[0]
        uid = _first(extra, POD_UID_EXTRA)
        return Sender(username, await self._pod_node(api, namespace, pod, uid))

    async def _pod_node(
        self, api: kubernetes.client.ApiClient, namespace: str, name: str, uid: str | None
    ) -> str:
        """The node of the token's pod (Kubernetes < 1.30 puts no node in the token)."""
        core = kubernetes.client.CoreV1Api(api)
        try:
            pod = await asyncio.to_thread(call_json, core.read_namespaced_pod, name, namespace)
        except kubernetes.client.ApiException as exc:
            where = f"pod {namespace}/{name}"
            if exc.status == 404:
                raise Denied(403, "no_node", f"{where} of the token is gone") from None
            raise ReviewUnavailable(f"GET {where}: {exc.status} {exc.reason}") from None
        except Exception as exc:  # connection errors of urllib3
            raise ReviewUnavailable(f"GET pod {namespace}/{name}: {exc}") from None
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise Denied(403, "no_node", f"pod {namespace}/{name} is not the token's pod")
        node = (pod.get("spec") or {}).get("nodeName")
        if not isinstance(node, str) or not node:
            raise Denied(403, "no_node", f"pod {namespace}/{name} of the token is not on a node")
        return node

    @staticmethod
    def _call(call: Callable[..., Any], body: dict[str, Any]) -> Any:
        try:
            return call_json(call, body)
        except kubernetes.client.ApiException as exc:
            raise ReviewUnavailable(
                f"TokenReview failed: {exc.status} {exc.reason} (the operator needs create "
                "on tokenreviews.authentication.k8s.io)"
                if exc.status == 403
                else f"TokenReview failed: {exc.status} {exc.reason}"
            ) from None
        except Exception as exc:  # connection errors of urllib3
            raise ReviewUnavailable(f"TokenReview failed: {exc}") from None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first(extra: dict[str, Any], key: str) -> str | None:
    """``extra`` values are lists of strings (``UserInfo.extra``)."""
    values = extra.get(key)
    if isinstance(values, list) and values and isinstance(values[0], str) and values[0]:
        return values[0]
    return None
