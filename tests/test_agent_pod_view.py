"""``nodeagent.pods``: what the agent reads off a worker pod, and bad annotations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from powerflow.nodeagent.pods import ProfilePlan, pod_view

from powerflow.core import contract


def pod(annotations: dict[str, str], *, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "bert-g0-w1",
            "namespace": "team-a",
            "uid": "u-1",
            "labels": {contract.JOB_LABEL: "bert", contract.WORKER_INDEX_LABEL: "1"},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "sidecar"},
                {
                    "name": "trainer",
                    "env": env
                    if env is not None
                    else [{"name": "LOCAL_BATCH_SIZE", "value": "32"}],
                    "resources": {"limits": {contract.GPU_RESOURCE: "1"}},
                },
            ],
        },
        "status": {"phase": "Running", "podIP": "10.1.2.3"},
    }


GOOD = {
    contract.WORKERS_ANNOTATION: "4",
    contract.FREQUENCY_ANNOTATION: "1410",
    contract.GENERATION_ANNOTATION: "3",
    contract.PLACEMENT_ANNOTATION: json.dumps(
        {"node": "n1", "block": [["n1", 0], ["n1", 1], ["n1", 2], ["n2", 0]]}
    ),
    contract.PROFILE_ANNOTATION: json.dumps({"clocksMhz": [810, 1410], "sliceSeconds": 12.5}),
    contract.POWER_LIMIT_ANNOTATION: "250",
    contract.MODEL_ANNOTATION: "bert",
}


def test_a_worker_pod_reads_as_its_contract() -> None:
    v = pod_view(pod(GOOD))
    assert (v.key, v.job_key, v.uid, v.node, v.ip) == (
        ("team-a", "bert-g0-w1"),
        ("team-a", "bert", 3),
        "u-1",
        "n1",
        "10.1.2.3",
    )
    assert (v.worker_index, v.n, v.gpus_per_node, v.local_batch_size) == (1, 4, 3, 32.0)
    assert (v.frequency_mhz, v.power_limit_w, v.model_name, v.gpus) == (1410, 250.0, "bert", 1)
    assert v.profile == ProfilePlan((810, 1410), 12.5)
    assert v.active and v.problems == ()


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        ("2026-11-27T10:00:00Z", 1795773600.0),
        ("2026-11-27T11:00:00+01:00", 1795773600.0),
        ("yesterday", None),
        (None, None),
    ],
)
def test_start_time_is_read_as_unix_seconds(start: str | None, expected: float | None) -> None:
    body = pod(GOOD)
    body["status"] = {**body.get("status", {}), "startTime": start}
    assert pod_view(body).started_s == expected


def test_bad_annotations_become_none_with_a_reason_and_keep_the_rest() -> None:
    bad = {
        **GOOD,
        contract.FREQUENCY_ANNOTATION: "fast",
        contract.PROFILE_ANNOTATION: json.dumps({"clocksMhz": [], "sliceSeconds": 1}),
        contract.POWER_LIMIT_ANNOTATION: "nan",
        contract.PLACEMENT_ANNOTATION: "{",
        contract.WORKERS_ANNOTATION: "-4",
    }
    v = pod_view(pod(bad, env=[{"name": "LOCAL_BATCH_SIZE", "value": "0"}]))
    assert (v.frequency_mhz, v.profile, v.power_limit_w, v.gpus_per_node, v.n) == (None,) * 5
    assert v.local_batch_size is None
    named = " ".join(v.problems)
    for key in (
        contract.FREQUENCY_ANNOTATION,
        contract.PROFILE_ANNOTATION,
        contract.POWER_LIMIT_ANNOTATION,
        contract.PLACEMENT_ANNOTATION,
        contract.WORKERS_ANNOTATION,
        "LOCAL_BATCH_SIZE",
    ):
        assert key in named
    assert v.gpus == 1 and v.generation == 3


def test_finished_or_unbound_pods_hold_no_gpus() -> None:
    done = pod(GOOD)
    done["status"]["phase"] = "Succeeded"
    assert not pod_view(done).active
    unbound = pod(GOOD)
    del unbound["spec"]["nodeName"]
    assert not pod_view(unbound).active
