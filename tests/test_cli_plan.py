"""``powerflow plan --demo``: the policy on the built-in cluster, as a table and as JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from powerflow.cli import main
from powerflow.commands.plan import DEMO_QUEUE, demo_snapshot
from powerflow.core.policy.budget import limit_w
from powerflow.core.policy.power_loop import CAP_SLACK_W, CAP_STEP_W
from powerflow.core.policy.snapshot import Budget


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", "--demo", "--json", *args]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_json_plan_is_complete_and_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_json(capsys)
    assert out["cluster_gpus"] == 32
    assert out["limit_w"] == pytest.approx(limit_w(demo_snapshot(Budget(eta=0.6))))
    assert [j["id"] for j in out["jobs"]] == [q[0] for q in DEMO_QUEUE]
    slots = [tuple(s) for j in out["jobs"] for s in j["placement"]]
    assert len(slots) == len(set(slots)) == sum(j["gpus"] for j in out["jobs"])
    for j in out["jobs"]:
        assert len(j["placement"]) == j["gpus"]
        assert all(node.startswith("node-") and 0 <= i < 8 for node, i in j["placement"])
        if j["gpus"]:
            batch = next(q[2] for q in DEMO_QUEUE if q[0] == j["id"])
            assert j["local_batch_size"] == -(-batch // j["gpus"])
    busy = {node for node, _ in slots}
    assert not busy & set(out["powered_down_nodes"])
    assert {"predicted_w", "migrations", "notes"} <= out.keys()


def test_absolute_limit_wins_and_strict_power_respects_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = plan_json(capsys, "--eta", "0.9", "--limit-watts", "2000", "--strict-power")
    assert out["limit_w"] == 2000.0
    assert out["predicted_w"] <= 2000.0
    assert out["powered_down_nodes"]  # 2 kW cannot keep all four nodes busy
    assert plan_json(capsys, "--eta", "0.9", "--limit-watts", "2000") == out  # the default
    # little room left: each running job is capped at what the plan counted for it plus
    # an equal share per GPU of the rest, rounded down with a cushion: the caps and idle
    # GPUs sum to the limit less at most CAP_STEP_W + CAP_SLACK_W per GPU
    running = [j for j in out["jobs"] if j["gpus"]]
    assert all(j["power_cap_w"] * j["gpus"] >= j["power_w"] * (1 - 1e-12) for j in running)
    idle = (32 - 8 * len(out["powered_down_nodes"]) - sum(j["gpus"] for j in running)) * 52.5
    caps = sum(j["power_cap_w"] * j["gpus"] for j in running)
    steps = (CAP_STEP_W + CAP_SLACK_W) * sum(j["gpus"] for j in running)
    assert 2000.0 - steps <= caps + idle <= 2000.0


def test_without_frequency_scaling_every_running_job_is_at_the_top_clock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = plan_json(capsys, "--no-frequency-scaling")
    assert {j["frequency_mhz"] for j in out["jobs"] if j["gpus"]} == {1410}


def test_table_shows_jobs_and_power(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--demo", "--eta", "0.4"]) == 0
    text = capsys.readouterr().out
    assert "PowerFlow plan" in text
    assert all(q[0] in text for q in DEMO_QUEUE)
    assert "W of limit" in text
    rows = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert rows and max(map(len, rows)) <= 80


def test_a_placement_across_nodes_wraps_between_nodes_and_is_never_cut() -> None:
    from rich.console import Console

    from powerflow.commands.plan import print_plan
    from powerflow.core.policy.snapshot import JobPlan, Plan

    snapshot = demo_snapshot(Budget(eta=0.6))
    long_id = "a-training-job-with-a-very-long-name-from-a-pipeline"
    snapshot = replace(snapshot, jobs=(replace(snapshot.jobs[0], id=long_id), *snapshot.jobs[1:]))
    nodes = [n.name for n in snapshot.nodes]
    slots = tuple((node, i) for node in nodes for i in range(8))
    first = snapshot.jobs[0]
    jobs = [JobPlan(first.id, len(slots), 1410, 1, slots)]
    jobs += [JobPlan(job.id, 0, 1410, 1) for job in snapshot.jobs[1:]]
    plan = Plan(tuple(jobs), 1e4, 5e3)
    for width in (200, 80):
        console = Console(record=True, width=width)
        print_plan(snapshot, plan, console)
        text = console.export_text()
        rows = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
        assert max(map(len, rows)) <= 80 and "…" not in text
        for node in nodes:
            assert f"{node}:0-7" in text
        assert "1410" in text and "32" in text  # the numbers whole
        cells = [line.split("│")[1].strip() for line in rows if line.startswith("│")]
        assert "".join(cells).startswith(long_id)  # the name folded, whole


@pytest.mark.parametrize("args", [["plan"], ["plan", "--demo", "--eta", "1.5"]])
def test_bad_input_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("powerflow plan: error:") and "\n" not in err
