"""One hostile corpus, fed to every reader of text a tenant or a broken node can write.

Pod annotations and env, sample batches, budget ConfigMaps and extender requests
reach the node agent, the operator and the extender from people and machines
PowerFlow does not control. Each text of the corpus (``HOSTILE``: JSON nested
10,000 deep, numbers past any float or 4,300 digits, NUL raw and escaped, lone
surrogates, invalid UTF-8 as text, huge strings; and hypothesis' JSON and text) is
put in every field each component reads, and each component must read it as an
error of that object alone: no exception escapes, and the good object beside the
bad one is handled as if the bad one were not there.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import orjson
import pytest
from extender_bodies import node as extender_node
from extender_bodies import pod as extender_pod
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from powerflow.extender.objects import pod_info
from powerflow.extender.state import ClusterState as ExtenderState
from powerflow.extender.wire import WireError, decode_args
from powerflow.nodeagent.agent import Agent
from powerflow.nodeagent.iterations import ReportError, parse_report
from powerflow.nodeagent.pods import pod_view
from powerflow.nodeagent.settings import desired_settings
from powerflow.operator import sample_checks
from powerflow.operator.actions import Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.kube import ClusterState as OperatorState
from support.nodeagent_harness import NODE, RecordingGpus, worker_pod
from test_operator_bad_input import body, one_pass, pods_of, running

from powerflow.core import contract, untrusted
from powerflow.core.errors import ResourceError
from powerflow.core.telemetry import TelemetryError, parse_batch

HOSTILE = [
    "[" * 10_000 + "]" * 10_000,
    '{"a":' * 5_000 + "1" + "}" * 5_000,
    '{"block": ' + "[" * 3_000 + "]" * 3_000 + "}",
    "1e999999",
    "-1e999999",
    "9" * 5_000,
    "18446744073709551616",
    '{"block": [["n0", 99999999999999999999999]]}',
    '{"block": [["n0", 1e400]]}',
    "NaN",
    "Infinity",
    "²",  # a digit to str.isdigit, not to int()
    "٣",
    "a\x00b",
    '"a\\u0000b"',
    '{"clocksMhz": [1410], "sliceSeconds": "\\u0000"}',
    '"\\ud800"',
    "\ud800",
    "\ufeff{}",
    "\xff\xfe",
    "x" * 300_000,
    '{"block": [' + '["n0", 0],' * 50_000 + '["n0", 0]]}',
    "",
    " ",
    "null",
    "[]",
    "{}",
    "0",
    "-0",
    "true",
]
"""Texts that broke, or could break, a reader (module docstring)."""

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
TEXTS = st.text(max_size=40) | JSON_VALUES.map(lambda v: json.dumps(v))
CASES = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

ANNOTATIONS = [
    contract.WORKERS_ANNOTATION,
    contract.FREQUENCY_ANNOTATION,
    contract.GENERATION_ANNOTATION,
    contract.PLANNED_BLOCK_ANNOTATION,
    contract.PLACEMENT_ANNOTATION,
    contract.PROGRESS_ANNOTATION,
    contract.PROFILE_ANNOTATION,
    contract.POWER_LIMIT_ANNOTATION,
    contract.MODEL_ANNOTATION,
]


def hostile_examples(test: Any) -> Any:
    for text in HOSTILE:
        test = example(text)(test)
    return test


# -- node agent -------------------------------------------------------------------------------


@CASES
@given(TEXTS)
@hostile_examples
def test_the_node_agent_reads_any_text_as_a_problem_of_its_pod(text: str) -> None:
    bad = worker_pod("bad", 1, frequency_mhz="1200")
    bad["metadata"]["annotations"] = dict.fromkeys(ANNOTATIONS, text)
    bad["spec"]["containers"][0]["env"] = [{"name": "LOCAL_BATCH_SIZE", "value": text}]
    good = worker_pod("good", 2, frequency_mhz="1005", power_limit_watts="250")
    view = pod_view(bad)
    assert view.key == ("ns", "bad")
    agent = Agent(NODE, RecordingGpus())
    agent.on_pods_listed([bad, good])
    agent.on_pod_event("MODIFIED", bad)
    assert set(agent.pods) == {("ns", "bad"), ("ns", "good")}
    gpus_of = {("ns", "good"): (2,)}
    targets = desired_settings(agent.pods, gpus_of, agent.limits, now_s=0.0)
    assert (targets[2].frequency_mhz, targets[2].power_limit_w) == (1005, 250.0)
    # the worker endpoint's body: a report or one error, nothing else
    with contextlib.suppress(ReportError, untrusted.UntrustedTextError):
        parse_report(untrusted.load_json(text.encode("utf-8", "surrogatepass"), "body"), 0.0)


# -- operator ---------------------------------------------------------------------------------


@CASES
@given(TEXTS)
@hostile_examples
def test_the_operator_reads_any_text_as_a_problem_of_its_object(text: str) -> None:
    status = {"phase": "Running", "allocation": {"gpus": 4, "generation": 1, "localBatchSize": 64}}
    job = {**body("job"), "status": status}
    pods = running("job", 4, dict.fromkeys(ANNOTATIONS, text))
    actions = one_pass([Observed(job, pods), Observed(body("good"))])
    assert not [e for e in actions.events if e.reason == "InternalError"]
    assert len(pods_of(actions, "good")) == 4
    state = OperatorState((Observed(job, pods), Observed(body("good"))), (), None)
    assert ("ml", "good") in sample_checks.index(state)
    for data in ({"eta": text}, {"eta": "1", "schedule": text}, {"eta": "1", "timezone": text}):
        with contextlib.suppress(ResourceError):
            parse_budget(data)
    with contextlib.suppress(orjson.JSONDecodeError, TelemetryError):  # the ingest's body
        parse_batch(orjson.loads(text.encode("utf-8", "surrogatepass")))


# -- extender ---------------------------------------------------------------------------------


@CASES
@given(TEXTS)
@hostile_examples
def test_the_extender_reads_any_text_as_a_problem_of_its_pod(text: str) -> None:
    bad = extender_pod("bad", job="j", workers=2, namespace="ml", node_name="gpu-0")
    bad["metadata"]["annotations"] = dict.fromkeys(ANNOTATIONS, text)
    good = extender_pod("good", gpus=2, node_name="gpu-1")
    info = pod_info(bad)
    assert info.key == ("ml", "bad")
    state = ExtenderState()
    state.replace([extender_node("gpu-0"), extender_node("gpu-1")], [bad, good], [bad])
    state.upsert_pod(bad)
    assert state.pods[("default", "good")].gpus == 2
    assert state.gangs == {}  # nothing adopted from a pod no DLJob owns
    with contextlib.suppress(WireError):
        decode_args(text.encode("utf-8", "surrogatepass"), "application/json")


@pytest.mark.parametrize("text", HOSTILE[:3])
def test_the_shared_reader_refuses_deep_nesting_in_one_line(text: str) -> None:
    with pytest.raises(untrusted.UntrustedTextError) as caught:
        untrusted.parse_block(text, "placement annotation")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("placement annotation")
