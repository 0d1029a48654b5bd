"""The agent's worker endpoint (``contract.ITERATIONS_PATH``) over real HTTP.

Anything on the node can reach it: whatever the body, it answers 204 or a
4xx naming the problem, never a 5xx, and the handler sees only valid reports.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from powerflow.nodeagent.iterations import (
    HEALTH_PATH,
    MAX_BODY_BYTES,
    READY_PATH,
    IterationReport,
    Refusal,
    UnknownPod,
    report_body,
    worker_app,
)
from support.agent_endpoint import serve_in_thread

from powerflow.core import contract

UID = "0b5c5f1e-6a8e-4c1e-9a39-5d1c0b0f7a11"
GOOD = {"namespace": "ml", "pod": "job-g1-w0", "uid": UID, "iterations": 12}


class Recorder:
    """A handler that accepts ``ml/job-g1-w0`` with ``UID`` only, as Telemetry would."""

    def __init__(self) -> None:
        self.reports: list[IterationReport] = []

    def __call__(self, r: IterationReport) -> str | None:
        if (r.namespace, r.pod) != ("ml", "job-g1-w0"):
            return UnknownPod(f"no pod {r.namespace}/{r.pod}")
        if r.uid != UID:
            return Refusal("UID mismatch")
        self.reports.append(r)
        return None


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()
    with serve_in_thread(lambda: worker_app(recorder, clock=lambda: 42.0)) as url:
        yield url, recorder


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("POST", contract.ITERATIONS_PATH, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_a_valid_report_reaches_the_handler(endpoint: tuple[str, Recorder]) -> None:
    url, recorder = endpoint
    body = {**GOOD, "gpuUuids": ["GPU-1c2d", "MIG-3/1/0"], "futureField": 1}
    status, text = post(url, json.dumps(body).encode())
    assert (status, text) == (204, "")
    assert recorder.reports[-1] == IterationReport(
        "ml", "job-g1-w0", UID, 12, ("GPU-1c2d", "MIG-3/1/0"), 42.0
    )
    assert report_body(recorder.reports[-1]) == {
        k: v for k, v in body.items() if k != "futureField"
    }


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"pod": "other-w0"}, 404, "no pod ml/other-w0"),
        ({"uid": "0b5c5f1e-0000-4c1e-9a39-5d1c0b0f7a11"}, 409, "UID mismatch"),
        ({"iterations": -1}, 400, "iterations"),
        ({"iterations": 1.5}, 400, "iterations"),
        ({"iterations": True}, 400, "iterations"),
        ({"iterations": 2**60}, 400, "iterations"),
        ({"namespace": "ML"}, 400, "namespace"),
        ({"pod": None}, 400, "pod"),
        ({"uid": "a b"}, 400, "uid"),
        ({"gpuUuids": "GPU-1"}, 400, "gpuUuids"),
        ({"gpuUuids": ["GPU-1"] * 17}, 400, "gpuUuids"),
        ({"gpuUuids": ["GPU 1"]}, 400, "gpuUuids[0]"),
    ],
)
def test_refusals_say_why(
    endpoint: tuple[str, Recorder], change: dict[str, Any], status: int, says: str
) -> None:
    url, recorder = endpoint
    before = len(recorder.reports)
    got, text = post(url, json.dumps({**GOOD, **change}).encode())
    assert got == status
    assert says in text
    assert len(recorder.reports) == before


def test_bodies_that_are_not_json_objects_are_400(endpoint: tuple[str, Recorder]) -> None:
    url, _ = endpoint
    for body in (b"", b"{", b"[1]", b"\xff\xfe", b"null", b'"x"'):
        status, text = post(url, body)
        assert status == 400, body
        assert text


def test_a_body_over_the_bound_is_refused_before_it_is_read(
    endpoint: tuple[str, Recorder],
) -> None:
    url, _ = endpoint
    big = json.dumps({**GOOD, "pad": "x" * MAX_BODY_BYTES}).encode()
    assert post(url, big)[0] == 413
    # the same without a Content-Length: chunked, read only up to the bound
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("POST", contract.ITERATIONS_PATH, body=iter([big]), encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()


def test_a_body_arriving_in_pieces_is_read_whole(endpoint: tuple[str, Recorder]) -> None:
    url, recorder = endpoint
    body = json.dumps(GOOD).encode()

    def pieces() -> Iterator[bytes]:
        yield body[:10]
        threading.Event().wait(0.1)  # the rest comes later, as on a slow link
        yield body[10:]

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("POST", contract.ITERATIONS_PATH, body=pieces(), encode_chunked=True)
    assert conn.getresponse().status == 204
    conn.close()
    assert recorder.reports[-1].iterations == GOOD["iterations"]


def test_the_liveness_endpoint_answers_from_the_agents_loop(
    endpoint: tuple[str, Recorder],
) -> None:
    url, recorder = endpoint
    before = len(recorder.reports)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("GET", HEALTH_PATH)
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok")
    conn.close()
    assert len(recorder.reports) == before  # not a report


def test_other_methods_and_paths_are_not_served(endpoint: tuple[str, Recorder]) -> None:
    url, _ = endpoint
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("GET", contract.ITERATIONS_PATH)
    assert conn.getresponse().status == 405
    conn.close()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    conn.request("POST", "/v1/other", body=json.dumps(GOOD).encode())
    assert conn.getresponse().status == 404
    conn.close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "namespace": st.sampled_from(["ml", "", "ML", "a" * 64]) | _json,
        "pod": st.sampled_from(["job-g1-w0", "x", "-x"]) | _json,
        "uid": st.sampled_from([UID, "u"]) | _json,
        "iterations": st.integers(-5, 2**64) | _json,
        "gpuUuids": st.lists(st.text(max_size=140), max_size=20) | _json,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_fields | _json, raw=st.binary(max_size=64), use_raw=st.booleans())
def test_no_body_gets_a_5xx(
    endpoint: tuple[str, Recorder], body: Any, raw: bytes, use_raw: bool
) -> None:
    url, recorder = endpoint
    before = len(recorder.reports)
    data = raw if use_raw else json.dumps(body).encode()
    status, _ = post(url, data)
    assert status in (204, 400, 404, 409, 413)
    if status == 204:
        r = recorder.reports[-1]
        assert (r.namespace, r.pod, r.uid) == ("ml", "job-g1-w0", UID)
        assert isinstance(r.iterations, int) and r.iterations >= 0
    else:
        assert len(recorder.reports) == before


def test_the_readiness_endpoint_says_whether_the_settings_are_applied() -> None:
    """``/readyz`` is 503 until the agent's first pass applied the node's settings (its
    ``ready``), then 200: the DaemonSet's readiness probe, so that a rollout waits."""
    applied = threading.Event()
    with serve_in_thread(lambda: worker_app(Recorder(), ready=applied.is_set)) as url:
        parts = urlsplit(url)

        def status() -> tuple[int, bytes]:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
            conn.request("GET", READY_PATH)
            response = conn.getresponse()
            out = (response.status, response.read())
            conn.close()
            return out

        assert status()[0] == 503
        applied.set()
        assert status() == (200, b"ok")
