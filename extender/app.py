"""The FastAPI app: kube-scheduler's three verbs, health, version and metrics.

A 500 would leave every pod of the scheduler Pending, so the verbs never give
one: ``_VerbRoute`` turns any exception raised while decoding or deciding
into ``VerbFailed``, and the one exception handler answers it with 200 and
the verb's own error shape (``Error`` for filter and bind; for prioritize,
whose ``HostPriorityList`` has no error field, an empty list, which means "no
opinion" to the scheduler). Two other statuses: 413, for a body over the size
limit, refused before it is read (``BodyBudget.body``), and 503 with ``Retry-After``
while the large bodies being read and handled already hold
``max_bodies_in_flight`` bytes (``BodyBudget``: each body, once decoded, takes
several times its size, so 16 concurrent 4 MiB bodies would take the extender
near its 1 GiB limit; kube-scheduler calls an extender for one pod at a time, and
its usual calls are small, never counted), and 408 for a body that takes over
``BODY_READ_S`` to arrive. Bodies too big to decode in a moment are
decoded, and their answers written, on a worker thread, so health probes and
binds are not held up (``OFFLOAD_BYTES``). Filter and prioritize, called
thousands of times a second, are served ahead of FastAPI's router by the same
handlers (``_ShortPath``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from powerflow import __version__
from powerflow.core.errors import PowerFlowError

from .kube import ApiUnreachable, KubeApi, load_connection
from .metrics import Metrics
from .service import Extender
from .state import ClusterState
from .wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    decode_args,
    decode_binding_args,
    dump,
    encode,
    encode_filter,
    encode_priorities,
)

log = logging.getLogger(__name__)

VERBS = {"/filter": "filter", "/prioritize": "prioritize", "/bind": "bind"}


MAX_BODY_BYTES = 4 << 20
"""The default limit on a verb's request body (``powerflow extender --max-body-bytes``).

With ``nodeCacheCapable: true`` (as shipped) kube-scheduler sends the pod and
the candidates' names: a pod is at most 1.5 MiB (etcd's default request limit,
which every stored object obeys) and 5,000 nodes (Kubernetes' largest
supported cluster) with names of at most 253 bytes take 5,000 x 256 bytes of
JSON = 1.22 MiB: 2.7 MiB in all, so 4 MiB leaves room. Sending whole
NodeLists (``nodeCacheCapable: false``, about 2 kB per node) fits up to about
2,000 nodes; raise the limit for more.
"""

MAX_BODIES_IN_FLIGHT = 16 << 20
"""Bytes of request bodies read or being handled at once (``BodyBudget``): four bodies at
the default size limit."""


@dataclass(frozen=True)
class BodyLimits:
    """How much request body the verbs take: one body of at most ``max_body_bytes``
    (413 past it), and large bodies of at most ``max_bodies_in_flight`` bytes read or
    handled at once (503 past it; ``BodyBudget``)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_bodies_in_flight: int = MAX_BODIES_IN_FLIGHT


DEFAULT_LIMITS: Final = BodyLimits()

OFFLOAD_BYTES = 256 << 10
"""Bodies larger than this are decoded and answers written on a worker thread, so that the
event loop (health probes, the watch, binds) keeps running meanwhile. kube-scheduler's
usual calls (names of a few thousand nodes) stay below it and skip the thread hop."""


class VerbFailed(Exception):
    """A verb could not be answered; carries the verb, a one-line reason and the status."""

    def __init__(self, verb: str, reason: str, status: int = 200) -> None:
        super().__init__(reason)
        self.verb, self.reason, self.status = verb, reason, status


class BodyTooLarge(PowerFlowError):
    """The request body is over the limit; answered 413 without reading (the rest of) it."""


class Busy(PowerFlowError):
    """The bodies in flight hold the budget; answered 503 with ``Retry-After``."""


class BodyTimeout(PowerFlowError):
    """A body that did not arrive in time; answered 408."""


BODY_READ_S = 30.0
"""How long a request body may take to arrive (``BodyBudget``): kube-scheduler sends
a few MiB at most, over the pod's loopback."""


