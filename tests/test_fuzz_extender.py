"""Every route of ``powerflow extender`` fuzzed: never a 5xx, never a hang.

10,000 requests a verb, 2,000 a page (``PAGE_CASES`` says why).

The extender runs as a user starts it (``python -m powerflow extender --kubeconfig FILE
--metrics-port PORT``, a subprocess), mirrors an emulated cluster (four 8-GPU nodes, a
bound gang, a pending one), and answers over real HTTP. Its verbs answer 200 with their
own error shape (``Error``; ``[]`` and ``X-PowerFlow-Error`` for prioritize) for anything
they cannot decide, since kube-scheduler treats a 5xx as "every pod Pending": each such
answer must be an error the extender meant, never the safety net's "internal error".
Bodies over the limit get 413 with ``Error``. The other routes (health, readiness,
version, metrics, the OpenAPI pages, and the metrics port) answer any method, query and
body with their page or a 4xx that says what was wrong.

Cases: ``support.fuzz`` (derandomized; ``CASES`` per endpoint). ``filter`` and
``prioritize`` take the same bodies, so one example posts to both.
"""

from __future__ import annotations

import asyncio
import functools
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from extender_bodies import args, binding_args, go_json, node, pod
from hypothesis import example, given
from hypothesis import strategies as st
from powerflow.extender import create_app
from powerflow.extender.app import MAX_BODY_BYTES
from powerflow.extender.wire import MAX_EXTENDER_PRIORITY, is_json
from support.extender_process import ExtenderProcess, create, extender_process
from support.fuzz import (
    CASES,
    CUT_SHORT,
    FUZZ_TIMEOUT,
    MALFORMED,
    NASTY,
    Answer,
    Http,
    Pipeline,
    Request,
    batch_of,
    batched,
    bodies,
    content_types,
    raw_status,
)
from support.kube_emulator import KubeEmulator
from support.operator_harness import write_kubeconfig

from powerflow.core.contract import (
    GENERATION_ANNOTATION,
    GPU_RESOURCE,
    JOB_LABEL,
    PLACEMENT_ANNOTATION,
    WORKER_INDEX_LABEL,
    WORKERS_ANNOTATION,
)

pytestmark = [pytest.mark.kmock(cls=KubeEmulator), FUZZ_TIMEOUT]

NODES = [f"gpu-{i}" for i in range(4)]
OLD = [pod(f"old-{i}", job="old", workers=4, generation="1", index=i) for i in range(4)]
NEW = [pod(f"new-{i}", job="new", workers=2, generation="1", index=i) for i in range(2)]
PLAIN = pod("plain", gpus=0)


@pytest.fixture
async def extender(kmock: KubeEmulator, tmp_path: Path) -> AsyncIterator[ExtenderProcess]:
    """``powerflow extender`` mirroring four nodes, a bound gang ``old`` and a pending gang
    ``new``; the test fails if its log holds a traceback."""
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for name in NODES:
            await create(api, "/api/v1/nodes", node(name))
        for body in (*OLD, *NEW, PLAIN):
            await create(api, "/api/v1/namespaces/default/pods", body)
        for body in OLD:
            binding = {"metadata": {"name": body["metadata"]["name"]},
                       "target": {"kind": "Node", "name": "gpu-0"}}  # fmt: skip
            path = f"/api/v1/namespaces/default/pods/{body['metadata']['name']}/binding"
            assert (await api.post(path, json=binding)).status_code == 201
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="t")
    async with extender_process(kubeconfig) as running:
        yield running
    assert " failed" not in running.output, running.output[-3000:]  # _VerbRoute's: a bug


async def fuzz(run: Any) -> None:
    """Run a hypothesis test in a worker thread: the emulator serves from this loop."""
    await asyncio.to_thread(run)


# -- filter and prioritize ------------------------------------------------------------------

