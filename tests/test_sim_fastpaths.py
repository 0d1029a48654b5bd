"""The engine's and the ground truth's shortcuts change no result.

``ReferenceSimulation`` is the engine with its hot paths written the plain
way (a ``Counter`` over every holder at every event, a fresh ``Job`` for every
view, progress and next events job by job); seeded runs of real
schedulers on the real ground truth must give bit-identical metrics, power
series and per-job records either way. The ground truth's memo must answer
exactly what evaluating afresh answers.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import gc
import math
import weakref
from collections import Counter
from typing import Any

import numpy as np
import pytest

from powerflow.core.devices import Workload, capped_clock_mhz
from powerflow.core.errors import DataError
from powerflow.core.policy.power_ratio import BELIEVED, RatioWindow
from powerflow.core.policy.snapshot import GpuSlot, Job, Snapshot
from powerflow.lab.groundtruth import ground_truth
from powerflow.lab.groundtruth.measure import measure, measured_power_w, one_gpu_sweep, sweep_plan
from powerflow.lab.groundtruth.truth import MEMO_MAX_ROWS, GroundTruth
from powerflow.lab.schedulers import scheduler
from powerflow.lab.sim import kernels
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.engine import MEASURE_WINDOW_S, Simulation, _with_changes
from powerflow.lab.sim.jobs import JobArrays, Phase, SimJob
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.rates import PowerRow, TruthRates
from powerflow.lab.sim.result import RunResult
from powerflow.lab.sim.runner import TraceSpec, load_jobs
from powerflow.lab.sim.synthetic import SyntheticSpec
from powerflow.lab.sim.world import default_world


class ReferenceSimulation(Simulation):
    """The engine's bookkeeping without shortcuts."""

    shared_events = 0
    """Events at which some GPU was time-sliced (so shares below 1 were tested)."""

    def _refresh(self) -> None:
        holders = self._holders.values()
        load: Counter[GpuSlot] = Counter()
        for job in holders:
            load.update(job.placement)
        shared = len(load) < sum(job.n for job in holders)
        self.shared_events += shared
        for job in holders:
            job.share = 1.0 / max(load[s] for s in job.placement) if shared else 1.0
        self._held_gpus = len(load)
        self._shares_dirty = False
        active_w = 0.0
        busy = 0.0
        for job in holders:
            if job.computing:
                active_w += job.share * job.power_w
                busy += job.share * job.n
        self._active_w = active_w
        self._busy_gpus = busy
        self._peak_extra_w = sum(
            job.share * (job.peak_w - job.power_w) for job in holders if job.phase is Phase.PROFILE
        )
        for job in holders:
            end = job.phase_end_s
            job.next_is_completion = False
            if job.computing:
                finish = self.now + job.remaining * job.step_s / job.share
                if finish <= end:
                    end = finish
                    job.next_is_completion = True
            job.next_event_s = end
        self._next_job_s = min((j.next_event_s for j in holders), default=math.inf)
        self._record()

    def _progress(self, dt: float) -> None:
        for job in self._holders.values():
            job.attained_gpu_s += job.n * dt
            job.run_s += dt
            if job.computing:
                job.done_iters += dt * job.share / job.step_s
                job.energy_j += dt * job.share * job.power_w

    def _due(self, due: float) -> list[SimJob]:
        return [j for j in self._holders.values() if j.next_event_s <= due]

    def _measure(self, job: SimJob, f: int) -> None:
        """The reading evaluates the truth itself."""
        job.measured_w = measured_power_w(
            job.truth,
            job.n,
            job.r,
            job.bs,
            float(f),
            rng=self._meter,
            noise=self.cfg.noise,
            iterations=max(1.0, MEASURE_WINDOW_S / job.step_s),
        )
        job.measured_f = f
        self._stale_views.add(job.index)

    def _power_ratio(self) -> float:
        """Every holder's true power read job by job."""
        self._ratios.add(
            self.now,
            (
                (job.share * job.power_w, job.plan.power_w)
                for job in self._holders.values()
                if job.phase is Phase.RUN and job.plan is not None and job.plan.power_w
            ),
        )
        return self._ratios.ratio(self.now)

    def snapshot(self) -> Snapshot:
        """Every view built afresh by the engine's own ``_fresh_view`` (never reused or copied)."""
        jobs = tuple(
            self._fresh_view(j) for j in self._active.values() if j.phase is not Phase.PRERUN
        )
        budgets = self._budgets
        budget = self.configured.budget if budgets is None else budgets.budget_at(self.now)
        return Snapshot(self._nodes, jobs, budget, self.now, self._power_ratio())