class BodyBudget:
    """The bytes of large request bodies in flight (read, or held while their verb runs):
    at most ``max_bytes`` (module docstring). A body of at most ``OFFLOAD_BYTES`` (the
    scheduler's usual call) is never counted nor refused; a larger one is counted from
    its first byte (its ``Content-Length``, else as it arrives: a connection that sent
    headers and nothing holds nothing), and must arrive within ``BODY_READ_S``
    (``BodyTimeout``), so a client that stalls cannot hold the budget. One event loop:
    no lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def _take(self, wanted: int) -> None:
        if self.held + wanted > self.max_bytes:
            raise Busy(
                f"busy: {self.held} bytes of request bodies in flight, at most "
                f"{self.max_bytes}; retry"
            )
        self.held += wanted

    @asynccontextmanager
    async def body(self, request: Request, limit: int) -> AsyncIterator[bytes]:
        """The request body, its bytes held until the block ends: over ``limit`` it is
        ``BodyTooLarge``, refused from ``Content-Length`` before anything is read, else
        while it streams in; past the budget it is ``Busy`` the same way."""
        taken = 0
        try:
            length = request.headers.get("content-length", "")
            declared = int(length) if length.isdigit() else None
            if declared is not None and declared > limit:
                raise BodyTooLarge(
                    f"the request body of {declared} bytes is over the {limit}-byte limit"
                )
            chunks: list[bytes] = []
            size = 0
            try:
                async with asyncio.timeout(BODY_READ_S):
                    async for chunk in request.stream():
                        size += len(chunk)
                        if size > limit:
                            raise BodyTooLarge(f"the request body is over the {limit}-byte limit")
                        counted = max(size, declared or 0)
                        if counted > OFFLOAD_BYTES and counted > taken and chunk:
                            self._take(counted - taken)
                            taken = counted
                        chunks.append(chunk)
            except TimeoutError:
                raise BodyTimeout(
                    f"the request body did not arrive within {BODY_READ_S:g} s"
                ) from None
            yield b"".join(chunks)
        finally:
            self.held -= taken


def _reason(exc: Exception) -> str:
    if isinstance(exc, RequestValidationError):
        parts = []
        for err in exc.errors()[:3]:
            if err.get("type") == "json_invalid":
                parts.append("the body is not valid JSON")
                continue
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return "cannot decode the request: " + "; ".join(parts)
    if isinstance(exc, HTTPException):
        return f"cannot decode the request: {exc.detail}"
    if isinstance(exc, ClientDisconnect):
        return "cannot decode the request: the client went away before sending the whole body"
    if isinstance(exc, PowerFlowError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


_STATUS: dict[type[Exception], int] = {BodyTooLarge: 413, Busy: 503, BodyTimeout: 408}
"""The verbs' answers that are not 200 (module docstring)."""
_EXPECTED = (PowerFlowError, RequestValidationError, HTTPException, ClientDisconnect)
"""Failures that are answers (bad input, undecidable, a body cut short: its answer reaches
nobody); anything else is logged as a bug."""


class _VerbRoute(APIRoute):
    """Times each verb and turns every failure into ``VerbFailed`` (see the module doc)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return _timed(VERBS[self.path], super().get_route_handler())


def _timed(
    verb: str, handler: Callable[[Request], Coroutine[Any, Any, Response]]
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """``handler`` timed and counted, every failure a ``VerbFailed``."""

    async def timed(request: Request) -> Response:
        metrics: Metrics = request.app.state.extender.metrics
        start = time.perf_counter()
        try:
            response = await handler(request)
        except Exception as exc:
            metrics.requests.labels(verb, "error").inc()
            if not isinstance(exc, _EXPECTED):
                log.exception("%s failed", verb)
            status = _STATUS.get(type(exc), 200)
            raise VerbFailed(verb, _reason(exc), status) from exc
        finally:
            metrics.latency.labels(verb).observe(time.perf_counter() - start)
        metrics.requests.labels(verb, "ok").inc()
        return response

    return timed


class _ShortPath:
    """Serves ``POST /filter`` and ``/prioritize`` ahead of the router: the same handlers,
    timing and failure answers as their routes (which stay, for the OpenAPI schema and
    any other method), without FastAPI's routing and dependency machinery, which cost as
    much server CPU as deciding and writing a prioritize answer at 5,000 nodes."""

    def __init__(
        self,
        app: ASGIApp,
        verbs: Mapping[str, Callable[[Request], Coroutine[Any, Any, Response]]],
    ) -> None:
        self.app = app
        self.verbs = verbs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except VerbFailed as exc:
            response = await _answer_failure(request, exc)
        await response(scope, receive, send)


async def _answer_failure(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, VerbFailed)
    log.info("%s answered with Error: %s", exc.verb, exc.reason)
    retry = {"Retry-After": "1"} if exc.status == 503 else {}
    if exc.verb == "filter":
        return Response(
            encode(dump(ExtenderFilterResult(Error=exc.reason))), exc.status, retry, JSON
        )
    if exc.verb == "bind":
        return Response(
            encode(dump(ExtenderBindingResult(Error=exc.reason))), exc.status, retry, JSON
        )
    # A header value is printable ASCII: the reason may quote a request's control characters.
    header = "".join(c if " " <= c <= "~" else "?" for c in exc.reason[:200])
    return Response(b"[]", exc.status, {"X-PowerFlow-Error": header, **retry}, JSON)


JSON = "application/json"


_ARGS_SCHEMA = ExtenderArgs.model_json_schema(ref_template="#/components/schemas/{model}")
_ARGS_SCHEMA.pop("$defs", None)  # NodeList is in the components through ExtenderFilterResult
_ARGS_BODY = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _ARGS_SCHEMA}}}
}


async def _off_loop(big: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on a worker thread when the request is big (``OFFLOAD_BYTES``)."""
    return await asyncio.to_thread(fn, *args) if big else fn(*args)