_POD = ("Pod",)
_META, _SPEC = (*_POD, "metadata"), (*_POD, "spec")
_CONTAINER = (*_SPEC, "containers", 0)
_NODE0 = ("Nodes", "items", 0)
ARGS_PATHS: list[tuple[str | int, ...]] = [
    _POD, ("pod",), ("POD",), ("Nodes",), ("nodes",), ("NodeNames",), ("nodenames",), ("Extra",),
    _META, (*_META, "name"), (*_META, "namespace"), (*_META, "uid"), (*_META, "labels"),
    (*_META, "labels", JOB_LABEL), (*_META, "labels", WORKER_INDEX_LABEL),
    (*_META, "annotations"), (*_META, "annotations", WORKERS_ANNOTATION),
    (*_META, "annotations", GENERATION_ANNOTATION), (*_META, "annotations", PLACEMENT_ANNOTATION),
    _SPEC, (*_SPEC, "containers"), _CONTAINER, (*_CONTAINER, "resources"),
    (*_CONTAINER, "resources", "limits"), (*_CONTAINER, "resources", "limits", GPU_RESOURCE),
    (*_CONTAINER, "resources", "requests", GPU_RESOURCE), (*_SPEC, "nodeName"),
    (*_SPEC, "tolerations"), (*_SPEC, "tolerations", 0), (*_SPEC, "tolerations", 0, "key"),
    (*_SPEC, "tolerations", 0, "operator"), (*_SPEC, "tolerations", 0, "effect"),
    (*_SPEC, "tolerations", 0, "tolerationSeconds"), (*_SPEC, "schedulerName"),
    (*_POD, "status"), (*_POD, "status", "phase"),
    ("NodeNames", 0), ("NodeNames", 1), ("NodeNames", 3), ("Nodes", "items"), ("Nodes", "metadata"),
    _NODE0, (*_NODE0, "metadata"), (*_NODE0, "metadata", "name"), (*_NODE0, "spec"),
    (*_NODE0, "spec", "unschedulable"), (*_NODE0, "spec", "taints"), (*_NODE0, "status"),
    (*_NODE0, "status", "allocatable", GPU_RESOURCE), (*_NODE0, "status", "conditions"),
    ("Nodes", "items", 1, "metadata", "name"),
]  # fmt: skip
"""Every field of ``ExtenderArgs`` the extender reads, the objects around them, Go's
case-folded keys and an unknown key."""


NAME_SETS = [NODES, ["gpu-0"], ["gpu-1", "gpu-2"], ["gpu-3", "elsewhere"], ["elsewhere"]]
ARGS = [
    args(the_pod, [node(n) for n in names], cache_capable=cache_capable)
    for the_pod in (*NEW, OLD[0], PLAIN, pod("ghost", job="ghost", workers=8))
    for names in NAME_SETS
    for cache_capable in (True, False)
]
"""``ExtenderArgs`` as kube-scheduler sends them, in either cache mode, for one of the
cluster's pods (pending gang, bound gang, no GPUs) or one it does not know."""


def check_filter(answer: Answer, content_type: str | None) -> str:
    """The answer is ``ExtenderFilterResult``; its ``Error`` (empty or a meant one)."""
    assert answer.status == 200, answer
    assert answer.headers["content-type"] == "application/json", answer
    body = answer.json()
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                         "Error"}, answer  # fmt: skip
    error = body["Error"]
    assert isinstance(error, str) and not error.startswith("internal error"), answer
    if not is_json(content_type):
        assert error.startswith("cannot decode the request: the body is not JSON"), answer
    return error


def check_prioritize(answer: Answer, content_type: str | None) -> str:
    """The answer is a ``HostPriorityList``; the reason in ``X-PowerFlow-Error``, if any."""
    assert answer.status == 200, answer
    assert answer.headers["content-type"] == "application/json", answer
    body = answer.json()
    assert isinstance(body, list), answer
    for entry in body:
        assert set(entry) == {"Host", "Score"} and isinstance(entry["Host"], str), answer
        assert 0 <= entry["Score"] <= MAX_EXTENDER_PRIORITY, answer
    error = answer.headers.get("x-powerflow-error", "")
    assert not error.startswith("internal error"), answer
    if not is_json(content_type):
        assert body == [] and error.startswith("cannot decode the request"), answer
    return error


