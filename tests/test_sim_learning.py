"""The simulator's online learner refits only on evidence it has not seen."""

from __future__ import annotations

import numpy as np

from powerflow import groundtruth as gt
from powerflow.gpus import A100
from powerflow.models.samples import Samples
from powerflow.sim.learning import FittedLearner, has_new_evidence, placement_counts

CLOCKS = np.array([810.0, 1110.0, 1410.0, 1230.0, 990.0, 1350.0], dtype=np.float64)


def _profile(truth: gt.GroundTruth, n: int, rng: np.random.Generator) -> Samples:
    f = CLOCKS
    return gt.measure(
        truth, np.full_like(f, n), np.full_like(f, n), np.full_like(f, 64.0), f, rng=rng, noise=0.03
    )


def test_placement_counts_and_evidence() -> None:
    truth = gt.ground_truth("resnet50")
    rng = np.random.default_rng(0)
    s = Samples.concat([_profile(truth, 1, rng), _profile(truth, 2, rng), _profile(truth, 2, rng)])
    counts = placement_counts(s)
    assert counts == ((1, 1, 6), (2, 2, 12))
    assert has_new_evidence((), counts)
    assert not has_new_evidence(counts, counts)
    assert has_new_evidence(((1, 1, 6), (2, 2, 6)), counts)  # doubled
    assert not has_new_evidence(((1, 1, 6), (2, 2, 7)), counts)
    assert has_new_evidence(counts, (*counts, (4, 4, 6)))  # a new placement


def test_update_refits_on_new_placement_and_keeps_the_model_otherwise() -> None:
    truth = gt.ground_truth("bert")
    rng = np.random.default_rng(1)
    learner = FittedLearner(A100)
    first = [gt.one_gpu_sweep(truth, 64.0, rng=rng), _profile(truth, 1, rng)]
    known = learner.initial("bert", truth, Samples.concat(first))
    assert known.fits == 1
    two = [*first, _profile(truth, 2, rng)]
    refit = learner.update("bert", truth, known, Samples.concat(two))
    assert refit.fits == 2 and refit.model is not known.model
    again = learner.update("bert", truth, refit, Samples.concat([*two, _profile(truth, 1, rng)]))
    assert again is refit  # same placements, not doubled: the same model object
