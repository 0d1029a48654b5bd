"""One bad DLJob, pod or status never stops the operator's pass for the others.

Bodies here bypass the CRD's schema on purpose (an older CRD, a body written
by someone else): ``parse_dljob`` must refuse them with ``ResourceError``, the
pass must contain whatever else goes wrong to the job at fault.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.job_view import _block
from powerflow.operator.jobs import BOUNDS, RequestCache, parse_dljob
from powerflow.operator.reconcile import reconcile
from powerflow.operator.workers import WorkerSet, worker_pods
from support.operator_pass import pass_inputs

from powerflow.core import contract
from powerflow.core.errors import ResourceError
from powerflow.core.gpus import A100
from powerflow.core.policy.snapshot import JobPlan, Node, Plan, Snapshot
from powerflow.core.timefmt import format_time, format_time_ms
from powerflow.lab.synthetic import SyntheticModel

FAST = settings(max_examples=300, deadline=None, derandomize=True)
NODES = (Node("n0", 8, A100), Node("n1", 8, A100))
GPU = contract.GPU_RESOURCE


def body(name: str = "job", **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 100,
            "gpus": {"requested": 4, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    out["spec"].update(spec)
    return out


def container(**fields: Any) -> dict[str, Any]:
    return {"template": {"spec": {"containers": [{"name": "trainer", "image": "x", **fields}]}}}


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"template": {"spec": {"containers": ["x"]}}}, "InvalidTemplate"),
        ({"template": {"spec": "x"}}, "InvalidTemplate"),
        ({"template": "x"}, "InvalidTemplate"),
        ({"template": {"spec": {"containers": [{"name": 5, "image": "x"}]}}}, "InvalidTemplate"),
        ({"template": {"spec": {"containers": [{"image": "x"}]}}}, "InvalidTemplate"),
        ({"template": {"spec": {"containers": {"name": "trainer"}}}}, "NoTrainerContainer"),
        (
            {"template": {"metadata": {"labels": ["a"]}, "spec": {"containers": [{"name": "t"}]}}},
            "InvalidTemplate",
        ),
        (
            {
                "template": {
                    "metadata": {"labels": {"a": 1}},
                    "spec": {"containers": [{"name": "t"}]},
                }
            },
            "InvalidTemplate",
        ),
        (
            {
                "template": {
                    "metadata": {"annotations": "a"},
                    "spec": {"containers": [{"name": "t"}]},
                }
            },
            "InvalidTemplate",
        ),
        ({"template": {"metadata": 3, "spec": {"containers": [{"name": "t"}]}}}, "InvalidTemplate"),
        (container(env="A=1"), "InvalidTemplate"),
        (container(env=[{"value": "1"}]), "InvalidTemplate"),
        (container(env=["A"]), "InvalidTemplate"),
        (container(resources=["gpu"]), "InvalidTemplate"),
        (container(resources={"limits": ["gpu"]}), "InvalidTemplate"),
        (container(resources={"requests": "1"}), "InvalidTemplate"),
        ({"trainerContainer": 5}, "NoTrainerContainer"),
        ({"iterations": 10**18}, "InvalidField"),
        ({"iterations": 10**400}, "InvalidField"),
        ({"globalBatchSize": 1 << 40}, "InvalidField"),
        ({"gpus": {"requested": 1 << 20}}, "InvalidField"),
        ({"gpus": "four"}, "InvalidTemplate"),
        ({"restart": {"limit": 10**30}}, "InvalidField"),
        ({"restart": 3}, "InvalidTemplate"),
        ({"masterPort": 70000}, "InvalidField"),
        ({"terminationGracePeriodSeconds": 10**18}, "InvalidField"),
        ({"maxLocalBatchSize": 10**20}, "InvalidField"),
        ({"maxLocalBatchSize": 1.5}, "InvalidField"),
        ({"model": ["resnet"]}, "InvalidField"),
    ],
)
def test_malformed_specs_are_refused_with_a_reason(spec: dict[str, Any], reason: str) -> None:
    with pytest.raises(ResourceError) as exc:
        parse_dljob(body(**spec))  # type: ignore[arg-type]
    assert exc.value.reason == reason
    assert len(str(exc.value)) < 300  # a clear one-line reason, not a dump of the body


@pytest.mark.parametrize("bad", [{"name": 5}, {"name": None}, {"namespace": ["ml"]}])
def test_malformed_metadata_is_refused(bad: dict[str, Any]) -> None:
    doc = body()
    doc["metadata"].update(bad)
    with pytest.raises(ResourceError):
        parse_dljob(doc)  # type: ignore[arg-type]


def test_spec_and_metadata_of_the_wrong_type_are_refused() -> None:
    for doc in ({"metadata": "x", "spec": {}}, {**body(), "spec": "x"}, {**body(), "spec": [1]}):
        with pytest.raises(ResourceError):
            parse_dljob(doc)  # type: ignore[arg-type]


def test_junk_generation_and_timestamp_are_not_fatal() -> None:
    doc = body()
    doc["metadata"].update(generation=1e400, creationTimestamp=["x"])
    job = parse_dljob(doc)  # type: ignore[arg-type]
    assert (job.generation, job.created_s) == (1, 0.0)
    assert RequestCache().parse(doc) == job  # type: ignore[arg-type]


def test_every_bound_is_enforced_at_both_ends() -> None:
    for path, (low, high) in BOUNDS.items():
        for value, ok in ((low - 1, False), (high + 1, False)):
            spec = copy.deepcopy(body()["spec"])
            node = spec
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
            with pytest.raises(ResourceError, match=path) as exc:
                parse_dljob({**body(), "spec": spec})  # type: ignore[typeddict-item]
            assert ok is False and exc.value.reason == "InvalidField"


def test_largest_values_still_make_pods_and_times() -> None:
    high = {path: bound[1] for path, bound in BOUNDS.items()}
    job = parse_dljob(body(iterations=high["iterations"]))  # type: ignore[arg-type]
    assert job.iterations == 10**12
    ws = WorkerSet(1, 1, 256, 1410)
    (pod,) = worker_pods(job, ws)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["POWERFLOW_ITERATIONS"] == "1000000000000"
    assert float(job.iterations) == job.iterations  # exact as a float


@pytest.mark.parametrize("epoch_s", [1e18, 10**400, float("inf"), float("-inf"), float("nan")])
def test_times_far_out_are_clamped_not_raised(epoch_s: float) -> None:
    assert format_time(epoch_s) in ("9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z")
    assert format_time_ms(epoch_s)[:4] in ("9999", "1970")


# -- property: parse_dljob refuses, or worker_pods gives the trainer one GPU -----------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["trainer", "side", "", "env", "name"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The right shape most of the time, anything JSON now and then."""
    return st.one_of(strategy, strategy, JSON)


