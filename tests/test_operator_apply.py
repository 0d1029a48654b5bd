"""``Kube.apply``'s skip rule, against the emulator over real HTTP: a job whose
generation record (the first-phase status patch) did not go through gets none of
its pod writes in that pass, while every other job's go out.

Pods unexplained by their job's status would be deleted and made again after a
crash, so the record must come first or nothing at all.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from powerflow.operator.actions import Actions
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.kube import Kube, WritesFailed
from powerflow.operator.workers import WorkerSet, rendezvous_service, worker_pods
from support.kube_emulator import KubeEmulator

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/ml/{contract.PLURAL}"
STATUS = f"{contract.PLURAL}/status"
RECORD = {"allocation": {"generation": 1, "gpus": 2}}


def _body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 100,
            "gpus": {"requested": 2, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


async def _jobs(kmock: KubeEmulator, stored: tuple[str, ...], deleted: tuple[str, ...]) -> Any:
    """Parsed DLJobs: ``stored`` ones created in the emulator, ``deleted`` ones not (as
    a DLJob deleted after the pass read it)."""
    jobs = {}
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        for name in stored:
            jobs[name] = parse_dljob((await client.post(JOBS, json=_body(name))).json())
    for name in deleted:
        body = _body(name)
        body["metadata"].update(uid=f"u-{name}", generation=1)
        jobs[name] = parse_dljob(body)
    return jobs


def _start_generation(jobs: dict[str, Any]) -> Actions:
    """What a pass that starts generation 1 of each job asks: the record, then the pods."""
    actions = Actions()
    for name, req in jobs.items():
        actions.status_first.append(("ml", name, RECORD))
        actions.create.append(rendezvous_service(req))
        actions.create.extend(worker_pods(req, WorkerSet(1, 2, 128, 1410)))
        actions.annotate_pods.append(("ml", f"{name}-g1-w0", {"x": "1"}))
        actions.status.append(("ml", name, {"phase": "Running"}))
    return actions


async def _pods(kmock: KubeEmulator) -> list[str]:
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        items = (await client.get("/api/v1/namespaces/ml/pods")).json()["items"]
    return sorted(p["metadata"]["name"] for p in items)


async def _status(kmock: KubeEmulator, name: str) -> Any:
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        return (await client.get(f"{JOBS}/{name}")).json().get("status")


async def test_a_refused_generation_record_skips_that_jobs_pods_only(
    kmock: KubeEmulator, kube: Kube
) -> None:
    jobs = await _jobs(kmock, ("refused", "fine"), ())
    rule = kmock.refuse("patch", STATUS, "refused", status=422, reason="Invalid")
    refused = await kube.apply(_start_generation(jobs))
    assert [(r.job_key, r.verb, r.kind, r.name, r.code) for r in refused] == [
        ("ml/refused", "patch", contract.KIND, "refused", 422)
    ]
    assert rule.hits == 1  # nor was its later status patch sent
    assert await _pods(kmock) == ["fine-g1-w0", "fine-g1-w1"]
    assert await _status(kmock, "fine") == {**RECORD, "phase": "Running"}
    assert await _status(kmock, "refused") is None


async def test_a_transient_failure_of_the_record_skips_that_jobs_pods_and_fails_the_pass(
    kmock: KubeEmulator, kube: Kube
) -> None:
    jobs = await _jobs(kmock, ("flaky", "fine"), ())
    kmock.refuse("patch", STATUS, "flaky", status=503, reason="ServiceUnavailable", times=1)
    with pytest.raises(WritesFailed) as exc:
        await kube.apply(_start_generation(jobs))
    assert exc.value.refusals == []
    assert await _pods(kmock) == ["fine-g1-w0", "fine-g1-w1"]
    assert await _status(kmock, "flaky") is None


async def test_a_deleted_dljob_gets_no_pods(kmock: KubeEmulator, kube: Kube) -> None:
    """The DLJob was deleted after the pass read it (404 on its record): creating its
    workers would only make orphans for the garbage collector; nothing is refused."""
    jobs = await _jobs(kmock, ("fine",), ("gone",))
    assert await kube.apply(_start_generation(jobs)) == []
    assert await _pods(kmock) == ["fine-g1-w0", "fine-g1-w1"]
