"""The baselines' defining behaviours on hand-built snapshots, and plan validity.

Models here are a small Amdahl-style ``PerfModel`` defined below, so every
expected outcome can be worked out by hand from its formula.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from powerflow.core.devices import Workload, capped_clock_mhz
from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.core.policy.budget import limit_w
from powerflow.core.policy.snapshot import Budget, GpuSlot, Job, Node, Plan, Policy, Snapshot
from powerflow.lab.baselines import (
    AfsPolicy,
    GandivaPolicy,
    TiresiasPolicy,
    ZeusPolicy,
    zeus_clock,
    zeus_power_limit,
)
from powerflow.lab.baselines.afs import Ladder, afs_l, ladder_counts
from powerflow.lab.baselines.common import cluster_gpu
from powerflow.lab.baselines.gandiva import GANDIVA_JOBS_PER_GPU
from powerflow.lab.baselines.zeus import power_limits_w
from powerflow.lab.schedulers import scheduler

F_MAX = float(A100.max_clock_mhz)


@dataclass(frozen=True)
class Amdahl:
    """Step time: a serial part, a parallel part split over GPUs, sync when n > 1.

    The compute part slows as ``F_MAX / f`` (``mem`` of it does not); power per
    GPU is ``static + dynamic * (f / F_MAX) ** 3``.
    """

    serial_s: float = 0.05
    work_s: float = 1.0
    sync_s: float = 0.02
    cross_node: float = 3.0
    mem: float = 0.3
    static_w: float = 80.0
    dynamic_w: float = 220.0

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        n, r, bs, f = (np.asarray(x, dtype=np.float64) for x in (n, r, bs, f))
        slow = self.mem + (1 - self.mem) * F_MAX / f
        sync = np.where(n > 1, self.sync_s * np.where(n > r, self.cross_node, 1.0), 0.0)
        return np.asarray(self.serial_s + self.work_s * bs / 64.0 * slow + sync)

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        power = self.static_w + self.dynamic_w * (np.asarray(f, dtype=np.float64) / F_MAX) ** 3
        return np.asarray(np.asarray(n) * power * self.step_time_s(n, r, bs, f))


MODEL = Amdahl()


def nodes(count: int, gpus: int = 4) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", gpus, A100) for i in range(count))


def job(job_id: str, gpus: int = 1, arrival: float = 0.0, **kw: object) -> Job:
    fields: dict[str, object] = {
        "model": MODEL,
        "remaining_iterations": 1000.0,
        "global_batch_size": 64,
        "requested_gpus": gpus,
        "arrival_s": arrival,
    }
    fields.update(kw)
    return Job(id=job_id, **fields)  # type: ignore[arg-type]


def snap(cluster: tuple[Node, ...], jobs: list[Job], now: float = 0.0) -> Snapshot:
    return Snapshot(cluster, tuple(jobs), Budget(eta=0.8), now)


def on(node: str, *gpus: int) -> tuple[GpuSlot, ...]:
    return tuple((node, g) for g in gpus)


# --------------------------------------------------------------------- Gandiva


def test_gandiva_is_fifo_and_not_elastic() -> None:
    cluster = nodes(1, 2)
    late, early = job("late", 2, arrival=5.0), job("early", 2, arrival=1.0)
    plan = GandivaPolicy(max_jobs_per_gpu=1).plan(snap(cluster, [late, early]))
    assert plan.job("early").gpus == 2
    assert plan.job("late").gpus == 0
    alone = GandivaPolicy().plan(snap(nodes(2, 4), [job("one", 1)]))
    assert alone.job("one").gpus == 1  # 7 GPUs idle, still the requested count


def test_gandiva_time_slices_same_size_jobs_when_gpus_are_exhausted() -> None:
    cluster = nodes(1, 2)
    a = job("a", 2, arrival=0.0, placement=on("n0", 0, 1))
    b, c, d = job("b", 2, arrival=1.0), job("c", 2, arrival=2.0), job("d", 1, arrival=3.0)
    plan = GandivaPolicy(max_jobs_per_gpu=2).plan(snap(cluster, [a, b, c, d]))
    assert plan.job("a").placement == on("n0", 0, 1)
    assert sorted(plan.job("b").placement) == sorted(on("n0", 0, 1))
    assert plan.job("c").gpus == 0  # at most two jobs per GPU
    assert plan.job("d").gpus == 0  # only jobs of the same size share
    three = GandivaPolicy().plan(snap(cluster, [a, b, c, d]))  # the default: three
    assert sorted(three.job("c").placement) == sorted(on("n0", 0, 1))
    assert three.job("d").gpus == 0
    solo = GandivaPolicy(max_jobs_per_gpu=1).plan(snap(cluster, [a, b]))
    assert solo.job("b").gpus == 0


def test_gandiva_stops_time_slicing_when_gpus_free_up() -> None:
    shared = on("n0", 0, 1)
    a = job("a", 2, arrival=0.0, placement=shared)
    b = job("b", 2, arrival=1.0, placement=shared)
    plan = GandivaPolicy().plan(snap(nodes(2, 2), [a, b]))
    assert plan.job("a").placement == shared
    assert {node for node, _ in plan.job("b").placement} == {"n1"}
    assert [(m.job_id, m.source) for m in plan.migrations] == [("b", shared)]


def test_gandiva_packs_jobs_into_one_node_with_size_affinity() -> None:
    cluster = nodes(3, 4)
    ones = job("ones", 1, arrival=0.0, placement=on("n1", 0))
    twos = job("twos", 2, arrival=0.0, placement=on("n2", 0, 1))
    new1, new2 = job("new1", 1, arrival=1.0), job("new2", 2, arrival=2.0)
    big = job("big", 4, arrival=3.0)
    plan = GandivaPolicy().plan(snap(cluster, [ones, twos, new1, new2, big]))
    assert {node for node, _ in plan.job("new1").placement} == {"n1"}
    assert {node for node, _ in plan.job("new2").placement} == {"n2"}
    assert {node for node, _ in plan.job("big").placement} == {"n0"}
    assert not plan.migrations


def test_gandiva_migrates_to_defragment_for_a_blocked_job() -> None:
    cluster = nodes(2, 4)
    small = [
        job("s0", 1, placement=on("n0", 0)),
        job("s1", 1, placement=on("n0", 1)),
        job("s2", 1, placement=on("n1", 0)),
        job("s3", 1, placement=on("n1", 1)),
    ]
    big = job("big", 4, arrival=1.0)
    plan = GandivaPolicy().plan(snap(cluster, [*small, big]))
    assert len({node for node, _ in plan.job("big").placement}) == 1
    assert len(plan.migrations) == 2
    assert all(plan.job(s.id).gpus == 1 for s in small)
    _check_valid(snap(cluster, [*small, big]), plan, max_share=1)


def test_gandiva_consolidates_a_spread_job() -> None:
    spread = job("x", 2, placement=(("n0", 0), ("n1", 0)))
    plan = GandivaPolicy().plan(snap(nodes(2, 2), [spread]))
    assert len({node for node, _ in plan.job("x").placement}) == 1
    assert [m.job_id for m in plan.migrations] == ["x"]


def test_gandiva_grow_shrink_grows_in_place_while_it_speeds_the_job_up() -> None:
    # MODEL's step: 1.05 s on 1 GPU, 0.57 s on 2, 0.32 s on 4 (global batch 64).
    a = job("a", 1, placement=on("n0", 0))
    s = snap(nodes(2, 4), [a])
    assert GandivaPolicy().plan(s).job("a").gpus == 1  # off by default: not elastic
    plan = GandivaPolicy(grow_shrink=True).plan(s)
    assert plan.job("a").placement == on("n0", 0, 1, 2, 3)  # its node's idle GPUs
    assert plan.job("a").local_batch_size == 16
    assert not plan.migrations  # grown around its GPU: a resize
    # Bounded by the global batch and max_gpus.
    assert GandivaPolicy(grow_shrink=True).plan(
        snap(nodes(1, 4), [replace(a, global_batch_size=2, model=Amdahl(sync_s=0.0))])
    ).job("a").placement == on("n0", 0, 1)
    assert (
        GandivaPolicy(grow_shrink=True)
        .plan(snap(nodes(1, 4), [replace(a, max_gpus=2)]))
        .job("a")
        .gpus
        == 2
    )
    # A job that two GPUs do not speed up (0.15 s on 1 and on 2) keeps its one.
    flat = replace(a, model=Amdahl(work_s=0.1, sync_s=0.05))
    assert GandivaPolicy(grow_shrink=True).plan(snap(nodes(1, 4), [flat])).job("a").gpus == 1


def test_gandiva_grow_shrink_shrinks_a_grown_job_for_a_waiting_one() -> None:
    grown = job("a", 1, placement=on("n0", 0, 1, 2, 3))
    s = snap(nodes(1, 4), [grown, job("b", 2, arrival=1.0)])
    plan = GandivaPolicy(grow_shrink=True).plan(s)
    assert plan.job("b").gpus == 2
    assert ("n0", 0) in plan.job("a").placement  # shrunk within its GPUs (and regrown
    assert plan.job("a").gpus == 2  # onto the one GPU left: nobody waits any more)
    assert not plan.migrations
    _check_valid(s, plan, max_share=1, elastic=True)
    # While a job still waits (4 GPUs, none free), the grown job stays at its request.
    s = snap(nodes(1, 4), [grown, job("c", 4, arrival=1.0)])
    plan = GandivaPolicy(grow_shrink=True).plan(s)
    assert (plan.job("a").placement, plan.job("c").gpus) == (on("n0", 0), 0)


# -------------------------------------------------------------------- Tiresias


ONE_HOUR = TiresiasPolicy(queue_thresholds_gpu_s=(3600.0,), promote_knob=None)
"""Two queues split at one GPU-hour, no promotion: the mechanisms by hand."""


def test_the_comparison_runs_tiresias_with_its_tuned_knobs() -> None:
    """docs/baselines.md, "Tiresias at its best": three queues, no promotion; the
    Zeus variant's inner Tiresias too."""
    tuned = ((32500.0, 72000.0), None)
    policy = scheduler("tiresias").configure(1410.0).policy
    assert isinstance(policy, TiresiasPolicy)
    assert (policy.queue_thresholds_gpu_s, policy.promote_knob) == tuned
    zeus = scheduler("tiresias+zeus").configure().policy
    assert isinstance(zeus, ZeusPolicy) and isinstance(zeus.inner, TiresiasPolicy)
    assert (zeus.inner.queue_thresholds_gpu_s, zeus.inner.promote_knob) == tuned