STRINGS = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
NAMES = st.sampled_from(["trainer", "side", "x"]) | st.text(max_size=4)
ENV = st.lists(maybe(st.fixed_dictionaries({"name": maybe(NAMES)}, optional={"value": JSON})))
RESOURCES = st.fixed_dictionaries(
    {}, optional={"limits": maybe(STRINGS), "requests": maybe(STRINGS), "claims": JSON}
)
CONTAINER = st.fixed_dictionaries(
    {"name": maybe(NAMES)},
    optional={"env": maybe(ENV), "resources": maybe(RESOURCES), "image": JSON},
)
TEMPLATE = st.fixed_dictionaries(
    {},
    optional={
        "metadata": maybe(
            st.fixed_dictionaries(
                {}, optional={"labels": maybe(STRINGS), "annotations": maybe(STRINGS)}
            )
        ),
        "spec": maybe(
            st.fixed_dictionaries(
                {"containers": maybe(st.lists(maybe(CONTAINER), max_size=3))},
                optional={"volumes": JSON, "hostname": JSON},
            )
        ),
    },
)
INTS = st.integers(min_value=-5, max_value=20) | st.integers() | JSON
SPEC = st.fixed_dictionaries(
    {
        "globalBatchSize": st.sampled_from([256, 64]) | INTS,
        "iterations": st.sampled_from([100, 10**12]) | INTS,
        "gpus": maybe(
            st.fixed_dictionaries(
                {"requested": st.sampled_from([1, 2, 4]) | INTS},
                optional={"min": INTS, "max": INTS},
            )
        ),
        "template": maybe(TEMPLATE),
    },
    optional={
        "trainerContainer": maybe(NAMES),
        "maxLocalBatchSize": INTS,
        "masterPort": INTS,
        "terminationGracePeriodSeconds": INTS,
        "restart": maybe(
            st.fixed_dictionaries(
                {}, optional={"limit": INTS, "backoffSeconds": INTS, "maxBackoffSeconds": INTS}
            )
        ),
        "model": JSON,
    },
)


