"""A trace's arrival rate scaled by superposing shifted copies (``powerflow.lab.sim.scaling``)."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.errors import DataError
from powerflow.lab.groundtruth import MODEL_NAMES
from powerflow.lab.sim.scaling import superpose, trace_period_s
from powerflow.lab.sim.trace import ITP_TRACE, TraceJob, bundled_trace, load_itp

HOUR = 3600.0


@pytest.fixture(scope="module")
def itp() -> tuple[TraceJob, ...]:
    return load_itp(bundled_trace(ITP_TRACE), MODEL_NAMES)


def _small() -> tuple[TraceJob, ...]:
    submits = (100.0, 250.0, 400.0, 1000.0, 1300.0)
    return tuple(
        TraceJob(f"j{i}", s, 2**i, "resnet50", 64 * (i + 1), 1000.0 * (i + 1), 60.0 * (i + 1))
        for i, s in enumerate(submits)
    )


def _copy_of(job_id: str) -> tuple[str, int]:
    base, _, copy = job_id.partition("~")
    return base, int(copy) if copy else 0


def test_one_copy_is_the_trace(itp: tuple[TraceJob, ...]) -> None:
    assert superpose(itp, 1) == itp


def test_k_copies_raise_the_arrival_rate_k_times_over_the_same_period(
    itp: tuple[TraceJob, ...],
) -> None:
    k = 8
    scaled = superpose(itp, k, seed=5)
    start, period = itp[0].submit_s, trace_period_s(itp)
    submits = np.array([j.submit_s for j in scaled])
    # Every job within the trace's period: k times the jobs there, k times the rate.
    assert len(scaled) == k * len(itp)
    assert submits.min() >= start and submits.max() < start + period
    # Quarter by quarter of the day too, within the smoothing of hour-long shifts.
    edges = np.linspace(0.0, 24 * HOUR, 5)
    before = np.histogram([j.submit_s for j in itp], edges)[0]
    after = np.histogram(submits, edges)[0]
    assert np.all(np.abs(after / (k * before) - 1.0) < 0.15)
    assert [(j.submit_s, j.job_id) for j in scaled] == sorted(
        (j.submit_s, j.job_id) for j in scaled
    )


def test_jobs_are_unchanged_but_for_id_and_submission(itp: tuple[TraceJob, ...]) -> None:
    by_id = {j.job_id: j for j in itp}
    scaled = superpose(itp, 4, seed=1)
    copies: dict[int, int] = {}
    for job in scaled:
        base, copy = _copy_of(job.job_id)
        copies[copy] = copies.get(copy, 0) + 1
        original = by_id[base]
        assert (job.num_gpu, job.model_name, job.global_batch_size) == (
            original.num_gpu,
            original.model_name,
            original.global_batch_size,
        )
        assert (job.iterations, job.duration_s) == (original.iterations, original.duration_s)
        if copy == 0:
            assert job == original
    assert copies == {c: len(itp) for c in range(4)}


def test_each_copy_is_the_trace_shifted_keeping_order_and_gaps() -> None:
    jobs = _small()
    period = trace_period_s(jobs)
    assert period == pytest.approx(1200.0 * 5 / 4)
    scaled = superpose(jobs, 6, seed=3, spread_s=period)
    for c in range(1, 6):
        copy = [j for j in scaled if _copy_of(j.job_id)[1] == c]
        # One shift for the whole copy, modulo the period.
        shifts = {round((j.submit_s - o.submit_s) % period, 6) for j, o in zip(
            sorted(copy, key=lambda j: _copy_of(j.job_id)[0]), jobs, strict=True
        )}  # fmt: skip
        assert len(shifts) == 1
        # In submission order the copy is the trace's order, rotated at the wrap.
        order = [_copy_of(j.job_id)[0] for j in copy]
        names = [j.job_id for j in jobs]
        at = names.index(order[0])
        assert order == names[at:] + names[:at]


def test_a_shift_is_at_most_the_spread(itp: tuple[TraceJob, ...]) -> None:
    by_id = {j.job_id: j for j in itp}
    period = trace_period_s(itp)
    for job in superpose(itp, 16, seed=2, spread_s=HOUR):
        shift = (job.submit_s - by_id[_copy_of(job.job_id)[0]].submit_s) % period
        assert 0.0 <= shift < HOUR


def test_the_days_shape_is_kept(itp: tuple[TraceJob, ...]) -> None:
    """The ITP day is nearly empty from hour 15 to hour 22; hour-long shifts keep it so."""

    def evening(jobs: tuple[TraceJob, ...]) -> float:
        return float(np.mean([16 * HOUR <= j.submit_s < 22 * HOUR for j in jobs]))

    assert evening(itp) < 0.03
    assert evening(superpose(itp, 32, seed=0)) < 0.03


def test_seeded() -> None:
    jobs = _small()
    assert superpose(jobs, 5, seed=7) == superpose(jobs, 5, seed=7)
    assert superpose(jobs, 5, seed=7) != superpose(jobs, 5, seed=8)


def test_jobs_submitted_at_once_are_copied_unshifted() -> None:
    jobs = tuple(TraceJob(f"j{i}", 50.0, 1, "resnet50", 64, 100.0) for i in range(3))
    scaled = superpose(jobs, 3)
    assert len(scaled) == 9 and {j.submit_s for j in scaled} == {50.0}


@pytest.mark.parametrize("k", [0, -2, 1.5, True])
def test_copies_must_be_a_positive_integer(k: object) -> None:
    with pytest.raises(DataError, match="positive integer"):
        superpose(_small(), k)  # type: ignore[arg-type]


def test_bad_spread_and_empty_trace_are_refused() -> None:
    with pytest.raises(DataError, match="spread"):
        superpose(_small(), 2, spread_s=-1.0)
    with pytest.raises(DataError, match="spread"):
        superpose(_small(), 2, spread_s=float("nan"))
    with pytest.raises(DataError, match="no jobs"):
        superpose((), 2)


def test_an_id_clash_is_refused() -> None:
    jobs = (*_small(), TraceJob("j0~1", 1.0, 1, "resnet50", 64, 10.0))
    with pytest.raises(DataError, match="repeats"):
        superpose(jobs, 2)
