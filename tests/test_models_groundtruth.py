"""The real check: the paper's model fitted to the ground truth, which is not
of the model's form (it interpolates public measurements)."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.gpus import A100
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.fitting import fit_profile, fit_with_prior, refit_online
from powerflow.core.models.metrics import accuracy, split
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import generic_prior, load_prior
from powerflow.core.models.samples import Samples
from powerflow.lab import groundtruth as gt

# Two of six models per check keeps the file fast; the benchmark covers all.
SUBSET = ("vgg16", "gpt2")


def _profile(name: str) -> Samples:
    return gt.dense_profile(gt.ground_truth(name), rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", SUBSET)
def test_held_out_mape_meets_the_target(name: str) -> None:
    train, test = split(_profile(name), seed=0)
    acc = accuracy(FittedModel(fit_profile(train, A100)), test)
    assert acc.throughput_mape <= 0.10
    assert acc.energy_mape <= 0.10


@pytest.mark.parametrize("name", SUBSET)
def test_one_gpu_sweep_with_a_leave_one_out_prior(name: str) -> None:
    truth = gt.ground_truth(name)
    profile = _profile(name)
    bs = truth.global_batch_sizes[0]
    sweep = gt.one_gpu_sweep(truth, bs, rng=np.random.default_rng(1))
    params = fit_with_prior(generic_prior(exclude=name), sweep, A100)
    one_gpu = accuracy(FittedModel(params), profile.take(profile.n == 1))
    assert one_gpu.throughput_mape <= 0.10 and one_gpu.energy_mape <= 0.10


# Multi-GPU MAPE of the 1-GPU-sweep-only fit: with the
# model's own prior every model meets 10%; with the generic prior of the other
# five, only these (inception3 and bert synchronise twice as long as the
# others, which no 1-GPU sample shows; see docs/models.md).
LOO_WITHIN_TARGET = ("resnet50", "gpt2", "deepspeech2")


def _sweep_fit_multi_gpu(name: str, prior: ModelParams) -> tuple[float, float]:
    truth = gt.ground_truth(name)
    profile = _profile(name)
    sweep = gt.one_gpu_sweep(truth, truth.global_batch_sizes[0], rng=np.random.default_rng(1))
    acc = accuracy(FittedModel(fit_with_prior(prior, sweep, A100)), profile.take(profile.n > 1))
    return acc.throughput_mape, acc.energy_mape


@pytest.mark.parametrize("name", gt.MODEL_NAMES)
def test_one_gpu_sweep_with_the_own_prior_predicts_multi_gpu(name: str) -> None:
    t, e = _sweep_fit_multi_gpu(name, load_prior(name))
    assert t <= 0.10 and e <= 0.10


@pytest.mark.parametrize("name", LOO_WITHIN_TARGET)
def test_one_gpu_sweep_with_the_others_prior_predicts_multi_gpu(name: str) -> None:
    t, e = _sweep_fit_multi_gpu(name, generic_prior(exclude=name))
    assert t <= 0.10 and e <= 0.10


def test_online_samples_fix_the_multi_gpu_terms() -> None:
    name = "bert"  # the generic prior's worst multi-GPU guess (docs/models.md)
    truth = gt.ground_truth(name)
    profile = _profile(name)
    multi = profile.take(profile.n > 1)
    sweep = gt.one_gpu_sweep(truth, 64, rng=np.random.default_rng(1))
    prior = generic_prior(exclude=name)
    before = fit_with_prior(prior, sweep, A100)
    # The scheduler then runs the job packed on 2, 8 and 32 GPUs, sweeping clocks.
    n = np.array([2.0, 8.0, 32.0])[:, None]
    f = np.asarray(A100.clocks_mhz[::4], dtype=np.float64)[None, :]
    online = gt.measure(truth, n, np.minimum(n, 8), 64 / n, f, rng=np.random.default_rng(2))
    after = refit_online(prior, Samples.concat([sweep, online]), A100, current=before)
    err_before = accuracy(FittedModel(before), multi)
    err_after = accuracy(FittedModel(after), multi)
    assert err_after.throughput_mape < 0.5 * err_before.throughput_mape
    assert err_after.throughput_mape < 0.15


@pytest.mark.parametrize("name", gt.MODEL_NAMES)
def test_shipped_prior_describes_its_model(name: str) -> None:
    """The priors in powerflow/data/priors are current: regenerate them with
    `powerflow fit --write-priors` when the ground truth or the fit changes."""
    acc = accuracy(FittedModel(load_prior(name)), _profile(name))
    assert acc.throughput_mape <= 0.10 and acc.energy_mape <= 0.10


def test_unknown_or_missing_hint_gives_the_generic_prior() -> None:
    assert load_prior(None).model == "generic"
    assert load_prior("alexnet") == load_prior(None)
    assert load_prior("BERT").model == "bert"


@pytest.mark.parametrize("name", SUBSET)
def test_profiles_at_2_to_16_gpus_predict_energy_from_1_to_32(name: str) -> None:
    """The learner's situation (``python -m benchmarks learner``): the 1-GPU
    sweep, then clock profiles packed at 2, 4, 8 and 16 GPUs at the job's
    global batch; energy per iteration at 1-32 GPUs and every clock within
    2.5% on average. The paper's attribution of the fixed per-step time to
    the compute power missed it (vgg16 3.9%, gpt2 4.2%; 0.9% and 2.2% with
    it at the light power: docs/models.md)."""
    truth = gt.ground_truth(name)
    gb = float(truth.global_batch_sizes[0])
    rng = np.random.default_rng(0)
    parts = [gt.one_gpu_sweep(truth, gb, rng=rng)]
    f = np.asarray(A100.clocks_mhz[::4], dtype=np.float64)[None, :]
    for n in (2.0, 4.0, 8.0, 16.0):
        parts.append(gt.measure(truth, n, min(n, 8.0), gb / n, f, rng=rng))
    params = fit_with_prior(load_prior(name), Samples.concat(parts), A100)
    n = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])[:, None]
    every = np.asarray(A100.clocks_mhz, dtype=np.float64)[None, :]
    want = truth.energy_per_iter_j(n, np.minimum(n, 8.0), gb / n, every)
    got = FittedModel(params).energy_per_iter_j(n, np.minimum(n, 8.0), gb / n, every)
    assert float(np.mean(np.abs(got / want - 1.0))) <= 0.025