def _trainer_gpus(pod: dict[str, Any], trainer: str) -> tuple[Any, Any]:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == trainer]
    return c["resources"]["limits"].get(GPU), c["resources"]["requests"].get(GPU)


@FAST
@given(SPEC)
def test_any_spec_is_refused_or_makes_gpu_workers(spec: dict[str, Any]) -> None:
    doc = {**body(), "spec": spec}
    try:
        job = parse_dljob(doc)  # type: ignore[typeddict-item]
    except ResourceError:
        return
    pods = worker_pods(job, WorkerSet(2, 2, 8, 1200))
    assert len(pods) == 2
    for pod in pods:
        assert _trainer_gpus(pod, job.trainer) == ("1", "1")
        json.dumps(pod)  # sendable to the API server
    for path, (low, high) in BOUNDS.items():
        value: Any = spec
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        assert value is None or low <= value <= high


# -- reconcile: the bad job is refused or contained, the others run --------------------------


class EachRequested:
    def plan(self, snapshot: Snapshot) -> Plan:
        plans = []
        for node, job in enumerate(snapshot.jobs):
            n = job.requested_gpus
            slots = tuple((f"n{node}", i) for i in range(n))
            plans.append(JobPlan(job.id, n, 1410, job.global_batch_size // n, slots))
        return Plan(tuple(plans), limit_w=1e9, predicted_w=0.0)


def one_pass(observed: list[Observed], models: Any = None, **kw: Any) -> Actions:
    return reconcile(
        observed,
        NODES,
        parse_budget({"eta": "1"}),
        1000.0,
        EachRequested(),
        models or (lambda job: SyntheticModel()),
        **pass_inputs(**kw),
    )


def patches(actions: Actions) -> dict[str, dict[str, Any]]:
    return {name: patch for _, name, patch in actions.status_first + actions.status}


def pods_of(actions: Actions, job: str) -> list[dict[str, Any]]:
    return [
        b
        for b in actions.create
        if b["kind"] == "Pod" and b["metadata"]["labels"][contract.JOB_LABEL] == job
    ]


def test_a_huge_iteration_count_that_bypassed_the_schema_fails_only_its_job() -> None:
    bad, good = body("bad", iterations=10**18), body("good")
    actions = one_pass([Observed(bad), Observed(good)])
    status = patches(actions)
    assert status["bad"]["phase"] == "Failed"
    (valid,) = [c for c in status["bad"]["conditions"] if c["type"] == "Valid"]
    assert (valid["status"], valid["reason"]) == ("False", "InvalidField")
    assert "spec.iterations" in valid["message"]
    assert len(pods_of(actions, "good")) == 4 and not pods_of(actions, "bad")
    assert status["good"]["phase"] == "Profiling"


@pytest.mark.parametrize(
    "spec",
    [
        {"template": {"spec": {"containers": ["x"]}}},
        {"template": {"spec": "x"}},
        container(env={"A": "1"}),
        container(resources={"limits": "nvidia.com/gpu=1"}),
        {"template": {"metadata": {"labels": ["x"]}, "spec": {"containers": [{"name": "t"}]}}},
    ],
)
def test_a_malformed_template_fails_only_its_job(spec: dict[str, Any]) -> None:
    actions = one_pass([Observed(body("bad", **spec)), Observed(body("good"))])
    assert patches(actions)["bad"]["phase"] == "Failed"
    assert len(pods_of(actions, "good")) == 4
    assert any(e.name == "bad" and e.reason == "InvalidSpec" for e in actions.events)


def test_an_unexpected_exception_is_an_internal_error_on_that_job_only() -> None:
    def models(job: Any) -> SyntheticModel:
        if job.name == "poisoned":
            raise ZeroDivisionError("a bug that only this job's body reaches\nsecond line")
        return SyntheticModel()

    actions = one_pass([Observed(body("poisoned")), Observed(body("good"))], models)
    status = patches(actions)
    (cond,) = [c for c in status["poisoned"]["conditions"] if c["type"] == "Reconciled"]
    assert (cond["status"], cond["reason"]) == ("False", "InternalError")
    assert cond["message"] == "ZeroDivisionError: a bug that only this job's body reaches"
    assert [e.reason for e in actions.events if e.name == "poisoned"] == ["InternalError"]
    assert not pods_of(actions, "poisoned") and len(pods_of(actions, "good")) == 4
    assert status["good"]["phase"] == "Profiling"

    # The same error on the next pass: no second event; once fixed, the condition clears.
    seen = {**body("poisoned"), "status": {"conditions": status["poisoned"]["conditions"]}}
    again = one_pass([Observed(seen), Observed(body("good"))], models)
    assert not [e for e in again.events if e.reason == "InternalError"]
    healed = patches(one_pass([Observed(seen)]))["poisoned"]
    (cond,) = [c for c in healed["conditions"] if c["type"] == "Reconciled"]
    assert cond["status"] == "True"


def test_a_poisoned_pod_is_contained_and_its_actions_undone() -> None:
    """A failed worker without a name (no API server sends one; a bug might) breaks the
    restart step midway: what that step queued for the job is dropped."""
    status = {"phase": "Running", "allocation": {"gpus": 2, "generation": 1}}
    bad = {**body("bad", gpus={"requested": 2, "min": 1, "max": 2}), "status": status}
    named = {
        "metadata": {
            "name": "bad-g1-w0",
            "labels": {contract.JOB_LABEL: "bad"},
            "annotations": {contract.GENERATION_ANNOTATION: "1"},
        },
        "status": {"phase": "Failed"},
    }
    nameless = copy.deepcopy(named)
    del nameless["metadata"]["name"]
    actions = one_pass([Observed(bad, (named, nameless)), Observed(body("good"))])  # type: ignore[arg-type]
    assert all(name != "bad-g1-w0" for _, name, _ in actions.delete_pods)  # undone
    assert patches(actions)["bad"]["conditions"][-1]["reason"] == "InternalError"
    assert len(pods_of(actions, "good")) == 4


# -- junk written by others: annotations and status fields -----------------------------------

JUNK = ["1e400", "Infinity", "-1", "9" * 5000, "0x10", " 4", "", "nan", "٣"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"block": [["n0", 1e400]]}',
        '{"block": [["n0", Infinity]]}',
        '{"block": [["n0", NaN]]}',
        '{"block": [["n0", 1.5]]}',
        '{"block": [["n0", true]]}',
        '{"block": [[5, 0]]}',
        '{"block": [["n0", 99999999999999999999999]]}',
        '{"block": [["n0"]]}',
        '{"block": {"n0": 1}}',
        '{"block": 5}',
        "[]",
        "[" * 10_000 + "]" * 10_000,
        '{"block": ' + "[" * 10_000 + "]" * 10_000 + "}",
        "not json",
    ],
)
def test_a_malformed_placement_annotation_is_skipped(raw: str) -> None:
    assert _block(raw) == ()


