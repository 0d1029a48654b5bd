"""Bad requests and big ones: a clear answer, never a traceback, a 500 or a blocked loop.

A wrong-typed ``status.phase``, a GPU limit of ``10**400``, JSON nested 10,000
deep and lone surrogates in names each get a refusal that says why, with no
traceback in the log; a body over the limit is refused before it is read whole,
and a big body is decoded off the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from extender_bodies import args, go_json, node, pod
from powerflow.extender import app as app_module
from powerflow.extender import create_app, wire
from powerflow.extender.app import BodyLimits
from powerflow.extender.candidates import LISTS_KEPT

from powerflow.core.contract import GPU_RESOURCE

JSON = {"Content-Type": "application/json"}
NODES = [node(f"gpu-{i}") for i in range(4)]


def client_of(**kw: Any) -> httpx.AsyncClient:
    app = create_app(connect=False, **kw)
    app.state.extender.state.replace(NODES, [])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ext")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_of() as c:
        yield c


def worker(**changes: Any) -> dict[str, Any]:
    body = pod("train-0", job="train", workers=4, namespace="ml")
    body["status"].update(changes)
    return body


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def with_gpus(raw_limit: str) -> bytes:
    """A filter body whose GPU limit is written verbatim (a JSON number or string)."""
    text = go_json(args(worker(), NODES, cache_capable=True)).decode()
    return text.replace(f'"{GPU_RESOURCE}":"1"', f'"{GPU_RESOURCE}":{raw_limit}').encode()


BAD_BODIES: dict[str, tuple[str, bytes, str]] = {
    "phase-list": (
        "/filter",
        go_json(args(worker(phase=["Running"]), NODES, cache_capable=True)),
        "",  # read as not terminal: placed as usual
    ),
    "phase-object": (
        "/prioritize",
        go_json(args(worker(phase={"a": 1}), NODES, cache_capable=True)),
        "",
    ),
    "gpus-int-10**400": ("/filter", with_gpus(str(10**400)), "power-of-two"),
    "gpus-str-10**400": ("/filter", with_gpus(f'"{10**400}"'), "power-of-two"),
    "nested-filter": ("/filter", f'{{"Pod": {deep(10_000)}}}'.encode(), "nested too deeply"),
    "nested-bind": ("/bind", f'{{"PodName": {deep(10_000)}}}'.encode(), "nested too deeply"),
    "nested-prioritize": ("/prioritize", deep(10_000).encode(), "nested too deeply"),
    "surrogate-names": (
        "/filter",
        b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": ["\\ud800", "gpu-0"]}',
        "",
    ),
    "surrogate-prioritize": (
        "/prioritize",
        b'{"Pod": {"metadata": {"name": "w"}}, "NodeNames": ["\\udfff", "gpu-1"]}',
        "",
    ),
    "surrogate-bind": (
        "/bind",
        b'{"PodName": "\\ud800", "PodNamespace": "ml", "PodUID": "u", "Node": "\\ud800"}',
        "PodName: '\\ud800' is not valid Unicode",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
async def test_bad_requests_get_a_clear_answer_without_a_traceback(
    client: httpx.AsyncClient, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    path, raw, error = BAD_BODIES[case]
    with caplog.at_level(logging.INFO):
        response = await client.post(path, content=raw, headers=JSON)
    assert response.status_code == 200
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    body = json.loads(response.content)
    if path == "/prioritize":
        reason = response.headers.get("x-powerflow-error", "")
        assert "internal error" not in reason and error in reason
        assert isinstance(body, list)
        return
    assert "internal error" not in body["Error"]
    assert error in body["Error"] if error else body["Error"] == ""


async def test_surrogate_names_come_back_as_the_same_escapes(client: httpx.AsyncClient) -> None:
    raw = BAD_BODIES["surrogate-names"][1]
    answer = json.loads((await client.post("/filter", content=raw, headers=JSON)).content)
    assert answer["NodeNames"] == ["\ud800", "gpu-0"]


async def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read() -> None:
    read: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            read.append(1)
            yield b" " * 1000

    async with client_of(limits=BodyLimits(max_body_bytes=10_000)) as c:
        small = go_json(args(worker(), NODES, cache_capable=True))
        assert len(small) < 10_000
        assert (await c.post("/filter", content=small, headers=JSON)).json()["Error"] == ""
        # Content-Length says it: refused without reading a byte of it.
        sized = await c.post("/filter", content=b" " * 10_001, headers=JSON)
        assert (
            sized.status_code == 413
            and "10001 bytes is over the 10000-byte limit" in (sized.json()["Error"])
        )
        # Chunked, no Content-Length: refused as soon as the count passes the limit.
        streamed = await c.post("/bind", content=chunks(), headers=JSON)
        assert (
            streamed.status_code == 413
            and "over the 10000-byte limit" in (streamed.json()["Error"])
        )
        assert len(read) <= 12
        prioritized = await c.post("/prioritize", content=b" " * 10_001, headers=JSON)
        assert prioritized.status_code == 413 and prioritized.json() == []


async def test_health_is_answered_while_a_big_request_decodes(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release, decoded = threading.Event(), threading.Event(), threading.Event()
    real = app_module.decode_args

    def slow_decode(raw: bytes, content_type: str | None = None) -> Any:
        started.set()
        release.wait(timeout=5)  # on the event loop this would hold up every other request
        decoded.set()
        return real(raw, content_type)

    monkeypatch.setattr(app_module, "decode_args", slow_decode)
    names = [f"node-{i:07d}" for i in range(app_module.OFFLOAD_BYTES // 10)]
    body = go_json({"Pod": pod("web"), "NodeNames": names})
    assert len(body) > app_module.OFFLOAD_BYTES
    call = asyncio.create_task(client.post("/prioritize", content=body, headers=JSON))
    while not started.is_set():
        await asyncio.sleep(0.01)
    health = await client.get("/healthz")
    answered_while_decoding = not decoded.is_set()
    release.set()
    scores = (await call).json()
    assert health.text == "ok" and answered_while_decoding
    assert len(scores) == len(names) and {s["Score"] for s in scores} == {0}


async def test_a_prioritize_error_header_holds_only_printable_ascii(
    client: httpx.AsyncClient,
) -> None:
    """The reason quotes the request (here a job label with a newline, a NUL and an é):
    uvicorn refuses to send a header value with control characters, which was a
    traceback and no answer."""
    body = pod("p", job="a\nb\x00\u00e9", workers=3)
    answer = await client.post(
        "/prioritize", content=go_json(args(body, NODES, cache_capable=True))
    )
    header = answer.headers["X-PowerFlow-Error"]
    assert answer.status_code == 200 and answer.json() == []
    assert "power-of-two" in header and all(" " <= c <= "~" for c in header), header


def test_prioritize_keeps_no_memory_of_the_names_it_was_sent() -> None:
    """30,000 names never seen before, 1,000 a call, as a churning cluster (or a client
    making names up) would send them: once the answers are gone, only the last few
    candidate lists (``NamesMemo``) are held, however many names went by."""
    app = create_app(connect=False)
    extender = app.state.extender
    extender.state.replace([], [])
    batches = [
        [f"node-{i:07d}.example" for i in range(k, k + 1000)] for k in range(0, 30_000, 1000)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        held = []
        for n, names in enumerate(batches):
            if n == LISTS_KEPT:  # the memo is full from here on
                gc.collect()
                held.append(tracemalloc.get_traced_memory()[0])
            args = wire.decode_args(go_json({"Pod": pod("web"), "NodeNames": names}))
            answer = wire.encode_priorities(*extender.priorities(args))
            assert json.loads(answer) == [{"Host": n, "Score": 0} for n in names]
            del answer, args
        gc.collect()
        held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert held[1] - held[0] <= 64 << 10


async def test_bodies_in_flight_are_bounded_and_the_rest_told_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 concurrent 3.9 MB bodies: each takes several times its size once decoded, so
    without a bound they approach the extender's 1 GiB limit. While the bodies being handled hold
    ``max_bodies_in_flight`` bytes, another is answered 503 with ``Retry-After`` (the
    verb's own error shape) without being read; health is answered meanwhile, and once
    the held ones finish, the budget is free again."""
    started, release = threading.Event(), threading.Event()
    real = app_module.decode_args
    decoding = [0]

    def slow_decode(raw: bytes, content_type: str | None = None) -> Any:
        decoding[0] += 1
        started.set()
        release.wait(timeout=10)
        return real(raw, content_type)

    monkeypatch.setattr(app_module, "decode_args", slow_decode)
    names = [f"node-{i:07d}" for i in range(3_900_000 // 14)]
    body = go_json({"Pod": pod("web"), "NodeNames": names})
    assert 3_800_000 < len(body) < app_module.MAX_BODY_BYTES
    budget = 4 * app_module.MAX_BODY_BYTES
    async with client_of(limits=BodyLimits(max_bodies_in_flight=budget)) as c:
        calls = [
            asyncio.create_task(c.post("/filter", content=body, headers=JSON)) for _ in range(16)
        ]
        while not started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # every call has been read or refused by now
        health = await asyncio.wait_for(c.get("/healthz"), 2)
        done = [t for t in calls if t.done()]
        release.set()
        answers = await asyncio.gather(*calls)
        assert health.text == "ok"
        busy = [a for a in answers if a.status_code == 503]
        assert len(busy) == len(done) == 16 - budget // len(body), [a.status_code for a in answers]
        assert decoding[0] == 16 - len(busy)  # the refused ones were never decoded
        for answer in busy:
            assert answer.headers["Retry-After"] == "1"
            assert answer.json()["Error"].startswith("busy: ")
        assert all(
            a.status_code == 200 and a.json()["Error"] == "" for a in answers if a not in busy
        )
        assert c._transport.app.state.bodies.held == 0  # type: ignore[attr-defined]
        again = await c.post("/filter", content=body, headers=JSON)
        assert again.status_code == 200


class StalledRequest:
    """A request whose headers announce ``length`` bytes and whose body comes after
    ``wait_s`` (as a client that sends headers and then stalls)."""

    def __init__(self, length: int, wait_s: float) -> None:
        self.headers = {"content-length": str(length)}
        self.length, self.wait_s = length, wait_s

    async def stream(self) -> AsyncIterator[bytes]:
        await asyncio.sleep(self.wait_s)
        yield b" " * self.length


async def test_a_stalled_client_holds_no_budget_and_small_bodies_always_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large body is counted from its first byte, not its headers: connections that
    announced 4 MiB and sent nothing hold nothing, and time out (408) after
    ``BODY_READ_S``; a body of at most ``OFFLOAD_BYTES`` (the scheduler's usual call) is
    never refused, even while large ones fill the budget."""
    monkeypatch.setattr(app_module, "BODY_READ_S", 0.5)
    budget = app_module.BodyBudget(4 << 20)
    big = app_module.MAX_BODY_BYTES

    async def read(request: StalledRequest) -> str:
        try:
            async with budget.body(request, big) as raw:  # type: ignore[arg-type]
                await asyncio.sleep(0.2)  # held while the verb runs
                return f"read {len(raw)}"
        except (app_module.Busy, app_module.BodyTimeout) as exc:
            return type(exc).__name__

    stalled = [asyncio.create_task(read(StalledRequest(big, 60))) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert budget.held == 0
    small = [read(StalledRequest(app_module.OFFLOAD_BYTES, 0)) for _ in range(3)]
    large = [read(StalledRequest(3 << 20, 0)) for _ in range(2)]
    outcomes = await asyncio.gather(*small, *large)
    assert outcomes[:3] == [f"read {app_module.OFFLOAD_BYTES}"] * 3
    assert sorted(outcomes[3:]) == ["Busy", f"read {3 << 20}"]  # the second is over 4 MiB
    assert await asyncio.gather(*stalled) == ["BodyTimeout"] * 4
    assert budget.held == 0


async def test_a_body_that_does_not_arrive_in_time_is_answered_408(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the app: a large body still arriving after ``BODY_READ_S`` gets 408 in the
    verb's own error shape, and frees what it held."""
    monkeypatch.setattr(app_module, "BODY_READ_S", 0.3)

    async def slow() -> AsyncIterator[bytes]:
        yield b" " * (app_module.OFFLOAD_BYTES + 1)
        await asyncio.sleep(2)
        yield b" "

    async with client_of() as c:
        answer = await c.post("/filter", content=slow(), headers=JSON)
        assert answer.status_code == 408
        assert "did not arrive within 0.3 s" in answer.json()["Error"]
        assert c._transport.app.state.bodies.held == 0  # type: ignore[attr-defined]


SHORT_PATH_CALLS = [
    ("/filter", go_json(args(worker(), NODES, cache_capable=True)), "application/json"),
    ("/prioritize", go_json(args(worker(), NODES, cache_capable=True)), "application/json"),
    ("/filter", go_json(args(pod("web"), NODES, cache_capable=True)), "application/json"),
    ("/filter", go_json(args(worker(), NODES, cache_capable=False)), "application/json"),
    ("/filter", b'{"Pod": {}, "NodeNames": ["a"', "application/json"),
    ("/prioritize", b'{"Pod": 3}', "application/json"),
    ("/filter", b'{"Pod": {}, "NodeNames": ["a"]}', "text/plain"),
    ("/filter", b"x" * 20_000, "application/json"),
    ("/prioritize", b"", "application/json"),
]
"""Answers, decodable or not, PowerFlow's pods and others', over the size limit."""
COUNTS = (
    "powerflow_extender_requests_total{",
    "powerflow_extender_request_duration_seconds_count{",
)


@pytest.mark.parametrize(("path", "body", "content_type"), SHORT_PATH_CALLS)
async def test_the_short_path_answers_as_the_routes_do(
    path: str, body: bytes, content_type: str
) -> None:
    """``_ShortPath`` serves the verbs ahead of the router; under a root path the router
    serves them itself: the same status, headers and bytes, counted the same way."""
    answers = []
    for root in ("", "/ext"):
        app = create_app(connect=False, limits=BodyLimits(max_body_bytes=10_000))
        app.state.extender.state.replace(NODES, [])
        transport = httpx.ASGITransport(app=app, root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://ext") as c:
            answer = await c.post(root + path, content=body, headers={"Content-Type": content_type})
        counted = app.state.extender.metrics.exposition().decode().splitlines()
        counts = [line for line in counted if line.startswith(COUNTS)]
        answers.append((answer.status_code, answer.content, dict(answer.headers), counts))
    assert answers[0][3] and answers[0] == answers[1]
