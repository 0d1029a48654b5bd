"""Write PowerFlow's Grafana dashboard (helm/powerflow/files/dashboard.json).

    python scripts/make_dashboard.py            # write the JSON
    python scripts/make_dashboard.py --png layout.png   # and a picture of its layout

(docs/dashboard.png is the dashboard with real series: docs/verification.md, "The
chart as the system under test".)

The dashboard is generated, not hand-edited, so that panels stay on one grid
and every query is written once here; tests/test_dashboard.py checks that each
PromQL expression names only metrics and labels the components export.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "helm" / "powerflow" / "files" / "dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = "dljob_namespace, dljob"
"""A DLJob's labels on the operator's per-job gauges and the agents' GPU metrics (not
``namespace``/``job``: Prometheus sets those to the scraped target's)."""
JOB_LEGEND = "{{dljob_namespace}}/{{dljob}}"


def leader(expr: str) -> str:
    """``expr`` on the leading operator replica's series only: with two replicas, a
    follower keeps the gauges of its last pass as leader (or none), and a sum over both
    would count every job twice."""
    return f"({expr}) and on (instance) (powerflow_operator_leader == 1)"


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    pid: int,
    title: str,
    grid: tuple[int, int, int, int],
    targets: list[tuple[str, str]],
    unit: str,
    *,
    kind: str = "timeseries",
    description: str = "",
) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
    }


def panels() -> list[dict[str, Any]]:
    p: list[dict[str, Any]] = []
    add = p.append
    add(
        panel(
            1,
            "Cluster power: measured, budget, plan",
            (0, 0, 16, 9),
            [
                (f"sum({leader('powerflow_cluster_power_watts')})", "measured (node agents)"),
                (f"max({leader('powerflow_power_budget_watts')})", "budget"),
                (f"max({leader('powerflow_predicted_power_watts')})", "plan (predicted)"),
            ],
            "watt",
            description="GPU board power measured by the node agents against the admin's "
            "budget and the power the allocation plan predicts.",
        )
    )
    add(
        panel(
            2,
            "GPU energy per day",
            (16, 0, 8, 9),
            [("sum(increase(powerflow_gpu_energy_joules_total[1d])) / 3.6e6", "kWh")],
            "kwatth",
            kind="stat",
        )
    )
    add(
        panel(
            3,
            "GPUs: allocated, powered on, total",
            (0, 9, 12, 8),
            [
                ("max(" + leader('powerflow_cluster_gpus{state="allocated"}') + ")", "allocated"),
                ("max(" + leader('powerflow_cluster_gpus{state="powered"}') + ")", "powered on"),
                ("max(" + leader('powerflow_cluster_gpus{state="total"}') + ")", "total"),
            ],
            "short",
        )
    )
    add(
        panel(
            4,
            "DLJobs by phase",
            (12, 9, 12, 8),
            [(f"sum by (phase) ({leader('powerflow_jobs')})", "{{phase}}")],
            "short",
        )
    )
    add(
        panel(
            5,
            "GPUs per job",
            (0, 17, 8, 8),
            [(f"max by ({JOB}) ({leader('powerflow_job_gpus')})", JOB_LEGEND)],
            "short",
        )
    )
    add(
        panel(
            6,
            "Clock per job",
            (8, 17, 8, 8),
            [
                (
                    f"max by ({JOB}) ({leader('powerflow_job_frequency_hertz')})",
                    JOB_LEGEND,
                )
            ],
            "hertz",
        )
    )
    add(
        panel(
            7,
            "Measured power per job",
            (16, 17, 8, 8),
            [(f'sum by ({JOB}) (powerflow_gpu_power_watts{{dljob!=""}})', JOB_LEGEND)],
            "watt",
            description="Board power of the GPUs each DLJob's workers use, from the node "
            "agents; idle GPUs (no DLJob) are left out.",
        )
    )
    add(
        panel(
            8,
            "Throughput per job (iterations/s)",
            (0, 25, 8, 8),
            [
                (
                    f"sum by ({JOB}) ({leader('deriv(powerflow_job_iterations[5m])')})",
                    JOB_LEGEND,
                )
            ],
            "short",
        )
    )
    add(
        panel(
            9,
            "JCT of finished jobs",
            (8, 25, 8, 8),
            [
                (
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(powerflow_job_completion_seconds_bucket[1d])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.95, sum by (le) "
                    "(rate(powerflow_job_completion_seconds_bucket[1d])))",
                    "p95",
                ),
                (
                    "sum(rate(powerflow_job_completion_seconds_sum[1d])) / "
                    "sum(rate(powerflow_job_completion_seconds_count[1d]))",
                    "mean",
                ),
            ],
            "s",
        )
    )
    add(
        panel(
            10,
            "Model fit error per job",
            (16, 25, 8, 8),
            [
                (
                    f"max by ({JOB}) ({leader('powerflow_job_fit_error_ratio')})",
                    JOB_LEGEND,
                )
            ],
            "percentunit",
        )
    )
    add(
        panel(
            11,
            "Allocation loop latency",
            (0, 33, 8, 8),
            [
                (
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(powerflow_allocation_loop_seconds_bucket[5m])))",
                    "p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(powerflow_allocation_loop_seconds_bucket[5m])))",
                    "p99",
                ),
            ],
            "s",
        )
    )
    add(
        panel(
            12,
            "Extender latency",
            (8, 33, 8, 8),
            [
                (
                    "histogram_quantile(0.99, sum by (le, verb) "
                    "(rate(powerflow_extender_request_duration_seconds_bucket[5m])))",
                    "p99 {{verb}}",
                ),
            ],
            "s",
        )
    )
    add(
        panel(
            13,
            "Telemetry: samples ingested, refused, dropped",
            (16, 33, 8, 8),
            [
                ("sum(rate(powerflow_ingest_samples_total[5m]))", "ingested/s"),
                (
                    "sum by (reason) (rate(powerflow_ingest_refused_total[5m]))",
                    "refused/s {{reason}}",
                ),
                ("sum(rate(powerflow_agent_samples_dropped_total[5m]))", "dropped by agents/s"),
                (
                    "sum by (reason) (rate(powerflow_model_samples_dropped_total[5m]))",
                    "dropped by the model store/s {{reason}}",
                ),
            ],
            "short",
        )
    )
    add(
        panel(
            14,
            "Extender errors and failed binds",
            (0, 41, 8, 8),
            [
                (
                    'sum by (verb) (rate(powerflow_extender_requests_total{outcome="error"}[5m]))',
                    "errors/s {{verb}}",
                ),
                (
                    "sum by (result) "
                    '(rate(powerflow_extender_binds_total{result=~"failed|refused"}[5m]))',
                    "binds/s {{result}}",
                ),
            ],
            "reqps",
            description="Calls kube-scheduler got an Error for (its pods wait and are "
            "retried), and binds that failed or were refused.",
        )
    )
    add(
        panel(
            15,
            "Node agents: failed posts and drops",
            (8, 41, 8, 8),
            [
                ("sum(rate(powerflow_agent_sample_post_failures_total[5m]))", "failed posts/s"),
                (
                    "sum by (reason) (rate(powerflow_agent_samples_dropped_total[5m]))",
                    "dropped/s {{reason}}",
                ),
                (
                    "sum by (sender_node, reason) "
                    "(rate(powerflow_ingest_samples_refused_total[5m]))",
                    "refused/s {{sender_node}} {{reason}}",
                ),
            ],
            "short",
            description="Posts of sample batches that failed (retried), samples the agents "
            "dropped, and samples the ingest refused, by sender (docs/security.md).",
        )
    )
    add(
        panel(
            16,
            "Budget valid, operator leading",
            (16, 41, 8, 8),
            [
                (f"min({leader('powerflow_budget_valid')})", "budget valid"),
                ("sum(powerflow_operator_leader)", "leading replicas"),
            ],
            "short",
            kind="stat",
            description="0 for the budget: the ConfigMap was refused and the last valid "
            "budget is in force (see its Events). Leading replicas must be 1.",
        )
    )
    return p


