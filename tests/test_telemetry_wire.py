"""The sample batch wire format (``powerflow.core.telemetry``): round trip and refusals."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerflow.core.telemetry import (
    MAX_PROGRESS_PER_BATCH,
    MAX_SAMPLES_PER_BATCH,
    JobProgress,
    NodePower,
    SampleBatch,
    TelemetryError,
    WindowSample,
    encode_batch,
    parse_batch,
)


def sample(**over: Any) -> WindowSample:
    base = {
        "namespace": "team-a",
        "job": "bert-1",
        "generation": 2,
        "n": 8,
        "gpus_per_node": 4,
        "local_batch_size": 32.0,
        "frequency_mhz": 1410,
        "gpus_measured": 4,
        "iterations": 17,
        "step_time_s": 0.31,
        "energy_j": 812.5,
        "end_s": 1.8e9,
    }
    return WindowSample(**{**base, **over})


def wire(**over: Any) -> dict[str, Any]:
    body = encode_batch(SampleBatch("node-1", (sample(),), NodePower(1234.5, 1.8e9)))
    body["samples"][0].update(over)
    return body


def test_a_batch_survives_json_round_trip() -> None:
    batch = SampleBatch("node-1", (sample(), sample(job="gpt-2", iterations=3)), None)
    assert parse_batch(json.loads(json.dumps(encode_batch(batch)))) == batch
    with_power = SampleBatch("node-1", (), NodePower(0.0, 1.8e9))
    assert parse_batch(json.loads(json.dumps(encode_batch(with_power)))) == with_power


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("energyJ", math.nan, "samples[0].energyJ"),
        ("energyJ", math.inf, "samples[0].energyJ"),
        ("stepTimeS", 0, "samples[0].stepTimeS"),
        ("stepTimeS", -1.0, "samples[0].stepTimeS"),
        ("n", True, "samples[0].n: expected an integer"),
        ("n", 2.0, "samples[0].n: expected an integer"),
        ("gpusPerNode", 16, "gpusPerNode: 16 exceeds n = 8"),
        ("gpusMeasured", 9, "gpusMeasured: 9 exceeds n = 8"),
        ("job", "Not_A_Name", "samples[0].job"),
        ("namespace", "", "samples[0].namespace"),
        ("frequencyMhz", "1410", "samples[0].frequencyMhz: expected an integer"),
        ("iterations", 0, "samples[0].iterations: 0 outside"),
    ],
)
def test_a_bad_field_is_refused_by_name(field: str, value: object, message: str) -> None:
    with pytest.raises(TelemetryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_batch(wire(**{field: value}))


def test_unknown_fields_missing_fields_and_oversized_batches_are_refused() -> None:
    with pytest.raises(TelemetryError, match="unknown field"):
        parse_batch(wire(extra=1))
    body = wire()
    del body["samples"][0]["energyJ"]
    with pytest.raises(TelemetryError, match="energyJ: expected a number"):
        parse_batch(body)
    big = wire()
    big["samples"] = big["samples"] * (MAX_SAMPLES_PER_BATCH + 1)
    with pytest.raises(TelemetryError, match="at most"):
        parse_batch(big)
    with pytest.raises(TelemetryError, match="body: expected an object"):
        parse_batch([])
    with pytest.raises(TelemetryError, match=r"power\.watts"):
        parse_batch({**wire(), "power": {"watts": -1.0, "atS": 1.0}})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(wire()["samples"][0])), value=json_values)
def test_any_value_in_any_field_parses_or_is_refused_with_telemetry_error(
    field: str, value: object
) -> None:
    """Nothing a sender puts in a field escapes as another exception."""
    try:
        batch = parse_batch(wire(**{field: value}))
    except TelemetryError:
        return
    s = batch.samples[0]
    assert all(math.isfinite(x) and x > 0 for x in (s.step_time_s, s.energy_j, s.end_s))
    assert 1 <= s.gpus_per_node <= s.n and 1 <= s.gpus_measured <= s.n


def test_progress_survives_the_round_trip_and_bad_progress_is_refused_by_name() -> None:
    progress = (JobProgress("team-a", "bert-1", 2, 0), JobProgress("team-b", "gpt", 1, 2**53))
    batch = SampleBatch("node-1", (sample(),), None, progress)
    assert parse_batch(json.loads(json.dumps(encode_batch(batch)))) == batch
    assert "progress" not in encode_batch(SampleBatch("node-1", ()))  # none: left out
    good = {"namespace": "ml", "job": "j", "generation": 1, "iterations": 5}
    for bad, message in [
        ({**good, "iterations": -1}, "progress[0].iterations: -1 outside"),
        ({**good, "iterations": 2**53 + 1}, "progress[0].iterations"),
        ({**good, "iterations": True}, "progress[0].iterations: expected an integer"),
        ({**good, "job": "Not_A_Name"}, "progress[0].job"),
        ({**good, "pod": "x"}, "progress[0]: unknown field(s) pod"),
        ({k: v for k, v in good.items() if k != "generation"}, "progress[0].generation"),
    ]:
        with pytest.raises(TelemetryError, match=re.escape(message)):
            parse_batch({"node": "n", "samples": [], "progress": [bad]})
    with pytest.raises(TelemetryError, match="progress: expected a list"):
        parse_batch({"node": "n", "samples": [], "progress": {}})
    too_many = [good] * (MAX_PROGRESS_PER_BATCH + 1)
    with pytest.raises(TelemetryError, match=f"at most {MAX_PROGRESS_PER_BATCH}"):
        parse_batch({"node": "n", "samples": [], "progress": too_many})
