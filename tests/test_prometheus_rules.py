"""The chart's alerts and the dashboard's queries, run by Prometheus' own engine (promtool).

``promtool test rules`` evaluates rules on series a test writes out, minute by minute:
each alert of ``helm/powerflow/files/alerts.yaml`` fires on the series it is for and not
on their harmless neighbours, and the dashboard's queries (``scripts/make_dashboard.py``)
count the leading operator replica's gauges once, where a follower keeps stale ones.
Every dashboard query also goes through Prometheus' parser (``promtool check rules``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "helm" / "powerflow" / "files" / "alerts.yaml"
DASHBOARD = ROOT / "helm" / "powerflow" / "files" / "dashboard.json"

LEADER = 'instance="op-a"'
FOLLOWER = 'instance="op-b"'


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's promtool (installed by scripts/fetch-k8s-tools.sh, as CI does)."""
    if shutil.which("promtool") is None:
        subprocess.run([str(ROOT / "scripts" / "fetch-k8s-tools.sh")], check=True)
    found = shutil.which("promtool")
    assert found, "promtool is not installed (apt-get install prometheus)"
    return found


def run_tests(promtool: str, tmp_path: Path, rules: Path, tests: list[dict[str, Any]]) -> str:
    # Each test's own ``interval`` (promtool 2.42 samples no input series without it).
    tests = [{"interval": "1m", **test} for test in tests]
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_the_alert_rules_are_valid_prometheus_rules(promtool: str) -> None:
    run = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "7 rules found" in run.stdout


def operator(instance: str, leader: int, **gauges: str) -> list[dict[str, str]]:
    """One operator replica's series (``series`` values per minute, promtool's notation)."""
    out = [{"series": f"powerflow_operator_leader{{{instance}}}", "values": f"{leader}x30"}]
    for name, values in gauges.items():
        out.append({"series": f"powerflow_{name}{{{instance}}}", "values": values})
    return out


