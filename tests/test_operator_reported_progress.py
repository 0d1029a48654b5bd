"""What the operator keeps of the jobs' progress the node agents report."""

from __future__ import annotations

from powerflow.operator.reported_progress import ReportedProgress

from powerflow.core.telemetry import JobProgress


def test_a_count_only_grows_within_a_generation_and_a_newer_generation_replaces_it() -> None:
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 1, 50))
    kept.report(JobProgress("ml", "a", 1, 40))  # a late post of another node
    assert kept.snapshot() == {"ml/a": (1, 50, None)}
    kept.report(JobProgress("ml", "a", 2, 30))  # resumed from a checkpoint at 30
    assert kept.snapshot() == {"ml/a": (2, 30, None)}
    kept.report(JobProgress("ml", "a", 1, 900))  # the old generation's leftovers
    assert kept.snapshot() == {"ml/a": (2, 30, None)}


def test_when_the_count_first_reached_the_total_is_kept() -> None:
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 1, 90), total=100, now_s=10.0)
    kept.report(JobProgress("ml", "a", 1, 100), total=100, now_s=20.0)
    kept.report(JobProgress("ml", "a", 1, 101), total=100, now_s=30.0)
    assert kept.snapshot() == {"ml/a": (1, 101, 20.0)}
    kept.report(JobProgress("ml", "a", 2, 100), total=100, now_s=40.0)  # a new generation
    assert kept.snapshot() == {"ml/a": (2, 100, 40.0)}


def test_a_job_created_again_under_its_name_starts_from_nothing() -> None:
    """The cluster shows generation 1 of a job whose old self reached generation 3: the
    kept count is the deleted job's, and the new job's first report replaces it."""
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 3, 500), total=600, now_s=1.0)
    kept.report(JobProgress("ml", "a", 1, 5), total=600, now_s=2.0, generations={1})
    assert kept.snapshot() == {"ml/a": (1, 5, None)}


def test_jobs_gone_from_the_cluster_are_forgotten() -> None:
    kept = ReportedProgress()
    kept.report(JobProgress("ml", "a", 1, 5))
    kept.report(JobProgress("ml", "b", 1, 6))
    snapshot = kept.snapshot()
    kept.keep_only(["ml/b"])
    assert kept.snapshot() == {"ml/b": (1, 6, None)}
    assert snapshot == {"ml/a": (1, 5, None), "ml/b": (1, 6, None)}  # a pass's copy is its own
