"""Writes the API server refuses: reported on their job, backed off, nothing else stopped.

The pure half (``reconcile`` fed the previous pass's refusals, the backoff read
back from status) and ``Kube.apply`` against the emulator over real HTTP.
"""

from __future__ import annotations

from typing import Any

import httpx
import kubernetes
import pytest
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.kube import Kube, WritesFailed
from powerflow.operator.reconcile import reconcile
from powerflow.operator.refusals import MAX_BACKOFF_S, Refusal, backoff_s
from powerflow.operator.workers import WorkerSet, rendezvous_service, worker_pods
from support.kube_emulator import KubeEmulator
from support.operator_pass import pass_inputs

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.timefmt import format_time
from powerflow.lab.synthetic import SyntheticModel

NODES = (Node("n0", 8, A100), Node("n1", 8, A100))
NOW = 1_000_000.0
POD_SECURITY = (
    'pods "bad-g1-w0" is forbidden: violates PodSecurity "restricted:latest": '
    'runAsNonRoot != true (pod or container "trainer" must set securityContext.runAsNonRoot=true)'
)


class Requested:
    def plan(self, snapshot: Snapshot) -> Plan:
        plans = []
        for node, job in enumerate(snapshot.jobs):
            n = job.requested_gpus
            slots = tuple((f"n{node}", i) for i in range(n))
            plans.append(JobPlan(job.id, n, 1410, job.global_batch_size // n, slots))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=0.0)


def body(name: str, status: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": generation},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 100,
            "gpus": {"requested": 4, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    if status is not None:
        out["status"] = status
    return out


def refusal(job: str = "bad", index: int = 0, verb: str = "create") -> Refusal:
    name = f"{job}-g1-w{index}"
    return Refusal("ml", job, verb, "Pod", name, 403, "Forbidden", POD_SECURITY)


def one_pass(observed: list[Observed], now_s: float = NOW, **kw: Any) -> Actions:
    return reconcile(
        observed,
        NODES,
        parse_budget({"eta": "1"}),
        now_s,
        Requested(),
        lambda job: SyntheticModel(),
        **pass_inputs(profiling_window_s=0.0, **kw),
    )


def patches(actions: Actions) -> dict[str, dict[str, Any]]:
    return {name: patch for _, name, patch in actions.status_first + actions.status}


def pods(actions: Actions, job: str) -> list[str]:
    return [
        b["metadata"]["name"]
        for b in actions.create
        if b["kind"] == "Pod" and b["metadata"]["labels"][contract.JOB_LABEL] == job
    ]


def created_pod(job: str, index: int) -> dict[str, Any]:
    """What the API server holds of a worker that was created (the others were refused)."""
    req = parse_dljob(body(job))  # type: ignore[arg-type]
    pod = worker_pods(req, WorkerSet(1, 4, 64, 1410), [index])[0]
    return {**pod, "status": {"phase": "Pending"}}


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(n) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert backoff_s(10**18) == MAX_BACKOFF_S  # no 2 ** 10**18


def test_a_refused_create_is_reported_on_its_job_which_backs_off() -> None:
    started = {"phase": "Running", "allocation": {"gpus": 4, "generation": 1}}
    bad = Observed(body("bad", started), (created_pod("bad", 3),))  # 3 of 4 refused
    refused = {"ml/bad": [refusal("bad", i) for i in range(3)]}
    actions = one_pass([bad, Observed(body("good"))], refused=refused)
    patch = patches(actions)["bad"]
    (cond,) = [c for c in patch["conditions"] if c["type"] == "WorkersCreated"]
    assert (cond["status"], cond["reason"]) == ("False", "Forbidden")
    assert POD_SECURITY in cond["message"] and "bad-g1-w0" in cond["message"]
    (event,) = [e for e in actions.events if e.name == "bad"]
    assert (event.type, event.reason) == ("Warning", "FailedCreate")
    assert POD_SECURITY in event.message
    assert patch["createRefusals"] == 1 and patch["lastCreateRefusalTime"] == format_time(NOW)
    assert patch["phase"] == "Pending" and patch["allocation"]["gpus"] == 0
    # A gang is all or nothing; the pod's own grace period (the DLJob default), no force delete.
    assert ("ml", "bad-g1-w3", 60) in actions.delete_pods
    assert not pods(actions, "bad")
    assert actions.wake_at_s == NOW + 10
    assert len(pods(actions, "good")) == 4  # the other job is not held up
    assert patches(actions)["good"]["phase"] == "Running"


def _after(patch: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**status, **{k: v for k, v in patch.items() if v is not None}}


def test_the_backoff_lives_in_status_and_a_restart_honours_it() -> None:
    first = one_pass([Observed(body("bad"))], refused={"ml/bad": [refusal()]})
    status = _after(patches(first)["bad"], {})
    # A fresh operator (no memory of the refusal) reads the backoff from status.
    waiting = one_pass([Observed(body("bad", status))], NOW + 5)
    assert not pods(waiting, "bad") and waiting.wake_at_s == NOW + 10
    assert "phase" not in patches(waiting).get("bad", {})  # still Pending, no churn
    retry = one_pass([Observed(body("bad", status))], NOW + 10)
    assert len(pods(retry, "bad")) == 4
    # Refused again: twice the wait.
    second = one_pass([Observed(body("bad", status))], NOW + 10, refused={"ml/bad": [refusal()]})
    status = _after(patches(second)["bad"], status)
    assert status["createRefusals"] == 2 and second.wake_at_s == NOW + 10 + 20
    assert not pods(one_pass([Observed(body("bad", status))], NOW + 29), "bad")


def test_a_changed_spec_retries_at_once() -> None:
    first = one_pass([Observed(body("bad"))], refused={"ml/bad": [refusal()]})
    status = _after(patches(first)["bad"], {})
    assert status["observedGeneration"] == 1
    fixed = one_pass([Observed(body("bad", status, generation=2))], NOW + 1)
    assert len(pods(fixed, "bad")) == 4


def test_a_created_gang_clears_the_refusals() -> None:
    status = {
        "phase": "Running",
        "allocation": {"gpus": 4, "generation": 1, "localBatchSize": 64, "frequencyMHz": 1410},
        "createRefusals": 2,
        "lastCreateRefusalTime": format_time(NOW - 100),
        "conditions": [{"type": "WorkersCreated", "status": "False", "reason": "Forbidden"}],
    }
    gang = tuple(created_pod("bad", i) for i in range(4))
    patch = patches(one_pass([Observed(body("bad", status), gang)]))["bad"]
    assert patch["createRefusals"] is None and patch["lastCreateRefusalTime"] is None
    (cond,) = [c for c in patch["conditions"] if c["type"] == "WorkersCreated"]
    assert (cond["status"], cond["reason"]) == ("True", "Created")


def test_other_refused_writes_are_reported_without_a_backoff() -> None:
    refused = {"ml/good": [refusal("good", 0, verb="delete")]}
    actions = one_pass([Observed(body("good"))], refused=refused)
    (event,) = [e for e in actions.events if e.reason == "FailedDelete"]
    assert event.type == "Warning" and POD_SECURITY in event.message
    assert len(pods(actions, "good")) == 4


# -- Kube.apply against the emulator ----------------------------------------------------------


async def _create_jobs(kmock: KubeEmulator, *names: str) -> dict[str, Any]:
    jobs = {}
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/ml/{contract.PLURAL}"
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        for name in names:
            doc = body(name)
            del doc["metadata"]["uid"], doc["metadata"]["generation"]
            created = (await client.post(path, json=doc)).json()
            jobs[name] = parse_dljob(created)
    return jobs


async def _get(kmock: KubeEmulator, path: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        resp = await client.get(path)
    found: dict[str, Any] | None = resp.json() if resp.status_code == 200 else None
    return found


async def _pod_exists(kmock: KubeEmulator, name: str) -> bool:
    return await _get(kmock, f"/api/v1/namespaces/ml/pods/{name}") is not None


async def _status(kmock: KubeEmulator, job: str) -> Any:
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/ml/{contract.PLURAL}/{job}"
    return ((await _get(kmock, path)) or {}).get("status")


def _actions(jobs: dict[str, Any]) -> Actions:
    actions = Actions()
    for name, req in jobs.items():
        actions.create.append(rendezvous_service(req))
        actions.create.extend(worker_pods(req, WorkerSet(1, 2, 128, 1410)))
        actions.status.append(("ml", name, {"phase": "Running"}))
    return actions


@pytest.mark.kmock(cls=KubeEmulator)
async def test_apply_returns_refusals_and_does_every_other_write(
    kmock: KubeEmulator, kube: Kube
) -> None:
    jobs = await _create_jobs(kmock, "bad", "good")
    kmock.refuse("create", "pods", "bad-*", message=POD_SECURITY)
    kmock.refuse("create", "services", "bad", status=422, reason="Invalid")
    refused = await kube.apply(_actions(jobs))
    assert sorted((r.job_key, r.kind, r.name, r.code, r.reason) for r in refused) == [
        ("ml/bad", "Pod", "bad-g1-w0", 403, "Forbidden"),
        ("ml/bad", "Pod", "bad-g1-w1", 403, "Forbidden"),
        ("ml/bad", "Service", "bad", 422, "Invalid"),
    ]
    assert {r.message for r in refused if r.kind == "Pod"} == {POD_SECURITY}
    assert await _pod_exists(kmock, "good-g1-w1")
    for name in ("bad", "good"):  # both jobs' status patches went out
        assert await _status(kmock, name) == {"phase": "Running"}


@pytest.mark.kmock(cls=KubeEmulator)
async def test_a_transient_error_fails_the_pass_after_every_other_write(
    kmock: KubeEmulator, kube: Kube
) -> None:
    jobs = await _create_jobs(kmock, "bad", "good")
    kmock.refuse("create", "pods", "bad-g1-w0", status=503, reason="ServiceUnavailable")
    kmock.refuse("create", "pods", "good-g1-w0", message=POD_SECURITY)
    with pytest.raises(WritesFailed) as exc:
        await kube.apply(_actions(jobs))
    (error,) = exc.value.errors
    assert isinstance(error, kubernetes.client.ApiException) and error.status == 503
    # A refusal of the same pass is kept for the next pass to report.
    assert [(r.job_key, r.name, r.code) for r in exc.value.refusals] == [
        ("ml/good", "good-g1-w0", 403)
    ]
    assert await _pod_exists(kmock, "good-g1-w1") and await _pod_exists(kmock, "bad-g1-w1")
    assert not await _pod_exists(kmock, "bad-g1-w0")
    for name in ("bad", "good"):
        assert await _status(kmock, name) == {"phase": "Running"}


@pytest.mark.kmock(cls=KubeEmulator)
async def test_a_service_of_someone_else_is_a_refusal_ours_is_not(
    kmock: KubeEmulator, kube: Kube
) -> None:
    jobs = await _create_jobs(kmock, "taken", "mine")
    foreign = {"metadata": {"name": "taken"}, "spec": {"ports": [{"port": 80}]}}
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        assert (await client.post("/api/v1/namespaces/ml/services", json=foreign)).is_success
    assert await kube.apply(_actions({"mine": jobs["mine"]})) == []
    refused = await kube.apply(_actions(jobs))  # "mine" again: its own Service, fine
    (conflict,) = refused
    assert (conflict.job_key, conflict.kind, conflict.code) == ("ml/taken", "Service", 409)
    assert 'Service "taken" already exists' in conflict.message