def test_tiresias_new_job_preempts_one_with_more_attained_service() -> None:
    old = job("old", 1, arrival=0.0, attained_gpu_s=5000.0, placement=on("n0", 0))
    new = job("new", 1, arrival=10.0)
    plan = ONE_HOUR.plan(snap(nodes(1, 1), [old, new], now=5010.0))
    assert plan.job("new").placement == on("n0", 0)
    assert plan.job("old").gpus == 0


@pytest.mark.parametrize(("attained", "old_runs"), [(3599.0, True), (3600.0, False)])
def test_tiresias_demotes_across_the_queue_threshold(attained: float, old_runs: bool) -> None:
    old = job("old", 1, arrival=0.0, attained_gpu_s=attained, placement=on("n0", 0))
    new = job("new", 1, arrival=10.0)
    plan = ONE_HOUR.plan(snap(nodes(1, 1), [new, old], now=attained))
    assert (plan.job("old").gpus == 1) is old_runs
    assert (plan.job("new").gpus == 1) is not old_runs


def test_tiresias_waiting_job_does_not_preempt_a_running_one_of_its_queue() -> None:
    """Both in the second queue: the earlier arrival waits behind the running job,
    as Tiresias's simulator moves waiting jobs to the back of their queue."""
    early = job("early", 1, arrival=0.0, attained_gpu_s=5000.0)
    late = job("late", 1, arrival=10.0, attained_gpu_s=4000.0, placement=on("n0", 0))
    plan = ONE_HOUR.plan(snap(nodes(1, 1), [early, late], now=9000.0))
    assert (plan.job("late").gpus, plan.job("early").gpus) == (1, 0)
    # a job of a higher queue still preempts it
    new = job("new", 1, arrival=20.0)
    plan = ONE_HOUR.plan(snap(nodes(1, 1), [late, new], now=9000.0))
    assert (plan.job("late").gpus, plan.job("new").gpus) == (0, 1)


