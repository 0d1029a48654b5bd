"""Zeus (You et al., NSDI'23) on top of a non-elastic scheduler: per-job clocks.

Zeus picks, per training job, the GPU setting that minimises its cost
``eta_knob * E + (1 - eta_knob) * MAXPOWER * T`` (``zeus.utils.metric.
zeus_cost``; default ``eta_knob = 0.5``, Zeus's own default). In Zeus's
``ZeusCost`` selector ``E`` is the energy summed over the job's GPUs and
``MAXPOWER`` is the GPU's maximum power limit times the job's world size, so
here, per iteration of a job on ``n`` GPUs::

    cost(f) = eta_knob * E_iter(n, r, bs, f) + (1 - eta_knob) * n * P_max * T_iter(n, r, bs, f)

with ``P_max`` the GPU's board power limit (``GpuSpec.max_power_w``),
minimised over every supported core clock ``f``. The wrapped scheduler
(Gandiva or Tiresias) decides who runs where; ``ZeusPolicy`` only replaces
each running job's clock, so apart from clocks and the predicted power its
plan is the inner plan. Zeus is energy-aware but not elastic, and it does
not enforce the cluster's power limit either (it has none).

Simplifications, and why:

- Zeus profiles power limits just in time during the first epoch (and its
  batch-size optimiser explores across recurring jobs). Here the knob is the
  core clock, which is what PowerFlow and the simulator control, so the
  optimum is searched over clocks instead (Zeus's later frequency optimiser
  applies the same ``ZeusCost`` to locked clocks). The cost is evaluated on
  the job's model, which the simulator fits from the same kind of just-in-time
  profile samples (or the ground truth in oracle mode): the measurements Zeus
  would take, without charging Zeus a second profiling phase.
- The batch-size half of Zeus is left out: the trace fixes each job's global
  batch, and changing it would change the iterations to convergence, which
  the simulator does not model.
- The clock is chosen for the configuration the inner scheduler gives the
  job (its GPU count, placement and local batch), re-evaluated at every event.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from powerflow.baselines.common import (
    ModelMemo,
    cluster_gpu,
    evaluate,
    per_node,
    predicted_watts,
)
from powerflow.errors import SnapshotError
from powerflow.gpus import GpuSpec
from powerflow.models.protocol import FloatArray, PerfModel
from powerflow.policy.snapshot import JobPlan, Plan, Policy, Snapshot


def zeus_cost(
    model: PerfModel, n: int, r: int, bs: int, spec: GpuSpec, eta_knob: float
) -> FloatArray:
    """Zeus's cost per iteration at each supported clock of ``spec``."""
    t, e = evaluate([model], [[n]], [[r]], [[bs]], [spec.clocks_mhz])
    cost: FloatArray = eta_knob * e[0] + (1.0 - eta_knob) * n * spec.max_power_w * t[0]
    return cost


def zeus_clock(model: PerfModel, n: int, r: int, bs: int, spec: GpuSpec, eta_knob: float) -> int:
    """The clock minimising Zeus's cost (the lowest such clock on ties)."""
    cost = zeus_cost(model, n, r, bs, spec, eta_knob)
    return int(spec.clocks_mhz[int(np.argmin(cost))])


@dataclass(frozen=True)
class ZeusPolicy:
    """``inner``'s plan with each running job at its Zeus-optimal clock."""

    inner: Policy
    eta_knob: float = 0.5
    memo: ModelMemo = field(default_factory=ModelMemo, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta_knob <= 1.0:
            raise SnapshotError(f"eta_knob {self.eta_knob} outside [0, 1]")

    def plan(self, snapshot: Snapshot) -> Plan:
        base = self.inner.plan(snapshot)
        spec = cluster_gpu(snapshot)
        models = {job.id: job.model for job in snapshot.jobs}
        clocks = self._clocks([jp for jp in base.jobs if jp.gpus > 0], models, spec)
        jobs = tuple(
            JobPlan(jp.job_id, jp.gpus, clocks[jp.job_id], jp.local_batch_size, jp.placement)
            if jp.job_id in clocks
            else jp
            for jp in base.jobs
        )
        watts = predicted_watts(snapshot, jobs, spec, models, self.memo)
        return replace(base, jobs=jobs, predicted_watts=watts)

    def _clocks(
        self, run: list[JobPlan], models: dict[str, PerfModel], spec: GpuSpec
    ) -> dict[str, int]:
        """Running jobs' clocks: remembered ones, the rest from one grouped evaluation."""
        out: dict[str, int] = {}
        miss: list[tuple[JobPlan, tuple[object, ...]]] = []
        known = self.memo.last(("zeus", spec, self.eta_knob))
        for jp in run:
            # The job's last configuration first: one lookup by id, no memo key to build.
            last = known.recall(
                jp.job_id, models[jp.job_id], (jp.gpus, jp.local_batch_size, jp.placement)
            )
            if last is not None:
                out[jp.job_id] = last
                continue
            key: tuple[object, ...] = (
                "zeus",
                spec,
                self.eta_knob,
                jp.gpus,
                per_node(jp.placement),
                jp.local_batch_size,
            )
            hit = self.memo.get(models[jp.job_id], key)
            if isinstance(hit, int):
                out[jp.job_id] = hit
                known.remember(
                    jp.job_id, models[jp.job_id], (jp.gpus, jp.local_batch_size, jp.placement), hit
                )
            else:
                miss.append((jp, key))
        if not miss:
            return out
        f = np.asarray(spec.clocks_mhz, dtype=np.float64)[None, :]
        n = np.array([[jp.gpus] for jp, _ in miss], dtype=np.float64)
        t, e = evaluate(
            [models[jp.job_id] for jp, _ in miss],
            n,
            [[per_node(jp.placement)] for jp, _ in miss],
            [[jp.local_batch_size] for jp, _ in miss],
            f,
        )
        cost = self.eta_knob * e + (1.0 - self.eta_knob) * n * spec.max_power_w * t
        for (jp, key), i in zip(miss, np.argmin(cost, axis=1), strict=True):
            clock = int(spec.clocks_mhz[i])
            self.memo.put(models[jp.job_id], key, clock)
            out[jp.job_id] = clock
            known.remember(
                jp.job_id, models[jp.job_id], (jp.gpus, jp.local_batch_size, jp.placement), clock
            )
        return out