def _sim(engine: type[Simulation], name: str, value: float | None, jobs: int) -> Simulation:
    config = SimConfig(nodes=2, seed=3)
    trace = TraceSpec(synthetic=SyntheticSpec(jobs=jobs, mean_interval_s=300.0, seed=5))
    world = default_world()
    configured = scheduler(name).configure(value, oracle=False)
    return engine(load_jobs(trace, config, world), configured, config, world)


def _run(engine: type[Simulation], name: str, value: float | None, jobs: int) -> RunResult:
    return _sim(engine, name, value, jobs).run()


def _same(a: RunResult, b: RunResult) -> None:
    ma, mb = summarise(a), summarise(b)
    for key in ("policy_s", "fit_s", "wall_s", "events_per_s"):
        del ma[key], mb[key]
    assert ma == mb
    assert a.jobs == b.jobs
    for name in ("t_s", "power_w", "busy_gpus", "powered_gpus", "held_gpus", "queued_jobs"):
        assert np.array_equal(getattr(a.series, name), getattr(b.series, name)), name


@pytest.mark.parametrize(
    ("name", "value", "jobs"),
    [
        ("gandiva", 1410, 40),  # time-slices GPUs: shares below 1
        ("tiresias", 1410, 40),  # preempts by attained service
        ("powerflow", 0.6, 12),  # pre-runs, profiles, refits, rescales, powers down
    ],
)
def test_engine_matches_the_plain_reference(name: str, value: float, jobs: int) -> None:
    fast = _run(Simulation, name, value, jobs)
    _same(fast, _run(ReferenceSimulation, name, value, jobs))
    assert fast.events > jobs  # the run did something worth comparing


def test_a_run_leaves_the_collector_as_it_found_it() -> None:
    """``Simulation.run`` freezes what exists and collects less often while it runs;
    afterwards the thresholds are the caller's again and nothing stays frozen."""
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    class Watching(Simulation):
        def _run(self) -> RunResult:
            seen.append(gc.get_threshold())
            return super()._run()

    _run(Watching, "tiresias", 1410, 6)
    assert seen and seen[0] != before
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_engine_exercised_the_shortcuts() -> None:
    """The gandiva case above really time-slices and the powerflow case
    really rescales: otherwise the comparison proves little."""
    gandiva = _sim(ReferenceSimulation, "gandiva", 1410, 40)
    gandiva.run()
    assert isinstance(gandiva, ReferenceSimulation) and gandiva.shared_events > 0
    flow = summarise(_run(Simulation, "powerflow", 0.6, 12))
    assert flow["rescales"] + flow["migrations"] > 0
    assert flow["profiling_phases"] > 0


def test_kernels_do_what_a_loop_over_the_jobs_does() -> None:
    """The compiled passes give the very floats of a Python loop over the rows
    (sums added in order, not pairwise), on random rows with big and tiny
    terms, and NaN comes out of the soonest event as np.min has it."""
    rng = np.random.default_rng(4)
    for size in (0, 1, 7, 130, 2000):
        a = JobArrays(size + 3)
        for col in ("done", "attained", "run_s", "energy", "power", "n", "iterations"):
            getattr(a, col)[:] = rng.random(size + 3) * 10.0 ** rng.uniform(-3, 5, size + 3)
        a.share[:] = rng.choice([1.0, 0.5, 1 / 3], size + 3)
        a.step[:] = rng.uniform(0.01, 3.0, size + 3)
        a.phase_end[:] = np.where(rng.random(size + 3) < 0.5, np.inf, rng.uniform(0, 1e5, size + 3))
        held = rng.permutation(size + 3)[:size].astype(np.intp)
        computing = held[rng.random(size) < 0.8]
        b = copy.deepcopy(a)
        kernels.advance(held, computing, 7.25, a.floats)
        for i in held.tolist():
            b.attained[i] += b.n[i] * 7.25
            b.run_s[i] += 7.25
        for i in computing.tolist():
            b.done[i] += 7.25 * b.share[i] / b.step[i]
            b.energy[i] += 7.25 * b.share[i] * b.power[i]
        active_w, busy = 0.0, 0.0
        for i in computing.tolist():
            active_w += float(b.share[i] * b.power[i])
            busy += float(b.share[i] * b.n[i])
        assert kernels.draw(computing, a.floats) == (active_w, busy)
        soonest = kernels.next_events(held, computing, 50.0, a.floats, a.flags)
        expected = math.inf
        computes = set(computing.tolist())
        for i in held.tolist():
            end, first = float(b.phase_end[i]), False
            if i in computes:
                left = max(float(b.iterations[i] - b.done[i]), 0.0)
                finish = 50.0 + left * b.step[i] / b.share[i]
                if finish <= end:
                    end, first = finish, True
            assert a.next_event[i] == end and a.completion[i] == first
            expected = min(expected, end)
        assert soonest == expected
        for col in ("attained", "run_s", "done", "energy"):
            assert np.array_equal(getattr(a, col), getattr(b, col)), col
    a.phase_end[held[0]] = np.nan  # the last (largest) case's first holder
    assert math.isnan(kernels.next_events(held, held[:0], 0.0, a.floats, a.flags))