def test_tiresias_queues_follow_the_thresholds() -> None:
    policy = TiresiasPolicy(queue_thresholds_gpu_s=(100.0, 1000.0), promote_knob=None)
    queues = [policy.queue(job("j", attained_gpu_s=a), now_s=0.0) for a in (0, 99, 100, 999, 1e4)]
    assert queues == [0, 0, 1, 1, 2]


def test_tiresias_is_fifo_within_a_queue_and_backfills() -> None:
    pinned = job("p", 1, arrival=0.0, pinned=True, placement=on("n0", 3), attained_gpu_s=1e5)
    big, small = job("big", 4, arrival=1.0), job("small", 1, arrival=2.0)
    late = job("late", 4, arrival=3.0)
    plan = TiresiasPolicy().plan(snap(nodes(1, 4), [late, small, big, pinned]))
    assert plan.job("p").placement == on("n0", 3)  # pinned jobs are never preempted
    assert plan.job("big").gpus == 0  # does not fit next to the pinned job
    assert plan.job("small").gpus == 1  # backfilled
    plan = TiresiasPolicy().plan(snap(nodes(1, 4), [late, big]))
    assert (plan.job("big").gpus, plan.job("late").gpus) == (4, 0)


def test_tiresias_promotes_a_starving_job() -> None:
    executed = 4000.0  # in the second queue
    starving = job("old", 1, arrival=0.0, attained_gpu_s=executed)
    new = job("new", 1, arrival=1.0)
    policy = TiresiasPolicy(queue_thresholds_gpu_s=(3600.0,), promote_knob=2.0)
    before = policy.plan(snap(nodes(1, 1), [starving, new], now=executed + 7999.0))
    after = policy.plan(snap(nodes(1, 1), [starving, new], now=executed + 8000.0))
    assert (before.job("old").gpus, before.job("new").gpus) == (0, 1)
    assert (after.job("old").gpus, after.job("new").gpus) == (1, 0)
    # Running again, it keeps the promotion while it has waited >= knob/2 times
    # its executed time: 8000 s waited, so until it has executed 8000 s.
    for ran, keeps in ((3000.0, True), (5000.0, False)):
        resumed = replace(starving, placement=on("n0", 0), attained_gpu_s=executed + ran)
        later = policy.plan(snap(nodes(1, 1), [resumed, new], now=executed + 8000.0 + ran))
        assert (later.job("old").gpus == 1) is keeps


def test_tiresias_consolidates_new_jobs() -> None:
    busy = [job(f"b{i}", 1, placement=on("n0", i)) for i in range(3)]
    other = job("o", 1, placement=on("n1", 0))
    new = job("new", 2, arrival=1.0)
    plan = TiresiasPolicy().plan(snap(nodes(2, 4), [*busy, other, new]))
    assert {node for node, _ in plan.job("new").placement} == {"n1"}


SKEWED = Amdahl(cross_node=10.0)
"""Placement-sensitive: 4 GPUs over two nodes step 0.50 s, on one 0.32 s (+56 %)."""
FLAT = Amdahl(cross_node=1.0)
"""Insensitive: the same step time on any number of nodes."""


def halves() -> list[Job]:
    """Two running 2-GPU jobs, one on each 4-GPU node: 4 GPUs free, no node free."""
    return [job("h0", 2, placement=on("n0", 0, 1)), job("h1", 2, placement=on("n1", 0, 1))]


def test_tiresias_sensitive_job_waits_for_a_block_and_an_insensitive_one_spreads() -> None:
    """Tiresias consolidates the skewed models and places the others anywhere: the
    sensitive job ahead waits, and its GPUs go to the insensitive job after it."""
    sensitive = job("s", 4, arrival=1.0, model=SKEWED)
    flat = job("f", 4, arrival=2.0, model=FLAT)
    plan = TiresiasPolicy().plan(snap(nodes(2, 4), [*halves(), sensitive, flat], now=2.0))
    assert plan.job("s").gpus == 0
    assert sorted(plan.job("f").placement) == sorted(on("n0", 2, 3) + on("n1", 2, 3))
    # one GPU per node: nothing to consolidate, so nothing to wait for
    one_each = TiresiasPolicy().plan(snap(nodes(4, 1), [job("s", 2, model=SKEWED)]))
    assert one_each.job("s").gpus == 2


def test_tiresias_sensitive_job_waits_for_a_block_only_while_it_pays() -> None:
    """It waits while its wait is below what spreading costs it: 1000 iterations at
    0.32 s consolidated, 56.25 % slower spread, 180 s."""
    sensitive = job("s", 4, arrival=0.0, model=SKEWED)
    for waited, gpus in ((179.0, 0), (181.0, 4)):
        plan = TiresiasPolicy().plan(snap(nodes(2, 4), [*halves(), sensitive], now=waited))
        assert plan.job("s").gpus == gpus
    # a job that has run waited only the time it has not run: 100 s of its 1100
    ran = replace(sensitive, attained_gpu_s=4 * 1000.0, remaining_iterations=1000.0)
    assert TiresiasPolicy().plan(snap(nodes(2, 4), [*halves(), ran], now=1100.0)).job("s").gpus == 0


