"""What a scheduler knows about a job: the ground truth, or models fitted online.

The engine hands over samples; a ``Learner`` turns them into the ``PerfModel``
the policy sees. The fitted learner follows the paper: the pre-run's 1-GPU
clock sweep anchored to the model's shipped prior (``fit_with_prior``), then a
warm-started refit on all samples whenever a profiling phase adds some
(``refit_online``), never at ordinary events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from powerflow.errors import ModelError
from powerflow.gpus import GpuSpec
from powerflow.models.fitted import FittedModel
from powerflow.models.fitting import MIN_SAMPLES, fit_with_prior, refit_online
from powerflow.models.params import ModelParams
from powerflow.models.priors import load_prior
from powerflow.models.protocol import PerfModel
from powerflow.models.samples import Samples


@dataclass(frozen=True)
class Knowledge:
    """A job's current model and whatever the learner needs to refine it."""

    model: PerfModel
    params: ModelParams | None = None
    fits: int = 0
    failed_fits: int = 0


class Learner(Protocol):
    def initial(self, model_name: str, truth: PerfModel, samples: Samples | None) -> Knowledge:
        """What the scheduler knows when the job becomes schedulable."""
        ...

    def update(
        self, model_name: str, truth: PerfModel, known: Knowledge, samples: Samples
    ) -> Knowledge:
        """Refine with all samples seen so far (called when new ones arrive)."""
        ...


class OracleLearner:
    """Schedules with the ground truth itself (the paper's pre-profiled case)."""

    def initial(self, model_name: str, truth: PerfModel, samples: Samples | None) -> Knowledge:
        return Knowledge(truth)

    def update(
        self, model_name: str, truth: PerfModel, known: Knowledge, samples: Samples
    ) -> Knowledge:
        return known


class FittedLearner:
    """The paper's online fitting: prior + pre-run, then warm-started refits.

    A fit that fails (``ModelError``: too few or degenerate samples) keeps the
    previous model and is counted, so a run never dies on one bad profile.
    """

    def __init__(
        self, gpu: GpuSpec, prior: Callable[[str | None], ModelParams] = load_prior
    ) -> None:
        self._gpu = gpu
        self._prior = prior

    def initial(self, model_name: str, truth: PerfModel, samples: Samples | None) -> Knowledge:
        prior = self._prior(model_name)
        if samples is None or len(samples) < MIN_SAMPLES:
            return Knowledge(FittedModel(prior), prior)
        try:
            params = fit_with_prior(prior, samples, self._gpu)
        except ModelError:
            return Knowledge(FittedModel(prior), prior, failed_fits=1)
        return Knowledge(FittedModel(params), params, fits=1)

    def update(
        self, model_name: str, truth: PerfModel, known: Knowledge, samples: Samples
    ) -> Knowledge:
        if len(samples) < MIN_SAMPLES:
            return known
        try:
            params = refit_online(self._prior(model_name), samples, self._gpu, current=known.params)
        except ModelError:
            return Knowledge(known.model, known.params, known.fits, known.failed_fits + 1)
        return Knowledge(FittedModel(params), params, known.fits + 1, known.failed_fits)