def test_ratio_sums_are_the_sums_the_window_forms() -> None:
    """``kernels.ratio_sums`` keeps the pairs ``RatioWindow.add`` keeps (running
    jobs, finite positive powers, ratios inside ``BELIEVED``) and adds them in
    ``held`` order: the window records the very same sample."""
    rng = np.random.default_rng(6)
    lo, hi = BELIEVED
    for size in (0, 1, 9, 300, 2000):
        rows = size + 2
        a = JobArrays(rows)
        a.share[:] = rng.choice([1.0, 0.5, 1 / 3], rows)
        a.power[:] = rng.uniform(50.0, 3000.0, rows) * 10.0 ** rng.uniform(-3, 3, rows)
        a.planned[:] = a.power * rng.uniform(0.3, 1.8, rows)  # outliers both ways
        bad = rng.random(rows) < 0.1
        a.planned[bad] = rng.choice([0.0, -5.0, np.nan, np.inf], int(bad.sum()))
        a.power[rng.random(rows) < 0.05] = rng.choice([np.nan, np.inf, 0.0])
        a.running[:] = rng.random(rows) < 0.7
        held = rng.permutation(rows)[:size].astype(np.intp)
        plain, fast = RatioWindow(), RatioWindow()
        plain.add(
            0.0,
            [
                (float(a.share[i] * a.power[i]), float(a.planned[i]))
                for i in held.tolist()
                if a.running[i] and a.planned[i]
            ],
        )
        fast.add_sums(0.0, *kernels.ratio_sums(held, lo, hi, a.floats, a.flags))
        assert list(fast._samples) == list(plain._samples)
        assert size < 9 or plain._samples  # a sample was recorded to compare


def test_progress_rows_are_what_a_rebuilt_view_shows() -> None:
    """The snapshot's progress fields of each holder: max(max(left, 0), 1e-9)
    as ``_fresh_view`` computes it (NaN kept), seconds and GPU-seconds held."""
    rng = np.random.default_rng(6)
    a = JobArrays(50)
    a.iterations[:] = rng.uniform(0, 1e4, 50)
    a.done[:] = a.iterations + rng.choice([-1e3, -1e-10, 0.0, 1e-12, 5.0], 50)
    a.done[3] = np.nan
    a.run_s[:] = rng.uniform(0, 1e5, 50)
    a.attained[:] = rng.uniform(0, 1e6, 50)
    held = rng.permutation(50)[:40].astype(np.intp)
    remaining, run_s, attained = kernels.progress_rows(held, a.floats).tolist()
    for k, i in enumerate(held.tolist()):
        want = max(max(float(a.iterations[i] - a.done[i]), 0.0), 1e-9)
        assert remaining[k] == want or (math.isnan(want) and math.isnan(remaining[k]))
        assert run_s[k] == a.run_s[i] and attained[k] == a.attained[i]
    assert any(r == 1e-9 for r in remaining) and any(math.isnan(r) for r in remaining)


def test_view_copy_equals_a_rebuilt_job() -> None:
    truth = ground_truth("resnet50")
    view = Job(
        id="j",
        model=truth,
        remaining_iterations=10.0,
        global_batch_size=64,
        requested_gpus=2,
        arrival_s=1.0,
        elapsed_s=2.0,
        placement=(("n0", 0), ("n0", 1)),
        frequency_mhz=1410,
        attained_gpu_s=4.0,
        model_name="resnet50",
        pinned=True,
    )
    other = ground_truth("bert")
    changed = _with_changes(view, other, 2.0, 5.0, (("n1", 3),), None, 9.0, False)
    assert changed == dataclasses.replace(
        view,
        model=other,
        remaining_iterations=2.0,
        elapsed_s=5.0,
        placement=(("n1", 3),),
        frequency_mhz=None,
        attained_gpu_s=9.0,
        pinned=False,
    )
    assert changed is not view and view.model is truth and view.pinned
    assert hash(changed) == hash(dataclasses.replace(changed))
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.elapsed_s = 1.0  # type: ignore[misc]