def test_tiresias_moves_a_spread_sensitive_job_to_a_free_block() -> None:
    """A resumed job that landed spread is re-consolidated when a node frees, when the
    move saves more than its restart: 1000 iterations 0.18 s faster, 180 s."""
    spread = on("n0", 2, 3) + on("n1", 2, 3)
    moving = job("s", 4, model=SKEWED, placement=spread)
    other = job("h0", 2, placement=on("n0", 0, 1))
    plan = TiresiasPolicy().plan(snap(nodes(2, 4), [other, moving]))
    assert plan.job("s").placement == on("n1", 0, 1, 2, 3)
    assert [(m.job_id, m.source, m.target) for m in plan.migrations] == [
        ("s", spread, on("n1", 0, 1, 2, 3))
    ]
    # no block free, a move that saves less than its restart, a flat model: it stays
    for jobs in (
        [*halves(), moving],
        [other, replace(moving, remaining_iterations=100.0)],
        [other, replace(moving, model=FLAT)],
    ):
        stays = TiresiasPolicy().plan(snap(nodes(2, 4), jobs))
        assert (stays.job("s").placement, stays.migrations) == (spread, ())


def test_tiresias_gives_a_free_block_to_the_job_it_serves_first_before_any_move() -> None:
    """The free node goes to the sensitive new job ahead in the service order, not to a
    move of a spread running job of a lower queue: moved first, that job took the block,
    the new job found none and waited, and the GPUs the move left sat idle."""
    spread = on("n0", 0, 1) + on("n1", 0, 1)
    low = job("m", 4, model=SKEWED, placement=spread, attained_gpu_s=1e6)
    new = job("s", 4, arrival=1.0, model=SKEWED)
    small = [job("h0", 2, placement=on("n0", 2, 3)), job("h1", 2, placement=on("n1", 2, 3))]
    plan = TiresiasPolicy().plan(snap(nodes(3, 4), [*small, low, new], now=1.0))
    assert plan.job("s").placement == on("n2", 0, 1, 2, 3)
    assert (plan.job("m").placement, plan.migrations) == (spread, ())


# ------------------------------------------------------- nodes that are on first


@pytest.mark.parametrize("policy", [GandivaPolicy(), TiresiasPolicy()], ids=["gandiva", "tiresias"])
def test_baselines_take_a_node_that_is_on_over_one_that_must_boot(policy: Policy) -> None:
    """With idle nodes off (the simulator's default) an empty node that is on (emptied
    since the last decision) and one that is off are equal to the baselines' placement
    rules; taking the one that is off charges the baseline a boot (``power_on_s`` of
    JCT and energy) that its own rules do not ask for and PowerFlow's placement avoids."""
    cluster = (*(replace(n, powered_on=False) for n in nodes(2, 4)), Node("n2", 4, A100))
    small, whole = job("small", 1, arrival=0.0), job("whole", 4, arrival=1.0)
    one = policy.plan(snap(cluster, [small]))
    assert {node for node, _ in one.job("small").placement} == {"n2"}
    four = policy.plan(snap(cluster, [whole]))
    assert {node for node, _ in four.job("whole").placement} == {"n2"}
    eight = policy.plan(snap(cluster, [job("big", 8)]))
    assert "n2" in {node for node, _ in eight.job("big").placement}  # and one node boots
    all_on = policy.plan(snap(nodes(3, 4), [small]))
    assert {node for node, _ in all_on.job("small").placement} == {"n0"}  # as before


# ------------------------------------------------------------------------- AFS


def test_afs_gives_the_step_to_the_best_marginal_gain() -> None:
    # Round 1: neither has GPUs, the sooner-finished one (short) gets one.
    # Round 2: long has none, its gain (1) beats any sub-linear one.
    # Round 3: short gains 1.2x - 1 = 0.2, long 1 - 1/2 = 0.5: long wins.
    short = Ladder((1, 2), (100.0, 100.0 / 1.2))
    long_ = Ladder((1, 2), (1000.0, 500.0))
    assert afs_l([short, long_], 3) == [1, 2]


def test_afs_prefers_the_short_job_at_similar_gains() -> None:
    # Short gains 1.4x - 1 = 0.4 over its current speed; long 1 - 1/1.5 = 0.33
    # over its new speed, though its scaling (1.5x) is the better one.
    short = Ladder((1, 2), (100.0, 100.0 / 1.4))
    long_ = Ladder((1, 2), (1000.0, 1000.0 / 1.5))
    assert afs_l([long_, short], 3) == [1, 2]
    # With equal scaling the shorter one always wins.
    twin = Ladder((1, 2), (1000.0, 1000.0 / 1.4))
    assert afs_l([twin, short], 3) == [1, 2]


def reference_afs_l(ladders: list[Ladder], free: int) -> list[int]:
    """AFS-L transcribed literally: every round a fresh tournament from the ladders."""
    level = [-1] * len(ladders)

    def remaining(i: int) -> float:
        return ladders[i].remaining_s[level[i]] if level[i] >= 0 else math.inf

    def step(i: int) -> tuple[int, float, float]:
        """Cost, gain over current speed, gain over new speed (per GPU)."""
        lad, k = ladders[i], level[i]
        if k < 0:
            return lad.counts[0], math.inf, 1.0 / lad.counts[0]
        c = lad.counts[k + 1] - lad.counts[k]
        s0, s1 = 1 / lad.remaining_s[k], 1 / lad.remaining_s[k + 1]
        return c, (s1 - s0) / s0 / c, (s1 - s0) / s1 / c

    while True:
        live = [
            i
            for i, lad in enumerate(ladders)
            if level[i] + 1 < len(lad.counts) and step(i)[0] <= free
        ]
        if not live:
            return [lad.counts[k] if k >= 0 else 0 for lad, k in zip(ladders, level, strict=True)]
        best = live[0]
        for i in live[1:]:
            short, long_ = (i, best) if remaining(i) < remaining(best) else (best, i)
            if remaining(short) == math.inf:
                best = i if ladders[i].remaining_s[0] < ladders[best].remaining_s[0] else best
            else:
                best = short if step(short)[1] > step(long_)[2] else long_
        free -= step(best)[0]
        level[best] += 1


@st.composite
def ladders(draw: st.DrawFn) -> list[Ladder]:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        lo = draw(st.sampled_from((1, 2, 4)))
        counts = tuple(lo * 2**k for k in range(draw(st.integers(1, 5))))
        r0 = draw(st.floats(1.0, 1e5))
        speedups = draw(st.lists(st.floats(1.01, 2.2), min_size=len(counts), max_size=len(counts)))
        remaining = tuple(r0 / math.prod(speedups[1 : k + 1]) for k in range(len(counts)))
        out.append(Ladder(counts, remaining))
    return out


