"""Random traces for the sensitivity studies (paper §6.4, after Gavel).

As in Gavel (Narayanan et al., OSDI'20), whose generator the paper follows:
Poisson arrivals with a given mean interval; durations ``10**x`` minutes with
``x ~ U[1.5, 3]`` for 80% of the jobs and ``U[3, 4]`` for the rest; requested
GPUs 1, 2, 4, 8 with probabilities 0.7, 0.1, 0.15, 0.05, multiplied by a
job-size factor (the "job size" axis). Models and global batches come from the
measured pool; iterations are duration x ground-truth throughput at the
requested GPU count, so a job "lasts" its drawn duration on its own GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import DataError
from powerflow.lab.sim.trace import TraceJob, TruthFn, step_times

GPU_CHOICES = (1, 2, 4, 8)
GPU_WEIGHTS = (0.7, 0.1, 0.15, 0.05)


@dataclass(frozen=True)
class SyntheticSpec:
    """Knobs of one synthetic trace."""

    jobs: int = 100
    mean_interval_s: float = 600.0
    job_size: float = 1.0
    seed: int = 0


def generate(
    spec: SyntheticSpec,
    pool: Iterable[tuple[str, int]],
    truth: TruthFn,
    *,
    gpus_per_node: int,
    max_gpus: int,
) -> tuple[TraceJob, ...]:
    """A seeded synthetic trace; ``max_gpus`` caps the (scaled) job size."""
    if spec.jobs < 1 or spec.mean_interval_s < 0 or spec.job_size <= 0:
        raise DataError(f"bad synthetic trace spec {spec}")
    choices = sorted(set(pool))
    if not choices:
        raise DataError("empty model pool")
    rng = np.random.default_rng(spec.seed)
    gaps = rng.exponential(spec.mean_interval_s, size=spec.jobs) if spec.mean_interval_s else None
    submits = np.concatenate([[0.0], np.cumsum(gaps)[:-1]]) if gaps is not None else None
    long_job = rng.random(spec.jobs) < 0.2
    exponent = np.where(long_job, rng.uniform(3, 4, spec.jobs), rng.uniform(1.5, 3, spec.jobs))
    durations = 60.0 * 10.0**exponent
    gpus = rng.choice(GPU_CHOICES, size=spec.jobs, p=GPU_WEIGHTS)
    picks = rng.integers(0, len(choices), size=spec.jobs)
    sizes = [_power_of_two(gpus[i] * spec.job_size, max_gpus) for i in range(spec.jobs)]
    models = [choices[int(p)] for p in picks]
    steps = step_times(
        [(m, n, gbs) for (m, gbs), n in zip(models, sizes, strict=True)], truth, gpus_per_node
    )
    return tuple(
        TraceJob(
            f"syn-{i:04d}",
            round(float(submits[i]), 3) if submits is not None else 0.0,
            sizes[i],
            models[i][0],
            models[i][1],
            float(durations[i] / steps[i]),
        )
        for i in range(spec.jobs)
    )


def _power_of_two(x: float, cap: int) -> int:
    """Nearest power of two to ``x`` in ``[1, cap]`` (jobs ask for 2**k GPUs)."""
    k = int(np.clip(np.round(np.log2(max(x, 1.0))), 0, np.floor(np.log2(cap))))
    return int(2**k)