T = TypeVar("T")


def create_app(
    api: KubeApi | None = None,
    *,
    kubeconfig: str | None = None,
    in_cluster: bool = False,
    connect: bool = True,
    state: ClusterState | None = None,
    limits: BodyLimits = DEFAULT_LIMITS,
) -> FastAPI:
    """Build the extender app.

    ``api`` is used as given; otherwise, with ``connect``, the kubeconfig (or
    in-cluster account) is read, and when that fails the app still starts, not
    ready, saying why. The cluster mirror runs in the app's lifespan (or call
    ``app.state.extender.start()`` yourself where no lifespan runs).
    ``state`` holds the reservations' TTL, the clock and the node taints
    PowerFlow's pools accept (``--reservation-ttl``, ``--tolerate``); by default
    a ``ClusterState()`` with its defaults.
    """
    state = state or ClusterState()
    max_body_bytes = limits.max_body_bytes
    if api is None and connect:
        try:
            api = KubeApi(load_connection(kubeconfig, in_cluster))
        except ApiUnreachable as exc:
            log.error("not ready: %s", exc)
            state.mark_unsynced(str(exc))
    elif api is None:
        state.mark_unsynced("no Kubernetes API configured")
    extender = Extender(state, api, Metrics(state.gauges))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await extender.start()
        try:
            yield
        finally:
            await extender.stop()

    app = FastAPI(
        title="PowerFlow scheduler extender",
        version=__version__,
        lifespan=lifespan,
        exception_handlers={VerbFailed: _answer_failure},
    )
    app.state.extender = extender
    bodies = app.state.bodies = BodyBudget(max(limits.max_bodies_in_flight, max_body_bytes))

    verbs = APIRouter(route_class=_VerbRoute)
    short: dict[str, Callable[[Request], Coroutine[Any, Any, Response]]] = {}

    # Filter and prioritize read the raw body (``wire.decode_args``) and write
    # their answers with ``wire.encode_filter`` and ``encode_priorities``: on
    # kube-scheduler's critical path, FastAPI's body validation and the stdlib
    # encoder cost more than the decision. The OpenAPI schema still documents
    # ``ExtenderArgs``.
    @verbs.post("/filter", response_model=ExtenderFilterResult, openapi_extra=_ARGS_BODY)
    async def filter_(request: Request) -> Response:
        async with bodies.body(request, max_body_bytes) as raw:
            big = len(raw) > OFFLOAD_BYTES
            args = await _off_loop(big, decode_args, raw, request.headers.get("content-type"))
            answer = extender.filter(args)
            return Response(await _off_loop(big, encode_filter, answer), media_type=JSON)

    @verbs.post("/prioritize", response_model=list[HostPriority], openapi_extra=_ARGS_BODY)
    async def prioritize(request: Request) -> Response:
        async with bodies.body(request, max_body_bytes) as raw:
            big = len(raw) > OFFLOAD_BYTES
            args = await _off_loop(big, decode_args, raw, request.headers.get("content-type"))
            hosts, scores = extender.priorities(args)
            return Response(await _off_loop(big, encode_priorities, hosts, scores), media_type=JSON)

    short["/filter"] = _timed("filter", filter_)
    short["/prioritize"] = _timed("prioritize", prioritize)
    app.add_middleware(_ShortPath, verbs=short)

    @verbs.post(
        "/bind",
        response_model=ExtenderBindingResult,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": ExtenderBindingArgs.model_json_schema()}
                },
            }
        },
    )
    async def bind(request: Request) -> Response:
        async with bodies.body(request, max_body_bytes) as raw:
            args = decode_binding_args(raw, request.headers.get("content-type"))
        return JSONResponse(dump(await extender.bind(args)))

    app.include_router(verbs)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz")
    async def readyz() -> Response:
        ready, why = extender.ready()
        return JSONResponse({"ready": ready, "reason": why}, status_code=200 if ready else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"name": "powerflow-extender", "version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(extender.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
