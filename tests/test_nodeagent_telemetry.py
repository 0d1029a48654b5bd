"""Telemetry on a simulated node: reports -> windows -> samples, and sweeps.

The GPUs follow the ground truth with noise (``SimulatedGpus``), so a
sample's energy per iteration and step time are checked against the ground
truth itself, not against numbers the test computed the same way.
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodeagent_telemetry_cases import EPOCH_S, NODE, SimNode, truth_per_gpu, worker
from powerflow.nodeagent.iterations import IterationReport, UnknownPod

from powerflow.core.telemetry import JobProgress, WindowSample


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b)


def test_samples_match_the_ground_truth_per_iteration() -> None:
    node = SimNode(seed=3)
    w0, w1 = worker("bert", 0), worker("bert", 1)
    node.place(w0, 0)
    node.place(w1, 1)
    node.run(61.0)
    samples = node.samples()
    # a window closes at the first boundary at or after 5 s: 11 or 12 in 61 s
    assert 11 <= len(samples) <= 12
    step_s, energy_j = truth_per_gpu(w0, 1200)
    for s in samples:
        assert (s.namespace, s.job, s.generation) == ("ml", "bert", 1)
        assert (s.n, s.gpus_per_node, s.local_batch_size) == (4, 2, 64.0)
        assert (s.frequency_mhz, s.gpus_measured) == (1200, 2)
        # Unix time (the node's clock is monotonic), within the run
        assert EPOCH_S < s.end_s <= EPOCH_S + node.now_s
        # energy summed over the node's two GPUs, per iteration, within the noise
        assert _close(s.energy_j, 2 * energy_j, 0.05), (s.energy_j, 2 * energy_j)
        assert _close(s.step_time_s, step_s, 0.05), (s.step_time_s, step_s)
        assert s.iterations * s.step_time_s >= 5.0
    assert _close(statistics.fmean(s.energy_j for s in samples), 2 * energy_j, 0.02)
    # consecutive windows: every iteration after the first boundary is in one
    total = sum(s.iterations for s in samples)
    assert total <= node.reported[w0.key] <= total + 5.0 / step_s + 1


def test_unlocked_gpus_are_tagged_with_their_top_clock() -> None:
    node = SimNode(seed=4)
    node.lock = False
    view = worker("bert", 0, n=1, per_node=1)
    node.place(view, 2)
    node.run(11.0)
    samples = node.samples()
    assert samples
    top = max(node.gpus.supported_graphics_clocks_mhz(2))
    assert {s.frequency_mhz for s in samples} == {top}
    _, energy_j = truth_per_gpu(view, top)
    assert all(_close(s.energy_j, energy_j, 0.05) for s in samples)


def test_only_the_lowest_index_reporting_worker_drives_windows() -> None:
    node = SimNode(seed=5)
    w0, w1 = worker("bert", 0), worker("bert", 1)
    node.place(w0, 0)
    node.place(w1, 1)
    # w0 silent: w1 leads
    node.pods, hidden = {w1.key: w1}, node.pods
    node.run(11.0)
    assert node.samples()
    led_by_w1 = len(node.samples())
    node.pods = hidden
    # w0 starts reporting: it takes the lead, and the window w1 opened is dropped
    node.run(4.0)
    assert len(node.samples()) == led_by_w1
    node.run(3.0)
    assert len(node.samples()) == led_by_w1 + 1


def test_a_clock_changed_between_boundaries_discards_that_window() -> None:
    node = SimNode(seed=6)
    view = worker("bert", 0, n=1, per_node=1)
    node.place(view, 0)
    node.run(7.0)
    first = node.samples()
    assert [s.frequency_mhz for s in first] == [1200]
    # the operator moves the job to 900 MHz: applied mid-window
    node.run(2.0)
    node.update(worker("bert", 0, n=1, per_node=1, frequency=900))
    node.run(3.5)
    assert node.samples() == first  # the straddling window never became a sample
    node.run(6.0)
    after = node.samples()[len(first) :]
    assert [s.frequency_mhz for s in after] == [900]
    _, energy_j = truth_per_gpu(view, 900)
    assert _close(after[0].energy_j, energy_j, 0.05)


def test_a_driver_restart_costs_one_interval_not_the_window() -> None:
    node = SimNode(seed=7)
    view = worker("bert", 0, n=1, per_node=1)
    node.place(view, 0)
    node.run(3.0)
    node.gpus.restart_driver()  # counters back to zero, clocks reset
    node.locked.clear()
    node.apply_clocks()
    node.run(6.0)
    samples = node.samples()
    assert [s.frequency_mhz for s in samples] == [1200]  # the window holding the restart
    _, energy_j = truth_per_gpu(view, 1200)
    # energy_delta_mj counts the restarted counter from zero: at most one
    # report interval (one iteration) of energy is lost, never a negative window
    assert _close(samples[0].energy_j, energy_j, 0.08)


def test_a_worker_restart_or_a_new_generation_starts_fresh() -> None:
    node = SimNode(seed=8)
    view = worker("bert", 0, n=1, per_node=1)
    node.place(view, 0)
    node.run(7.0)
    assert len(node.samples()) == 1
    # the worker restarts: its count goes back to zero at the next boundary
    node.gpus.assign(0, node.gpus.workload(0))  # type: ignore[arg-type]
    node.reported.pop(view.key)
    node.run(4.0)
    assert len(node.samples()) == 1
    node.run(2.0)
    assert len(node.samples()) == 2
    assert node.samples()[-1].iterations * node.samples()[-1].step_time_s < 6.5
    # generation 2 replaces generation 1 on the same GPU
    node.remove(view.key)
    g2 = worker("bert", 0, n=1, per_node=1, generation=2)
    node.place(g2, 0)
    node.run(7.0)
    assert [s.generation for s in node.samples()] == [1, 1, 2]


def test_reports_are_accepted_only_from_known_pods_with_their_uid() -> None:
    node = SimNode()
    view = worker("bert", 0)
    node.place(view, 0)
    elsewhere = worker("other", 0, node="node-b")
    node.pods[elsewhere.key] = elsewhere
    node.gpus_of[elsewhere.key] = (3,)
    node.sync()
    tel = node.telemetry

    def report(ns: str, pod: str, uid: str) -> str | None:
        return tel.report(IterationReport(ns, pod, uid, 1, (), node.now_s))

    assert report("ml", view.name, view.uid) is None
    unknown = report("ml", "bert-g1-w9", "u")
    assert isinstance(unknown, UnknownPod) and unknown.status == 404
    assert isinstance(report("ml", elsewhere.name, elsewhere.uid), UnknownPod)
    wrong = report("ml", view.name, "another-uid")
    assert wrong is not None and getattr(wrong, "status", None) == 409
    finished = worker("bert", 0, phase="Succeeded")
    node.update(finished)
    assert isinstance(report("ml", view.name, view.uid), UnknownPod)


def test_reported_gpu_uuids_are_kept_and_announced() -> None:
    node = SimNode()
    view = worker("bert", 0)
    node.place(view, 0)
    calls: list[int] = []
    node.telemetry.on_gpus_reported = lambda: calls.append(1)
    uuid = node.gpus.gpus()[0].uuid
    for _ in range(3):
        r = IterationReport("ml", view.name, view.uid, 1, (uuid,), node.now_s)
        assert node.telemetry.report(r) is None
    assert node.telemetry.reported_uuids(view.key) == (uuid,)
    assert calls == [1]  # announced once, not per report
    node.remove(view.key)
    assert node.telemetry.reported_uuids(view.key) == ()


def test_a_failing_hook_never_fails_a_report() -> None:
    node = SimNode()
    view = worker("bert", 0, n=1, per_node=1, profile={"clocksMhz": [900], "sliceSeconds": 1})
    node.place(view, 0)

    def broken() -> None:
        raise RuntimeError("bug")

    node.telemetry.on_clock_change = broken
    r = IterationReport("ml", view.name, view.uid, 0, (), node.now_s)
    assert node.telemetry.report(r) is None
    assert node.telemetry.clock_for(view.key) == 900


@pytest.mark.parametrize("window_s", [1.0, 5.0])
def test_no_sample_is_one_the_operator_would_refuse(window_s: float) -> None:
    node = SimNode(window_s=window_s, seed=9)
    node.place(worker("bert", 0), 0)
    node.run(12.0)
    samples: list[WindowSample] = node.samples()
    assert samples
    assert all(s.energy_j > 0 and s.step_time_s > 0 and s.iterations > 0 for s in samples)
    assert node.telemetry.node == NODE


@settings(max_examples=60, deadline=None)
@given(
    reports=st.lists(
        st.tuples(
            st.sampled_from(["bert-g1-w0", "bert-g1-w1", "bert-g1-w7", "x"]),
            st.booleans(),
            st.integers(0, 2**53),
            st.lists(st.text(min_size=1, max_size=8), max_size=3),
            st.floats(0.0, 10.0),
        ),
        max_size=40,
    )
)
def test_any_report_sequence_is_answered_and_samples_stay_valid(
    reports: list[tuple[str, bool, int, list[str], float]],
) -> None:
    node = SimNode(window_s=1.0, seed=1)
    w0, w1 = worker("bert", 0), worker("bert", 1)
    node.place(w0, 0)
    node.place(w1, 1)
    for pod, right_uid, iterations, uuids, gap_s in reports:
        node.now_s += gap_s
        view = node.pods.get(("ml", pod))
        uid = view.uid if view is not None and right_uid else "other"
        r = IterationReport("ml", pod, uid, iterations, tuple(uuids), node.now_s)
        answer = node.telemetry.report(r)
        assert answer is None or getattr(answer, "status", None) in (404, 409)
        assert (answer is None) == (view is not None and right_uid)
    for s in node.samples():
        assert s.iterations > 0 and s.energy_j > 0 and s.step_time_s > 0
        assert s.frequency_mhz == 1200


def test_progress_is_each_jobs_most_reported_iterations_of_its_generation() -> None:
    """What the agent passes on to the operator: per job and generation, the most
    iterations any of its workers here reported; a pod gone takes its count along."""
    node = SimNode(seed=2)
    a0, a1 = worker("bert", 0), worker("bert", 1)
    b0 = worker("vgg", 0, n=1, per_node=1, generation=3)
    for gpu, view in enumerate((a0, a1, b0)):
        node.place(view, gpu)
    assert node.telemetry.progress() == ()
    assert node.report(a0.key, 7) is None
    assert node.report(a1.key, 9) is None
    assert node.report(b0.key, 120) is None
    assert node.telemetry.progress() == (
        JobProgress("ml", "bert", 1, 9),
        JobProgress("ml", "vgg", 3, 120),
    )
    assert node.report(a0.key, 12) is None
    node.remove(b0.key)
    assert node.telemetry.progress() == (JobProgress("ml", "bert", 1, 12),)


def test_a_worker_that_finished_first_still_counts_for_its_job() -> None:
    """Worker 0 reached the job's end and its pod succeeded; the others wait on it (a
    collective that never completes): the job's progress keeps worker 0's count until
    none of its pods is active here."""
    node = SimNode(seed=3)
    w0, w1 = worker("bert", 0), worker("bert", 1)
    node.place(w0, 0)
    node.place(w1, 1)
    assert node.report(w0.key, 1000) is None
    assert node.report(w1.key, 990) is None
    node.update(worker("bert", 0, phase="Succeeded"))
    assert node.telemetry.progress() == (JobProgress("ml", "bert", 1, 1000),)
    node.update(worker("bert", 1, phase="Failed"))
    assert node.telemetry.progress() == ()


def test_progress_leaves_out_what_the_operator_would_refuse() -> None:
    """A job label that is a valid label but not an object name (``Bad_Job``) would get
    every batch of the node refused, its samples with it: that job's progress is left
    out, the others' go."""
    node = SimNode(seed=4)
    good, bad = worker("bert", 0, n=1, per_node=1), worker("Bad_Job", 0, n=1, per_node=1)
    node.place(good, 0)
    node.place(bad, 1)
    assert node.report(good.key, 5) is None
    assert node.report(bad.key, 7) is None
    assert node.telemetry.progress() == (JobProgress("ml", "bert", 1, 5),)
