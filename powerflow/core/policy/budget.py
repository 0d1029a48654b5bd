"""The admin's budget as one number: the cluster power limit in watts.

The rule (paper §5.2, ``power_limit = eta * G * P_max``), exactly:

1. ``budget.limit_w`` given: it is the limit, whatever ``eta`` says
   (an absolute limit is what a facility contract states; ``eta`` is a knob).
2. Otherwise ``eta`` (``None`` means 1.0, the paper's "no saving" point):
   ``limit = eta * G * P_max`` with ``G`` every GPU of the cluster, powered on
   or not, and ``P_max`` either ``budget.p_max_w`` or the GPU type's
   ``GpuSpec.p_max_w``: its reference power (A100: 300.1 W, the mean per-GPU
   power of the six reference workloads at the top clock, from the shipped
   profiles; ``powerflow.lab.groundtruth.reference_power_w``), else its board limit.

``P_max`` is a constant of the hardware, never an estimate from the models or
the jobs queued: the same ``eta`` is the same watts for PowerFlow with fitted
models, with the ground truth, and for every baseline, and the limit does not
move when the queue changes. (The paper estimates ``P_max`` from the current
jobs; with fitted models that put the limit about 9 % above what the admin
meant, and the limit moved with the job mix.)

``eta`` must lie in [0, 1], ``limit_w`` be finite and >= 0, and
``p_max_w`` finite and > 0; anything else is a ``SnapshotError``.
"""

from __future__ import annotations

import math

from powerflow.core.errors import SnapshotError
from powerflow.core.policy.snapshot import Budget, Snapshot


def resolve_limit_w(budget: Budget, cluster_gpus: int, p_max_w: float) -> float:
    """The limit from a budget, the cluster's GPU count and its GPUs' ``P_max``.

    ``p_max_w`` (the GPU type's ``GpuSpec.p_max_w``) is only used when
    ``budget.p_max_w`` is unset.
    """
    if budget.limit_w is not None:
        if not math.isfinite(budget.limit_w) or budget.limit_w < 0:
            raise SnapshotError(f"power limit {budget.limit_w} W must be finite and >= 0")
        return float(budget.limit_w)
    eta = 1.0 if budget.eta is None else budget.eta
    if not 0.0 <= eta <= 1.0:  # also refuses NaN
        raise SnapshotError(f"eta {eta} outside [0, 1]")
    p_max = budget.p_max_w if budget.p_max_w is not None else p_max_w
    if not math.isfinite(p_max) or p_max <= 0:
        raise SnapshotError(f"P_max {p_max} W must be finite and > 0")
    return float(eta * cluster_gpus * p_max)


def limit_w(snapshot: Snapshot) -> float:
    """The snapshot's power limit (any cluster shape: baselines may plan mixed clusters).

    ``G`` is the sum of the nodes' GPUs and ``P_max`` their GPUs' mean ``p_max_w``.
    """
    nodes = snapshot.nodes
    gpus = sum(n.gpus for n in nodes)
    if gpus == 0:
        raise SnapshotError("the cluster has no GPUs")
    p_max = sum(n.gpus * n.gpu.p_max_w for n in nodes) / gpus
    return resolve_limit_w(snapshot.budget, gpus, p_max)
