"""What a scheduler knows about a job: the ground truth, or models fitted online.

In the core because the operator and the simulator learn alike: the operator's
sample store (``powerflow.operator.learning``) and the simulator's engine hand
this module the samples; a ``Learner`` turns them into the ``PerfModel``
the policy sees. The fitted learner follows the paper: the pre-run's 1-GPU
clock sweep anchored to the model's shipped prior (``fit_with_prior``), then a
warm-started refit on all samples (``refit_online``) when a profiling phase
adds evidence the model has not seen, never at ordinary events.

"Evidence not seen" is a placement ``(n, r)`` whose sample count at least
doubled since the last fit: a first profile on a new GPU count always refits,
a re-profile of a known count after a preemption or migration (same clocks,
same configuration, fresh noise) refits only once it has doubled that
configuration's data. On the first 6 h of the ITP trace (PowerFlow, eta 0.6)
this skips about a quarter of the refits without changing what the models
know about scaling; the skipped job keeps its ``FittedModel`` object, so the
policy's per-model memos stay valid.

Evidence that the model already explains is no evidence either: when the
samples added since the last fit show no bias and no trend across the clocks
beyond ``NOISE_Z`` standard errors of their own noise (``explains``), the
refit is skipped and those samples wait, with any that follow, until they
contradict the model. A 21-clock profile at 3% noise (42 rows, two per slice)
resolves a 0.9% bias (PowerFlow+'s 12 rows about 1.7%),
so a skipped refit would have moved the model by less than that. On the
first 6 h this skips a fifth of the remaining refits with the models' error
against the ground truth unchanged.

Each stage of a fit is one compiled call (``models/kernels.py``), and this
module's placement counting and noise test are compiled too: the whole
trace's fitted PowerFlow eta 0.6 run spends 2.1-2.3 s of CPU on its 3,506
fits (``python benchmarks/sim_bench.py --runs fitted``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from powerflow.core.errors import ModelError
from powerflow.core.gpus import GpuSpec
from powerflow.core.jit import njit
from powerflow.core.models.fitted import FittedModel, as_column
from powerflow.core.models.fitting import MIN_SAMPLES, FitOptions, fit_with_prior, refit_online
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.models.protocol import FloatArray, PerfModel
from powerflow.core.models.samples import Samples


@dataclass(frozen=True)
class Knowledge:
    """A job's current model and whatever the learner needs to refine it."""

    model: PerfModel
    params: ModelParams | None = None
    fits: int = 0
    failed_fits: int = 0
    seen: tuple[tuple[int, int, int], ...] = ()
    """``(n, r, samples)`` per placement in the samples the model was fitted on."""


def placement_counts(samples: Samples) -> tuple[tuple[int, int, int], ...]:
    """How many samples each ``(n, r)`` placement has, sorted."""
    found = _placements(as_column(samples.n), as_column(samples.r))
    rows = found[: int(np.count_nonzero(found[:, 2]))].tolist()
    return tuple(sorted((int(n), int(r), int(c)) for n, r, c in rows))


@njit
def _placements(n: FloatArray, r: FloatArray) -> FloatArray:
    """``(n, r, count)`` per placement in order of appearance, then rows of
    zeros. Compiled: the learner counts a few hundred rows of a handful of
    placements at every update, where ``np.unique``'s sort and wrappers cost
    ten times more."""
    out = np.zeros((n.shape[0], 3))
    k = 0
    for i in range(n.shape[0]):
        j = 0
        while j < k and not (out[j, 0] == n[i] and out[j, 1] == r[i]):
            j += 1
        if j == k:
            out[k, 0] = n[i]
            out[k, 1] = r[i]
            k += 1
        out[j, 2] += 1.0
    return out


def has_new_evidence(
    seen: tuple[tuple[int, int, int], ...], now: tuple[tuple[int, int, int], ...]
) -> bool:
    """Whether some placement is new or has at least doubled its samples."""
    before = {(n, r): c for n, r, c in seen}
    return any(c >= 2 * before.get((n, r), 0) for n, r, c in now)


NOISE_Z = 2.0
"""How many standard errors a new profile's mean log error, or its trend
across the clocks, may reach before it counts as evidence against the model."""
MIN_NEW_ROWS = 6
"""Fewest new samples ``explains`` judges; fewer always refit."""


