"""The admin's budget as one number: the cluster power limit in watts.

The rule (paper §5.2, ``power_limit = eta * G * P_max``), exactly:

1. ``budget.limit_watts`` given: it is the limit, whatever ``eta`` says
   (an absolute limit is what a facility contract states; ``eta`` is a knob).
2. Otherwise ``eta`` (``None`` means 1.0, the paper's "no saving" point):
   ``limit = eta * G * P_max`` with ``G`` every GPU of the cluster, powered on
   or not, and ``P_max`` either ``budget.p_max_watts`` or, if unset, the mean
   over the active jobs of each job's predicted power per GPU on its requested
   GPU count (local batch ``ceil(global / n)``, ``min(n, GPUs per node)`` GPUs
   per node) at the highest clock, ``E_iter / T_iter / n``. With no active
   jobs ``P_max`` is the mean board power limit (``GpuSpec.max_power_w``) of
   the cluster's GPUs.

``eta`` must lie in [0, 1], ``limit_watts`` be finite and >= 0, and
``p_max_watts`` finite and > 0; anything else is a ``SnapshotError``. Note
that the estimated ``P_max`` moves with the job mix: the same ``eta`` gives a
different limit when the queue changes, as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from powerflow.errors import SnapshotError
from powerflow.policy.snapshot import Budget, Snapshot


def resolve_limit_watts(budget: Budget, cluster_gpus: int, p_max_w: float) -> float:
    """The limit from a budget, the cluster's GPU count and a ``P_max`` estimate.

    ``p_max_w`` is only used when ``budget.p_max_watts`` is unset.
    """
    if budget.limit_watts is not None:
        if not math.isfinite(budget.limit_watts) or budget.limit_watts < 0:
            raise SnapshotError(f"power limit {budget.limit_watts} W must be finite and >= 0")
        return float(budget.limit_watts)
    eta = 1.0 if budget.eta is None else budget.eta
    if not 0.0 <= eta <= 1.0:  # also refuses NaN
        raise SnapshotError(f"eta {eta} outside [0, 1]")
    p_max = budget.p_max_watts if budget.p_max_watts is not None else p_max_w
    if not math.isfinite(p_max) or p_max <= 0:
        raise SnapshotError(f"P_max {p_max} W must be finite and > 0")
    return float(eta * cluster_gpus * p_max)


def estimate_p_max_w(job_gpu_powers_w: Sequence[float], fallback_w: float) -> float:
    """Mean per-GPU power of the jobs at the top clock; ``fallback_w`` with no jobs."""
    if not job_gpu_powers_w:
        return fallback_w
    return float(np.mean(job_gpu_powers_w))


def limit_watts(snapshot: Snapshot) -> float:
    """The snapshot's power limit, for callers that do not run PowerFlow's tables.

    Works for any cluster shape (baselines may plan mixed clusters): ``G`` is
    the sum of the nodes' GPUs and GPUs per node is the largest node's.
    """
    nodes = snapshot.nodes
    gpus = sum(n.gpus for n in nodes)
    if gpus == 0:
        raise SnapshotError("the cluster has no GPUs")
    fallback = sum(n.gpus * n.gpu.max_power_w for n in nodes) / gpus
    budget = snapshot.budget
    if budget.limit_watts is not None or budget.p_max_watts is not None:
        return resolve_limit_watts(budget, gpus, fallback)
    gpn = max(n.gpus for n in nodes)
    top = max(n.gpu.max_clock_mhz for n in nodes)
    powers = []
    for job in snapshot.jobs:
        n = job.requested_gpus
        if n < 1 or job.global_batch_size < 1:
            raise SnapshotError(f"job {job.id!r}: requested GPUs and global batch must be >= 1")
        args = (n, min(n, gpn), -(-job.global_batch_size // n), top)
        t = float(np.asarray(job.model.step_time_s(*args)))
        e = float(np.asarray(job.model.energy_per_iter_j(*args)))
        if not (math.isfinite(t) and math.isfinite(e) and t > 0 and e > 0):
            raise SnapshotError(f"job {job.id!r}: model predicts T={t}, E={e} at {top} MHz")
        powers.append(e / t / n)
    return resolve_limit_watts(budget, gpus, estimate_p_max_w(powers, fallback))
