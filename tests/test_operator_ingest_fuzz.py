"""No body or header makes the ingest answer a 5xx, and only the agent gets samples in.

Hypothesis posts junk (bytes, JSON of any shape, valid batches with one field
replaced by junk) with tokens of every kind (the agents', another account's,
unknown, malformed headers) to a running operator (``test_operator_ingest``'s
cluster). Examples are synchronous; they run in a worker thread so that the
emulator, served from the test's loop, keeps answering TokenReviews.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kube_emulator import KubeEmulator
from test_operator_ingest import Cluster, batch, cluster, sample  # noqa: F401 (the fixture)

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
junk = json_values | st.sampled_from(
    ["n1", "resnet", "", "-1", "1e309", 10**400, -(10**30), 2**31, "\ud800", "NaN"]
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
AGENTS = ("agent-n1", "agent-n2")
tokens = st.sampled_from(["agent-n1", "agent-n2", "intruder", "api-audience", "unknown"])


def token_of(authorization: str | None) -> str:
    """The token the server reads from the header (``tokenreview.bearer_token``)."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    """A valid batch from n1 with one field (top level, a sample's or power's) replaced."""
    body: dict[str, Any] = batch("n1", sample(), sample(iterations=3), watts=300.0)
    where = draw(st.sampled_from(["top", "sample", "power"]))
    target = {"top": body, "sample": body["samples"][0], "power": body["power"]}[where]
    key = draw(st.sampled_from([*target, "extra"]))
    target[key] = draw(junk)
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


bodies = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))
    | mutated_batches()
)
authorizations = (
    tokens.map(lambda t: f"Bearer {t}")
    | header_text
    | header_text.map(lambda t: f"Bearer {t}")
    | st.none()
)


async def test_no_input_gets_a_5xx(cluster: Cluster) -> None:  # noqa: F811
    statuses: set[int] = set()

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(body=bodies, authorization=authorizations, content_type=header_text | st.none())
    def check(body: bytes, authorization: str | None, content_type: str | None) -> None:
        headers = {}
        if authorization is not None:  # a client cannot send surrounding blanks
            headers["Authorization"] = authorization = authorization.strip()
        if content_type is not None:
            headers["Content-Type"] = content_type.strip()
        resp = http.post(cluster.url, content=body, headers=headers)
        statuses.add(resp.status_code)
        if resp.status_code == 503:  # a well-formed sample newer than the view: resent later
            assert resp.json()["error"] == "view_behind" and cluster.may_defer(body), resp.text
            assert token_of(authorization) == "agent-n1", authorization
            return
        assert resp.status_code < 500, (resp.status_code, resp.text)
        assert resp.headers["Content-Type"].startswith("application/json")
        if resp.status_code == 200:  # only the agent of n1 gets anything in
            assert token_of(authorization) == "agent-n1", authorization

    before = len(cluster.sink.added)
    with httpx.Client(timeout=30) as http:
        await asyncio.to_thread(check)
    assert {400, 401, 403} <= statuses  # past the token, the account and the parser
    assert all(node == "n1" for node, _ in cluster.sink.added[before:])


async def test_only_the_agent_gets_samples_in(cluster: Cluster) -> None:  # noqa: F811
    """Every sender but the agents refused, whatever the body; no sample stored."""

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(authorization=authorizations.filter(lambda a: token_of(a) not in AGENTS), body=bodies)
    def check(authorization: str | None, body: bytes) -> None:
        headers = {} if authorization is None else {"Authorization": authorization.strip()}
        valid = json.dumps(batch("n1", sample(end_s=time.time()))).encode()
        for content in (body, valid):
            resp = http.post(cluster.url, content=content, headers=headers)
            assert resp.status_code in (401, 403), (resp.status_code, resp.text)

    before = len(cluster.sink.added)
    with httpx.Client(timeout=30) as http:
        await asyncio.to_thread(check)
    assert len(cluster.sink.added) == before
