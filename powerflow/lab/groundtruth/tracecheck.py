"""Does the ground truth reproduce the ITP trace's job durations?

Every ITP job ran at the default clock on its requested GPUs, packed on
8-GPU nodes, with local batch = global batch / GPUs; its duration should be
``num_iteration * step_time``. The trace rounds durations to whole seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from powerflow.core.models.protocol import FloatArray
from powerflow.lab.groundtruth.built import ground_truth
from powerflow.lab.groundtruth.sources import itp_trace
from powerflow.lab.groundtruth.truth import GroundTruth


@dataclass(frozen=True, eq=False)
class DurationError:
    """Relative error |predicted - trace| / trace per job, and its summary."""

    relative: FloatArray

    @property
    def median(self) -> float:
        return float(np.median(self.relative))

    @property
    def max(self) -> float:
        return float(np.max(self.relative))


def trace_duration_error(truths: dict[str, GroundTruth] | None = None) -> DurationError:
    """Per-job relative duration error of the ITP trace under the ground truth."""

    jobs = itp_trace()
    names = np.array(jobs.model_name)
    predicted = np.empty_like(jobs.duration_s)
    for name in np.unique(names):
        truth = truths[name] if truths is not None else ground_truth(str(name))
        m = names == name
        n = jobs.num_gpu[m]
        r = np.minimum(n, truth.gpus_per_node)
        bs = jobs.global_batch_size[m] / n
        step = truth.step_time_s(n, r, bs, truth.gpu.default_clock_mhz)
        predicted[m] = jobs.num_iteration[m] * step
    return DurationError(np.abs(predicted - jobs.duration_s) / jobs.duration_s)