def _fresh(truth: GroundTruth) -> GroundTruth:
    """The same ground truth with an empty memo."""
    return dataclasses.replace(truth)


@pytest.mark.parametrize("model", ["resnet50", "bert", "deepspeech2"])
def test_memo_answers_exactly_what_a_fresh_evaluation_does(model: str) -> None:
    rng = np.random.default_rng(11)
    truth = _fresh(ground_truth(model))
    clocks = np.array(truth.gpu.clocks_mhz, dtype=np.float64)
    for _ in range(40):
        k = int(rng.integers(1, 5))
        n = float(2 ** rng.integers(0, 7))
        r = min(n, float(2 ** rng.integers(0, 4)))
        bs = float(rng.integers(1, 256))
        f = rng.choice(clocks, size=int(rng.integers(1, 30)))
        args = (np.full(k, n), np.full(k, r), np.full(k, bs), f[:k]) if k > 1 else (n, r, bs, f)
        for _ in range(2):  # the second call is answered from the memo
            again = _fresh(truth)  # nothing remembered
            assert np.array_equal(truth.step_time_s(*args), again.step_time_s(*args))
            assert np.array_equal(truth.energy_per_iter_j(*args), again.energy_per_iter_j(*args))
            assert np.array_equal(truth.power_w(*args), again.power_w(*args))
    assert truth._memo


def test_memo_is_not_corrupted_by_callers() -> None:
    truth = _fresh(ground_truth("resnet50"))
    n = np.array([4.0, 4.0])
    f = np.array([1410.0, 1005.0])
    first = truth.step_time_s(n, 4, 32, f)
    expected = first.copy()
    first[:] = -1.0  # the caller owns what it got
    n[:] = 8.0  # and its own input
    assert np.array_equal(truth.step_time_s(np.array([4.0, 4.0]), 4, 32, f), expected)
    assert np.array_equal(truth.step_time_s(n, 4, 32, f), _fresh(truth).step_time_s(n, 4, 32, f))


def test_memo_keys_on_values_whatever_their_type() -> None:
    """Equal numbers of different types share a memo entry; the answers are
    what a fresh evaluation of each spelling gives."""
    truth = _fresh(ground_truth("gpt2"))
    spellings: list[tuple[Any, Any, Any, Any]] = [
        (4, 2, 16, 1410),
        (4.0, 2.0, 16.0, 1410.0),
        (np.int64(4), np.float64(2), 16, np.float32(1410)),
        (np.array(4.0), 2, 16, 1410),
        (np.array([4, 4]), 2, 16, np.array([1410, 1005])),
        (np.array([4.0, 4.0]), 2, 16, np.array([1410.0, 1005.0])),
    ]
    for args in spellings:
        for _ in range(2):
            assert np.array_equal(truth.step_time_s(*args), _fresh(truth).step_time_s(*args))
            assert np.array_equal(
                truth.energy_per_iter_j(*args), _fresh(truth).energy_per_iter_j(*args)
            )
            assert np.shape(truth.step_time_s(*args)) == np.shape(args[0])
    assert len(truth._memo) == 4  # scalars as one, 0-d, int and float arrays


@pytest.mark.parametrize("model", ["resnet50", "bert", "deepspeech2"])
def test_rows_remembered_by_clock_are_what_a_whole_evaluation_gives(model: str) -> None:
    """Profiles measured with more and more slices done (prefixes of the same
    clocks, each repeated) and other orders of them reuse rows remembered clock
    by clock: every output must be the very floats of evaluating the whole
    input at once."""
    truth = _fresh(ground_truth(model))
    clocks = np.asarray(truth.gpu.clocks_mhz[::4], dtype=np.float64)
    rng = np.random.default_rng(13)
    for n, r, bs in ((1, 1, 32.0), (8, 8, 4.0), (16, 8, 64.0), (4, 2, 512.0)):
        for f in (
            *(np.repeat(clocks[:k], 2) for k in range(1, len(clocks) + 1)),
            rng.permutation(clocks),
            np.asarray(rng.choice(truth.gpu.clocks_mhz, 9), dtype=np.float64),
        ):
            args = (np.full(f.size, float(n)), np.full(f.size, float(r)), np.full(f.size, bs), f)
            want = _fresh(truth)._compute_phases(*(a.copy() for a in args))
            got = truth._phases(*args)
            for w, g in zip(want, got, strict=True):
                assert np.array_equal(w, g)
    assert truth._clock_rows  # the rows were remembered and reused


