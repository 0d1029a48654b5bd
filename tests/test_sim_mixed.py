"""The simulator on a mixed cluster (A100 and H100 nodes): each node's type gives
its jobs' clocks, power and progress from that type's ground truth, FleetPolicy
plans the pools under one budget, and a cluster of one type runs as before."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from powerflow.cli import main
from powerflow.commands.simulate import cluster_nodes
from powerflow.core.devices.capping import capped_clock_mhz
from powerflow.core.devices.interface import Workload
from powerflow.core.gpus import A100, GpuSpec, gpu_spec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.policy.fleet import FleetPolicy
from powerflow.core.policy.snapshot import Plan, Snapshot
from powerflow.lab.groundtruth import GroundTruth, ground_truth
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim.config import NodePool, SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.jobs import Phase, SimJob
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.result import RunResult
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.world import default_world

H100 = gpu_spec("H100-SXM")
MIXED = SimConfig(pools=(NodePool(A100, 2), NodePool(H100, 2)))
TRACE = TraceSpec(hours=2)
ETA = 0.6


@dataclass
class Seen:
    """What the checks saw over a run."""

    plans: int = 0
    placed_on: dict[str, set[str]] = field(default_factory=dict)  # job -> types
    moves: int = 0  # a job holding GPUs of another type than before
    checked_rates: int = 0
    measured: int = 0
    snapshots: int = 0
    unswept: int = 0  # waiting views not showing counts profiled on the job's last type only


class Checked(Simulation):
    """The engine, each snapshot and each applied plan checked against the ground
    truth of the type of every node a job holds."""

    seen: Seen

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        self.seen.snapshots += 1
        assert self._fleet is not None
        names = tuple(self._fleet.types)
        for view in snap.jobs:
            # every job carries its model on every type of the cluster
            assert tuple(name for name, _ in view.models_by_gpu) == names
            job = self._by_id[view.id]
            assert dict(view.models_by_gpu)[job.on.gpu.name] is view.model
            if view.profiled_gpus is not None:
                # holding: its type's counts; waiting: those profiled on every type
                # (a count its next type lacks sweeps there: counted at its peak)
                assert view.profiled_gpus <= job.profiled
                if not job.holding and view.profiled_gpus != job.profiled:
                    self.seen.unswept += 1
                if job.holding:
                    assert view.profiled_gpus == job.profiled
            for name, model in view.models_by_gpu:
                if isinstance(model, FittedModel):
                    assert model.params.gpu == name  # learned on (or carried to) that type
                else:  # the oracle's and the baselines': the type's ground truth
                    assert isinstance(model, GroundTruth)
                    assert (model.model_name, model.gpu.name) == (view.model_name, name)
        return snap

    def apply(self, plan: Plan) -> None:
        types = {name: gpu for name, _, gpu in self.cfg.node_types()}
        before = {job.index: (job.on.gpu.name, job.restarts, job.started) for job in self.jobs}
        super().apply(plan)
        self.seen.plans += 1
        for jp in plan.jobs:
            if not jp.gpus:
                continue
            on = {types[node] for node, _ in jp.placement}
            assert len(on) == 1, f"{jp.job_id} on {on}"
            gpu = on.pop()
            assert jp.frequency_mhz in gpu.clocks_mhz
            self.seen.placed_on.setdefault(jp.job_id, set()).add(gpu.name)
            job = self._by_id[jp.job_id]
            assert job.on.gpu is gpu and job.f == jp.frequency_mhz
            assert isinstance(job.truth, GroundTruth) and job.truth.gpu == gpu
            name, restarts, started = before[job.index]
            if name != gpu.name and started:
                # onto another type: a checkpoint restart, as any rescale
                self.seen.moves += 1
                assert job.phase is Phase.RESTART and job.restarts == restarts + 1
        for job in self._holders.values():
            self._check_rates(job, types[job.placement[0][0]])

    def _check_rates(self, job: SimJob, gpu: GpuSpec) -> None:
        """The job's rates are its node type's ground truth, read directly."""
        truth = ground_truth(job.trace.model_name, gpu)
        n, r, bs = job.n, job.r, job.bs
        if job.phase is Phase.RUN:
            cap = job.cap_w
            if cap is not None and gpu.min_power_limit_w is not None:
                cap = min(max(cap, gpu.min_power_limit_w), gpu.max_power_w)
            work = Workload(job.trace.model_name, n, r, bs)
            f = capped_clock_mhz(truth, work, gpu.clocks_mhz, job.f, cap)
            step = float(truth.step_time_s(n, r, bs, f))
            watts = float(truth.energy_per_iter_j(n, r, bs, f)) / step
            if job.measured_f == f and job.measured_w is not None:
                # measured there, with the profiler's 3 % noise: the H100 draws
                # about 1.75 times the A100's watts, so the type is unmistakable
                assert job.measured_w == pytest.approx(watts, rel=0.2)
                self.seen.measured += 1
        elif job.phase is Phase.PROFILE:
            assert set(job.profile_clocks) <= set(gpu.clocks_mhz)
            if job.cap_w is not None:
                return  # each slice capped: the fast paths' tests check that rule
            clocks = np.asarray(job.profile_clocks, dtype=np.float64)
            steps = np.asarray(truth.step_time_s(n, r, bs, clocks))
            step = float(1.0 / np.mean(1.0 / steps))
            watts = float(np.mean(np.asarray(truth.energy_per_iter_j(n, r, bs, clocks)) / steps))
        else:
            return
        assert job.step_s == pytest.approx(step, rel=1e-12)
        assert job.power_w == pytest.approx(watts, rel=1e-12)
        self.seen.checked_rates += 1


def run_checked(
    name: str, value: float | None, *, oracle: bool = False, trace: tuple[TraceJob, ...] = ()
) -> tuple[RunResult, Seen]:
    configured = scheduler(name).configure(value, oracle=oracle)
    sim = Checked(trace or load_jobs(TRACE, MIXED), configured, MIXED, default_world(A100))
    sim.seen = Seen()
    return sim.run(), sim.seen


@pytest.fixture(scope="module")
def fitted() -> tuple[RunResult, Seen]:
    return run_checked("powerflow", ETA)


@pytest.fixture(scope="module")
def oracle() -> tuple[RunResult, Seen]:
    return run_checked("powerflow", ETA, oracle=True)


def test_a_mixed_run_plans_each_type_at_its_clocks_on_its_ground_truth(
    fitted: tuple[RunResult, Seen],
) -> None:
    result, seen = fitted
    metrics = summarise(result)
    assert metrics["jobs"] == 108 and seen.plans > 100 and seen.snapshots >= seen.plans
    assert seen.checked_rates > 1000 and seen.measured > 100
    assert seen.unswept > 0
    types = {t for placed in seen.placed_on.values() for t in placed}
    assert types == {"A100", "H100-SXM"}


@pytest.mark.parametrize("run", ["fitted", "oracle"])
def test_jobs_are_spread_over_both_types_and_the_totals_add_up(
    run: str, request: pytest.FixtureRequest
) -> None:
    result, seen = request.getfixturevalue(run)
    on_h100 = sum("H100-SXM" in placed for placed in seen.placed_on.values())
    on_a100 = sum("A100" in placed for placed in seen.placed_on.values())
    assert on_h100 >= 10 and on_a100 >= 10
    by = {t.gpu: t for t in result.by_gpu}
    assert [by[name].gpus for name in ("A100", "H100-SXM")] == [16, 16]
    assert all(t.busy_gpu_s > 3600 for t in by.values())
    assert sum(t.active_energy_j for t in by.values()) == pytest.approx(result.active_energy_j)
    assert sum(t.idle_energy_j for t in by.values()) == pytest.approx(result.idle_energy_j)
    assert sum(t.held_gpu_s for t in by.values()) == pytest.approx(result.held_gpu_s)
    assert sum(t.busy_gpu_s for t in by.values()) == pytest.approx(result.busy_gpu_s)
    metrics = summarise(result)
    assert set(metrics["by_gpu"]) == {"A100", "H100-SXM"}


def test_a_job_that_changes_type_restarts_from_its_checkpoint(
    fitted: tuple[RunResult, Seen], oracle: tuple[RunResult, Seen]
) -> None:
    # the checks assert each move is a restart; here: there were moves to check
    assert fitted[1].moves + oracle[1].moves > 0


@pytest.mark.parametrize("run", ["fitted", "oracle"])
def test_the_budget_is_the_sum_of_each_types_share_and_the_true_power_keeps_it(
    run: str, request: pytest.FixtureRequest
) -> None:
    """Fitted too: its jobs start from priors carried to their pool's type, in that
    type's watts (``prior_on``)."""
    metrics = summarise(request.getfixturevalue(run)[0])
    limit = ETA * (16 * A100.p_max_w + 16 * H100.p_max_w)
    assert metrics["limit_w"] == pytest.approx(limit)
    assert metrics["time_above_limit_s"] == 0.0
    assert metrics["peak_power_w"] <= limit


