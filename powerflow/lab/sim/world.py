"""The physical side of a simulation: the ground truth and how it is measured.

Bundled so that tests can swap in a hand-computable world, and so that the
engine names no ground-truth module directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from powerflow.core.gpus import A100, GpuSpec
from powerflow.core.models.protocol import ArrayLike, PerfModel
from powerflow.core.models.samples import Samples


class MeasureFn(Protocol):
    def __call__(
        self,
        truth: PerfModel,
        n: ArrayLike,
        r: ArrayLike,
        bs: ArrayLike,
        f: ArrayLike,
        *,
        rng: np.random.Generator,
        noise: float,
    ) -> Samples: ...


class SweepFn(Protocol):
    def __call__(
        self,
        truth: PerfModel,
        bs: float,
        *,
        rng: np.random.Generator,
        noise: float,
        duration_s: float,
    ) -> Samples: ...


@dataclass(frozen=True)
class World:
    """Ground truth by model name, its noisy measurement, and the 1-GPU sweep."""

    truth: Callable[[str], PerfModel]
    measure: MeasureFn
    one_gpu_sweep: SweepFn
    model_names: tuple[str, ...]
    pool: tuple[tuple[str, int], ...]
    """(model, global batch) settings a trace without models draws from."""


def default_world(gpu: GpuSpec = A100) -> World:
    """The project's ground truth (``powerflow.lab.groundtruth``) on ``gpu``, by
    default the A100 (a type without one is refused, naming those with one).
    The pool of settings is the A100 tables' on every type: the jobs are the same."""
    from powerflow.lab import groundtruth as gt

    pool = tuple(
        (name, int(bs))
        for name in gt.MODEL_NAMES
        for bs in gt.ground_truth(name).global_batch_sizes
    )
    truth = gt.ground_truth if gpu == A100 else functools.partial(_truth_on, gpu=gpu)
    if gpu != A100:
        truth(gt.MODEL_NAMES[0])  # refuse a type without a ground truth now
    return World(truth, gt.measure, gt.one_gpu_sweep, tuple(gt.MODEL_NAMES), pool)


def _truth_on(name: str, *, gpu: GpuSpec) -> PerfModel:
    from powerflow.lab import groundtruth as gt

    return gt.ground_truth(name, gpu)
