"""The twin's run against ``powerflow simulate`` on the same jobs and cluster."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from powerflow.core.learning import FittedLearner
from powerflow.core.models.priors import load_prior
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import BATCH_S, INTERVAL_S, RESTART_S, SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.result import RunResult
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.world import default_world
from powerflow.lab.twin.harness import TwinResult
from powerflow.lab.twin.timescale import SAMPLE_WINDOW_S, TimeScale
from powerflow.lab.twin.trace import MiniJob, write_csv


def simulate_mini(
    jobs: tuple[MiniJob, ...],
    *,
    nodes: int,
    gpus_per_node: int,
    scale: TimeScale,
    eta: float = 1.0,
    interval_s: float = INTERVAL_S,
    restart_s: float = RESTART_S,
    seed: int = 0,
) -> RunResult:
    """What ``powerflow simulate --scheduler powerflow --eta ETA --trace MINI.csv --nodes N
    --gpus-per-node G --interval I --restart-s R`` runs (the same engine, policy and
    ground truth) on the mini trace's jobs, with the simulator's durations on the twin's
    time scale and the profiling the operator does: the ``profile_s`` window at each new
    GPU count, scaled, and no offline pre-run (the operator starts a job from its model's
    prior; the simulator's pre-run is an offline 1-GPU sweep before submission that the
    product does not have). No node boots (``power_on_s=0``): the operator parks the GPUs
    of a node it powers down, and the twin's nodes never switch off, so a job runs on
    them again at once; with the simulator's 300 s boot (unscaled), the first job's JCT at
    ``TimeScale(0.05)`` would be 747 s, against 149 s. Models start from each job's own
    model's prior, as the operator's do from the DLJob's ``model`` hint (the recurring-job
    case of ``powerflow simulate --priors recurring``), not from the simulator's default
    held-out prior."""
    with tempfile.TemporaryDirectory() as folder:
        path = write_csv(jobs, Path(folder) / "mini.csv")
        config = SimConfig(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            interval_s=scale(interval_s),
            restart_s=scale(restart_s),
            batch_s=scale(BATCH_S),
            seed=seed,
            # The twin's nodes never power off; with the simulator's default (idle nodes
            # off, 300 s unscaled to power one on) a job paid up to 600 s per node it
            # spread to, whatever the time scale.
            idle_nodes_off=False,
            power_on_s=0.0,
            sample_window_s=scale(SAMPLE_WINDOW_S),  # the twin's agents' --window
        )
        configured = scheduler("powerflow").configure(eta)
        profiling = replace(
            configured.profiling, prerun_s=0.0, profile_s=scale(configured.profiling.profile_s)
        )
        configured = replace(configured, profiling=profiling)
        trace = load_jobs(TraceSpec(path=str(path)), config)
        learner = FittedLearner(config.gpu, prior=load_prior)  # as the operator's hint does
        return Simulation(trace, configured, config, default_world(), learner).run()


@dataclass(frozen=True)
class Agreement:
    """Average JCT and job energy of both runs, and the twin's relative difference."""

    twin_jct_s: float
    sim_jct_s: float
    twin_energy_j: float
    sim_energy_j: float
    # Checkpoint-restarts of all jobs (``TwinResult.restarts``, ``JobRecord.restarts``).
    twin_restarts: int = 0
    sim_restarts: int = 0

    @property
    def jct_diff(self) -> float:
        return self.twin_jct_s / self.sim_jct_s - 1.0

    @property
    def energy_diff(self) -> float:
        return self.twin_energy_j / self.sim_energy_j - 1.0

    def describe(self) -> str:
        return (
            f"average JCT: twin {self.twin_jct_s:.0f} s, simulate {self.sim_jct_s:.0f} s "
            f"({self.jct_diff:+.1%}); job energy: twin {self.twin_energy_j / 1e6:.2f} MJ, "
            f"simulate {self.sim_energy_j / 1e6:.2f} MJ ({self.energy_diff:+.1%}); "
            f"restarts: twin {self.twin_restarts}, simulate {self.sim_restarts}"
        )


def agreement(twin: TwinResult, sim: RunResult) -> Agreement:
    sim_jct = sum(j.jct_s for j in sim.jobs) / len(sim.jobs)
    sim_energy = sum(j.energy_j for j in sim.jobs)
    sim_restarts = sum(j.restarts for j in sim.jobs)
    return Agreement(
        twin.avg_jct_s, sim_jct, twin.active_energy_j, sim_energy, twin.restarts, sim_restarts
    )
