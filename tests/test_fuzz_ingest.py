"""The operator's sample ingest, 10,000 fuzzed requests (and 2,000 to its GPU report path):
never a 5xx, never a hang, every 4xx says why, and only the node's own agent gets in.

The operator runs through ``serve`` as ``powerflow operator --ingest-port`` starts it
(``test_operator_ingest``'s ``cluster``: a DLJob with workers on n1 and n2, agents'
tokens reviewed by the emulator). Each case is a batch as the node agent writes it
(``telemetry.encode_batch``) with fields replaced by junk, or junk outright; with the
agent's token (most), another agent's, another account's, a token for the API server,
none, or a malformed header; any Content-Type; a fixed length or chunked; now and then
another method or path. Examples run in a worker thread, so that the emulator, served
from the test's loop, keeps answering TokenReviews.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.parse
from collections import Counter
from typing import Any

import pytest
from aiohttp.http_exceptions import HttpProcessingError
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz import (
    CASES,
    CUT_SHORT,
    FUZZ_TIMEOUT,
    MALFORMED,
    Answer,
    Http,
    batch_of,
    batched,
    bodies,
    content_types,
    raw_status,
)
from support.kube_emulator import KubeEmulator
from test_operator_ingest import Cluster, batch, cluster, sample  # noqa: F401 (the fixture)

from powerflow.core import contract
from powerflow.core.telemetry import MAX_BODY_BYTES

pytestmark = [pytest.mark.kmock(cls=KubeEmulator), FUZZ_TIMEOUT]

REFUSALS = {
    400: {"invalid"},
    401: {"unauthenticated"},
    403: {"wrong_account", "no_node", "node_mismatch"},
    413: {"body_too_large"},
}
"""Every 4xx of the ingest before the samples are judged, with the reasons it may give."""
JUDGED = {"unknown_job", "not_on_node", "too_many_gpus", "wrong_allocation", "impossible_clock",
          "impossible_power", "duplicate", "overlap", "clock_ahead"}  # fmt: skip

FIELDS = ["namespace", "job", "generation", "n", "gpusPerNode", "localBatchSize", "frequencyMhz",
          "gpusMeasured", "iterations", "stepTimeS", "energyJ", "endS", "extra"]  # fmt: skip
BATCH_PATHS: list[tuple[str | int, ...]] = [
    ("node",), ("samples",), ("power",), ("extra",), ("Node",), ("samples", 0), ("samples", 1),
    ("power", "watts"), ("power", "atS"), ("power", "extra"),
    *[("samples", 0, f) for f in FIELDS], *[("samples", 1, f) for f in FIELDS],
]  # fmt: skip
"""Every field the agent sends, unknown keys, and a key in the wrong case."""


def batches() -> list[dict[str, Any]]:
    """Batches as ``telemetry.encode_batch`` writes them: n1's or n2's, for the job or not,
    ending after every window the fixture sent (a replay is refused) and within
    ``MAX_AHEAD_S`` of now (a window from further ahead is refused)."""
    end_s = time.time() + 100
    return [
        batch(
            node,
            sample(job=first, end_s=end_s, iterations=iterations),
            sample(job=second, end_s=end_s + 10),
            watts=300.0,
        )
        for node in ("n1", "n2")
        for first in ("resnet", "gone")
        for second in ("resnet", "gone")
        for iterations in (1, 7)
    ]


REFUSED_HERE = [None, "", "Bearer", "Bearer ", "Basic YWxpY2U6cHc=", "Bearer \u00e9",
                "Bearer " + "x" * 8000, "Token agent-n1", "Bearer a\tb"]  # fmt: skip
"""Headers refused before any TokenReview: none, another scheme, no token, not a token."""
REVIEWED = ["Bearer unknown", "Bearer intruder", "Bearer api-audience", "Bearer no-node",
            "Bearer agent-n1 extra"]  # fmt: skip
"""Tokens the API server refuses (or another account's, one without a node): refusals are
never cached, so each costs a TokenReview (30 ms here); ``test_operator_ingest`` tests each."""
AUTHORIZATIONS = [
    *["Bearer agent-n1"] * 150, *["bearer agent-n1"] * 10, *["Bearer agent-n2"] * 20,
    *REFUSED_HERE * 2, *REVIEWED,
]  # fmt: skip
"""Mostly the nodes' agents (their reviews are cached: the body parser gets the most cases);
2 % of cases need a review of their own."""


def _headers(**values: str | None) -> dict[str, str]:
    """The request's headers: those of ``values`` that are not None."""
    return {name: value for name, value in values.items() if value is not None}


def check(ingest: Cluster, answer: Answer, authorization: str | None, sent: bytes) -> None:
    if answer.status == 503:  # a well-formed sample newer than the view: resent later
        assert answer.json()["error"] == "view_behind" and ingest.may_defer(sent), answer
        assert (authorization or "").lower() == f"bearer agent-{json.loads(sent)['node']}"
        return
    assert answer.status < 500, answer
    if answer.headers["content-type"].startswith("text/plain"):
        # aiohttp's HTTP parser refused the request (a header over its 8 KiB line limit)
        # before the ingest saw it: its status and reason, in plain text.
        assert answer.status in (400, 431) and answer.body, answer
        return
    assert answer.headers["content-type"].startswith("application/json"), answer
    body = answer.json()
    if answer.status in (200, 422):  # judged, sample by sample
        assert set(body) == {"accepted", "refused", "reasons"}, answer
        assert set(body["reasons"]) <= JUDGED, answer
        assert (answer.status == 422) == (body["accepted"] == 0 and body["refused"] > 0), answer
        # Only a node's own agent gets past the token, the account and the node check.
        node = json.loads(sent)["node"]
        assert (authorization or "").lower() == f"bearer agent-{node}", answer
        return
    assert body["error"] in REFUSALS[answer.status], answer
    assert isinstance(body["message"], str) and body["message"], answer


async def test_no_request_gets_a_5xx(cluster: Cluster) -> None:  # noqa: F811
    statuses: Counter[int] = Counter()

    sample_case = st.tuples(
        bodies(batches(), BATCH_PATHS),
        st.sampled_from(AUTHORIZATIONS),
        content_types,
        st.booleans(),
        st.sampled_from([None] * 8 + ["100-continue", "something-else"]),
    )

    @batched()
    @given(cases=batch_of(sample_case))
    @example(cases=[(b"{" * 100_000, "Bearer agent-n1", None, False, None)])
    def case(cases: list[tuple[bytes, str | None, str | None, bool, str | None]]) -> None:
        for body, authorization, content_type, chunked, expect in cases:
            headers = _headers(
                Authorization=authorization, Expect=expect, **{"Content-Type": content_type}
            )
            answer = http.request("POST", contract.SAMPLES_PATH, body, headers, chunked=chunked)
            if expect not in (None, "100-continue"):
                assert answer.status == 417, answer  # aiohttp's own answer: not ours to shape
            else:
                check(cluster, answer, authorization, body)
            statuses[answer.status] += 1

    before = len(cluster.sink.added)
    port = urllib.parse.urlsplit(cluster.url).port
    assert port is not None
    with Http(port) as http:
        await asyncio.to_thread(case)
        assert http.sent >= CASES
    assert {200, 400, 401, 403, 422} <= set(statuses), statuses
    assert {node for node, _ in cluster.sink.added[before:]} == {"n1", "n2"}


async def test_other_methods_and_paths_are_4xx(cluster: Cluster) -> None:  # noqa: F811
    """The ingest serves one route; anything else is aiohttp's 404 or 405, with its reason."""
    port = urllib.parse.urlsplit(cluster.url).port
    assert port is not None
    token = {"Authorization": "Bearer agent-n1"}
    cases = [("GET", contract.SAMPLES_PATH, 405), ("PUT", contract.SAMPLES_PATH, 405),
             ("DELETE", contract.SAMPLES_PATH, 405), ("POST", "/", 404),
             ("POST", contract.SAMPLES_PATH + "/x", 404), ("GET", "/%zz", 404),
             ("POST", "/v1/samples?" + "x" * 5000, None)]  # fmt: skip
    with Http(port) as http:
        for method, path, status in cases:
            answer = await asyncio.to_thread(http.request, method, path, b"{}", token)
            assert answer.status < 500 and answer.body, answer
            if status is not None:
                assert answer.status == status, answer


async def test_a_body_over_the_limit_is_413(cluster: Cluster) -> None:  # noqa: F811
    """Refused without being stored, with a length or chunked; the agent's next batch is
    taken as usual."""
    port = urllib.parse.urlsplit(cluster.url).port
    assert port is not None
    token = {"Authorization": "Bearer agent-n1"}
    huge = b'{"node":"n1","samples":[],"x":"' + b"x" * MAX_BODY_BYTES + b'"}'
    for chunked in (False, True):
        with Http(port) as http:
            send = functools.partial(http.request, chunked=chunked)
            answer = await asyncio.to_thread(send, "POST", contract.SAMPLES_PATH, huge, token)
            assert answer.status == 413 and answer.json()["error"] == "body_too_large", answer
            fine = json.dumps(batch("n1", sample())).encode()
            again = await asyncio.to_thread(
                http.request, "POST", contract.SAMPLES_PATH, fine, token
            )
            assert again.status == 200, again


async def test_malformed_http_is_refused_and_the_server_goes_on(
    cluster: Cluster,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Requests no client library sends (``support.fuzz.MALFORMED``), with the agent's token."""
    port = urllib.parse.urlsplit(cluster.url).port
    assert port is not None
    token = b"Host: x\r\nAuthorization: Bearer agent-n1\r\n"
    for request in MALFORMED:
        raw = request.replace(b"{path}", contract.SAMPLES_PATH.encode())
        raw = raw.replace(b"Host: x\r\n", token)
        status = await asyncio.to_thread(raw_status, port, raw)
        assert status is not None and status < 500, (status, raw[:200])
    for request in CUT_SHORT:
        raw = request.replace(b"{path}", contract.SAMPLES_PATH.encode())
        raw = raw.replace(b"Host: x\r\n", token)
        status = await asyncio.to_thread(functools.partial(raw_status, port, raw, hang_up=True))
        assert status is None or status < 500, (status, raw[:200])
    with Http(port) as http:
        fine = json.dumps(batch("n1", sample())).encode()
        answer = await asyncio.to_thread(
            http.request, "POST", contract.SAMPLES_PATH, fine, {"Authorization": "Bearer agent-n1"}
        )
    assert answer.status == 200, answer
    # aiohttp logs each request its HTTP parser refused (with a 400); anything else with a
    # traceback is an exception that escaped the ingest.
    escaped = [
        r
        for r in caplog.records
        if r.exc_info and not isinstance(r.exc_info[1], HttpProcessingError)
    ]
    assert not escaped, [(r.getMessage(), r.exc_info[1]) for r in escaped]


GPU_FIELDS = ["index", "name", "clocksMhz", "defaultLimitW", "minLimitW", "maxLimitW", "extra"]
REPORT_PATHS: list[tuple[str | int, ...]] = [
    ("node",), ("gpus",), ("extra",), ("Gpus",), ("gpus", 0), ("gpus", 1),
    ("gpus", 0, "clocksMhz", 0), ("gpus", 0, "clocksMhz", -1),
    *[("gpus", 0, f) for f in GPU_FIELDS], *[("gpus", 1, f) for f in GPU_FIELDS],
]  # fmt: skip
"""Every field of a GPU report, unknown keys, a key in the wrong case, single clocks."""
REPORT_REFUSALS = {
    **REFUSALS,
    422: {"implausible"},
    429: {"too_often"},
}
"""Every 4xx of the GPU report path, with the reasons it may give."""


def reports() -> list[dict[str, Any]]:
    """Reports as the agent writes them (``gpu_facts.encode_report``): n1's or n2's, of one
    or two H100s or an A100."""
    h100 = {"name": "NVIDIA H100 80GB HBM3", "clocksMhz": list(range(345, 1981, 15)),
            "defaultLimitW": 700.0, "minLimitW": 200.0, "maxLimitW": 700.0}  # fmt: skip
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "clocksMhz": list(range(210, 1411, 15)),
            "defaultLimitW": 400.0, "minLimitW": 100.0, "maxLimitW": 400.0}  # fmt: skip
    return [
        {"node": node, "gpus": [{"index": i, **gpu} for i in range(count)]}
        for node in ("n1", "n2")
        for gpu in (h100, a100)
        for count in (1, 2)
    ]


async def test_no_gpu_report_gets_a_5xx_and_none_plans_beyond_physics(
    cluster: Cluster,  # noqa: F811
) -> None:
    """``POST contract.GPUS_PATH`` fuzzed as the sample path is (a fifth of its cases: the
    body is smaller): never a 5xx, every 4xx says why, only a node's own agent is
    heard, and whatever got in describes GPUs within the catalogue's bounds."""
    statuses: Counter[int] = Counter()
    controller = cluster.operator.controller
    assert controller is not None

    report_case = st.tuples(
        bodies(reports(), REPORT_PATHS),
        st.sampled_from(AUTHORIZATIONS),
        content_types,
        st.booleans(),
    )

    @batched(CASES // 5)
    @given(cases=batch_of(report_case))
    def case(cases: list[tuple[bytes, str | None, str | None, bool]]) -> None:
        for body, authorization, content_type, chunked in cases:
            headers = _headers(Authorization=authorization, **{"Content-Type": content_type})
            answer = http.request("POST", contract.GPUS_PATH, body, headers, chunked=chunked)
            statuses[answer.status] += 1
            assert answer.status < 500, answer
            if answer.headers["content-type"].startswith("text/plain"):
                assert answer.status in (400, 431) and answer.body, answer
                continue
            assert answer.headers["content-type"].startswith("application/json"), answer
            got = answer.json()
            if answer.status == 200:
                assert set(got) == {"gpu", "clocks", "boardW"}, answer
                node = json.loads(body)["node"]
                assert (authorization or "").lower() == f"bearer agent-{node}", answer
                continue
            assert got["error"] in REPORT_REFUSALS[answer.status], answer
            assert isinstance(got["message"], str) and got["message"], answer

    port = urllib.parse.urlsplit(cluster.url).port
    assert port is not None
    with Http(port) as http:
        await asyncio.to_thread(case)
    assert {200, 400, 401, 403, 429} <= set(statuses), statuses
    specs = controller.discovered.specs()
    assert set(specs) <= {"n1", "n2"} and specs
    for spec in specs.values():
        assert 100 <= spec.clocks_mhz[0] <= spec.clocks_mhz[-1] <= 3000
        assert 0 < spec.max_power_w <= 700.0
