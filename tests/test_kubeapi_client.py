"""Every call of the components' ``kubernetes`` client has a time limit
(``powerflow/kubeapi/client.py``): an API server that stops answering fails the call
instead of holding the operator's pass or the agent's write for ever; a call that names
its own limit (the watch's long poll) keeps it. Against the emulator over HTTP, its
late answers."""

from __future__ import annotations

import asyncio
import time

import kubernetes
import pytest
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator

from powerflow.kubeapi import client as client_module
from powerflow.kubeapi.client import TimedApiClient

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


async def test_a_call_the_server_does_not_answer_fails_after_the_limit(
    kmock: KubeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "REQUEST_TIMEOUT_S", (1.0, 0.2))
    kmock.load_builtins()
    kmock.faults.inject("list", "nodes", Answer(delay_s=3.0))
    cfg = kubernetes.client.Configuration(host=str(kmock.url))
    timed = TimedApiClient(cfg)
    try:
        core = kubernetes.client.CoreV1Api(timed)
        began = time.monotonic()
        with pytest.raises(Exception, match=r"(?i)timed? ?out"):
            await asyncio.to_thread(core.list_node)
        # urllib3 tries a GET four times: four reads of 0.2 s, not 3 s each.
        assert time.monotonic() - began < 2.5
        # A call that names its own limit keeps it: the late answer comes within it.
        listed = await asyncio.to_thread(core.list_node, _request_timeout=10)
        assert listed.items == []
    finally:
        timed.close()


def test_the_operator_and_the_node_agent_talk_through_it() -> None:
    from powerflow.nodeagent.kube import AgentKube
    from powerflow.operator.connection import api_client

    cfg = kubernetes.client.Configuration(host="https://127.0.0.1:1")
    operator_api = api_client(cfg, "powerflow-operator/test")
    agent = AgentKube(cfg, "n0")
    try:
        assert isinstance(operator_api, TimedApiClient)
        assert isinstance(agent.api, TimedApiClient)
    finally:
        operator_api.close()
        agent.api.close()


async def test_the_agents_event_post_gives_up_after_its_own_limit(
    kmock: KubeEmulator, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's pass waits for its Events: a server slow to take one holds it for
    ``EVENT_TIMEOUT_S``, not the client's minute."""
    from powerflow.nodeagent import kube as agent_kube
    from powerflow.nodeagent.apply import PodEvent
    from powerflow.nodeagent.kube import AgentKube

    monkeypatch.setattr(agent_kube, "EVENT_TIMEOUT_S", 0.3)
    kmock.load_builtins()
    kmock.faults.inject("create", "events", Answer(delay_s=5.0))
    agent = AgentKube(kubernetes.client.Configuration(host=str(kmock.url)), "n0")
    try:
        event = PodEvent(("ml", "w-0"), "Warning", "ClockClamped", "1410 MHz is not supported")
        began = time.monotonic()
        await asyncio.to_thread(agent.post_event, event, "uid-0")
        assert time.monotonic() - began < 2.0  # a POST is never sent twice
    finally:
        agent.close()
    assert any("could not post event ClockClamped" in r.getMessage() for r in caplog.records)
