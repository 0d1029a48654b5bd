"""The FastAPI app: kube-scheduler's three verbs, health, version and metrics.

A 500 would leave every pod of the scheduler Pending, so the verbs never give
one: ``_VerbRoute`` turns any exception raised while decoding or deciding
into ``VerbFailed``, and the one exception handler answers it with 200 and
the verb's own error shape (``Error`` for filter and bind; for prioritize,
whose ``HostPriorityList`` has no error field, an empty list, which means "no
opinion" to the scheduler).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from powerflow import __version__
from powerflow.errors import PowerFlowError

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
    dump,
    encode,
)

log = logging.getLogger(__name__)

VERBS = {"/filter": "filter", "/prioritize": "prioritize", "/bind": "bind"}


class VerbFailed(Exception):
    """A verb could not be answered; carries the verb and a one-line reason."""

    def __init__(self, verb: str, reason: str) -> None:
        super().__init__(reason)
        self.verb, self.reason = verb, reason


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
    if isinstance(exc, PowerFlowError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


_EXPECTED = (PowerFlowError, RequestValidationError, HTTPException)
"""Failures that are answers (bad input, undecidable); anything else is logged as a bug."""


class _VerbRoute(APIRoute):
    """Times each verb and turns every failure into ``VerbFailed`` (see the module doc)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        verb = VERBS[self.path]

        async def timed(request: Request) -> Response:
            metrics: Metrics = request.app.state.extender.metrics
            start = time.perf_counter()
            try:
                response = await handler(request)
            except Exception as exc:
                metrics.requests.labels(verb, "error").inc()
                if not isinstance(exc, _EXPECTED):
                    log.exception("%s failed", verb)
                raise VerbFailed(verb, _reason(exc)) from exc
            finally:
                metrics.latency.labels(verb).observe(time.perf_counter() - start)
            metrics.requests.labels(verb, "ok").inc()
            return response

        return timed


async def _answer_failure(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, VerbFailed)
    log.info("%s answered with Error: %s", exc.verb, exc.reason)
    if exc.verb == "filter":
        return JSONResponse(dump(ExtenderFilterResult(Error=exc.reason)))
    if exc.verb == "bind":
        return JSONResponse(dump(ExtenderBindingResult(Error=exc.reason)))
    header = exc.reason[:200].encode("ascii", "replace").decode()
    return JSONResponse([], headers={"X-PowerFlow-Error": header})


_ARGS_SCHEMA = ExtenderArgs.model_json_schema(ref_template="#/components/schemas/{model}")
_ARGS_SCHEMA.pop("$defs", None)  # NodeList is in the components through ExtenderFilterResult
_ARGS_BODY = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _ARGS_SCHEMA}}}
}


async def _args(request: Request) -> ExtenderArgs:
    return decode_args(await request.body(), request.headers.get("content-type"))


def _json(answer: Any) -> Response:
    return Response(encode(answer), media_type="application/json")


def create_app(
    api: KubeApi | None = None,
    *,
    kubeconfig: str | None = None,
    in_cluster: bool = False,
    connect: bool = True,
    reservation_ttl_s: float = 120.0,
    clock: Callable[[], float] | None = None,
    state: ClusterState | None = None,
) -> FastAPI:
    """Build the extender app.

    ``api`` is used as given; otherwise, with ``connect``, the kubeconfig (or
    in-cluster account) is read, and when that fails the app still starts, not
    ready, saying why. The cluster mirror runs in the app's lifespan (or call
    ``app.state.extender.start()`` yourself where no lifespan runs).
    """
    state = state or ClusterState(ttl_s=reservation_ttl_s, clock=clock)
    if api is None and connect:
        try:
            api = KubeApi(load_connection(kubeconfig, in_cluster))
        except ApiUnreachable as exc:
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

    verbs = APIRouter(route_class=_VerbRoute)

    # Filter and prioritize read the raw body (``wire.decode_args``) and write
    # their answers with ``wire.encode``: on kube-scheduler's critical path,
    # FastAPI's body validation and the stdlib encoder cost more than the
    # decision. The OpenAPI schema still documents ``ExtenderArgs``.
    @verbs.post("/filter", response_model=ExtenderFilterResult, openapi_extra=_ARGS_BODY)
    async def filter_(request: Request) -> Response:
        return _json(extender.filter(await _args(request)))

    @verbs.post("/prioritize", response_model=list[HostPriority], openapi_extra=_ARGS_BODY)
    async def prioritize(request: Request) -> Response:
        answer = extender.prioritize(await _args(request))
        return Response(answer, media_type="application/json")

    @verbs.post("/bind", response_model=ExtenderBindingResult)
    async def bind(args: ExtenderBindingArgs) -> Response:
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