@njit
def _within_noise(err: FloatArray, x: FloatArray) -> bool:
    """Whether log errors ``err`` (in clock order) look like noise around 0.

    The noise is estimated from successive differences (von Neumann), which
    a smooth misfit across the clocks does not inflate; then neither the mean
    nor the least-squares slope against ``x`` may exceed ``NOISE_Z`` of
    their standard errors. Compiled: the learner asks this thousands of
    times per run of a few dozen samples, where numpy's per-call cost is all
    the cost.
    """
    k = err.shape[0]
    # Plain loops: numba takes seconds to compile np.diff and np.mean.
    diff2 = mean_err = mean_x = 0.0
    for i in range(k):
        mean_err += err[i]
        mean_x += x[i]
        if i:
            diff2 += (err[i] - err[i - 1]) ** 2
    mean_err /= k
    mean_x /= k
    sigma = math.sqrt(diff2 / (2.0 * (k - 1)))
    if abs(mean_err) > NOISE_Z * sigma / math.sqrt(k):
        return False
    sxx = sxe = 0.0
    for i in range(k):
        xc = x[i] - mean_x
        sxx += xc * xc
        sxe += xc * err[i]
    return sxx <= 0.0 or abs(sxe) / sxx <= NOISE_Z * sigma / math.sqrt(sxx)


def explains(model: FittedModel, new: Samples) -> bool:
    """Whether ``model`` already predicts ``new`` (samples it was not fitted
    on) within their measurement noise, in step time and energy: then a
    refit has no new information to learn from."""
    if len(new) < MIN_NEW_ROWS:
        return False
    t, e = model.predict_columns(new.n, new.r, new.bs, new.f)
    inv_f = 1.0 / new.f
    return _within_noise(np.log(new.step_time_s / t), inv_f) and _within_noise(
        np.log(new.energy_j / e), inv_f
    )


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

    FIT_OPTIONS = FitOptions(tol=1e-3)
    """Stop a fit once an accepted step lowers the cost by under 0.1%: fits
    start from the rescaled prior or the current model and are near the
    optimum already. 3e-3 would need 40% fewer model evaluations at the same
    accuracy in ``python -m benchmarks learner``, but moved the simulated
    average JCT by +0.46% over seeds 0-2 (+0.17% at 1e-3)."""
    REFIT_OPTIONS = FitOptions(polish_nfev=15, tol=1e-3)
    """The same for warm-started refits, capped at 15 evaluations."""

    def __init__(
        self, gpu: GpuSpec, prior: Callable[[str | None], ModelParams] = load_prior
    ) -> None:
        self._gpu = gpu
        self._prior = prior

    def on(self, gpu: GpuSpec) -> FittedLearner:
        """The same learner (the same priors) for jobs on ``gpu``: a mixed cluster
        learns each job's model per GPU type, each from the prior carried over to it."""
        return self if gpu == self._gpu else FittedLearner(gpu, prior=self._prior)

    def _prior_on_gpu(self, model_name: str) -> ModelParams:
        """The job's prior carried over to this learner's GPU type (``prior_on``:
        the shipped priors are the A100's; on an A100 it is the prior itself)."""
        return prior_on(self._prior(model_name), self._gpu)

    def initial(self, model_name: str, truth: PerfModel, samples: Samples | None) -> Knowledge:
        prior = self._prior_on_gpu(model_name)
        if samples is None or len(samples) < MIN_SAMPLES:
            return Knowledge(FittedModel.on(prior, self._gpu), prior)
        seen = placement_counts(samples)
        try:
            params = fit_with_prior(prior, samples, self._gpu, options=self.FIT_OPTIONS)
        except ModelError:
            return Knowledge(FittedModel.on(prior, self._gpu), prior, failed_fits=1, seen=seen)
        return Knowledge(FittedModel.on(params, self._gpu), params, fits=1, seen=seen)

    def update(
        self, model_name: str, truth: PerfModel, known: Knowledge, samples: Samples
    ) -> Knowledge:
        if len(samples) < MIN_SAMPLES:
            return known
        seen = placement_counts(samples)
        if not has_new_evidence(known.seen, seen):
            return known
        fitted_rows = sum(c for *_, c in known.seen)
        if isinstance(known.model, FittedModel) and explains(
            known.model, samples.take(slice(fitted_rows, None))
        ):
            return known
        try:
            params = refit_online(
                self._prior_on_gpu(model_name),
                samples,
                self._gpu,
                current=known.params,
                options=self.REFIT_OPTIONS,
            )
        except ModelError:
            return Knowledge(known.model, known.params, known.fits, known.failed_fits + 1, seen)
        return Knowledge(
            FittedModel.on(params, self._gpu), params, known.fits + 1, known.failed_fits, seen
        )