def test_memo_skips_large_inputs_and_still_validates() -> None:
    truth = _fresh(ground_truth("resnet50"))
    big = np.full(MEMO_MAX_ROWS + 1, 1410.0)
    truth.step_time_s(1, 1, 32, big)
    assert not truth._memo
    with pytest.raises(Exception, match="r must be"):
        truth.step_time_s(2, 4, 32, 1410.0)
    with pytest.raises(Exception, match="r must be"):  # not remembered as valid
        truth.step_time_s(2, 4, 32, 1410.0)


def test_measurements_do_not_depend_on_the_memo() -> None:
    """Noisy samples are the same draws whether the truth was remembered or not."""
    truth = ground_truth("bert")
    f = np.array(truth.gpu.clocks_mhz[-5:], dtype=np.float64)
    warm = [measure(truth, 2, 2, 16, f, rng=np.random.default_rng(s)) for s in range(3)]
    cold = [measure(_fresh(truth), 2, 2, 16, f, rng=np.random.default_rng(s)) for s in range(3)]
    assert all(
        np.array_equal(a.step_time_s, b.step_time_s) for a, b in zip(warm, cold, strict=True)
    )
    assert all(np.array_equal(a.energy_j, b.energy_j) for a, b in zip(warm, cold, strict=True))
    a = one_gpu_sweep(truth, 32, rng=np.random.default_rng(1))
    b = one_gpu_sweep(_fresh(truth), 32, rng=np.random.default_rng(1))
    assert np.array_equal(a.f, b.f) and np.array_equal(a.energy_j, b.energy_j)


BATCHES = (1.0, 8.0, 24.0, 32.0, 100.0, 512.0, 3000.0)
"""Local batches the rate tests draw from: small, odd and beyond the tables."""


def _configuration(
    rng: np.random.Generator, count_bits: int, batches: tuple[float, ...]
) -> tuple[int, int, float]:
    """A random (GPUs, GPUs per node, local batch): a power of two below
    ``2**count_bits`` GPUs, at most 8 per node."""
    n = int(2 ** rng.integers(0, count_bits))
    r = min(n, int(2 ** rng.integers(0, 4)))
    return n, r, float(rng.choice(list(batches)))


@pytest.mark.parametrize("model", ["resnet50", "bert", "deepspeech2", "gpt2"])
def test_rates_filled_for_every_clock_equal_one_clock_at_a_time(model: str) -> None:
    """A miss fills the rate cache for all clocks from one array evaluation;
    each entry must be the very floats a scalar evaluation of that clock gives."""
    truth = ground_truth(model)
    clocks = truth.gpu.clocks_mhz
    batched = TruthRates(lambda name: _fresh(truth), clocks)
    single = TruthRates(lambda name: _fresh(truth))  # no clocks: every miss alone
    rng = np.random.default_rng(8)
    for _ in range(30):
        n, r, bs = _configuration(rng, 7, BATCHES)
        for f in rng.choice(clocks, size=4).tolist():
            assert batched.rate(model, n, r, bs, f) == single.rate(model, n, r, bs, f)
    assert len(batched._cache) > len(single._cache)  # the fill really happened


@pytest.mark.parametrize("model", ["resnet50", "bert", "deepspeech2", "gpt2"])
def test_sweeps_read_from_the_filled_cache_equal_one_evaluation(model: str) -> None:
    """A sweep of supported clocks takes each clock's step time and energy from
    the filled cache; its effective rates must be the very floats one evaluation
    of the truth at all its clocks gives (clocks repeated, unsupported ones too)."""
    truth = ground_truth(model)
    clocks = truth.gpu.clocks_mhz
    cached = TruthRates(lambda name: _fresh(truth), clocks)
    # The reference: a fresh truth and rates object per sweep, so that no memo of
    # either (the truth's rows clock by clock included) answers any part of it.
    rng = np.random.default_rng(9)
    for _ in range(30):
        n, r, bs = _configuration(rng, 7, BATCHES)
        for sweep in (
            tuple(clocks[::4]),
            tuple(sorted(rng.choice(clocks, size=15).tolist())),
            (clocks[3],) * 5 + (clocks[-1],) * 2,
            (clocks[0] - 15, clocks[10]),
        ):
            want = TruthRates(lambda name: _fresh(truth)).sweep(model, n, r, bs, sweep)
            assert cached.sweep(model, n, r, bs, sweep) == want
    assert cached._clean  # the cached one read the cache


