"""The engine's accounting against hand-computed small cases.

A toy world whose step time and power are simple formulas lets every expected
number below be derived by hand; a fixed policy (requested GPUs, FIFO, first
free slots) stands in for a scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from powerflow.core.errors import SimulationError
from powerflow.core.gpus import A100
from powerflow.core.learning import OracleLearner
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.core.models.samples import Samples
from powerflow.core.policy.snapshot import Budget, JobPlan, Plan, Snapshot
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep
from powerflow.core.schedulers import PLUS_PROFILE_SWEEP
from powerflow.lab.schedulers import ORACLE, Configured, Profiling, scheduler
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import Simulation
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.trace import TraceJob
from powerflow.lab.sim.world import World, default_world

FMAX = A100.max_clock_mhz
IDLE = A100.idle_power_w
POWER = 250.0  # W per computing GPU in the toy world


class ToyTruth:
    """T = 1 s x (FMAX / f) / n per iteration; every computing GPU draws 250 W."""

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        return np.asarray((FMAX / np.asarray(f, float)) / np.asarray(n, float), dtype=np.float64)

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        return np.asarray(POWER * np.asarray(n, float) * self.step_time_s(n, r, bs, f))


def _measure(truth, n, r, bs, f, *, rng, noise):  # type: ignore[no-untyped-def]
    t = truth.step_time_s(n, r, bs, f)
    e = truth.energy_per_iter_j(n, r, bs, f)
    k = np.ones_like(t)
    return Samples(*(np.asarray(x, float) * k for x in (n, r, bs, f)), t, e)


def _sweep(truth, bs, *, rng, noise, duration_s):  # type: ignore[no-untyped-def]
    f = np.array([1005.0, 1410.0])
    return _measure(truth, 1.0, 1.0, bs, f, rng=rng, noise=noise)


WORLD = World(lambda name: ToyTruth(), _measure, _sweep, ("toy",), (("toy", 32),))


@dataclass
class FixedPolicy:
    """Requested GPUs, FIFO, first free slots of powered-on nodes; one clock.

    ``overrides`` maps job id to (from time, GPUs) to force a rescale;
    ``share`` puts every job on the same first GPUs (time-slicing);
    ``power_down`` powers down nodes holding no job.
    """

    frequency_mhz: int = FMAX
    overrides: dict[str, tuple[float, int]] = field(default_factory=dict)
    share: bool = False
    power_down: bool = False
    limit_w: float = float("inf")

    def plan(self, snapshot: Snapshot) -> Plan:
        free = [(node.name, i) for node in snapshot.nodes for i in range(node.gpus)]
        plans = []
        for job in sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.id)):
            want = job.requested_gpus
            when, gpus = self.overrides.get(job.id, (np.inf, want))
            if snapshot.now_s >= when:
                want = gpus
            if self.share:
                slots = tuple(free[:want])
            elif job.placement and len(job.placement) == want:
                slots = job.placement
                free = [s for s in free if s not in slots]
            elif len(free) >= want:
                slots, free = tuple(free[:want]), free[want:]
            else:
                slots = ()
            plans.append(
                JobPlan(job.id, len(slots), self.frequency_mhz, job.global_batch_size, slots)
            )
        used = {node for jp in plans for node, _ in jp.placement}
        down = (
            tuple(n.name for n in snapshot.nodes if n.name not in used) if self.power_down else ()
        )
        return Plan(tuple(plans), self.limit_w, 0.0, down)


def _run(
    jobs,
    policy,
    *,
    profiling=ORACLE,
    nodes=1,
    gpus=4,
    restart_s=30.0,
    seed=0,
    batch_s=0.0,
    idle_off=False,
    power_on_s=0.0,
):  # type: ignore[no-untyped-def]
    """One run; by default in the paper's setting with free power-on (nodes on
    unless a plan powers them down), which the hand computations below assume."""
    cfg = SimConfig(
        nodes=nodes,
        gpus_per_node=gpus,
        restart_s=restart_s,
        seed=seed,
        batch_s=batch_s,
        idle_nodes_off=idle_off,
        power_on_s=power_on_s,
    )
    configured = Configured(policy, Budget(eta=1.0), profiling, None, None)
    return Simulation(tuple(jobs), configured, cfg, WORLD, OracleLearner()).run()


def _job(i: int, submit: float, gpus: int, iters: float) -> TraceJob:
    return TraceJob(f"j{i}", submit, gpus, "toy", 32, iters)


def test_one_job_alone_costs_its_step_time_and_idle_neighbours() -> None:
    res = _run([_job(0, 100.0, 2, 1000.0)], FixedPolicy())
    m = summarise(res)
    jct = 1000 * 1.0 / 2  # T = 1/n at full clock
    assert m["avg_jct_s"] == pytest.approx(jct)
    assert res.active_energy_j == pytest.approx(1000 * POWER * 2 * 0.5)
    assert res.idle_energy_j == pytest.approx(2 * IDLE * jct)
    assert m["gpu_utilisation"] == pytest.approx(0.5)


def test_power_above_the_limit_is_measured_in_time_energy_and_peak() -> None:
    """From the ground truth: 2 x 250 W computing + 2 x idle against a 500 W limit."""
    res = _run([_job(0, 100.0, 2, 1000.0)], FixedPolicy(limit_w=500.0))
    over = 2 * POWER + 2 * IDLE - 500.0
    m = summarise(res)
    assert m["limit_w"] == 500.0
    assert m["time_above_limit_s"] == pytest.approx(500.0)
    assert m["energy_above_limit_j"] == pytest.approx(500.0 * over)
    assert m["max_overshoot_w"] == pytest.approx(over)
    assert m["max_overshoot_pct"] == pytest.approx(100 * over / 500.0)
    within = summarise(_run([_job(0, 100.0, 2, 1000.0)], FixedPolicy(limit_w=700.0)))
    assert within["time_above_limit_s"] == 0.0
    assert within["energy_above_limit_j"] == within["max_overshoot_w"] == 0.0
    assert summarise(_run([_job(0, 0.0, 1, 10.0)], FixedPolicy()))["limit_w"] is None


def test_lower_clock_slows_the_job_in_proportion() -> None:
    m = summarise(_run([_job(0, 0.0, 1, 600.0)], FixedPolicy(frequency_mhz=705)))
    assert m["avg_jct_s"] == pytest.approx(600 * FMAX / 705)


def test_prerun_and_profiling_are_counted_in_jct_and_energy() -> None:
    profiling = Profiling(prerun_s=240.0, profile_s=240.0, fitted_models=False)
    iters = 5000.0
    res = _run([_job(0, 0.0, 1, iters)], FixedPolicy(), profiling=profiling)
    clocks = np.array(PAPER_SWEEP.clocks_mhz(A100), dtype=float)
    slice_s = 240.0 / len(clocks)
    progress = np.sum(slice_s / (FMAX / clocks))  # n = 1
    expected = 240.0 + 240.0 + (iters - progress) * 1.0
    assert res.jobs[0].jct_s == pytest.approx(expected)
    assert res.jobs[0].profilings == 1
    # the pre-run's GPU draws 250 W while it sweeps, off the cluster's books
    assert res.prerun_energy_j == pytest.approx(240.0 * POWER)
    assert res.active_energy_j == pytest.approx(POWER * (expected - 240.0))


def test_rescale_charges_one_checkpoint_restart() -> None:
    policy = FixedPolicy(overrides={"j0": (200.0, 2)})
    res = _run([_job(0, 0.0, 1, 1000.0), _job(1, 200.0, 1, 10.0)], policy, restart_s=30.0)
    # 200 iterations on 1 GPU by t=200; 30 s restart; 800 iterations at 0.5 s
    assert res.jobs[0].jct_s == pytest.approx(200 + 30 + 800 * 0.5)
    assert res.jobs[0].rescales == 1 and res.jobs[0].restarts == 1
    free = _run([_job(0, 0.0, 1, 1000.0), _job(1, 200.0, 1, 10.0)], policy, restart_s=0.0)
    assert free.jobs[0].jct_s == pytest.approx(200 + 800 * 0.5)


def test_time_sliced_jobs_share_the_gpu_and_its_energy() -> None:
    res = _run([_job(0, 0.0, 1, 100.0), _job(1, 0.0, 1, 100.0)], FixedPolicy(share=True))
    # each runs at half speed on GPU 0 until both finish together
    assert [j.jct_s for j in res.jobs] == pytest.approx([200.0, 200.0])
    assert res.active_energy_j == pytest.approx(200.0 * POWER)  # one GPU busy, not two
    assert res.idle_energy_j == pytest.approx(3 * IDLE * 200.0)


def test_powered_down_nodes_draw_nothing() -> None:
    jobs = [_job(0, 0.0, 2, 100.0)]
    on = _run(jobs, FixedPolicy(), nodes=3, gpus=2)
    down = _run(jobs, FixedPolicy(power_down=True), nodes=3, gpus=2)
    assert on.idle_energy_j == pytest.approx(4 * IDLE * 50.0)
    assert down.idle_energy_j == pytest.approx(0.0)
    assert down.active_energy_j == pytest.approx(on.active_energy_j)


def test_waiting_job_starts_when_gpus_free_up() -> None:
    res = _run([_job(0, 0.0, 4, 400.0), _job(1, 10.0, 4, 400.0)], FixedPolicy())
    assert res.jobs[0].finish_s == pytest.approx(100.0)
    assert res.jobs[1].finish_s == pytest.approx(200.0)
    assert summarise(res)["p95_jct_s"] > summarise(res)["median_jct_s"]


def test_plan_on_unknown_gpu_is_an_error() -> None:
    class Bad:
        def plan(self, snapshot: Snapshot) -> Plan:
            jobs = tuple(JobPlan(j.id, 1, FMAX, 32, (("nowhere", 0),)) for j in snapshot.jobs)
            return Plan(jobs, float("inf"), 0.0)

    with pytest.raises(SimulationError, match="no GPU"):
        _run([_job(0, 0.0, 1, 10.0)], Bad())


def test_policy_that_never_schedules_is_reported_not_looped() -> None:
    class Idle:
        def plan(self, snapshot: Snapshot) -> Plan:
            return Plan(tuple(JobPlan(j.id, 0, FMAX, 32) for j in snapshot.jobs), 1.0, 0.0)

    with pytest.raises(SimulationError, match="waiting on an idle cluster"):
        _run([_job(0, 0.0, 1, 10.0)], Idle())


def test_events_within_the_batch_window_wait_for_one_joint_decision() -> None:
    jobs = [_job(0, 0.0, 1, 100.0), _job(1, 10.0, 1, 100.0)]
    immediate = _run(jobs, FixedPolicy(), batch_s=0.0)
    batched = _run(jobs, FixedPolicy(), batch_s=60.0)
    assert immediate.jobs[1].finish_s == pytest.approx(110.0)
    # the second arrival is decided 60 s after the first decision, at t = 60
    assert batched.jobs[1].finish_s == pytest.approx(160.0)
    assert batched.jobs[0].finish_s == pytest.approx(100.0)


# ---------------------------------------------------------------- idle nodes off


def test_a_job_on_an_off_node_starts_after_it_boots_and_the_boot_is_counted() -> None:
    """Idle nodes off: both nodes start off; the job's node boots 300 s (its two
    GPUs at idle power), then the job computes 500 s; the other node stays off."""
    jobs = [_job(0, 100.0, 2, 1000.0)]
    res = _run(jobs, FixedPolicy(), nodes=2, gpus=2, idle_off=True, power_on_s=300.0)
    assert res.jobs[0].jct_s == pytest.approx(300.0 + 500.0)
    assert res.active_energy_j == pytest.approx(1000 * POWER * 2 * 0.5)
    assert res.idle_energy_j == pytest.approx(2 * IDLE * 300.0)
    assert res.power_on_energy_j == pytest.approx(2 * IDLE * 300.0)
    assert res.power_ons == 1
    assert summarise(res)["powered_fraction"] == pytest.approx(2 * 800.0 / (4 * 800.0))
    # the paper's setting: every node on from the start, no boot, idle neighbours
    paper = _run(jobs, FixedPolicy(), nodes=2, gpus=2, idle_off=False, power_on_s=300.0)
    assert paper.jobs[0].jct_s == pytest.approx(500.0)
    assert paper.idle_energy_j == pytest.approx(2 * IDLE * 500.0)
    assert paper.power_ons == 0 and paper.power_on_energy_j == 0.0


def test_a_node_goes_off_when_its_last_job_leaves_and_boots_again_for_the_next() -> None:
    """One 2-GPU node: j0 boots it (50 s) and runs 100 s on one GPU; with nothing
    left it goes off at t = 150 and draws nothing until j1 boots it again at 1000."""
    jobs = [_job(0, 0.0, 1, 100.0), _job(1, 1000.0, 1, 100.0)]
    res = _run(jobs, FixedPolicy(), nodes=1, gpus=2, idle_off=True, power_on_s=50.0)
    assert [j.finish_s for j in res.jobs] == pytest.approx([150.0, 1150.0])
    assert res.power_ons == 2
    assert res.power_on_energy_j == pytest.approx(2 * (2 * IDLE * 50.0))
    # boots, plus the free GPU beside each running job
    assert res.idle_energy_j == pytest.approx(2 * (2 * IDLE * 50.0) + 2 * IDLE * 100.0)


def test_a_node_emptied_while_others_run_goes_off_at_the_next_decision() -> None:
    """Two 1-GPU nodes: j0 ends at 100 on node-0, j1 runs to 300 on node-1; the
    decision at j0's completion switches node-0 off (the paper's setting keeps
    it on, idle, for 200 s)."""
    jobs = [_job(0, 0.0, 1, 100.0), _job(1, 0.0, 1, 300.0)]
    off = _run(jobs, FixedPolicy(), nodes=2, gpus=1, idle_off=True)
    assert [j.finish_s for j in off.jobs] == pytest.approx([100.0, 300.0])
    assert off.idle_energy_j == pytest.approx(0.0)
    on = _run(jobs, FixedPolicy(), nodes=2, gpus=1, idle_off=False)
    assert on.idle_energy_j == pytest.approx(IDLE * 200.0)
    assert on.active_energy_j == pytest.approx(off.active_energy_j)


def test_a_plan_that_powers_nodes_down_pays_the_boot_when_it_uses_them_again() -> None:
    """The paper's setting, a policy powering down empty nodes (as PowerFlow's
    plans do): node-1, powered down by the first plan, boots 300 s for j1."""
    jobs = [_job(0, 0.0, 1, 1000.0), _job(1, 50.0, 1, 100.0)]
    policy = FixedPolicy(power_down=True)
    res = _run(jobs, policy, nodes=2, gpus=1, idle_off=False, power_on_s=300.0)
    assert res.jobs[1].jct_s == pytest.approx(300.0 + 100.0)
    assert res.power_ons == 1
    assert res.power_on_energy_j == pytest.approx(IDLE * 300.0)
    free = _run(jobs, policy, nodes=2, gpus=1, idle_off=False, power_on_s=0.0)
    assert free.jobs[1].jct_s == pytest.approx(100.0)
    # the same policy with idle nodes off for all pays the same boot
    same = _run(jobs, policy, nodes=2, gpus=1, idle_off=True, power_on_s=300.0)
    assert same.jobs[1].jct_s == pytest.approx(400.0)
    assert same.jobs[0].jct_s == pytest.approx(300.0 + 1000.0)  # its node boots too


def test_a_restart_on_a_booting_node_waits_for_the_longer_of_the_two() -> None:
    """j0 rescales from 1 to 2 GPUs at t = 200 onto a node that must boot (100 s)
    while its checkpoint restart takes 30 s: it computes again at t = 300."""
    policy = FixedPolicy(overrides={"j0": (200.0, 2)})
    jobs = [_job(0, 0.0, 1, 1000.0), _job(1, 200.0, 1, 10.0)]
    res = _run(jobs, policy, nodes=2, gpus=1, idle_off=True, power_on_s=100.0, restart_s=30.0)
    # boot 0-100, 100 iterations by t = 200, then 900 left at 0.5 s each from t = 300
    assert res.jobs[0].finish_s == pytest.approx(300.0 + 900 * 0.5)
    assert res.jobs[0].restarts == 1


def test_power_on_time_must_be_finite_and_not_negative() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(SimulationError, match="power-on"):
            SimConfig(power_on_s=bad)


@pytest.mark.parametrize(
    ("profile_s", "sweep", "per_clock"),
    [
        (240.0, PAPER_SWEEP, 2),  # 11.4 s slices: two of the agent's 5 s windows each
        (138.0, PLUS_PROFILE_SWEEP, 2),  # PowerFlow+'s 11.5 s slices
        (69.0, ClockSweep(8, 0.5), 2),  # six 11.5 s slices
        (21.0, PAPER_SWEEP, 1),  # 1 s slices: one sample each, never none
        (240.0, ClockSweep(40, 0.0), 16),  # 3 clocks, 80 s each
    ],
)
def test_a_profile_reports_a_sample_per_agent_window_of_each_slice(
    profile_s: float, sweep: ClockSweep, per_clock: int
) -> None:
    """The operator's learner gets a row per node-agent window (5 s, closed at each
    clock change too), and the simulator's learner as many: a 69 s, six-clock profile
    gives 12 rows, enough for a fit (``MIN_SAMPLES``), not 6."""
    sizes: list[int] = []

    def measure(truth, n, r, bs, f, *, rng, noise):  # type: ignore[no-untyped-def]
        sizes.append(np.size(f))
        return _measure(truth, n, r, bs, f, rng=rng, noise=noise)

    world = World(WORLD.truth, measure, _sweep, WORLD.model_names, WORLD.pool)
    cfg = SimConfig(nodes=1, gpus_per_node=4, idle_nodes_off=False, power_on_s=0.0, batch_s=0.0)
    profiling = Profiling(profile_s=profile_s, sweep=sweep)
    configured = Configured(FixedPolicy(), Budget(eta=1.0), profiling, None, None)
    Simulation((_job(0, 0.0, 1, 5000.0),), configured, cfg, world, OracleLearner()).run()
    clocks = sweep.clocks_mhz(A100)
    assert sizes[:1] == [per_clock * len(clocks)]


def test_powerflow_plus_refits_a_job_after_its_first_profile() -> None:
    """With no pre-run, a job's first profile is its first evidence: PowerFlow+'s
    learner must fit it then (with one sample per slice it had 6 rows, under
    ``MIN_SAMPLES``, and the job ran on its prior until a second GPU count)."""
    world = default_world()
    cfg = SimConfig(nodes=1, gpus_per_node=8)
    job = TraceJob("j0", 0.0, 1, "resnet50", 64, 20_000.0)
    configured = scheduler("powerflow+").configure(0.6)
    result = Simulation((job,), configured, cfg, world).run()
    assert (result.jobs[0].profilings, result.jobs[0].fits) == (1, 1)


def test_the_sample_window_is_the_node_agent_s_and_the_twin_s() -> None:
    """The simulator's rows per slice follow the agent's default ``--window``; the twin
    scales that same window for its agents and for the run it compares with."""
    from powerflow.cli import build_parser
    from powerflow.lab.twin.timescale import SAMPLE_WINDOW_S

    agent = build_parser(only="nodeagent").parse_args(["nodeagent", "--simulate", "1"])
    assert agent.window == SimConfig().sample_window_s == SAMPLE_WINDOW_S
    with pytest.raises(SimulationError):
        SimConfig(sample_window_s=0.0)
