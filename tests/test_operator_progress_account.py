"""A running job's account (``powerflow.operator.progress``): reported counts against
the status the operator wrote before."""

from __future__ import annotations

from powerflow.operator.progress import Running, account

from powerflow.core.gpus import A100
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import load_prior

MODEL = FittedModel(load_prior("resnet50"))


def running(done: int, reported: int | None) -> Running:
    return Running(
        key="ml/a",
        model=MODEL,
        gpus=4,
        local_batch_size=64,
        frequency_mhz=A100.default_clock_mhz,
        iterations_total=1000,
        iterations_done=done,
        joules=0.0,
        reported=reported,
        workers_running=True,
    )


def test_a_report_counts_where_it_is_ahead_of_the_status() -> None:
    (acc,) = account([running(17, 40)], 8, now_s=100.0, anchors={"ml/a": 99.0})
    assert acc is not None and acc.iterations == 40 and acc.anchor_s == 100.0


def test_a_report_behind_the_status_does_not_take_progress_back() -> None:
    """The status holds 17 (estimated since an operator restart); the agents' first post
    after it says 9: the job shows 17 until the reports pass it."""
    (acc,) = account([running(17, 9)], 8, now_s=100.0, anchors={"ml/a": 99.0})
    assert acc is not None and acc.iterations == 17
    assert acc.joules == 0.0  # nothing gained: no energy counted twice
