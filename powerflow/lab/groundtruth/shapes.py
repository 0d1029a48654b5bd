"""Relative shapes taken from other GPUs' measurements (Pollux T4, Zeus).

Each function reduces one public data set to one or two dimensionless numbers
that the A100 ground truth borrows; the module docstring of
``powerflow.lab.groundtruth`` says where each one enters and why.
"""

from __future__ import annotations

import functools

import numpy as np

from powerflow.core.errors import DataError
from powerflow.lab.groundtruth.sources import ZEUS_GPUS, pollux_records, zeus_run

# Trace model -> nearest Pollux model (Pollux measured resnet50 on imagenet;
# bert and gpt2 are both transformer encoders/decoders of similar size).
POLLUX_MODEL = {
    "resnet50": "imagenet",
    "vgg16": "imagenet",
    "inception3": "imagenet",
    "gpt2": "bert",
    "bert": "bert",
    "deepspeech2": "deepspeech2",
}

# Trace model -> nearest Zeus network (the CNNs to resnet50, the transformers to
# bert_base_uncased, deepspeech2 to itself).
ZEUS_NETWORK = {
    "resnet50": "resnet50",
    "vgg16": "resnet50",
    "inception3": "resnet50",
    "gpt2": "bert_base_uncased",
    "bert": "bert_base_uncased",
    "deepspeech2": "deepspeech2",
}

# A network that keeps the GPU mostly waiting (embedding lookups, tiny kernels):
# its power is what a GPU draws in a phase with little arithmetic.
ZEUS_LIGHT_NETWORK = "ncf"


@functools.cache
def pollux_sync_bs_elasticity(pollux_model: str) -> float:
    """d log(sync time) / d log(local batch) at fixed GPUs and nodes.

    Least squares with one intercept per (GPUs, nodes) group, so that only the
    batch-size dependence is left: larger local batches hide more of the
    all-reduce behind the backward pass, so it is negative.

    The slope is computed on the values less their group's mean (the
    Frisch-Waugh-Lovell form of that least squares fit): the same slope as a
    solve with one column per group, without its ~1,000 x 100 design matrix.
    """
    rec = pollux_records(pollux_model)
    groups = np.unique(np.column_stack([rec.gpus, rec.nodes]), axis=0, return_inverse=True)[1]
    groups = np.asarray(groups).ravel()
    x, y = np.log(rec.local_bs), np.log(rec.sync_time_s)
    size = np.bincount(groups)
    x = x - (np.bincount(groups, x) / size)[groups]
    y = y - (np.bincount(groups, y) / size)[groups]
    return float(np.dot(x, y) / np.dot(x, x))


def _zeus_ratio(network: str) -> float:
    """Median over GPU types of (average power at the top power limit / that limit)."""
    ratios = []
    for gpu in ZEUS_GPUS:
        run = zeus_run(gpu)
        top = run.power_limit_w.max()
        mask = (np.array(run.network) == network) & (run.power_limit_w == top)
        if mask.any():
            ratios.append(float(np.median(run.average_power_w[mask] / top)))
    if not ratios:
        raise DataError(f"no Zeus measurements for network {network!r}")
    return float(np.median(ratios))


@functools.cache
def active_power_ratio(model_name: str) -> float:
    """Full-clock training power of the model as a fraction of the board limit."""
    return min(_zeus_ratio(ZEUS_NETWORK[model_name]), 0.97)


@functools.cache
def light_power_ratio() -> float:
    """Power of a GPU-light phase as a fraction of the board limit."""
    return _zeus_ratio(ZEUS_LIGHT_NETWORK)