async def test_filter_and_prioritize_answer_every_body(extender: ExtenderProcess) -> None:
    sent: Counter[str] = Counter()
    errors: Counter[bool] = Counter()

    @batched()
    @given(cases=batch_of(st.tuples(bodies(ARGS, ARGS_PATHS), content_types, st.booleans())))
    @example(cases=[(b"[" * 100_000 + b"]" * 100_000, None, False)])
    @example(cases=[(b'{"Pod":' + b"[" * 900 + b"]" * 900 + b"}", None, True)])
    def case(cases: list[tuple[bytes, str | None, bool]]) -> None:
        for body, content_type, chunked in cases:
            headers = {} if content_type is None else {"Content-Type": content_type}
            for verb, check in (("/filter", check_filter), ("/prioritize", check_prioritize)):
                answer = http.request("POST", verb, body, headers, chunked=chunked)
                errors[bool(check(answer, content_type))] += 1
                sent[verb] += 1

    with Http(extender.port) as http:
        await fuzz(case)
    assert sent["/filter"] >= CASES and sent["/prioritize"] >= CASES, sent
    assert errors[True] and errors[False]  # both decided answers and refusals were reached


# -- bind ------------------------------------------------------------------------------------

BIND_PATHS: list[tuple[str | int, ...]] = [
    ("PodName",), ("PodNamespace",), ("PodUID",), ("Node",), ("podname",), ("NODE",),
    ("poduid",), ("Extra",),
]  # fmt: skip


BINDINGS = [
    {**binding_args(the_pod, target), "PodUID": uid}
    for the_pod in (*NEW, OLD[1], PLAIN, pod("ghost"))
    for target in (*NODES, "elsewhere")
    for uid in ("", the_pod["metadata"]["uid"])  # the emulator gave the pods uids of its own
]
"""``ExtenderBindingArgs`` for a pod the cluster has (pending, bound, plain) or not."""


async def test_bind_answers_every_body(extender: ExtenderProcess) -> None:
    errors: Counter[bool] = Counter()

    @batched()
    @given(cases=batch_of(st.tuples(bodies(BINDINGS, BIND_PATHS), content_types, st.booleans())))
    # Found by this test: a lone surrogate reached the API path's quoting ("internal error").
    @example(cases=[(b'{"PodName":"\\ud800","Node":"gpu-0"}', None, False)])
    @example(cases=[(b'{"PodName":"new-0","Node":"\\udfff"}', None, False)])
    # Found by this test: a name of 70,000 characters made the API's URL too long for httpx.
    @example(cases=[(b'{"PodName":"' + b"a" * 70_000 + b'","Node":"gpu-0"}', None, False)])
    def case(cases: list[tuple[bytes, str | None, bool]]) -> None:
        for body, content_type, chunked in cases:
            headers = {} if content_type is None else {"Content-Type": content_type}
            answer = http.request("POST", "/bind", body, headers, chunked=chunked)
            assert answer.status == 200, answer
            assert answer.headers["content-type"] == "application/json", answer
            result = answer.json()
            assert set(result) == {"Error"} and isinstance(result["Error"], str), answer
            assert not result["Error"].startswith("internal error"), answer
            if not is_json(content_type):
                assert result["Error"].startswith("cannot decode the request"), answer
            errors[bool(result["Error"])] += 1

    with Http(extender.port) as http:
        await fuzz(case)
        assert http.sent >= CASES
    assert errors[True] and errors[False]


# -- bodies over the limit -------------------------------------------------------------------