def alert(name: str, at: str, firing: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": firing}


def test_each_alert_fires_on_its_series_and_not_on_their_neighbours(
    promtool: str, tmp_path: Path
) -> None:
    """A test per alert: the series that must fire it (after its ``for``), and beside them
    what must not (within the budget's slack, a follower's stale gauges, a GPU locked)."""
    power = [
        # the leader measures 1,100 W against 1,000 W; a follower's stale 5,000 W is ignored
        *operator(LEADER, 1, cluster_power_watts="1100x30", power_budget_watts="1000x30"),
        *operator(FOLLOWER, 0, cluster_power_watts="5000x30", power_budget_watts="100x30"),
    ]
    within = operator(LEADER, 1, cluster_power_watts="1010x30", power_budget_watts="1000x30")
    agents = [
        {"series": 'up{job="powerflow-nodeagent-metrics",instance="n1:9401"}', "values": "0x30"},
        {"series": 'up{job="powerflow-nodeagent-metrics",instance="n2:9401"}', "values": "1x30"},
    ]
    gpu = 'node="n1",gpu="{}",dljob_namespace="ml",dljob="{}",worker_pod="p"'
    clocks = [
        {"series": f"powerflow_gpu_locked_clock_hertz{{{gpu.format(0, 'a')}}}", "values": "0x30"},
        {
            "series": f"powerflow_gpu_locked_clock_hertz{{{gpu.format(1, 'b')}}}",
            "values": "1.2e9x30",
        },
        {"series": f"powerflow_gpu_locked_clock_hertz{{{gpu.format(2, '')}}}", "values": "0x30"},
    ]
    errors = [
        {
            "series": 'powerflow_extender_requests_total{verb="filter",outcome="error"}',
            "values": "0+60x30",
        },
        {
            "series": 'powerflow_extender_requests_total{verb="filter",outcome="ok"}',
            "values": "0+6000x30",
        },
    ]
    budget = [
        *operator(LEADER, 1, budget_valid="0x30"),
        *operator(FOLLOWER, 0, budget_valid="1x30"),
    ]
    tests = [
        {
            "input_series": power,
            "alert_rule_test": [
                alert("PowerFlowPowerAboveBudget", "3m", []),  # not for 5 minutes yet
                alert(
                    "PowerFlowPowerAboveBudget", "10m", [{"exp_labels": {"severity": "critical"}}]
                ),
            ],
        },
        {
            "input_series": within,
            "alert_rule_test": [alert("PowerFlowPowerAboveBudget", "10m", [])],
        },
        {
            "input_series": agents,
            "alert_rule_test": [
                alert(
                    "PowerFlowNodeAgentDown",
                    "10m",
                    [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "job": "powerflow-nodeagent-metrics",
                                "instance": "n1:9401",
                            }
                        }
                    ],
                )
            ],
        },
        {
            "input_series": clocks,
            "alert_rule_test": [
                alert(
                    "PowerFlowClocksNotApplied",
                    "10m",
                    [{"exp_labels": {"severity": "warning", "node": "n1", "gpu": "0"}}],
                )
            ],
        },
        {
            "input_series": operator(LEADER, 0) + operator(FOLLOWER, 0),
            "alert_rule_test": [
                alert(
                    "PowerFlowOperatorNotLeading", "10m", [{"exp_labels": {"severity": "critical"}}]
                )
            ],
        },
        {
            "input_series": operator(LEADER, 1) + operator(FOLLOWER, 0),
            "alert_rule_test": [alert("PowerFlowOperatorNotLeading", "10m", [])],
        },
        {
            "input_series": [{"series": "something_else", "values": "1x30"}],
            "alert_rule_test": [
                alert(
                    "PowerFlowOperatorNotLeading", "10m", [{"exp_labels": {"severity": "critical"}}]
                )
            ],
        },
        {
            # The leader's last pass at 0 s (promtool's clock starts at 0), its interval
            # 60 s; a follower's last passes are recent, and no one's concern.
            "input_series": [
                *operator(
                    LEADER,
                    1,
                    allocation_last_pass_timestamp_seconds="0x30",
                    scheduling_interval_seconds="60x30",
                ),
                *operator(FOLLOWER, 0, allocation_last_pass_timestamp_seconds="0+60x30"),
            ],
            "alert_rule_test": [
                alert("PowerFlowAllocationStalled", "13m", []),
                alert(
                    "PowerFlowAllocationStalled", "17m", [{"exp_labels": {"severity": "critical"}}]
                ),
            ],
        },
        {
            # The leader passes every minute; a follower's stale record is not the leader's.
            "input_series": [
                *operator(
                    LEADER,
                    1,
                    allocation_last_pass_timestamp_seconds="0+60x30",
                    scheduling_interval_seconds="60x30",
                ),
                *operator(
                    FOLLOWER,
                    0,
                    allocation_last_pass_timestamp_seconds="0x30",
                    scheduling_interval_seconds="60x30",
                ),
            ],
            "alert_rule_test": [alert("PowerFlowAllocationStalled", "20m", [])],
        },
        {
            # An idle cluster on a 20-minute interval passes every 20 minutes: 19 minutes
            # without a pass at 39m is no stall (without the interval it would fire at 35m).
            "input_series": [
                {"series": f"powerflow_operator_leader{{{LEADER}}}", "values": "1x50"},
                {
                    "series": f"powerflow_allocation_last_pass_timestamp_seconds{{{LEADER}}}",
                    "values": "0x19 1200x19 2400x10",
                },
                {
                    "series": f"powerflow_scheduling_interval_seconds{{{LEADER}}}",
                    "values": "1200x50",
                },
            ],
            "alert_rule_test": [alert("PowerFlowAllocationStalled", "39m", [])],
        },
        {
            "input_series": errors,
            "alert_rule_test": [
                alert("PowerFlowExtenderErrors", "20m", [{"exp_labels": {"severity": "warning"}}])
            ],
        },
        {
            "input_series": budget,
            "alert_rule_test": [
                alert("PowerFlowBudgetInvalid", "10m", []),
                alert("PowerFlowBudgetInvalid", "20m", [{"exp_labels": {"severity": "warning"}}]),
            ],
        },
        {
            "input_series": [
                *operator(LEADER, 1, budget_valid="1x30"),
                *operator(FOLLOWER, 0, budget_valid="0x30"),
            ],
            "alert_rule_test": [alert("PowerFlowBudgetInvalid", "20m", [])],
        },
    ]
    # The alerts without their annotations: promtool compares those word for word, and
    # their templates are checked by ``promtool check rules`` above.
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    bare = tmp_path / "alerts.yaml"
    bare.write_text(yaml.safe_dump(rules))
    run_tests(promtool, tmp_path, bare, tests)


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Each panel's query through Prometheus' parser, as a recording rule of its own."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e}
        for i, (_, e) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_dashboard_counts_the_leaders_gauges_once(promtool: str, tmp_path: Path) -> None:
    """Two operator replicas: the leader's gauges and a follower's stale ones from before
    it lost the Lease. The dashboard's job, GPU and power panels show the leader's."""
    queries = {title: e for title, e in dashboard_queries()}
    jobs = queries["DLJobs by phase"]
    power = next(
        e for t, e in dashboard_queries() if t.startswith("Cluster power") and "cluster_power" in e
    )
    series = [
        {"series": f'powerflow_jobs{{{LEADER},phase="Running"}}', "values": "3x10"},
        {"series": f'powerflow_jobs{{{FOLLOWER},phase="Running"}}', "values": "5x10"},
        {"series": f'powerflow_jobs{{{FOLLOWER},phase="Pending"}}', "values": "2x10"},
        *operator(LEADER, 1, cluster_power_watts="900x10"),
        *operator(FOLLOWER, 0, cluster_power_watts="700x10"),
    ]
    tests = [
        {
            "input_series": series,
            "promql_expr_test": [
                {
                    "expr": jobs,
                    "eval_time": "5m",
                    "exp_samples": [{"labels": '{phase="Running"}', "value": 3}],
                },
                {"expr": power, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 900}]},
            ],
        }
    ]
    empty = tmp_path / "none.yaml"
    empty.write_text("groups: []\n")
    run_tests(promtool, tmp_path, empty, tests)
