"""What a budget would cost: a queue replayed by the simulator at each budget.

An admin choosing a budget wants its price in the queue's terms: how much
longer jobs take, how much energy is saved, when the queue is done. The
prediction is the simulator itself (the same engine and the policy of the
scheduler the operator runs, ``--scheduler``, as every other run), with one
change: the models the scheduler has now
(each DLJob's fitted ``status.model`` parameters, else the prior of its
``model``) are taken as the ground truth, and the policy knows them
(``OracleLearner``). Jobs still pay that scheduler's profiling as
the simulator charges it (for ``powerflow`` a 240 s pre-run the operator does
not run, so its predicted JCT is up to 4 minutes per job pessimistic; PowerFlow+
has none) and every checkpoint-restart, as they would. So the prediction is exactly as
good as the models: ``powerflow budget what-if --validate`` measures its error
against the full simulator (true performance, models fitted online) on a
trace, and docs/operator.md states it.

A live queue has no future arrivals: every job is submitted at ``t = 0`` with
its remaining iterations, and JCT counts from now. A running job is replayed
as if it started now (it pays a pre-run, a profile and a restart again): the
JCT of a queue of running jobs is pessimistic by a few minutes per job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from powerflow.core.errors import SimulationError
from powerflow.core.learning import OracleLearner
from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.snapshot import Budget
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.world import World


@dataclass(frozen=True)
class QueuedJob:
    """One job of the queue and the model taken as its truth."""

    job_id: str
    model: PerfModel
    requested_gpus: int
    global_batch_size: int
    remaining_iterations: float
    submit_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """What the queue costs at one budget (``limit_w``: the plan's, at the start)."""

    budget: Budget
    limit_w: float
    avg_jct_s: float
    total_energy_j: float
    completion_s: float
    """When the last job completes, from ``t = 0`` (the earliest submission)."""

    @property
    def label(self) -> str:
        return budget_label(self.budget)


def budget_label(budget: Budget) -> str:
    """A budget as the what-if's table names it: ``60000 W`` or ``eta 0.6``."""
    if budget.limit_w is not None:
        return f"{budget.limit_w:g} W"
    return f"eta {1.0 if budget.eta is None else budget.eta:g}"


def predict(
    queue: Sequence[QueuedJob],
    budgets: Sequence[Budget],
    config: SimConfig,
    scheduler_name: str = "powerflow",
    world: World | None = None,
) -> list[Prediction]:
    """One simulated run of ``queue`` per budget, the models taken as the truth."""
    if not queue:
        raise SimulationError("the queue is empty: nothing to predict")
    world = model_world(queue) if world is None else world
    trace = tuple(
        TraceJob(
            q.job_id,
            q.submit_s,
            q.requested_gpus,
            q.job_id,
            q.global_batch_size,
            max(q.remaining_iterations, 1.0),
        )
        for q in queue
    )
    spec = scheduler(scheduler_name)
    if spec.knob != "eta":
        raise SimulationError(f"{spec.name} has no power budget to vary")
    out = []
    for budget in budgets:
        configured = replace(spec.configure(budget.eta), budget=budget)
        result = Simulation(trace, configured, config, world, OracleLearner()).run()
        metrics = summarise(result)
        start = min(q.submit_s for q in queue)
        finish = max(j.finish_s for j in result.jobs)
        limit = next((w for w in result.series.limit_w.tolist() if math.isfinite(w)), math.inf)
        out.append(
            Prediction(
                budget,
                limit,
                float(metrics["avg_jct_s"]),
                float(metrics["total_energy_j"]),
                finish - start,
            )
        )
    return out


def model_world(queue: Sequence[QueuedJob]) -> World:
    """A world whose ground truth of each job (by its id) is the job's model."""
    from powerflow.lab import groundtruth as gt

    models = {q.job_id: q.model for q in queue}
    if len(models) != len(queue):
        raise SimulationError("job ids in the queue must be unique")
    truth: Callable[[str], PerfModel] = models.__getitem__
    return World(truth, gt.measure, gt.one_gpu_sweep, tuple(models), ())
