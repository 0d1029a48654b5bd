"""Counters and histograms the dashboard rates by label exist at 0 from the start.

``rate()`` over a series that was never exported is no data, not 0, and the
increase up to a series' first scrape is never counted: the
dashboard's panels of errors, failed binds and dropped samples would read
"No data" on a healthy cluster, and its extender latency would miss the first
burst of calls (what the chart twin's real Prometheus showed,
``e2e/test_chart_twin.py``). Each labelled counter a panel reads is exported for
every label value it can take before the first event.
"""

from __future__ import annotations

from powerflow.extender.metrics import BIND_RESULTS, VERBS, Metrics
from powerflow.operator.learning import DROP_REASONS, SampleStore
from prometheus_client import CollectorRegistry, generate_latest


def test_extender_errors_and_bind_results_start_at_zero() -> None:
    text = Metrics(lambda: {}).exposition().decode()
    for verb in VERBS:
        assert f'powerflow_extender_requests_total{{outcome="error",verb="{verb}"}} 0.0' in text
        count = f'powerflow_extender_request_duration_seconds_count{{verb="{verb}"}} 0.0'
        assert count in text
    for result in BIND_RESULTS:
        assert f'powerflow_extender_binds_total{{result="{result}"}} 0.0' in text


def test_dropped_model_samples_start_at_zero_for_every_reason() -> None:
    registry = CollectorRegistry()
    SampleStore(registry=registry)
    text = generate_latest(registry).decode()
    for reason in DROP_REASONS:
        assert f'powerflow_model_samples_dropped_total{{reason="{reason}"}} 0.0' in text
