"""What the operator keeps of the jobs' progress the node agents report."""

from __future__ import annotations

from powerflow.operator.reported_progress import ReportedProgress

from powerflow.telemetry import JobProgress


def test_a_count_only_grows_within_a_generation_and_a_newer_generation_replaces_it() -> None:
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 1, 50))
    kept.report(JobProgress("ml", "a", 1, 40))  # a late post of another node
    assert kept.snapshot() == {"ml/a": (1, 50)}
    kept.report(JobProgress("ml", "a", 2, 30))  # resumed from a checkpoint at 30
    assert kept.snapshot() == {"ml/a": (2, 30)}
    kept.report(JobProgress("ml", "a", 1, 900))  # the old generation's leftovers
    assert kept.snapshot() == {"ml/a": (2, 30)}


def test_jobs_gone_from_the_cluster_are_forgotten() -> None:
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 1, 5))
    kept.report(JobProgress("ml", "b", 1, 6))
    snapshot = kept.snapshot()
    kept.keep_only(["ml/b"])
    assert kept.snapshot() == {"ml/b": (1, 6)}
    assert snapshot == {"ml/a": (1, 5), "ml/b": (1, 6)}  # a pass's copy is its own
