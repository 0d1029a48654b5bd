"""The operator's dashboard gauges: the pool's GPUs, each job's GPUs, clock,
iterations and fit error, and the completion-time histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from operator_cases import (
    JOBS,
    MERGE,
    NS,
    PODS,
    ThresholdPolicy,
    dljob,
    eventually,
    models,
    pods_of,
    status_of,
)
from powerflow.operator.metrics import JobSeries, job_series
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args

from powerflow.core import contract

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


def body(
    name: str, status: dict[str, Any], created: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": name, "creationTimestamp": created},
        "status": status,
    }


def test_job_series_merge_the_pass_patches_and_count_a_completion_once() -> None:
    running = body(
        "a",
        {
            "allocation": {"gpus": 4, "frequencyMHz": 1215},
            "progress": {"iterations": 10},
            "model": {"fitErrorPercent": 3.5},
        },
    )
    finished = body("b", {"phase": "Succeeded", "completionTime": "2026-01-01T01:00:00Z"})
    finishing = body("c", {"phase": "Running"})
    patches = [
        (NS, "a", {"progress": {"iterations": 20}}),
        (NS, "c", {"phase": "Succeeded", "completionTime": "2026-01-01T02:00:00Z"}),
    ]
    a, b, c = job_series([running, finished, finishing], patches)
    assert a == JobSeries(NS, "a", 4, 1215, 20, 3.5, None)
    assert b.completion_s is None  # finished in an earlier pass: counted then
    assert c.completion_s == 7200.0


def test_job_series_read_junk_as_zero() -> None:
    junk = body("j", {"allocation": {"gpus": "four", "frequencyMHz": True}, "model": "x"})
    junk["status"]["progress"] = {"iterations": float("inf")}
    (s,) = job_series([junk], [])
    assert (s.gpus, s.frequency_mhz, s.iterations, s.fit_error_percent) == (0, 0, 0, None)


def sample(op: Operator, name: str, **labels: str) -> float | None:
    assert op.controller is not None
    return op.controller.metrics.registry.get_sample_value(name, labels or None)


def reads(op: Operator, name: str, value: float | None, **labels: str) -> Any:
    """A check for ``eventually``: the sample reads ``value``."""

    async def check() -> bool:
        return sample(op, name, **labels) == value

    return check


async def test_the_gauges_follow_jobs_and_a_deleted_job_leaves_none(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0")
    async with Operator(args, ThresholdPolicy(), models) as op:
        await api.post(JOBS, json=dljob("m", iterations=50))

        async def four() -> bool:
            return len(await pods_of(api, "m")) == 4

        await eventually(four)
        job = {"dljob_namespace": NS, "dljob": "m"}
        await eventually(reads(op, "powerflow_job_gpus", 4, **job))
        status = await status_of(api, "m")
        mhz = status["allocation"]["frequencyMHz"]
        assert sample(op, "powerflow_job_frequency_hertz", **job) == mhz * 1e6
        assert sample(op, "powerflow_cluster_gpus", state="total") == 8
        assert sample(op, "powerflow_cluster_gpus", state="allocated") == 4
        assert sample(op, "powerflow_job_completion_seconds_count") == 0
        progress = {"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: "50"}}}
        await api.patch(f"{PODS}/m-g1-w0", json=progress, headers=MERGE)
        await eventually(reads(op, "powerflow_job_completion_seconds_count", 1))
        assert sample(op, "powerflow_job_iterations", **job) == 50
        await api.delete(f"{JOBS}/m")
        await eventually(reads(op, "powerflow_job_gpus", None, **job))
        assert sample(op, "powerflow_job_completion_seconds_count") == 1
