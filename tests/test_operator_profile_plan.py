"""The profiling plan on a profiling job's pods, and the refit's ``status.model``
fields, in one pass of ``reconcile`` (pure, no cluster)."""

from __future__ import annotations

import json
from typing import Any

from powerflow.nodeagent.pods import parse_profile, pod_view
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.profile_plan import plan_annotation
from powerflow.operator.reconcile import reconcile
from support.operator_pass import pass_inputs
from test_operator_profiling import (
    BUDGET,
    MODEL,
    NODES,
    WINDOW,
    KeepPolicy,
    allocation,
    body,
    merged,
    running_pods,
)

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.core.timefmt import format_time_ms

PLAN = contract.PROFILE_ANNOTATION


def one_pass(
    obs: Observed, now_s: float, **kw: Any
) -> tuple[Actions, dict[str, Any], dict[str, dict[str, str | None]]]:
    """The pass's actions, the job's status patch and its pod annotation patches."""
    kw.setdefault("profiling_window_s", WINDOW)
    actions = reconcile(
        [obs], NODES, BUDGET, now_s, KeepPolicy(), lambda j: MODEL, **pass_inputs(**kw)
    )
    patches = {name: patch for _, name, patch in actions.status_first + actions.status}
    annotations = actions.annotate_first + actions.annotate_pods
    return actions, patches.get("job", {}), {name: a for _, name, a in annotations}


def with_annotation(pods: tuple[dict[str, Any], ...], value: str) -> tuple[dict[str, Any], ...]:
    out = []
    for pod in pods:
        annotations = {**pod["metadata"]["annotations"], PLAN: value}
        out.append({**pod, "metadata": {**pod["metadata"], "annotations": annotations}})
    return tuple(out)


def test_the_plan_is_the_simulators_sweep_over_the_window() -> None:
    plan = parse_profile(plan_annotation(A100, 240.0, 1.8e9 + 0.1234))  # what the agent reads
    clocks = PAPER_SWEEP.clocks_mhz(A100)
    assert plan.clocks_mhz == clocks and list(clocks) == sorted(clocks)
    assert plan.until_s == 1.8e9 + 0.123  # the window's end, to the millisecond
    assert clocks[-1] == A100.max_clock_mhz and len(clocks) == 21
    assert abs(plan.slice_s * len(clocks) - 240.0) < 0.01


def test_the_plan_goes_on_the_pods_when_the_window_starts() -> None:
    status = {"phase": "Profiling", "allocation": allocation()}
    pods = running_pods(phase="Pending")
    _, _, annotated = one_pass(Observed(body(status), pods), 100.0)
    assert annotated == {}  # not all workers run: the window has not started

    _, patch, annotated = one_pass(Observed(body(status), running_pods()), 100.0)
    assert "profilingUntil" in patch["allocation"]
    want = plan_annotation(A100, WINDOW, 100.0 + WINDOW)
    assert annotated == {p["metadata"]["name"]: {PLAN: want} for p in running_pods()}
    for pod in with_annotation(running_pods(), want):
        view = pod_view(pod)
        assert view.profile is not None and not view.problems


def test_a_pass_during_the_window_rewrites_nothing() -> None:
    """Also what a restarted operator finds: the plan already on the pods."""
    until = 100.0 + WINDOW
    status = {"phase": "Profiling", "allocation": allocation(profilingUntil=format_time_ms(until))}
    pods = with_annotation(running_pods(), plan_annotation(A100, WINDOW, 100.0 + WINDOW))
    _, _, annotated = one_pass(Observed(body(status), pods), until - 0.1)
    assert annotated == {}
    stale = with_annotation(running_pods(), '{"clocksMhz":[1410],"sliceSeconds":1}')
    _, _, annotated = one_pass(Observed(body(status), stale), until - 0.1)
    want = plan_annotation(A100, WINDOW, 100.0 + WINDOW)
    assert annotated == {p["metadata"]["name"]: {PLAN: want} for p in stale}


def test_the_plan_goes_when_the_window_ends() -> None:
    until = 100.0 + WINDOW
    status = {"phase": "Profiling", "allocation": allocation(profilingUntil=format_time_ms(until))}
    pods = with_annotation(running_pods(), plan_annotation(A100, WINDOW, 100.0 + WINDOW))
    _, patch, annotated = one_pass(Observed(body(status), pods), until)
    assert patch["phase"] == "Running"
    assert annotated == {p["metadata"]["name"]: {PLAN: None} for p in pods}  # merge: delete
    # A running job whose pods kept a plan (an operator that died in between) loses it.
    running = {"phase": "Running", "allocation": allocation(), "model": {"profiledGpuCounts": [4]}}
    _, _, annotated = one_pass(Observed(body(running), pods), until + 10)
    assert annotated == {p["metadata"]["name"]: {PLAN: None} for p in pods}
    _, _, annotated = one_pass(Observed(body(running), running_pods()), until + 10)
    assert annotated == {}


FIT = {
    "prior": "generic",
    "samples": 40,
    "fits": 1,
    "params": {"version": 1, "gpu": "A100"},
    "fitErrorPercent": 2.5,
}


def running_status(**model: Any) -> dict[str, Any]:
    """A running job's status as the operator's previous pass left it."""
    status = {
        "phase": "Running",
        "allocation": allocation(),
        "model": {"profiledGpuCounts": [4], **model},
        "progress": {"iterations": 0},
        "energy": {"joules": 0.0},
    }
    _, patch, _ = one_pass(Observed(body(status), running_pods()), 990.0, anchors={"ml/job": 990.0})
    return merged(status, patch)


def quiet_pass(status: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A pass in which nothing but the fit may be written (progress was just written)."""
    _, patch, _ = one_pass(
        Observed(body(status), running_pods()),
        1000.0,
        learned={"ml/job": fields},
        progress_interval_s=60.0,
        progress_written={"ml/job": 990.0},
        anchors={"ml/job": 990.0},
    )
    return patch


def test_a_new_fit_is_written_at_once() -> None:
    patch = quiet_pass(running_status(), FIT)
    assert patch == {"model": FIT}
    # Bad params to remove count as a change too.
    patch = quiet_pass(running_status(params={"junk": 1}), {"samples": 0, "params": None})
    assert patch == {"model": {"params": None, "samples": 0}}


def test_samples_ride_along_with_other_writes() -> None:
    status = running_status(**FIT)
    assert quiet_pass(status, FIT) == {}  # the same fit: no churn
    assert quiet_pass(status, {**FIT, "samples": 60, "fitErrorPercent": 2.6}) == {}
    _, patch, _ = one_pass(  # progress is due: the count and error go with it
        Observed(body(status), running_pods()),
        1000.0,
        learned={"ml/job": {**FIT, "samples": 60, "fitErrorPercent": 2.6}},
        progress_interval_s=5.0,
        progress_written={"ml/job": 990.0},
        anchors={"ml/job": 990.0},
    )
    assert "progress" in patch
    assert patch["model"] == {"samples": 60, "fitErrorPercent": 2.6}


def test_a_fit_and_the_profiled_count_share_one_patch() -> None:
    until = 100.0 + WINDOW
    status = {
        "phase": "Profiling",
        "allocation": allocation(profilingUntil=format_time_ms(until)),
        "model": {"profiledGpuCounts": [1]},
    }
    _, patch, _ = one_pass(Observed(body(status), running_pods()), until, learned={"ml/job": FIT})
    assert patch["model"] == {"profiledGpuCountsByType": [{"gpu": "A100", "gpuCounts": [4]}], **FIT}
    assert json.loads(json.dumps(patch))  # plain JSON