async def test_bodies_over_the_limit_are_413_with_a_reason(extender: ExtenderProcess) -> None:
    """Refused before they are read whole, with a length or chunked; the next request is
    answered as usual. (One extender for all six: each start costs seconds.)"""
    huge = b'{"NodeNames":["' + b"n" * MAX_BODY_BYTES + b'"]}'
    json_type = {"Content-Type": "application/json"}
    for verb in ("/filter", "/prioritize", "/bind"):
        for chunked in (False, True):
            with Http(extender.port) as http:
                send = functools.partial(http.request, chunked=chunked)
                answer = await asyncio.to_thread(send, "POST", verb, huge, json_type)
                assert answer.status == 413, (verb, chunked, answer)
                if verb == "/prioritize":
                    assert answer.json() == []
                    assert "byte limit" in answer.headers["x-powerflow-error"]
                else:
                    assert "byte limit" in answer.json()["Error"]
                body = go_json(binding_args(PLAIN, "gpu-1"))
                after = await asyncio.to_thread(http.request, "POST", "/bind", body)
                assert after.status == 200, after


# -- every other route -----------------------------------------------------------------------

PAGES = ["/healthz", "/readyz", "/version", "/metrics", "/openapi.json", "/docs",
         "/docs/oauth2-redirect", "/redoc"]  # fmt: skip
"""The app's routes besides the verbs (``test_the_fuzzed_routes_are_all_the_apps``)."""

METHODS = ["GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
           "FUZZ"]  # fmt: skip

