"""How the ingest is served: only by the leader, over HTTPS when asked, and what its
token cache keeps.

Operators start through ``serve`` with a kubeconfig to the emulator, as in
``test_operator_ingest``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
import subprocess
from pathlib import Path

import httpx
import kubernetes
import pytest
from operator_cases import ThresholdPolicy, eventually, models
from powerflow.operator.tokenreview import Denied, TokenReviewer, bearer_token
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, free_port, operator_args
from test_operator_ingest import AGENT, NODE_EXTRA, batch

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


def register(emulator: KubeEmulator) -> None:
    extra = {NODE_EXTRA: ["n1"]}
    emulator.register_token("agent-n1", AGENT, extra=extra, audiences=(contract.INGEST_AUDIENCE,))


def replica(kubeconfig: Path, identity: str, port: int, *options: str) -> Operator:
    args = operator_args(
        kubeconfig,
        "--leader-identity",
        identity,
        "--lease-duration",
        "1",
        "--ingest-port",
        str(port),
        "--ingest-host",
        "127.0.0.1",
        *options,
    )
    return Operator(args, ThresholdPolicy(), models, wait_for_pass=identity == "a")


async def test_only_the_leader_takes_samples(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """A follower answers 503 with Retry-After (the agent retries and reaches the leader
    through the Service), never a 4xx that would make the agent drop the samples."""
    register(kmock)
    pa, pb = free_port(), free_port()
    headers = {"Authorization": "Bearer agent-n1"}
    client = httpx.AsyncClient(headers=headers)
    async with replica(kubeconfig, "a", pa), replica(kubeconfig, "b", pb), client:
        path = contract.SAMPLES_PATH
        follower = await client.post(f"http://127.0.0.1:{pb}{path}", json=batch("n1"))
        assert follower.status_code == 503 and follower.headers["Retry-After"] == "1"
        assert follower.json()["error"] == "unavailable"
        leader = await client.post(f"http://127.0.0.1:{pa}{path}", json=batch("n1"))
        assert leader.status_code == 200, leader.text


async def test_https_when_given_a_certificate(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path, tmp_path: Path
) -> None:
    register(kmock)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=powerflow-ingest", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    options = ("--ingest-tls-cert", str(cert), "--ingest-tls-key", str(key))
    async with replica(kubeconfig, "a", port, *options):
        context = ssl.create_default_context(cafile=str(cert))
        async with httpx.AsyncClient(verify=context) as client:
            url = f"https://127.0.0.1:{port}{contract.SAMPLES_PATH}"
            headers = {"Authorization": "Bearer agent-n1"}
            resp = await client.post(url, json=batch("n1"), headers=headers)
            assert resp.status_code == 200, resp.text
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.post(f"http://127.0.0.1:{port}{contract.SAMPLES_PATH}", json={})


async def test_a_busy_ingest_port_is_one_clear_error(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as failed:
            async with replica(kubeconfig, "a", port):
                pass
    assert f"--ingest-port: cannot listen on 127.0.0.1:{port}" in str(failed.value.__cause__)


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer ", "Basic abc", "bearer\tx", "Bearer " + "x" * 20000]
)
def test_malformed_authorization_headers_are_401(header: str | None) -> None:
    with pytest.raises(Denied) as denied:
        bearer_token(header)
    assert denied.value.status == 401


async def test_the_cache_keeps_reviews_a_short_while_by_hash_and_bounded(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Positive reviews are reused for ``ttl_s``, under the token's SHA-256 (never the
    token), at most ``max_entries``; refusals are asked again every time."""
    aud = (contract.INGEST_AUDIENCE,)
    for i in range(3):
        kmock.register_token(f"tok-{i}", AGENT, extra={NODE_EXTRA: [f"n{i}"]}, audiences=aud)
    config = kubernetes.client.Configuration(host=str(kmock.url).rstrip("/"))
    client = kubernetes.client.ApiClient(config)
    now = [0.0]
    reviewer = TokenReviewer(
        lambda: client, contract.INGEST_AUDIENCE, AGENT, ttl_s=30, max_entries=2,
        clock=lambda: now[0],
    )  # fmt: skip

    def reviews() -> int:
        return sum(1 for r in kmock if r.url.path.endswith("/tokenreviews"))

    try:
        assert (await reviewer.sender("tok-0")).node == "n0"
        assert (await reviewer.sender("tok-0")).node == "n0"
        assert reviews() == 1
        now[0] = 31.0  # expired
        await reviewer.sender("tok-0")
        assert reviews() == 2
        await asyncio.gather(reviewer.sender("tok-1"), reviewer.sender("tok-1"))  # one review
        assert reviews() == 3
        await reviewer.sender("tok-2")  # evicts tok-0, the least recently used
        await reviewer.sender("tok-1")
        assert reviews() == 4
        await reviewer.sender("tok-0")
        assert reviews() == 5
        for _ in range(2):
            with pytest.raises(Denied):
                await reviewer.sender("nope")
        assert reviews() == 7
        cache = reviewer._cache
        assert len(cache) == 2 and all(len(k) == 32 for k in cache)
        assert not any(b"tok-" in k for k in cache)
    finally:
        client.close()