@pytest.mark.parametrize("model", ["resnet50", "bert", "gpt2"])
def test_capped_clock_equals_the_device_rule(model: str) -> None:
    """``TruthRates.capped`` and ``capped_each`` read one per-GPU power row per
    configuration; they must answer what ``capped_clock_mhz`` (the simulated GPUs'
    rule) answers, for caps between, at and beyond the configuration's powers and
    ceilings below every clock."""
    truth = ground_truth(model)
    clocks = truth.gpu.clocks_mhz
    rates = TruthRates(lambda name: _fresh(truth), clocks)
    rng = np.random.default_rng(11)
    for _ in range(40):
        n, r, bs = _configuration(rng, 6, (1.0, 16.0, 32.0, 200.0))
        work = Workload(model, n, r, bs)
        f = np.asarray(clocks, dtype=np.float64)
        per_gpu = truth.energy_per_iter_j(n, r, bs, f) / (n * truth.step_time_s(n, r, bs, f))
        caps = [*rng.uniform(0.5 * per_gpu.min(), 1.2 * per_gpu.max(), 5), *per_gpu[::20]]
        ceilings = [clocks[0] - 15, clocks[0], *rng.choice(clocks, 3).tolist(), clocks[-1]]
        for cap in caps:
            wants = [
                capped_clock_mhz(_fresh(truth), work, clocks, int(hi), float(cap))
                for hi in ceilings
            ]
            got = [rates.capped(model, n, r, bs, int(hi), float(cap)) for hi in ceilings]
            assert got == wants
            each = rates.capped_each(model, n, r, bs, [int(hi) for hi in ceilings], float(cap))
            assert list(each) == wants


def test_capped_each_matches_a_pass_over_the_row_at_every_power() -> None:
    """``capped_each`` finds the first clock that does not fit by bisection of
    the running maximum and then looks only at the dips; at caps equal to each
    clock's power and one ulp either side (and NaN and the infinities) it must
    answer what the plain pass (the running maximum of fitting indices) does,
    on rows with dips and on a row holding a NaN."""

    def plain(supported: list[int], power: list[float], clocks: Any, cap: float) -> tuple[int, ...]:
        best, top = [], 0
        for k, w in enumerate(power):
            top = k if w <= cap else top
            best.append(top)
        return tuple(
            supported[best[k - 1]] if (k := bisect.bisect_right(supported, f)) else supported[0]
            for f in clocks
        )

    truth = ground_truth("resnet50")
    clocks = truth.gpu.clocks_mhz
    rates = TruthRates(lambda name: truth, clocks)
    rng = np.random.default_rng(12)
    dips = 0
    for n, bs in ((1, 8.0), (8, 8.0), (4, 64.0), (16, 300.0)):
        row = rates._per_gpu_w("resnet50", n, min(n, 8), bs)
        dips += bool(row.dips)
        nan = list(row.power)
        nan[30] = math.nan  # a NaN at a clock: the plain pass answers
        for power in (row.power, nan) if n == 4 else (row.power,):
            supported = row.clocks
            rates._powers["resnet50", n, min(n, 8), bs] = PowerRow(supported, row.index, power)
            caps = [*power, *np.nextafter(power, 0.0), *np.nextafter(power, np.inf)]
            caps += [math.nan, math.inf, -math.inf, 0.0]
            sweeps = (
                tuple(clocks[::4]),
                tuple(sorted(rng.choice(clocks, size=9).tolist())),
                (clocks[0] - 15, clocks[40], clocks[-1] + 15),
            )
            for cap in caps:
                for sweep in sweeps:
                    got = rates.capped_each("resnet50", n, min(n, 8), bs, sweep, float(cap))
                    assert got == plain(supported, power, sweep, float(cap)), (n, bs, cap)
    assert dips  # rows whose power falls somewhere were tried