@settings(max_examples=200, deadline=None)
@given(lads=ladders(), free=st.integers(0, 64))
@example(  # an exact tie of gains (1.5x speed-up against a first step of 2 GPUs)
    lads=[
        Ladder((1, 2, 4), (107.0, 107.0 / 1.5, 107.0 / 3.0)),
        Ladder((2,), (107.0,)),
        Ladder((4,), (1.0,)),
        *[Ladder((1,), (1.0,))] * 8,
    ],
    free=15,
)
def test_afs_l_matches_the_literal_tournament(lads: list[Ladder], free: int) -> None:
    assert afs_l(lads, free) == reference_afs_l(lads, free)


def paper_afs_l(times: list[list[float]], gpus: int) -> list[int]:
    """AFS-L as the paper writes it: GPUs one at a time to ``TopPriority``'s winner.

    ``times[j][k - 1]`` is job j's remaining time on k GPUs; its throughput there
    is ``1 / times[j][k - 1]`` (0 on no GPUs). In each pair, j_L is the job that
    finishes sooner at its current share (no GPUs: never) and wins the GPU iff
    ``(s'_L - s_L) / s_L > (s'_H - s_H) / s'_H``; two jobs without GPUs go by
    their time on one GPU. A job at the end of its table takes no more.
    """
    alloc = [0] * len(times)

    def speed(j: int, k: int) -> float:
        return 1.0 / times[j][k - 1] if k > 0 else 0.0

    def now(j: int) -> float:
        return times[j][alloc[j] - 1] if alloc[j] > 0 else math.inf

    for _ in range(gpus):
        open_ = [j for j in range(len(times)) if alloc[j] < len(times[j])]
        if not open_:
            break
        top = open_[0]
        for j in open_[1:]:
            if now(top) == math.inf and now(j) == math.inf:
                top = j if times[j][0] < times[top][0] else top
                continue
            low, high = (j, top) if now(j) < now(top) else (top, j)
            s_l, s_l1 = speed(low, alloc[low]), speed(low, alloc[low] + 1)
            s_h, s_h1 = speed(high, alloc[high]), speed(high, alloc[high] + 1)
            top = low if (s_l1 - s_l) / s_l > (s_h1 - s_h) / s_h1 else high
        alloc[top] += 1
    return alloc


@settings(max_examples=200, deadline=None)
@given(
    tables=st.lists(
        st.tuples(
            st.floats(1.0, 1e4),
            st.lists(st.floats(1.01, 2.0), min_size=0, max_size=6),
        ),
        max_size=8,
    ),
    gpus=st.integers(0, 24),
)
@example(  # a tie of gains (0.5 each, up to rounding): both must break it alike
    tables=[(1.0, []), (1.0, []), (1.0, []), (1.0, []), (2.0, [2.0]), (1.5, [1.5])], gpus=7
)
def test_afs_l_with_one_gpu_steps_is_the_papers_rule(
    tables: list[tuple[float, list[float]]], gpus: int
) -> None:
    # Ladders of 1, 2, 3, ... GPUs: every step costs one GPU, the per-GPU division
    # is by 1, and afs_l must hand out GPUs exactly as the paper's AFS-L does.
    times = [(w / np.cumprod([1.0, *ups])).tolist() for w, ups in tables]
    lads = [Ladder(tuple(range(1, len(t) + 1)), tuple(t)) for t in times]
    assert afs_l(lads, gpus) == paper_afs_l(times, gpus)


def test_afs_power_of_two_steps_compare_gains_per_gpu() -> None:
    # Equal step costs (both double 2 -> 4): the division by 2 cancels and the paper's
    # inequality decides on the whole step. Short (100 s) gains 1.3x - 1 = 0.3 over its
    # speed; long gains 1 - 1/1.5 = 0.33 over its new speed: long wins.
    short = Ladder((2, 4), (100.0, 100.0 / 1.3))
    long_ = Ladder((2, 4), (1000.0, 1000.0 / 1.5))
    assert afs_l([short, long_], 6) == [2, 4]
    # Unequal costs. Short runs on 1, long (first step 4 GPUs, 1/4 = 0.25 per GPU) beats
    # short's 1 -> 2 (0.2) and gets 4. Then short doubles 1 -> 2 (1 GPU) for 0.2, long
    # 4 -> 8 (4 GPUs) for 0.33, i.e. 0.083 per GPU: short wins per GPU, and long's step
    # no longer fits. The paper's rule on the whole steps (0.2 < 0.33) would give long 8.
    short = Ladder((1, 2), (100.0, 100.0 / 1.2))
    long_ = Ladder((4, 8), (1000.0, 1000.0 / 1.5))
    assert afs_l([long_, short], 9) == [4, 2]


def test_afs_steps_are_powers_of_two_within_the_job_bounds() -> None:
    j = job("j", 1, min_gpus=3, max_gpus=16, global_batch_size=512)
    assert ladder_counts(j, 64) == (4, 8, 16)
    assert ladder_counts(replace(j, global_batch_size=8), 64) == (4, 8)
    assert ladder_counts(replace(j, max_local_batch_size=16), 64) == ()  # 32 needed, 16 allowed
    capped = replace(j, min_gpus=1, max_local_batch_size=100)
    assert ladder_counts(capped, 64)[0] == 8  # ceil(512 / 100) = 6 -> 8


def test_afs_plan_is_elastic_and_uses_the_job_models() -> None:
    lonely = AfsPolicy().plan(snap(nodes(2, 4), [job("j", 1, global_batch_size=256)]))
    assert lonely.job("j").gpus == 8
    assert lonely.job("j").local_batch_size == 32
    # A job that scales (little serial time) gets more GPUs than one that does not.
    scales = job("scales", 1, model=Amdahl(serial_s=0.0), remaining_iterations=1e5)
    stuck = job("stuck", 1, model=Amdahl(serial_s=5.0, sync_s=1.0), remaining_iterations=1e5)
    plan = AfsPolicy().plan(snap(nodes(1, 4), [stuck, scales]))
    assert plan.job("scales").gpus > plan.job("stuck").gpus >= 1