def dashboard() -> dict[str, Any]:
    return {
        "title": "PowerFlow",
        "uid": "powerflow",
        "description": "Power against budget, GPUs, jobs, fits and the scheduler's health.",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "tags": ["powerflow", "gpu", "energy"],
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels(),
    }


def draw(board: dict[str, Any], path: Path) -> None:
    """The panel layout as a picture (titles and queries' legends on the grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    fig, ax = plt.subplots(figsize=(12, rows * 0.28))
    for p in board["panels"]:
        g = p["gridPos"]
        ax.add_patch(
            Rectangle((g["x"], g["y"]), g["w"], g["h"], fill=True, fc="#f4f6fa", ec="#4a5b7a")
        )
        ax.text(g["x"] + 0.3, g["y"] + 0.8, p["title"], fontsize=9, weight="bold", va="top")
        # Wrapped to the panel's width (about 6 characters of 7 pt text per grid column).
        legends = textwrap.fill(", ".join(t["legendFormat"] for t in p["targets"]), g["w"] * 6)
        ax.text(g["x"] + 0.3, g["y"] + 2.0, legends, fontsize=7, va="top", color="#333")
        ax.text(
            g["x"] + g["w"] - 0.3,
            g["y"] + g["h"] - 0.5,
            p["fieldConfig"]["defaults"]["unit"],
            fontsize=7,
            ha="right",
            color="#777",
        )
    ax.set_xlim(0, 24)
    ax.set_ylim(rows, 0)
    ax.axis("off")
    ax.set_title('Grafana dashboard "PowerFlow": panel layout', fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, help="also draw the panel layout here")
    args = parser.parse_args()
    board = dashboard()
    OUT.write_text(json.dumps(board, indent=2) + "\n")
    if args.png:
        draw(board, args.png)


if __name__ == "__main__":
    main()