def _measure_by_broadcasting(
    truth: Any, n: Any, r: Any, bs: Any, f: Any, rng: np.random.Generator, iterations: Any = 1
) -> tuple[np.ndarray, ...]:
    """``measure`` written the plain way: broadcast everything, evaluate twice."""
    cols = np.broadcast_arrays(n, r, bs, f, iterations)
    n_, r_, bs_, f_, it_ = (np.asarray(x, dtype=np.float64).ravel() for x in cols)
    sigma = 0.03 / np.sqrt(it_)
    t = truth.step_time_s(n_, r_, bs_, f_)
    t = t * np.exp(sigma * rng.standard_normal(sigma.shape) - 0.5 * sigma**2)
    e = truth.energy_per_iter_j(n_, r_, bs_, f_)
    e = e * np.exp(sigma * rng.standard_normal(sigma.shape) - 0.5 * sigma**2)
    return n_, r_, bs_, f_, t, e


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@dataclasses.dataclass(frozen=True)
class _NotAGroundTruth:
    """A ground truth behind the bare PerfModel methods (measure's general path)."""

    truth: GroundTruth

    def step_time_s(self, n: Any, r: Any, bs: Any, f: Any) -> Any:
        return self.truth.step_time_s(n, r, bs, f)

    def energy_per_iter_j(self, n: Any, r: Any, bs: Any, f: Any) -> Any:
        return self.truth.energy_per_iter_j(n, r, bs, f)


def test_measure_shortcuts_give_the_plain_samples() -> None:
    """Numbers and equal-length arrays skip np.broadcast_arrays, a ground truth
    is evaluated once for both columns, the pre-run's plan is remembered: the
    samples are the very floats of the plain way, whatever the spelling."""
    truth = ground_truth("gpt2")
    f = np.array(truth.gpu.clocks_mhz[-7:], dtype=np.float64)
    spellings: list[tuple[Any, Any, Any, Any, Any]] = [
        (4, 2, 16.0, f, 1),
        (np.full(7, 4.0), np.full(7, 2.0), 16, f, 1),
        (4.0, np.full(7, 2.0), np.full(7, 16.0), f, np.arange(1, 8)),
        (np.array(4), 2, 16, f[::2], 3.0),  # a strided column
        (4, 2, 16, 1410, 1),  # all numbers: one sample
        (np.full((2, 7), 4.0), 2, 16, f, 1),  # 2-D: the general path
        (np.array([4.0, 8.0]), np.array([[2.0], [4.0]]), 16, 1410, 1),
    ]
    for k, (n, r, bs, clocks, iters) in enumerate(spellings):
        for model in (truth, _NotAGroundTruth(truth)):
            got = measure(model, n, r, bs, clocks, rng=_rng(k), noise=0.03, iterations=iters)
            want = _measure_by_broadcasting(model, n, r, bs, clocks, _rng(k), iters)
            for name, col in zip(
                ("n", "r", "bs", "f", "step_time_s", "energy_j"), want, strict=True
            ):
                assert np.array_equal(getattr(got, name), col), (k, name)
                assert getattr(got, name).flags.c_contiguous
    for bs in (8.0, 8, 64.0):
        fresh = one_gpu_sweep(_fresh(truth), bs, rng=_rng(2))
        plan = sweep_plan(truth, bs)
        plan[0][:] = 0.0  # the caller owns what it got: the memo is not touched
        again = one_gpu_sweep(truth, bs, rng=_rng(2))
        for name in ("n", "r", "bs", "f", "step_time_s", "energy_j"):
            assert np.array_equal(getattr(fresh, name), getattr(again, name)), name
    assert truth._plans


def test_remembered_rows_give_the_plain_draws() -> None:
    """A ground truth's measured rows are kept and only the noise is drawn again
    (time's and energy's factors from one draw): every sample, and the generator
    after it, is what the plain path through the bare PerfModel gives, and rows
    that ``Samples`` refuses are refused the same way."""
    truth = _fresh(ground_truth("bert"))
    plain = _NotAGroundTruth(truth)
    f = np.repeat(np.array(truth.gpu.clocks_mhz[-4:], dtype=np.float64), 3)
    fast, slow = _rng(6), _rng(6)
    for _ in range(3):
        for n, r, bs, clocks, iters in ((2, 2, 16.0, f, 1), (1, 1, 32, f[:5], 7.5)):
            got = measure(truth, n, r, bs, clocks, rng=fast, noise=0.03, iterations=iters)
            want = measure(plain, n, r, bs, clocks, rng=slow, noise=0.03, iterations=iters)
            for name in ("n", "r", "bs", "f", "step_time_s", "energy_j"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), name
        got = one_gpu_sweep(truth, 32, rng=fast)
        want = one_gpu_sweep(plain, 32, rng=slow)
        assert np.array_equal(got.step_time_s, want.step_time_s)
        assert np.array_equal(got.energy_j, want.energy_j)
        assert got.n.flags.writeable and got.step_time_s.flags.writeable
    assert fast.random() == slow.random()
    assert len(truth._measured) == 3
    for bad in (np.array([np.inf]), np.array([1410.0, np.nan]), np.array([1410.0, -5.0])):
        with pytest.raises(DataError) as caught:
            measure(plain, 2, 2, 16.0, bad, rng=slow)
        with pytest.raises(DataError, match=str(caught.value)):
            measure(truth, 2, 2, 16.0, bad, rng=fast)


