"""Trace loading and validation, the Philly model draw, and the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from powerflow.core.errors import DataError
from powerflow.lab.groundtruth import MODEL_NAMES, ground_truth
from powerflow.lab.sim.synthetic import SyntheticSpec, generate
from powerflow.lab.sim.trace import (
    ITP_TRACE,
    PHILLY_TRACE,
    bundled_trace,
    check_durations,
    load_itp,
    load_philly,
    window,
)

POOL = (("resnet50", 128), ("gpt2", 256), ("bert", 64))
HEADER = "job_id,submit_time,num_gpu,duration,model_name,global_batch_size,num_iteration,cluster\n"


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + body)
    return path


def test_bundled_itp_trace_loads_sorted_with_real_work() -> None:
    jobs = load_itp(bundled_trace(ITP_TRACE), MODEL_NAMES)
    assert len(jobs) == 1901
    submits = [j.submit_s for j in jobs]
    assert submits == sorted(submits)
    assert all(j.iterations > 0 and j.num_gpu >= 1 for j in jobs)
    assert len(window(jobs, 2.0)) < len(jobs)


def test_ground_truth_reproduces_itp_durations() -> None:
    jobs = load_itp(bundled_trace(ITP_TRACE), MODEL_NAMES)
    check = check_durations(jobs, ground_truth, gpus_per_node=8)
    assert check.jobs == 1901
    # The ground truth is built from the table the trace's durations came from.
    assert check.median_abs_rel_error < 0.02
    assert check.mean_abs_rel_error < 0.05


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("a,-5,1,100,resnet50,128,10,c\n", "negative submit"),
        ("a,5,1,100,alexnet,128,10,c\n", "unknown model"),
        ("a,5,0,100,resnet50,128,10,c\n", "positive integer"),
        ("a,5,1,100,resnet50,128,-3,c\n", "must be positive"),
        ("a,x,1,100,resnet50,128,10,c\n", "not a number"),
        ("a,5,1,100,resnet50,128,10,c\na,6,1,100,resnet50,128,10,c\n", "duplicate"),
    ],
)
def test_bad_rows_are_data_errors(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_itp(_write(tmp_path, body), MODEL_NAMES)


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "a,5,1\n", header="job_id,submit_time,num_gpu\n")
    with pytest.raises(DataError, match="model_name"):
        load_itp(path, MODEL_NAMES)


def test_philly_draw_is_seeded_and_iterations_match_duration() -> None:
    path = bundled_trace(PHILLY_TRACE)
    a = load_philly(path, POOL, ground_truth, seed=3, gpus_per_node=8)
    b = load_philly(path, POOL, ground_truth, seed=3, gpus_per_node=8)
    c = load_philly(path, POOL, ground_truth, seed=4, gpus_per_node=8)
    assert a == b
    assert [j.model_name for j in a] != [j.model_name for j in c]
    assert {(j.model_name, j.global_batch_size) for j in a} == set(POOL)
    check = check_durations(a, ground_truth, gpus_per_node=8)
    assert check.max_abs_rel_error < 1e-9  # work was derived from these very durations


def test_synthetic_trace_follows_its_knobs() -> None:
    spec = SyntheticSpec(jobs=100, mean_interval_s=600.0, job_size=2.0, seed=1)
    jobs = generate(spec, POOL, ground_truth, gpus_per_node=8, max_gpus=16)
    assert jobs == generate(spec, POOL, ground_truth, gpus_per_node=8, max_gpus=16)
    assert len(jobs) == 100
    gaps = np.diff([j.submit_s for j in jobs])
    assert 300 < gaps.mean() < 1200
    sizes = {j.num_gpu for j in jobs}
    assert sizes <= {2, 4, 8, 16} and 1 not in sizes
    small = generate(
        SyntheticSpec(jobs=100, job_size=0.5, seed=1),
        POOL,
        ground_truth,
        gpus_per_node=8,
        max_gpus=16,
    )
    assert np.mean([j.num_gpu for j in small]) < np.mean([j.num_gpu for j in jobs])
