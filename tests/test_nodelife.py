"""The twin's node lifecycle controller (``powerflow.lab.twin.nodelife``) against the emulator.

What kube-controller-manager does when a node's kubelet stops renewing its Lease
(https://kubernetes.io/docs/concepts/architecture/nodes/#node-controller): ``Ready``
``Unknown`` after the grace period, the ``unreachable`` taints, pods evicted once their
``tolerationSeconds`` (the ``DefaultTolerationSeconds`` admission's) have passed and
never without one, force-deleted once an admin adds ``out-of-service``; the taints
go when the kubelet posts ``Ready`` again. One pass at a time (``step``), no thread.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from powerflow.lab.twin.apiserver import ApiServer
from powerflow.lab.twin.kubelet import LEASES
from powerflow.lab.twin.nodelife import OUT_OF_SERVICE, UNREACHABLE, NodeLifecycle, eviction_at

MERGE = {"Content-Type": "application/merge-patch+json"}
PODS = "/api/v1/namespaces/ns/pods"
TOLERATION_S = 2


@pytest.fixture
def api() -> Iterator[httpx.Client]:
    with (
        ApiServer(kubelets=True, toleration_s=TOLERATION_S) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        yield client


def renew(api: httpx.Client, node: str) -> None:
    stamp = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": node, "renewTime": stamp}
    if api.patch(f"{LEASES}/{node}", json={"spec": spec}, headers=MERGE).status_code == 404:
        lease = {"metadata": {"name": node, "namespace": "kube-node-lease"}, "spec": spec}
        api.post(LEASES, json=lease).raise_for_status()


def running_pod(api: httpx.Client, name: str, node: str, **spec: Any) -> None:
    body = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
    }
    api.post(PODS, json=body).raise_for_status()
    binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    api.post(f"{PODS}/{name}/binding", json=binding).raise_for_status()
    running = {"status": {"phase": "Running"}}
    api.patch(f"{PODS}/{name}/status", json=running, headers=MERGE).raise_for_status()


def node(api: httpx.Client, name: str = "n1") -> dict[str, Any]:
    body: dict[str, Any] = api.get(f"/api/v1/nodes/{name}").json()
    return body


def pod(api: httpx.Client, name: str) -> dict[str, Any] | None:
    answer = api.get(f"{PODS}/{name}")
    return None if answer.status_code == 404 else answer.json()


def test_a_silent_node_is_marked_tainted_evicted_fenced_and_untainted(api: httpx.Client) -> None:
    ready = {"type": "Ready", "status": "True"}
    body = {"metadata": {"name": "n1"}, "status": {"conditions": [ready]}}
    api.post("/api/v1/nodes", json=body).raise_for_status()
    renew(api, "n1")
    forever = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}
    running_pod(api, "a", "n1")  # gets the default tolerations: 2 s
    running_pod(api, "b", "n1", tolerations=[forever])  # tolerates it for ever
    running_pod(api, "orphan", "gone")  # bound to a node that does not exist
    life = NodeLifecycle(str(api.base_url), grace_s=1.0)
    try:
        life.step()
        assert node(api)["status"]["conditions"][0]["status"] == "True"
        assert pod(api, "orphan") is None  # pod GC: its node does not exist
        time.sleep(1.3)  # no renewal: past the grace period
        life.step()
        conditions = node(api)["status"]["conditions"]
        assert [(c["status"], c["reason"]) for c in conditions] == [
            ("Unknown", "NodeStatusUnknown")
        ]
        taints = node(api)["spec"]["taints"]
        assert sorted((t["key"], t["effect"]) for t in taints) == [
            (UNREACHABLE, "NoExecute"),
            (UNREACHABLE, "NoSchedule"),
        ]
        assert not (pod(api, "a") or {})["metadata"].get("deletionTimestamp")  # tolerated 2 s
        time.sleep(TOLERATION_S + 1.0)
        life.step()
        a = pod(api, "a")
        assert a is not None and a["metadata"]["deletionTimestamp"]  # evicted, terminating
        assert not (pod(api, "b") or {})["metadata"].get("deletionTimestamp")
        assert life.stats.evicted == ["a"]
        life.step()
        assert pod(api, "a") is not None  # no kubelet finishes it: it stays

        fence = {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
        patch = {"spec": {"taints": [*node(api)["spec"]["taints"], fence]}}
        api.patch("/api/v1/nodes/n1", json=patch, headers=MERGE).raise_for_status()
        life.step()  # a: force-deleted; b: evicted (out-of-service is not tolerated)
        life.step()  # b: force-deleted
        assert pod(api, "a") is None and pod(api, "b") is None
        assert sorted(life.stats.force_deleted) == ["a", "b", "orphan"]

        renew(api, "n1")  # the kubelet is back: its Lease, then Ready
        back = {"status": {"conditions": [ready]}}
        api.patch("/api/v1/nodes/n1/status", json=back, headers=MERGE).raise_for_status()
        life.step()
        taints = node(api)["spec"]["taints"]
        assert [t["key"] for t in taints] == [OUT_OF_SERVICE]  # the admin's stays
        assert node(api)["status"]["conditions"][0]["status"] == "True"
    finally:
        life.api.close()


def test_eviction_time_follows_the_pods_tolerations() -> None:
    """``eviction_at``: now for an untolerated ``NoExecute`` taint, the shortest
    ``tolerationSeconds`` after the taint was added, never without one, and
    nothing for ``NoSchedule`` alone."""
    added = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    taint = {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}
    soft = {"key": UNREACHABLE, "effect": "NoSchedule"}

    def spec(*tolerations: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"tolerations": list(tolerations)}}

    now = added + datetime.timedelta(seconds=1)
    assert eviction_at(spec(), [taint], now) == now
    assert eviction_at(spec(), [soft], now) is None
    forever = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}
    assert eviction_at(spec(forever), [taint], now) is None
    short = forever | {"tolerationSeconds": 5}
    long = forever | {"tolerationSeconds": 300}
    assert eviction_at(spec(long, short), [taint], now) == added + datetime.timedelta(seconds=5)