def test_remembered_rows_are_per_configuration_and_their_own() -> None:
    """The memo holds one entry per configuration whatever the iterations (a simulated
    GPU's readings average a different count each time), and keeps its own copy of
    the columns: a caller that changes its array later changes no later sample."""
    truth = _fresh(ground_truth("bert"))
    plain = _NotAGroundTruth(truth)
    fast, slow = _rng(8), _rng(8)
    f = np.array(truth.gpu.clocks_mhz[-2:], dtype=np.float64)
    for k in range(50):
        iters = 1.0 + k / 7.0
        got = measure(truth, 1, 1, 32, f, rng=fast, noise=0.03, iterations=iters)
        want = measure(plain, 1, 1, 32, f, rng=slow, noise=0.03, iterations=iters)
        assert np.array_equal(got.step_time_s, want.step_time_s)
        assert np.array_equal(got.energy_j, want.energy_j)
    assert len(truth._measured) == 1
    kept = f.copy()
    f[0] = truth.gpu.clocks_mhz[0]  # the caller reuses its buffer
    again = measure(truth, 1, 1, 32, kept, rng=fast, noise=0.03)
    want = measure(plain, 1, 1, 32, kept, rng=slow, noise=0.03)
    assert np.array_equal(again.f, kept)
    assert np.array_equal(again.step_time_s, want.step_time_s)


def test_the_planned_power_column_follows_every_jobs_plan() -> None:
    """``kernels.ratio_sums`` reads each job's planned watts from the arrays, which
    ``SimJob.set_plan`` keeps: at every decision of a run that rescales, profiles
    and preempts, each job's column is its plan's power (0 without one)."""
    checked: list[int] = []

    class Checking(Simulation):
        def _power_ratio(self) -> float:
            planned = self._arrays.planned
            for job in self.jobs:
                plan = job.plan
                want = (plan.power_w or 0.0) if plan is not None else 0.0
                assert planned[job.index] == want, job.trace.job_id
            checked.append(sum(job.plan is not None for job in self.jobs))
            return super()._power_ratio()

    _run(Checking, "powerflow", 0.6, 12)
    assert len(checked) > 10 and max(checked) > 0


def _progress_of(job: Job) -> tuple[float, float, float]:
    return (job.remaining_iterations, job.elapsed_s, job.attained_gpu_s)


def test_a_view_someone_keeps_never_changes() -> None:
    """``snapshot`` updates a holder's last view in place only when ``_views`` alone
    holds it. Decisions take turns: one's snapshot is kept, the next one's views are
    held by weak references only, the next one's not at all. Kept views still show
    what they showed when planned, and so does every weakly held view still alive;
    the views nobody held are the very objects the next snapshot shows (a copy is
    built while the view it copies lives, so it never has that view's ``id``)."""
    kept: list[tuple[Snapshot, list[tuple[float, float, float]]]] = []
    weak: list[tuple[weakref.ref[Job], tuple[float, float, float]]] = []
    loose: dict[str, int] = {}
    reused = 0

    class Keeping(Simulation):
        def snapshot(self) -> Snapshot:
            nonlocal reused
            snap = super().snapshot()
            reused += sum(loose.get(j.id) == id(j) for j in snap.jobs)
            loose.clear()
            for ref, progress in weak:
                view = ref()
                assert view is None or _progress_of(view) == progress
            turn = self._totals.policy_calls % 3
            if turn == 0:
                kept.append((snap, [_progress_of(j) for j in snap.jobs]))
            elif turn == 1:
                weak.extend((weakref.ref(j), _progress_of(j)) for j in snap.jobs if j.placement)
            else:
                loose.update((j.id, id(j)) for j in snap.jobs if j.placement)
            return snap

    _run(Keeping, "gandiva", 1410, 40)
    assert reused > 100
    for snap, progress in kept:
        assert [_progress_of(j) for j in snap.jobs] == progress
