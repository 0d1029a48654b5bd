"""Each reference model's ground truth, built once per GPU type (``ground_truth``).

Its own module so that the package's parts (``tracecheck``) reach the cached builder
without importing the package that imports them.
"""

from __future__ import annotations

import functools

from powerflow.core.errors import DataError
from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.groundtruth.truth import GroundTruth, build

MODEL_NAMES: tuple[str, ...] = ("resnet50", "vgg16", "inception3", "gpt2", "bert", "deepspeech2")


@functools.cache
def ground_truth(model_name: str, gpu: GpuSpec = A100) -> GroundTruth:
    """The ground truth of one trace model on one GPU type (built once, cached)."""
    if model_name not in MODEL_NAMES:
        raise DataError(f"unknown model {model_name!r}; known: {', '.join(MODEL_NAMES)}")
    return build(model_name, gpu)