@FAST
@given(st.text(max_size=30) | JSON.map(json.dumps))
def test_any_placement_annotation_parses_or_is_skipped(raw: str) -> None:
    for node, index in _block(raw):
        assert isinstance(node, str) and isinstance(index, int) and 0 <= index < 1 << 16


def running(job: str, gpus: int, annotations: dict[str, str]) -> tuple[dict[str, Any], ...]:
    placement = json.dumps({"node": "n0", "block": [["n0", i] for i in range(gpus)]})
    return tuple(
        {
            "metadata": {
                "name": f"{job}-g1-w{i}",
                "labels": {contract.JOB_LABEL: job},
                "annotations": {
                    contract.GENERATION_ANNOTATION: "1",
                    contract.PLACEMENT_ANNOTATION: placement,
                    **annotations,
                },
            },
            "spec": {"nodeName": "n0"},
            "status": {"phase": "Running"},
        }
        for i in range(gpus)
    )


@pytest.mark.parametrize("raw", JUNK)
@pytest.mark.parametrize(
    "key",
    [contract.GENERATION_ANNOTATION, contract.PROGRESS_ANNOTATION, contract.PLACEMENT_ANNOTATION],
)
def test_junk_pod_annotations_are_not_fatal(key: str, raw: str) -> None:
    status = {"phase": "Running", "allocation": {"gpus": 4, "generation": 1, "localBatchSize": 64}}
    job = {**body("job"), "status": status}
    actions = one_pass([Observed(job, running("job", 4, {key: raw})), Observed(body("good"))])
    assert not [e for e in actions.events if e.reason == "InternalError"]
    assert len(pods_of(actions, "good")) == 4


