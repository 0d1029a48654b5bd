"""Caps that do not move with every measurement window (``power_loop.steady_caps``).

A cap follows measured power, which moves a little with each window; exact caps
were rewritten on most passes (a PATCH per worker pod, an NVML write per GPU).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from powerflow.operator.actions import Observed
from powerflow.operator.reconcile import reconcile
from support.operator_pass import pass_inputs
from support.plan_recorder import Recorder
from test_operator_profiling import (
    BUDGET,
    MODEL,
    NODES,
    WINDOW,
    KeepPolicy,
    allocation,
    body,
    running_pods,
)

from powerflow.core import contract
from powerflow.core.policy.power_loop import CAP_RAISE_W, CAP_SLACK_W, CAP_STEP_W, steady_caps
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.world import default_world

LOW, HIGH = 100.0, 400.0


@pytest.mark.parametrize(
    ("cap", "counted", "current", "expected"),
    [
        (187.3, 150.0, None, 185.0),  # a whole watt with a cushion below the cap
        (187.3, 186.5, None, 186.5),  # never below what the plan counted
        (193.0, 150.0, 185.0, 185.0),  # a held cap kept: the new one is < CAP_RAISE_W above
        (192.0, 186.0, 185.0, 185.0),  # ... down to CAP_SLACK_W below what was counted
        (197.0, 150.0, 185.0, 195.0),  # raised by a clear step
        (183.0, 150.0, 185.0, 181.0),  # a cap that must go down goes down at once
        (200.0, 190.0, 185.0, 198.0),  # a held cap too far below what was counted
        (548.0, 375.0, None, HIGH),  # the board's highest limit
        (548.0, 375.0, 395.0, 395.0),  # ... a held cap within a raise step of it kept
        (80.0, 50.0, None, LOW),  # the board's lowest limit
        (80.0, 50.0, 95.0, LOW),
    ],
)
def test_steady_caps(cap: float, counted: float, current: float | None, expected: float) -> None:
    assert steady_caps([cap], [counted], [current], LOW, HIGH) == [expected]
    assert CAP_RAISE_W > CAP_SLACK_W + CAP_STEP_W  # a fresh cap can be kept


def test_caps_do_not_move_at_every_pass_in_the_simulator() -> None:
    """The first 3 h of the default trace at eta 0.6: of the plans where a job keeps
    its GPUs and clock and is capped in both, under a third change its cap, mostly
    where the cap is what the plan counted and the measured power moved it down
    (exact caps changed in 73 % of them)."""
    config = SimConfig()
    world = default_world()
    jobs = load_jobs(TraceSpec(hours=3.0), config, world)
    configured = scheduler("powerflow").configure(0.6)
    recorder = Recorder(configured.policy)
    Simulation(jobs, replace(configured, policy=recorder), config, world).run()
    kept = moved = 0
    last: dict[str, tuple[int, int, float | None]] = {}
    for plan in recorder.plans:
        for jp in plan.jobs:
            before = last.get(jp.job_id)
            now = (jp.gpus, jp.frequency_mhz, jp.power_cap_w)
            if before is not None and before[:2] == now[:2] and jp.gpus and before[2] and now[2]:
                kept += 1
                moved += before[2] != now[2]
            last[jp.job_id] = now
    assert kept > 100  # caps were in force for a good part of the run
    assert moved <= 0.35 * kept


def test_the_operator_hands_the_cap_its_workers_hold_to_the_policy() -> None:
    status = {"phase": "Running", "allocation": allocation(complete=True)}
    for caps, expected in (
        (["185.0"] * 4, 185.0),
        (["185.0", "190.0", "185.0", "185.0"], 190.0),  # mid-update: the highest
        (["185.0", None, "185.0", "185.0"], None),  # a worker uncapped: no cap held
        (["185.0", "junk", "185.0", "185.0"], None),
    ):
        pods = running_pods()
        for pod, cap in zip(pods, caps, strict=True):
            if cap is not None:
                pod["metadata"].setdefault("annotations", {})[contract.POWER_LIMIT_ANNOTATION] = cap
        policy = KeepPolicy()
        reconcile([Observed(body(status), pods)], NODES, BUDGET, 1000.0, policy,
                  lambda j: MODEL, **pass_inputs(profiling_window_s=WINDOW))  # fmt: skip
        (job,) = policy.snapshots[-1].jobs
        assert job.power_cap_w == expected