def test_a_lone_job_runs_on_the_h100_and_costs_what_its_ground_truth_says() -> None:
    """One Gandiva job (its requested GPUs at the top clock, no profiling): the H100's
    energy-delay product is the lower, so it runs there, and its time and energy are
    the H100 ground truth's at its configuration, read directly."""
    job = load_jobs(TRACE, MIXED)[0]
    result, seen = run_checked("gandiva", None, trace=(job,))
    assert seen.placed_on == {job.job_id: {"H100-SXM"}}
    truth = ground_truth(job.model_name, H100)
    n = job.num_gpu
    r, bs, f = min(n, 8), -(-job.global_batch_size // n), H100.max_clock_mhz
    step = float(truth.step_time_s(n, r, bs, f))
    energy = float(truth.energy_per_iter_j(n, r, bs, f))
    (record,) = result.jobs
    assert record.energy_j == pytest.approx(job.iterations * energy, rel=1e-9)
    assert record.jct_s == pytest.approx(MIXED.power_on_s + job.iterations * step, rel=1e-9)
    h100 = next(t for t in result.by_gpu if t.gpu == "H100-SXM")
    assert h100.active_energy_j == pytest.approx(job.iterations * energy, rel=1e-9)


def test_a_mixed_clusters_policy_is_the_fleet_of_single_pool_policies() -> None:
    configured = scheduler("powerflow").configure(ETA)
    jobs = load_jobs(TraceSpec(hours=0.25), MIXED)
    sim = Simulation(jobs, configured, MIXED, default_world(A100))
    assert isinstance(sim.configured.policy, FleetPolicy)
    one = Simulation(jobs, configured, replace(MIXED, pools=()), default_world(A100))
    assert one.configured is configured


# ---------------------------------------------------------------- the --nodes option


def test_nodes_takes_type_count_pairs_with_optional_node_sizes() -> None:
    assert cluster_nodes("12", None) == (12, ())
    assert cluster_nodes(None, "A100") == (None, ())
    _, pools = cluster_nodes("A100:32, nvidia h100 80gb hbm3:16x4", None)
    assert pools == ((A100, 32, None), (H100, 16, 4))


def test_one_pool_is_the_cluster_of_one_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert SimConfig(pools=(NodePool(H100, 8),)) == SimConfig(nodes=8, gpu=H100)
    rows = []
    for cluster in (["--nodes", "H100-SXM:8"], ["--gpu", "H100-SXM", "--nodes", "8"]):
        args = ["simulate", "--scheduler", "gandiva", "--hours", "0.25", *cluster, "--json"]
        assert main(args) == 0
        row = json.loads(capsys.readouterr().out)
        rows.append({k: v for k, v in row.items() if k not in WALL})
    assert rows[0] == rows[1] and rows[0]["gpu"] == "H100-SXM" and "by_gpu" not in rows[0]


WALL = {"wall_s", "policy_s", "fit_s", "events_per_s"}


def test_simulate_runs_a_mixed_cluster_and_reports_each_type(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["simulate", "--scheduler", "gandiva", "--hours", "0.25", "--json"]
    assert main([*args, "--nodes", "A100:2,H100-SXM:1x4"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["nodes"] == "A100:2x8,H100-SXM:1x4" and "gpu" not in row
    assert row["frequency_mhz"] is None  # each type's top clock
    assert {k: v["gpus"] for k, v in row["by_gpu"].items()} == {"A100": 16, "H100-SXM": 4}
    assert row["time_above_limit_s"] == 0.0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nodes", "A100:2,B200:2"], "unknown GPU type 'B200'; known: A10, A100"),
        (
            ["--nodes", "A100:2,L4:2"],
            "no ground truth for L4; the simulator has one for A100, H100-SXM",
        ),
        (["--nodes", "A100:2,H100-SXM"], "'H100-SXM' is not one of TYPE:COUNT pairs"),
        (["--nodes", "A100:2x"], "'A100:2x' is not one of TYPE:COUNT pairs"),
        (["--nodes", "A100:0,H100-SXM:1"], "A100 nodes must be 1 to 10000, got 0"),
        (["--nodes", "A100:1x9,H100-SXM:1"], "GPUs per node must be 1 to 8, got 9"),
        (["--nodes", "A100:1,a100:2"], "pool A100:x8 is given twice"),
        (["--nodes", "-3"], "--nodes must be 1 to 10000, got -3"),
        (["--nodes", "A100:1,H100-SXM:1", "--gpu", "A100"], "drop --gpu"),
        (["--nodes", "A100:1,H100-SXM:1", "--frequency", "1410"], "drop --frequency"),
    ],
)
def test_a_bad_cluster_is_refused_in_one_line(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--scheduler", "gandiva", "--hours", "0.25", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_the_comparison_is_refused_on_a_mixed_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--quick", "--nodes", "A100:1,H100-SXM:1"]) == 2
    assert "one --scheduler at a time" in capsys.readouterr().err
