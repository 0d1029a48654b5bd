"""The Grafana dashboard names only metrics and labels the components export,
and loads as a dashboard (schema version, unique panel ids, datasource variable)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from powerflow.extender.metrics import Metrics as ExtenderMetrics
from powerflow.nodeagent.metrics import GpuMetrics
from powerflow.nodeagent.sender import IngestConnection, SampleSender
from powerflow.operator.learning import SampleStore
from powerflow.operator.metrics import Metrics as OperatorMetrics
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "helm" / "powerflow" / "files" / "dashboard.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}


def exported() -> dict[str, set[str]]:
    """Every series name the components export, with its label names (as each
    component builds its own registry: operator, its sample store, extender,
    node agent and its sample sender)."""
    operator = OperatorMetrics()
    SampleStore(registry=operator.registry)
    agent = GpuMetrics("n1")
    SampleSender(IngestConnection("http://127.0.0.1:1"), "n1", registry=agent.registry)
    registries: list[CollectorRegistry] = [
        operator.registry,
        ExtenderMetrics(lambda: {}).registry,
        agent.registry,
    ]
    names: dict[str, set[str]] = {}
    for registry in registries:
        for collector in list(registry._collector_to_names):
            labels = set(getattr(collector, "_labelnames", ()))
            kind = getattr(collector, "_type", "")
            base = getattr(collector, "_name", None)
            if base is None:
                continue
            names[base] = labels
            for suffix in SUFFIXES.get(kind, ()):
                names[base + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def expressions() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board()["panels"] for t in p["targets"]]


def test_the_dashboard_loads_as_a_grafana_dashboard() -> None:
    b = board()
    assert isinstance(b["schemaVersion"], int) and b["schemaVersion"] >= 36
    ids = [p["id"] for p in b["panels"]]
    assert len(ids) == len(set(ids)) > 0
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in b["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0


def test_the_dashboard_is_what_the_generator_writes(tmp_path: Path) -> None:
    """helm/powerflow/files/dashboard.json is generated: scripts/make_dashboard.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_dashboard", ROOT / "scripts" / "make_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert json.dumps(module.dashboard(), indent=2) + "\n" == DASHBOARD.read_text()


@pytest.mark.parametrize(("title", "expr"), expressions(), ids=lambda v: str(v)[:40])
def test_every_query_names_exported_metrics_and_labels(title: str, expr: str) -> None:
    known = exported()
    metrics = re.findall(r"\b(powerflow_[a-z0-9_]+)", expr)
    assert metrics, f"{title}: {expr} names no PowerFlow metric"
    for name in metrics:
        assert name in known, f"{title}: {name} is not exported by any component"
    # Label names in selectors {a="b"} and in by (...) clauses must be on the metrics.
    labels = set(re.findall(r"[{,]\s*([a-zA-Z_]+)\s*(?:=|!=|=~|!~)", expr))
    for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    available = set().union(*(known[m] for m in metrics))
    missing = labels - available
    assert not missing, f"{title}: labels {sorted(missing)} are on none of {sorted(set(metrics))}"


def test_the_legends_use_labels_the_queries_keep() -> None:
    for p in board()["panels"]:
        for t in p["targets"]:
            used = set(re.findall(r"\{\{\s*([a-zA-Z_]+)\s*\}\}", t["legendFormat"]))
            kept = set()
            for group in re.findall(r"\bby\s*\(([^)]*)\)", t["expr"]):
                kept |= {x.strip() for x in group.split(",")}
            assert used <= kept, f"{p['title']}: legend uses {sorted(used - kept)}"


# Labels Prometheus (and the Prometheus operator's ServiceMonitor) put on every series it
# scrapes. With ``honor_labels: false`` (the default) an exported label of the same name
# is renamed ``exported_<name>``, so queries grouping by it find nothing.
TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
)


def test_no_metric_carries_a_label_prometheus_sets_on_its_targets() -> None:
    clashes = {
        name: sorted(labels & TARGET_LABELS)
        for name, labels in exported().items()
        if labels & TARGET_LABELS
    }
    assert not clashes, f"labels Prometheus would rename to exported_*: {clashes}"
