"""The plan's per-GPU power caps on the workers, and power lowered before it is raised.

Against the emulated API server, with the operator started as ``powerflow operator``
starts it (``support.operator_harness``); the node agent's side (applying
``powerflow.io/power-limit-watts``) is tested in ``test_nodeagent_*``. The pure
ordering rules are checked on ``reconcile``'s actions too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from operator_cases import BUDGET, JOBS, MERGE, dljob, eventually, models, pods_of
from powerflow.operator.actions import Observed
from powerflow.operator.learning import MeasuredPower
from powerflow.operator.power_order import cap_annotation, lowers
from powerflow.operator.reconcile import reconcile
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args
from support.operator_pass import pass_inputs
from test_operator_profiling import (
    BUDGET as ETA_BUDGET,
)
from test_operator_profiling import (
    MODEL,
    NODES,
    WINDOW,
    KeepPolicy,
    allocation,
    body,
    running_pods,
)

from powerflow.core import contract
from powerflow.core.policy.snapshot import JobPlan, Plan, Snapshot

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

CAP = contract.POWER_LIMIT_ANNOTATION
FREQ = contract.FREQUENCY_ANNOTATION


class SwapPolicy:
    """Two 2-GPU jobs ``a`` and ``b`` trading power: with a limit of 3 kW or more ``b``
    runs at 1410 MHz uncapped and ``a`` at 1005 MHz capped at 150 W; below it ``b``
    drops to 1005 MHz capped at 120 W and ``a`` rises to 1410 MHz uncapped (``a``
    comes first in a pass, so only the ordering puts ``b``'s writes first)."""

    def plan(self, snapshot: Snapshot) -> Plan:
        limit = snapshot.budget.limit_w or 1e9
        high = limit >= 3000
        settings = {"b": (1410, None), "a": (1005, 150.0)} if high else {
            "b": (1005, 120.0), "a": (1410, None)
        }  # fmt: skip
        plans = []
        for job in snapshot.jobs:
            clock, cap = settings[job.id.split("/")[1]]
            plans.append(JobPlan(job.id, 2, clock, 32, power_w=500.0, power_cap_w=cap))
        return Plan(tuple(plans), limit_w=limit, predicted_w=1000.0)


def operator(kubeconfig: Path) -> Operator:
    args = operator_args(kubeconfig, "--debounce", "0.02", "--profiling-window", "0")
    return Operator(args, SwapPolicy(), models)


def annotations(pods: list[dict[str, Any]]) -> set[tuple[str | None, str | None]]:
    return {(p["metadata"]["annotations"].get(FREQ), p["metadata"]["annotations"].get(CAP))
            for p in pods}  # fmt: skip


async def test_caps_are_written_removed_and_lowered_first(
    kubeconfig: Path, api: httpx.AsyncClient, kmock: KubeEmulator
) -> None:
    async with operator(kubeconfig):
        two = {"gpus": {"requested": 2, "min": 2, "max": 2}}
        for name in ("a", "b"):
            assert (await api.post(JOBS, json=dljob(name, **two))).status_code == 201

        async def state(job: str, want: set[tuple[str | None, str | None]]) -> bool:
            pods = await pods_of(api, job)
            return len(pods) == 2 and annotations(pods) == want

        # new workers carry the cap from their creation on
        await eventually(lambda: state("b", {("1410", None)}))
        await eventually(lambda: state("a", {("1005", "150.0")}))
        mark = len(list(kmock))
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "2000"}}, headers=MERGE)
        await eventually(lambda: state("b", {("1005", "120.0")}))  # capped, clock down
        await eventually(lambda: state("a", {("1410", None)}))  # cap removed, clock up
        patches = [
            (r.name or "").split("-")[0]
            for r in list(kmock)[mark:]
            if r.method == "PATCH" and r.resource is not None and r.resource.plural == "pods"
        ]
        assert sorted(set(patches)) == ["a", "b"]
        # every write lowering b's power went out before any raising a's
        assert max(i for i, job in enumerate(patches) if job == "b") < patches.index("a")
        assert {p["metadata"]["name"] for p in await pods_of(api, "b")} == {"b-g1-w0", "b-g1-w1"}
        # and back: b's cap goes, a's comes back; the same workers throughout
        await api.patch(BUDGET, json={"data": {"powerLimitWatts": "5000"}}, headers=MERGE)
        await eventually(lambda: state("b", {("1410", None)}))
        await eventually(lambda: state("a", {("1005", "150.0")}))
        assert {p["metadata"]["name"] for p in await pods_of(api, "a")} == {"a-g1-w0", "a-g1-w1"}


def test_a_cap_is_written_rounded_down_to_a_tenth_of_a_watt() -> None:
    assert cap_annotation(None) is None
    assert cap_annotation(212.49) == "212.4"
    assert cap_annotation(150.0) == "150.0"
    assert cap_annotation(0.01) == "0.1"  # never 0: the agent refuses a non-positive cap
    with pytest.raises(ValueError, match="finite"):
        cap_annotation(float("inf"))


@pytest.mark.parametrize(
    ("old", "patch", "lower"),
    [
        ({FREQ: "1410"}, {FREQ: "1005"}, True),
        ({FREQ: "1005"}, {FREQ: "1410"}, False),
        ({}, {FREQ: "1005"}, False),  # from an unknown clock: last, never early
        ({}, {CAP: "200.0"}, True),  # a new cap
        ({CAP: "200.0"}, {CAP: "150.0"}, True),
        ({CAP: "150.0"}, {CAP: "200.0"}, False),
        ({CAP: "150.0"}, {CAP: None}, False),  # removed
        ({CAP: "junk"}, {CAP: "150.0"}, False),
        ({contract.PROFILE_ANNOTATION: "{}"}, {contract.PROFILE_ANNOTATION: None}, True),
        ({}, {contract.PROFILE_ANNOTATION: "{}"}, False),
        ({FREQ: "1410", CAP: "200.0"}, {FREQ: "1005", CAP: "250.0"}, False),  # one raise
        ({FREQ: "1410"}, {"other": "x"}, False),
        ({FREQ: "1410"}, {}, False),
    ],
)
def test_which_patches_lower_power(
    old: dict[str, str], patch: dict[str, str | None], lower: bool
) -> None:
    assert lowers(old, patch) is lower


def test_the_policy_sees_the_power_measured_where_the_job_runs() -> None:
    """Measured on its 4 GPUs of n0 at 64 per GPU: passed on, with the clock it ran;
    measured on another configuration (8 GPUs): not passed on."""
    status = {"phase": "Running", "allocation": allocation(complete=True)}
    here = MeasuredPower(4, 4, 64, 1350, 812.5)
    for measured, expected in ((here, (812.5, 1350)), (replace(here, n=8), (None, None))):
        policy = KeepPolicy()
        obs = Observed(body(status), running_pods())
        inputs = pass_inputs(profiling_window_s=WINDOW, measured={"ml/job": measured})
        reconcile([obs], NODES, ETA_BUDGET, 1000.0, policy, lambda j: MODEL, **inputs)
        (job,) = policy.snapshots[-1].jobs
        assert (job.measured_power_w, job.measured_frequency_mhz) == expected
        assert job.profiled_gpus == frozenset()  # profiling is on; no count profiled yet