STATUS_JUNK: list[dict[str, Any]] = [
    {"restarts": 1e400},
    {"restarts": 10**400},
    {"restarts": "3"},
    {"restarts": 10**18, "lastFailureTime": "2020-01-01T00:00:00Z"},
    {"allocation": {"gpus": "x", "generation": 1e400}},
    {"allocation": {"gpus": float("nan"), "frequencyMHz": [1], "localBatchSize": -4}},
    {"allocation": {"generation": 10**400, "nodes": "n0"}},
    {"allocation": "x"},
    {"progress": {"iterations": 1e400}},
    {"progress": {"iterations": "9" * 5000}},
    {"energy": {"joules": float("inf"), "watts": "x"}},
    {"energy": {"joules": 10**400}},
    {"model": {"profiledGpuCounts": ["x", 1e400, None, 4]}},
    {"model": {"profiledGpuCounts": "4"}},
    {"model": {"profiledGpuCountsByType": "A100"}},
    {"model": {"profiledGpuCountsByType": [None, {"gpu": 4}, {"gpu": "A100", "gpuCounts": 4}]}},
    {"model": {"profiledGpuCountsByType": [{"gpu": "A100", "gpuCounts": ["x", 1e400, -4]}]}},
    {"model": 3},
    {"conditions": "x"},
    {"conditions": [1, None, {"type": "Valid"}]},
    {"phase": 5, "message": ["x"], "startTime": 7},
    {"createRefusals": 1e400, "lastCreateRefusalTime": 5},
    {"allocation": {"profilingUntil": 1e400}, "phase": "Profiling"},
]


@pytest.mark.parametrize("status", STATUS_JUNK, ids=lambda s: json.dumps(s, default=str)[:40])
@pytest.mark.parametrize("with_pods", [False, True])
def test_junk_status_fields_are_not_fatal(status: dict[str, Any], with_pods: bool) -> None:
    job = {**body("job"), "status": status}
    pods = running("job", 4, {}) if with_pods else ()
    actions = one_pass([Observed(job, pods), Observed(body("good"))])
    assert not [e for e in actions.events if e.reason == "InternalError"], actions.events
    assert len(pods_of(actions, "good")) == 4
    json.dumps(actions.status_first + actions.status)


ANY_STATUS = st.fixed_dictionaries(
    {},
    optional={
        key: JSON | st.integers() | st.floats()
        for key in (
            "phase",
            "message",
            "restarts",
            "lastFailureTime",
            "startTime",
            "createRefusals",
            "lastCreateRefusalTime",
            "observedGeneration",
        )
    }
    | {
        "allocation": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    k: st.integers() | JSON
                    for k in (
                        "gpus",
                        "generation",
                        "frequencyMHz",
                        "localBatchSize",
                        "nodes",
                        "profilingUntil",
                    )
                },
            )
        ),
        "progress": maybe(st.fixed_dictionaries({}, optional={"iterations": st.integers() | JSON})),
        "energy": maybe(
            st.fixed_dictionaries({}, optional={"joules": JSON | st.floats(), "watts": JSON})
        ),
        "model": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "profiledGpuCounts": maybe(st.lists(JSON)),
                    "profiledGpuCountsByType": maybe(
                        st.lists(
                            maybe(
                                st.fixed_dictionaries(
                                    {}, optional={"gpu": JSON, "gpuCounts": maybe(st.lists(JSON))}
                                )
                            )
                        )
                    ),
                },
            )
        ),
        "conditions": maybe(
            st.lists(maybe(st.fixed_dictionaries({"type": JSON}, optional={"status": JSON})))
        ),
    },
)


@FAST
@given(ANY_STATUS, st.booleans(), st.sampled_from(["Running", "Failed", "Succeeded", "Pending"]))
def test_any_status_is_handled_without_an_internal_error(
    status: dict[str, Any], with_pods: bool, pod_phase: str
) -> None:
    job = {**body("job"), "status": status}
    pods = running("job", 4, {}) if with_pods else ()
    for pod in pods:
        pod["status"]["phase"] = pod_phase
    actions = one_pass([Observed(job, pods), Observed(body("good"))])
    assert not [e for e in actions.events if e.reason == "InternalError"], actions.events
    assert len(pods_of(actions, "good")) == 4
    json.dumps(actions.status_first + actions.status)