PAGE_CASES = max(1, CASES // 5)
"""Cases for the pages: a fifth of the verbs' ``CASES``. A page reads no body into a
decision; what varies its answer is the method (11 values), the query and the headers
(a few dozen sampled values and short texts) and the unknown path, and 2,000 cases
draw each sampled value hundreds of times. Each case goes to all nine pages and the
metrics port."""


def _paths(routes: Any) -> list[str]:
    """The paths of ``routes``, through included routers (FastAPI keeps those as one entry)."""
    out: list[str] = []
    for route in routes:
        if isinstance(getattr(route, "path", None), str):
            out.append(route.path)
        elif hasattr(route, "original_router"):
            out += _paths(route.original_router.routes)
        else:
            out.append(repr(route))  # something unknown: the test below says so
    return out


def test_the_fuzzed_routes_are_all_the_apps() -> None:
    """A route added to the app without being fuzzed here fails this test."""
    paths = _paths(create_app(connect=False).routes)
    assert sorted(paths) == sorted({*PAGES, "/filter", "/prioritize", "/bind"})


queries = st.one_of(
    st.just(""),
    st.text(max_size=20).map(lambda t: "?" + urllib.parse.quote(t, safe="=&")),
    st.sampled_from(["?name[]=powerflow_extender_requests_total", "?name[]=", "?%", "?%zz",
                     "?a=%ff%fe", "?" + "x" * 5000, "?name[]=%00", "?debug=1&debug=2"]),
)  # fmt: skip
extra_headers = st.dictionaries(
    st.sampled_from(["Accept", "Accept-Encoding", "X-Fuzz", "Origin", "Range", "If-None-Match",
                     "Access-Control-Request-Method", "Content-Type"]),
    st.sampled_from(["*/*", "text/html", "application/openmetrics-text; version=1.0.0",
                     "gzip", "br, gzip;q=0", "bytes=0-10", "bytes=9-1", "\u00e9", "", "GET",
                     "http://evil.example", "application/json", "x" * 1000]),
    max_size=3,
)  # fmt: skip


def check_page(answer: Answer, method: str, page: str) -> None:
    if page == "/readyz" and answer.status == 503 and method == "GET":
        # Not ready, by contract (the kubelet's probe): here when the mirror's watch broke
        # on the emulator, starved by this test; it says why.
        assert answer.json()["ready"] is False and answer.json()["reason"], answer
        return
    assert answer.status < 500, answer
    if answer.status >= 400 and method != "HEAD":
        assert answer.body, answer  # a 4xx says what was wrong


async def test_every_other_route_answers_any_request(extender: ExtenderProcess) -> None:
    seen: Counter[int] = Counter()

    route_case = st.tuples(
        st.sampled_from(METHODS),
        queries,
        extra_headers,
        st.sampled_from([b"", b"", b"{}", b"\xff\x00", NASTY[-2].encode()])
        | st.binary(max_size=40),
        st.text(max_size=12).map(lambda t: "/" + urllib.parse.quote(t)),
    )

    @batched(PAGE_CASES)
    @given(cases=batch_of(route_case))
    def case(cases: list[tuple[str, str, dict[str, str], bytes, str]]) -> None:
        for method, query, headers, body, unknown in cases:
            payload = body if body or method in ("POST", "PUT", "PATCH") else None
            pages = (*PAGES, unknown)
            answers = app.send([(method, page + query, payload, headers) for page in pages])
            for page, answer in zip(pages, answers, strict=True):
                check_page(answer, method, page)
                seen[answer.status] += 1
                if page in ("/healthz", "/version") and method == "GET":
                    assert answer.status == 200, answer
            answer = scrape.request(method, unknown + query, payload, headers)
            check_page(answer, method, unknown)

    # The app's pages of a case go out pipelined (one round trip for the nine).
    with Pipeline(extender.port) as app, Http(extender.metrics_port) as scrape:
        await fuzz(case)
        assert app.sent >= PAGE_CASES * (len(PAGES) + 1) and scrape.sent >= PAGE_CASES
    assert {200, 404, 405} <= set(seen), seen


async def test_a_pipeline_gets_each_answer_in_order_and_sends_again_after_a_close(
    extender: ExtenderProcess,
) -> None:
    """``Pipeline`` (the route cases' client) reads the answers of a batch in the order
    sent, the same as one request at a time gets them; when the server closes after one
    (``Connection: close``), the rest go again on a new connection and are answered."""
    close = {"Connection": "close"}
    batch: list[Request] = [
        ("GET", "/version", None, {}),
        ("GET", "/nowhere", None, {}),
        ("HEAD", "/healthz", None, {}),
        ("GET", "/healthz", None, close),
        ("POST", "/version", b"{}", {}),
        ("GET", "/version", None, {}),
    ]

    def both() -> tuple[list[Answer], list[Answer], int]:
        with Pipeline(extender.port) as pipe, Http(extender.port) as http:
            piped = pipe.send(batch)
            alone = [http.request(m, path, body, headers) for m, path, body, headers in batch]
            return piped, alone, pipe.sent

    piped, alone, sent = await asyncio.to_thread(both)
    assert [(a.status, a.body) for a in piped] == [(a.status, a.body) for a in alone]
    assert [a.status for a in piped] == [200, 404, 405, 200, 405, 200]
    assert sent == len(batch)


async def test_malformed_http_is_refused_and_the_server_goes_on(extender: ExtenderProcess) -> None:
    """Requests no client library sends (``support.fuzz.MALFORMED``), to each verb."""
    for verb in ("/filter", "/prioritize", "/bind"):
        for request in MALFORMED:
            raw = request.replace(b"{path}", verb.encode())
            status = await asyncio.to_thread(raw_status, extender.port, raw)
            assert status is not None and status < 500, (status, raw[:200])
        for request in CUT_SHORT:
            raw = request.replace(b"{path}", verb.encode())
            cut = functools.partial(raw_status, extender.port, raw, hang_up=True)
            status = await asyncio.to_thread(cut)
            assert status is None or status < 500, (status, raw[:200])
    with Http(extender.port) as http:
        body = go_json(binding_args(PLAIN, "gpu-1"))
        answer = await asyncio.to_thread(http.request, "POST", "/bind", body)
    assert answer.status == 200, answer