# ------------------------------------------------------------------------ Zeus


def brute_force_clock(model: Amdahl, n: int, r: int, bs: int, eta: float) -> int:
    best, best_cost = 0, math.inf
    for f in A100.clocks_mhz:
        t = float(model.step_time_s(n, r, bs, f))
        e = float(model.energy_per_iter_j(n, r, bs, f))
        cost = eta * e + (1 - eta) * n * A100.max_power_w * t
        if cost < best_cost:
            best, best_cost = f, cost
    return best


@pytest.mark.parametrize("eta", [0.0, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize(("n", "r"), [(1, 1), (4, 4), (8, 4)])
def test_zeus_clock_minimises_the_cost(eta: float, n: int, r: int) -> None:
    assert zeus_clock(MODEL, n, r, 16, A100, eta) == brute_force_clock(MODEL, n, r, 16, eta)


def test_zeus_knob_ends() -> None:
    assert zeus_clock(MODEL, 1, 1, 64, A100, 0.0) == A100.max_clock_mhz  # time only
    interior = zeus_clock(MODEL, 1, 1, 64, A100, 0.5)
    assert A100.min_clock_mhz < interior < A100.max_clock_mhz


@pytest.mark.parametrize("inner", [GandivaPolicy(), TiresiasPolicy()])
def test_zeus_clock_variant_only_changes_clocks_of_the_inner_plan(inner: Policy) -> None:
    s = _random_snapshot(random.Random(3), nodes(2, 4), 8)
    base, zeus = inner.plan(s), ZeusPolicy(inner, eta_knob=0.5, knob="clock").plan(s)
    strip = [replace(jp, frequency_mhz=0) for jp in base.jobs]
    assert [replace(jp, frequency_mhz=0) for jp in zeus.jobs] == strip
    assert (zeus.migrations, zeus.limit_w) == (base.migrations, base.limit_w)
    for jp in zeus.jobs:
        if jp.gpus:
            nodes_used = [node for node, _ in jp.placement]
            r = max(nodes_used.count(x) for x in nodes_used)
            model = next(j.model for j in s.jobs if j.id == jp.job_id)
            assert isinstance(model, Amdahl)
            want = brute_force_clock(model, jp.gpus, r, jp.local_batch_size, 0.5)
            assert jp.frequency_mhz == want
    assert zeus.predicted_w < base.predicted_w


def test_zeus_power_limits_are_zeus_profiling_range() -> None:
    # GlobalPowerLimitOptimizer: range(max, min - pl_step, -pl_step), highest first.
    assert power_limits_w(A100) == tuple(float(w) for w in range(400, 99, -25))
    odd = replace(A100, min_power_limit_w=110.0)
    assert power_limits_w(odd)[-2:] == (125.0, 110.0)  # 100 W is below the board: clamped
    assert power_limits_w(replace(A100, min_power_limit_w=None)) == (400.0,)


def brute_force_limit(model: Amdahl, n: int, r: int, bs: int, eta: float) -> tuple[float, int]:
    """Zeus's ZeusCost selector over its profiled limits, each run as the simulated GPU runs it."""
    best: tuple[float, int] = (0.0, 0)
    best_cost = math.inf
    for limit in range(400, 99, -25):  # highest first: a tie keeps the higher limit
        f = capped_clock_mhz(model, Workload("m", n, r, bs), A100.clocks_mhz, 1410, limit)
        t = float(model.step_time_s(n, r, bs, f))
        e = float(model.energy_per_iter_j(n, r, bs, f))
        cost = eta * e + (1 - eta) * n * A100.max_power_w * t
        if cost < best_cost:
            best, best_cost = (float(limit), f), cost
    return best


@pytest.mark.parametrize("eta", [0.0, 0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("model", [MODEL, Amdahl(static_w=40.0, dynamic_w=300.0)])
@pytest.mark.parametrize(("n", "r"), [(1, 1), (8, 4)])
def test_zeus_power_limit_minimises_the_cost_over_the_limits(
    eta: float, model: Amdahl, n: int, r: int
) -> None:
    assert zeus_power_limit(model, n, r, 64, A100, eta) == brute_force_limit(model, n, r, 64, eta)


def test_zeus_power_limit_cannot_reach_every_clock() -> None:
    # Energy only (eta 1): the clock optimum is 525 MHz, but even the lowest limit
    # (100 W) lets this GPU run at 810 MHz, so Zeus's limit search lands there.
    model = Amdahl(static_w=40.0, dynamic_w=300.0)
    assert zeus_clock(model, 1, 1, 64, A100, 1.0) == 525
    assert zeus_power_limit(model, 1, 1, 64, A100, 1.0) == (100.0, 810)
    # Time only (eta 0): the highest limit, the top clock, as Zeus picks it.
    assert zeus_power_limit(model, 1, 1, 64, A100, 0.0) == (400.0, 1410)


@pytest.mark.parametrize("inner", [GandivaPolicy(), TiresiasPolicy()])
def test_zeus_caps_power_and_leaves_the_clock_unlocked(inner: Policy) -> None:
    s = _random_snapshot(random.Random(3), nodes(2, 4), 8)
    base, zeus = inner.plan(s), ZeusPolicy(inner, eta_knob=0.5).plan(s)
    strip = [replace(jp, power_cap_w=None) for jp in zeus.jobs]
    assert strip == list(base.jobs)  # same jobs, GPUs, clocks (the top one), batches
    watts = 0.0
    for jp in zeus.jobs:
        if not jp.gpus:
            assert jp.power_cap_w is None
            continue
        nodes_used = [node for node, _ in jp.placement]
        r = max(nodes_used.count(x) for x in nodes_used)
        model = next(j.model for j in s.jobs if j.id == jp.job_id)
        assert isinstance(model, Amdahl)
        limit, f = brute_force_limit(model, jp.gpus, r, jp.local_batch_size, 0.5)
        assert (jp.frequency_mhz, jp.power_cap_w) == (1410, limit)
        watts += float(model.energy_per_iter_j(jp.gpus, r, jp.local_batch_size, f)) / float(
            model.step_time_s(jp.gpus, r, jp.local_batch_size, f)
        )
    assert any(jp.power_cap_w is not None and jp.power_cap_w < 400 for jp in zeus.jobs)
    busy = sum(jp.gpus for jp in zeus.jobs)  # no time-slicing in this snapshot
    assert len({slot for jp in zeus.jobs for slot in jp.placement}) == busy
    idle = (sum(n.gpus for n in s.nodes) - busy) * A100.idle_power_w
    assert zeus.predicted_w == pytest.approx(watts + idle)  # at the clocks the caps give


def test_zeus_leaves_a_profiling_job_uncapped() -> None:
    # Zeus's JIT profiler sets the limits itself while the job profiles its GPU count.
    cluster = nodes(1, 4)
    profiling = job("p", 2, placement=on("n0", 0, 1), pinned=True, profiled_gpus=frozenset())
    profiled = job("q", 2, placement=on("n0", 2, 3), pinned=True, profiled_gpus=frozenset({2}))
    plan = ZeusPolicy(GandivaPolicy()).plan(snap(cluster, [profiling, profiled]))
    assert plan.job("p").power_cap_w is None
    assert plan.job("q").power_cap_w == brute_force_limit(MODEL, 2, 2, 32, 0.5)[0]


def test_zeus_starts_a_job_uncapped_where_it_has_not_profiled() -> None:
    # A job the plan starts on a GPU count it has not profiled enters its profiling
    # phase with the plan's cap: Zeus must not cap it (it profiles from the highest
    # limit down). A job resumed on a count it has profiled gets its limit at once.
    cluster = nodes(1, 4)
    new = job("new", 2, profiled_gpus=frozenset())
    resumed = job("resumed", 2, arrival=1.0, profiled_gpus=frozenset({2}))
    plan = ZeusPolicy(GandivaPolicy()).plan(snap(cluster, [new, resumed]))
    assert (plan.job("new").gpus, plan.job("resumed").gpus) == (2, 2)
    assert plan.job("new").power_cap_w is None
    assert plan.job("resumed").power_cap_w == brute_force_limit(MODEL, 2, 2, 32, 0.5)[0]


@dataclass
class SnapshotLog:
    """A policy that keeps every snapshot the simulator hands it."""

    inner: Policy
    seen: list[Snapshot]

    def plan(self, snapshot: Snapshot) -> Plan:
        self.seen.append(snapshot)
        return self.inner.plan(snapshot)


def test_zeus_profiling_phases_run_uncapped_in_the_simulator() -> None:
    from powerflow.lab.sim.config import SimConfig
    from powerflow.lab.sim.engine import Simulation
    from powerflow.lab.sim.runner import TraceSpec, load_jobs
    from powerflow.lab.sim.world import default_world

    config, world = SimConfig(nodes=8), default_world()
    jobs = load_jobs(TraceSpec(hours=0.5), config, world)
    configured = scheduler("gandiva+zeus").configure()
    log = SnapshotLog(configured.policy, [])
    Simulation(jobs, replace(configured, policy=log), config, world).run()
    profiling = capped = 0
    for s in log.seen:
        for j in s.jobs:
            if not j.placement:
                continue
            assert j.profiled_gpus is not None
            if len(j.placement) in j.profiled_gpus:
                capped += j.power_cap_w is not None
            else:  # profiling (or restarting into it) on this GPU count
                profiling += 1
                assert j.power_cap_w is None, (s.now_s, j.id)
    assert profiling > 20 and capped > 20  # both phases seen, and Zeus did cap


def test_zeus_knob_is_checked() -> None:
    with pytest.raises(SnapshotError):
        ZeusPolicy(GandivaPolicy(), knob="voltage")  # type: ignore[arg-type]
    with pytest.raises(SnapshotError):
        ZeusPolicy(GandivaPolicy(), pl_step_w=0.0)


def test_zeus_baselines_search_power_limits_and_the_clock_variant_is_reachable() -> None:
    from powerflow.lab.schedulers import scheduler
    from powerflow.lab.sim.config import SimConfig
    from powerflow.lab.sim.experiments import comparison
    from powerflow.lab.sim.runner import TraceSpec

    for name in ("gandiva+zeus", "tiresias+zeus"):
        for suffix, knob in (("", "power_limit"), ("-clock", "clock")):
            policy = scheduler(name + suffix).configure().policy
            assert isinstance(policy, ZeusPolicy)
            assert (policy.knob, policy.eta_knob) == (knob, 0.5)
    names = {run.scheduler for run in comparison(TraceSpec(), SimConfig(), quick=True)}
    assert {"gandiva+zeus", "tiresias+zeus"} <= names
    assert not {"gandiva+zeus-clock", "tiresias+zeus-clock"} & names  # variants: by name only


# ------------------------------------------------------------ validity (hypothesis)


def _random_snapshot(rng: random.Random, cluster: tuple[Node, ...], count: int) -> Snapshot:
    total = sum(n.gpus for n in cluster)
    sizes = [s for s in (1, 2, 4, 8, 16) if s <= total]
    jobs = [
        job(
            f"j{i}",
            rng.choice(sizes),
            arrival=float(rng.randint(0, 50)),
            model=Amdahl(serial_s=rng.uniform(0.0, 0.5), sync_s=rng.uniform(0.0, 0.1)),
            remaining_iterations=float(rng.randint(1, 10**5)),
            global_batch_size=rng.choice((16, 64, 256)),
            attained_gpu_s=float(rng.choice((0, 100, 5000, 20000))),
        )
        for i in range(count)
    ]
    return snap(cluster, jobs, now=100.0)


def _advance(s: Snapshot, plan: Plan, rng: random.Random) -> Snapshot:
    """The next event: jobs take their planned GPUs, run a while, some finish."""
    dt = 600.0
    jobs = []
    for j in s.jobs:
        jp = plan.job(j.id)
        if jp.gpus and rng.random() < 0.2:
            continue  # finished
        jobs.append(
            replace(
                j,
                placement=jp.placement,
                frequency_mhz=jp.frequency_mhz if jp.gpus else None,
                attained_gpu_s=j.attained_gpu_s + jp.gpus * dt,
                pinned=bool(jp.gpus) and rng.random() < 0.1,
            )
        )
    return replace(s, jobs=tuple(jobs), now_s=s.now_s + dt)


def _check_valid(s: Snapshot, plan: Plan, max_share: int, elastic: bool = False) -> None:
    assert [jp.job_id for jp in plan.jobs] == [j.id for j in s.jobs]
    sizes = {node.name: node.gpus for node in s.nodes}
    users: dict[GpuSlot, list[str]] = {}
    by_id = {j.id: j for j in s.jobs}
    for jp in plan.jobs:
        j = by_id[jp.job_id]
        assert jp.gpus == len(jp.placement) == len(set(jp.placement))
        assert jp.frequency_mhz in A100.clocks_mhz
        if jp.gpus:
            assert jp.local_batch_size == math.ceil(j.global_batch_size / jp.gpus)
            if not elastic:
                assert jp.gpus == j.requested_gpus
        if j.pinned and j.placement:
            assert sorted(jp.placement) == sorted(j.placement)
        for node, g in jp.placement:
            assert 0 <= g < sizes[node]
            users.setdefault((node, g), []).append(jp.job_id)
    for ids in users.values():
        assert len(ids) <= max_share
        placements = {tuple(sorted(plan.job(i).placement)) for i in ids}
        assert len(placements) == 1  # sharers time-slice one whole GPU set
    for m in plan.migrations:
        assert m.source == by_id[m.job_id].placement
        assert sorted(m.target) == sorted(plan.job(m.job_id).placement)
    assert plan.predicted_w > 0 and plan.limit_w > 0
    assert not plan.powered_down_nodes


POLICIES: list[tuple[Policy, int, bool]] = [
    (GandivaPolicy(), GANDIVA_JOBS_PER_GPU, False),
    (GandivaPolicy(frequency_mhz=1050, max_jobs_per_gpu=1), 1, False),
    (GandivaPolicy(max_jobs_per_gpu=2), 2, False),
    (GandivaPolicy(grow_shrink=True), GANDIVA_JOBS_PER_GPU, True),
    (TiresiasPolicy(), 1, False),
    (TiresiasPolicy(queue_thresholds_gpu_s=(500.0, 5000.0), promote_knob=1.0), 1, False),
    (AfsPolicy(), 1, True),
    (ZeusPolicy(GandivaPolicy()), GANDIVA_JOBS_PER_GPU, False),
    (ZeusPolicy(TiresiasPolicy(), eta_knob=0.8), 1, False),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(seed=4829, node_count=3, per_node=8, count=10)  # Gandiva moved and grew one job
@given(
    seed=st.integers(0, 10**6),
    node_count=st.integers(1, 4),
    per_node=st.sampled_from((2, 4, 8)),
    count=st.integers(0, 14),
)
def test_every_plan_is_valid_over_a_run(
    seed: int, node_count: int, per_node: int, count: int
) -> None:
    for policy, max_share, elastic in POLICIES:
        rng = random.Random(seed)
        s = _random_snapshot(rng, nodes(node_count, per_node), count)
        for _ in range(4):
            plan = policy.plan(s)
            _check_valid(s, plan, max_share, elastic)
            assert policy.plan(s) == plan  # deterministic
            shuffled = list(s.jobs)
            rng.shuffle(shuffled)
            again = policy.plan(replace(s, jobs=tuple(shuffled)))
            assert {jp.job_id: jp for jp in again.jobs} == {jp.job_id: jp for jp in plan.jobs}
            s = _advance(s, plan, rng)


def test_unsupported_clock_is_refused() -> None:
    with pytest.raises(SnapshotError, match="not a supported"):
        GandivaPolicy(frequency_mhz=1000).plan(snap(nodes(1), [job("j")]))


# ---------------------------------------------------------------------- watts


@pytest.mark.parametrize(
    "budget",
    [Budget(), Budget(eta=0.5), Budget(eta=0.5, p_max_w=250.0), Budget(limit_w=9e3)],
)
def test_limit_is_the_budget_rule(budget: Budget) -> None:
    s = replace(_random_snapshot(random.Random(1), nodes(2, 4), 6), budget=budget)
    assert TiresiasPolicy().plan(s).limit_w == pytest.approx(limit_w(s), rel=1e-12)


def test_predicted_w_count_time_slices_once_and_idle_gpus() -> None:
    shared = on("n0", 0, 1)
    a = job("a", 2, placement=shared, model=Amdahl(dynamic_w=100.0))
    b = job("b", 2, arrival=1.0, placement=shared, model=Amdahl(dynamic_w=300.0), pinned=True)
    plan = GandivaPolicy().plan(snap(nodes(1, 4), [a, b]))  # pinned: b stays time-sliced
    assert plan.job("b").placement == shared

    def power(model: Amdahl) -> float:
        args = (2, 2, 32, A100.max_clock_mhz)
        return float(model.energy_per_iter_j(*args) / model.step_time_s(*args))

    want = (power(a.model) + power(b.model)) / 2 + 2 * A100.idle_power_w  # type: ignore[arg-type]
    assert plan.predicted_w == pytest.approx(want)


def test_cluster_gpu_is_checked_for_each_node_tuple() -> None:
    """``cluster_gpu`` reads the type its nodes' layout found once per node tuple: an
    equal spec on every node passes, another type on any node refuses, whichever
    tuple was asked before."""
    same = tuple(Node(f"n{i}", 8, replace(A100)) for i in range(3))
    mixed = (*same, Node("x", 8, replace(A100, name="other")))
    for nodes in (same, mixed, same, mixed[::-1], same):
        snapshot = Snapshot(nodes, (), Budget(), 0.0)
        if nodes is same:
            assert cluster_gpu(snapshot) == A100
        else:
            with pytest.raises(SnapshotError, match="one GPU type"):
                cluster_gpu(snapshot)
    with pytest.raises(SnapshotError, match="no nodes"):
        cluster_gpu(Snapshot((), (), Budget(), 0.0))
