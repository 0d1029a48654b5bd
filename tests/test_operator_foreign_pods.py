"""The watch-fed cache of foreign GPU pods (``operator/foreign_pods.py``) against the
emulator over real HTTP: what it keeps, what is news, and a relist after ``410 Gone``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kubernetes
import pytest
from operator_cases import eventually
from powerflow.operator import foreign_pods
from powerflow.operator.kube import Kube
from support import kube_emulator
from support.kube_emulator import KubeEmulator

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)
PODS = "/api/v1/namespaces/ml/pods"


def pod(name: str, node: str | None, gpus: str = "1", **labels: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if gpus:
        container["resources"] = {"limits": {contract.GPU_RESOURCE: gpus}}
    spec: dict[str, Any] = {"containers": [container], **({"nodeName": node} if node else {})}
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


@pytest.fixture
async def api(kmock: KubeEmulator, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    # A short history makes a resumed watch too old (410) after a few writes, and short
    # watches make the cache resume often.
    monkeypatch.setattr(kube_emulator, "_HISTORY", 3)
    monkeypatch.setattr(foreign_pods, "WATCH_TIMEOUT_S", 1)
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        yield client


async def test_the_cache_keeps_foreign_gpu_pods_and_relists_after_gone(
    kmock: KubeEmulator, api: httpx.AsyncClient
) -> None:
    for body in (
        pod("notebook", "n1"),
        pod("cpu", "n1", gpus=""),
        pod("unbound", None),
        pod("ours", "n1", **{contract.JOB_LABEL: "j"}),
    ):
        assert (await api.post(PODS, json=body)).status_code == 201
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kmock.url)))
    kube = Kube(client, None)
    news: list[str] = []
    kube.watch_foreign(news.append)

    async def names() -> list[str]:
        return sorted(p["metadata"]["name"] for p in kube.foreign.pods() or ())

    async def holds(*expected: str) -> bool:
        return await names() == sorted(expected)

    try:
        await eventually(lambda: holds("notebook"))
        assert news == []  # the first LIST is no news

        # A non-GPU foreign pod is no news; a GPU one arriving and finishing is.
        assert (await api.post(PODS, json=pod("cpu-2", "n2", gpus=""))).status_code == 201
        assert (await api.post(PODS, json=pod("late", "n2"))).status_code == 201
        await eventually(lambda: holds("notebook", "late"))
        done = {"status": {"phase": "Succeeded"}}
        assert (await api.patch(f"{PODS}/late/status", json=done)).is_success
        await eventually(lambda: holds("notebook"))
        assert news == ["foreign GPU pod ml/late ADDED", "foreign GPU pod ml/late MODIFIED"]

        # Writes the watch does not see (PowerFlow's pods) push its resourceVersion out of
        # the history: the next resume is 410 Gone, and the cache lists again.
        assert kube.foreign.lists == 1
        for i in range(5):
            body = pod(f"own-{i}", "n2", **{contract.JOB_LABEL: "j"})
            assert (await api.post(PODS, json=body)).status_code == 201

        async def relisted() -> bool:
            return kube.foreign.lists >= 2

        await eventually(relisted, timeout=10)
        assert await holds("notebook")
    finally:
        kube.stop()
        await asyncio.sleep(0)
        client.close()