async def test_a_flood_of_tokens_is_reviewed_a_few_at_a_time(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    """Twenty bad tokens at once: every one refused, at most ``max_reviews`` in flight."""
    config = kubernetes.client.Configuration(host=str(kmock.url).rstrip("/"))
    client = kubernetes.client.ApiClient(config)
    reviewer = TokenReviewer(lambda: client, contract.INGEST_AUDIENCE, AGENT, max_reviews=2)
    try:
        results = await asyncio.gather(
            *(reviewer.sender(f"bad-{i}") for i in range(20)), return_exceptions=True
        )
    finally:
        client.close()
    assert all(isinstance(r, Denied) and r.status == 401 for r in results)
    assert reviewer.reviews == 20 and reviewer.peak_in_flight == 2


async def test_samples_flow_again_once_reviews_work(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """TokenReviews refused twice (an RBAC rule being fixed): 503 twice, then 200."""
    register(kmock)
    kmock.refuse("create", "tokenreviews", times=2)
    port = free_port()
    async with replica(kubeconfig, "a", port), httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{port}{contract.SAMPLES_PATH}"
        headers = {"Authorization": "Bearer agent-n1"}
        codes = [(await client.post(url, json=batch("n1"), headers=headers)).status_code]
        codes.append((await client.post(url, json=batch("n1"), headers=headers)).status_code)

        async def accepted() -> bool:
            return (await client.post(url, json=batch("n1"), headers=headers)).status_code == 200

        await eventually(accepted)
    assert codes == [503, 503]


def test_ingest_options_default_and_refused() -> None:
    from powerflow.cli import build_parser
    from powerflow.commands import operator as command

    def parse(*argv: str) -> argparse.Namespace:
        return build_parser().parse_args(["operator", *argv])

    args = parse()
    assert (args.ingest_port, args.ingest_host) == (contract.INGEST_PORT, "0.0.0.0")
    assert args.ingest_service_account == AGENT
    assert args.ingest_tls_cert is None
    for bad in (
        ("--ingest-port", "70000"),
        ("--ingest-port", "-1"),
        ("--ingest-tls-key", "k.pem"),  # a key without its certificate
        ("--ingest-service-account", "alice"),
    ):
        with pytest.raises(command.OperatorConfigError):
            command.kopf_options(parse(*bad))


async def test_an_unusable_certificate_is_one_clear_error(
    kmock: KubeEmulator, api: httpx.AsyncClient, kubeconfig: Path, tmp_path: Path
) -> None:
    from powerflow.commands.operator import OperatorConfigError, serve

    missing = str(tmp_path / "missing.crt")
    port = str(free_port())
    args = operator_args(kubeconfig, "--ingest-port", port, "--ingest-tls-cert", missing)
    with pytest.raises(OperatorConfigError, match="--ingest-tls-cert"):
        await asyncio.to_thread(serve, args)
