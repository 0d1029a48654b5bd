"""The agent's endpoint for the worker library: iteration reports over HTTP.

Workers on this node POST ``contract.ITERATIONS_PATH`` at iteration
boundaries (``powerflow.worker``). HTTP on a hostPort, not a unix socket on a
hostPath: Pod Security "baseline" and "restricted" refuse hostPath volumes in
user pods, while HTTP needs nothing in the pod but env from the downward API.

Anything on the node (or the pod network) can reach the port, so the body is
treated as hostile: its size is bounded before it is read, every field is
type- and size-checked, and a refusal is a 4xx with one line saying why,
never a 5xx. Whether the pod may report at all (a PowerFlow pod bound here,
its UID matching) is the handler's decision (``Telemetry.report``): it
returns None to accept, or the reason to refuse; a ``Refusal`` carries its
HTTP status (``UnknownPod``: 404, the agent has not seen that pod, perhaps
not yet; anything else 409). Unknown fields are ignored, so a worker library
newer than the agent still reports.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from powerflow.core import contract, untrusted

log = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 4096
"""A report is ~200 bytes; a few KiB leaves room for 16 GPU UUIDs."""
MAX_GPU_UUIDS: Final = 16
MAX_UUID_CHARS: Final = 128
MAX_ITERATIONS: Final = 1 << 53
"""Counts stay exact in a JSON double (what any sender's JSON library keeps)."""

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9-]{1,128}$")
_GPU_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}$")


@dataclass(frozen=True)
class IterationReport:
    """One worker's report: its pod finished ``iterations`` iterations so far."""

    namespace: str
    pod: str
    uid: str
    iterations: int
    gpu_uuids: tuple[str, ...]
    """The GPUs the worker sees (its ``NVIDIA_VISIBLE_DEVICES``); may be empty."""
    received_s: float
    """When the agent received it (the endpoint's clock)."""


class Refusal(str):
    """A reason to refuse a report, with the HTTP status the endpoint answers."""

    status: int = 409


class UnknownPod(Refusal):
    """The agent knows no PowerFlow pod of that name on its node (yet)."""

    status = 404


class ReportError(ValueError):
    """A body that is not a valid report; the message names the field."""


def parse_report(obj: object, received_s: float) -> IterationReport:
    """Validate a decoded body (``contract.ITERATIONS_PATH``'s docstring)."""
    if not isinstance(obj, dict):
        raise ReportError("body: expected a JSON object")
    namespace = _text(obj.get("namespace"), "namespace", _NAMESPACE)
    pod = _text(obj.get("pod"), "pod", _POD)
    uid = _text(obj.get("uid"), "uid", _UID)
    iterations = obj.get("iterations")
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise ReportError(f"iterations: expected an integer, got {iterations!r:.40}")
    if not 0 <= iterations <= MAX_ITERATIONS:
        raise ReportError(f"iterations: {iterations} outside [0, 2**53]")
    raw = obj.get("gpuUuids")
    uuids: tuple[str, ...] = ()
    if raw is not None:
        if not isinstance(raw, list) or len(raw) > MAX_GPU_UUIDS:
            raise ReportError(f"gpuUuids: expected a list of at most {MAX_GPU_UUIDS} strings")
        uuids = tuple(_text(u, f"gpuUuids[{i}]", _GPU_UUID) for i, u in enumerate(raw))
    return IterationReport(namespace, pod, uid, iterations, uuids, received_s)


def _text(value: object, where: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ReportError(f"{where}: invalid value {value!r:.80}")
    return value


HEALTH_PATH = "/healthz"
"""The agent's liveness endpoint, beside the worker endpoint (the chart's probe)."""
READY_PATH = "/readyz"
"""The agent's readiness endpoint: 200 once it has applied the node's settings (a pass
after the first LISTs), 503 before; the chart's readiness probe, so that a rolling
update waits for each node's clocks before it moves on."""


def worker_app(
    handler: Callable[[IterationReport], str | None],
    *,
    clock: Callable[[], float] = time.time,
    ready: Callable[[], bool] = lambda: True,
) -> web.Application:
    """The aiohttp application serving ``contract.ITERATIONS_PATH``.

    ``handler`` runs on the event loop for every valid report, so it must be
    quick (``Telemetry.report`` is). 204 when it accepts, its ``Refusal``
    status (409 for a plain string) with the reason as text otherwise.
    """

    async def post(request: web.Request) -> web.StreamResponse:
        received_s = clock()
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            return _refuse(413, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
        raw = bytearray()
        while len(raw) <= MAX_BODY_BYTES:  # read() returns what has arrived, not all
            chunk = await request.content.read(MAX_BODY_BYTES + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return _refuse(413, f"body exceeds {MAX_BODY_BYTES} bytes")
        try:
            report = parse_report(untrusted.load_json(bytes(raw), "body"), received_s)
        except (ReportError, untrusted.UntrustedTextError) as e:
            return _refuse(400, str(e))
        reason = handler(report)
        if reason is None:
            return web.Response(status=204)
        return _refuse(getattr(reason, "status", 409), str(reason))

    async def healthz(request: web.Request) -> web.StreamResponse:
        # Answered on the agent's event loop, where its passes run: a loop wedged
        # in a pass (a hung NVML or API call) answers nothing, and the kubelet's
        # liveness probe restarts the agent, which restores the GPUs' defaults.
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(contract.ITERATIONS_PATH, post)

    async def readyz(request: web.Request) -> web.StreamResponse:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="the node's settings are not applied yet")

    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_get(READY_PATH, readyz)
    return app


def _refuse(status: int, reason: str) -> web.Response:
    log.debug("iteration report refused (%d): %s", status, reason)
    return web.Response(status=status, text=reason[:500])


def report_body(report: IterationReport) -> dict[str, Any]:
    """The JSON body a worker sends for ``report`` (the inverse of ``parse_report``)."""
    body: dict[str, Any] = {
        "namespace": report.namespace,
        "pod": report.pod,
        "uid": report.uid,
        "iterations": report.iterations,
    }
    if report.gpu_uuids:
        body["gpuUuids"] = list(report.gpu_uuids)
    return body
