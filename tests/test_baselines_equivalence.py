"""The baselines' per-job memos and shortcuts never change a plan.

The baselines keep per-job memos (power figures, ladders, Zeus clocks, job
plans) that must never serve a stale entry. So each test drives one long-lived policy
object (memos warm) through a seeded sequence of snapshots shaped like the
simulator's: jobs arrive, run where the last plan put them, get pinned,
finish, and now and then change what the memos key on (a refitted model
object, another global batch or GPU count). Every plan must equal, field for
field and power figures included, the plan of a fresh object (empty memos) on
the same snapshot; and AFS-L's compiled rounds must hand out what the literal
tournament does on ladders full of exact ties.

The equivalence with the baselines before the speed work was checked against
a frozen copy of them at the commits that added the memos (836ea17 and after);
these tests keep the property that can regress without that copy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
from test_baselines import reference_afs_l

import powerflow.lab.baselines.afs as afs
import powerflow.lab.baselines.gandiva as gandiva
from powerflow.core.gpus import A100
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.core.policy.snapshot import Budget, Job, Node, Plan, Policy, Snapshot
from powerflow.lab.baselines import AfsPolicy, GandivaPolicy, TiresiasPolicy, ZeusPolicy

F_MAX = float(A100.max_clock_mhz)


@dataclass(frozen=True)
class Toy:
    """A cheap model with the shape the baselines care about (sync cost, clock)."""

    work_s: float
    sync_s: float
    cross_node: float
    mem: float
    watts: float

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        n, r, bs, f = (np.asarray(x, dtype=np.float64) for x in (n, r, bs, f))
        slow = self.mem + (1 - self.mem) * F_MAX / f
        sync = np.where(n > 1, self.sync_s * np.where(n > r, self.cross_node, 1.0), 0.0)
        return np.asarray(0.02 + self.work_s * bs / 64.0 * slow + sync * np.log2(n + 1))

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        power = 90.0 + self.watts * (np.asarray(f, dtype=np.float64) / F_MAX) ** 2.5
        return np.asarray(np.asarray(n) * power * self.step_time_s(n, r, bs, f))


def toy(rng: random.Random) -> Toy:
    return Toy(
        work_s=rng.uniform(0.1, 1.0),
        sync_s=rng.uniform(0.0, 0.3),
        cross_node=rng.uniform(1.0, 4.0),
        mem=rng.uniform(0.1, 0.6),
        watts=rng.uniform(150.0, 300.0),
    )


SIZES = (1, 1, 1, 1, 2, 2, 4, 8, 16)


def new_job(rng: random.Random, i: int, now: float, shared: list[Toy]) -> Job:
    # Half the jobs share a model object (oracle mode), half own one (fitted).
    model = rng.choice(shared) if rng.random() < 0.5 else toy(rng)
    return Job(
        id=f"j{i:04d}",
        model=model,
        remaining_iterations=float(rng.randint(100, 20_000)),
        global_batch_size=rng.choice((32, 64, 128, 256)),
        requested_gpus=rng.choice(SIZES),
        arrival_s=now - rng.choice((0.0, 0.0, 5.0)),  # some equal arrival times
        min_gpus=rng.choice((1, 1, 2)),
        max_gpus=rng.choice((None, None, 8, 16)),
        max_local_batch_size=rng.choice((None, None, 64)),
    )


def advance(rng: random.Random, snap: Snapshot, plan: Plan, shared: list[Toy]) -> Snapshot:
    """The next event: the plan applied, some progress, arrivals, departures, changes."""
    dt = rng.choice((30.0, 300.0, 1800.0))
    jobs: list[Job] = []
    for job in snap.jobs:
        jp = plan.job(job.id)
        left = job.remaining_iterations - (rng.uniform(0, 400) if jp.gpus else 0.0)
        if left <= 0 or rng.random() < 0.03:
            continue  # finished
        changes: dict[str, object] = {
            "placement": jp.placement,
            "frequency_mhz": jp.frequency_mhz if jp.gpus else None,
            "remaining_iterations": left,
            "attained_gpu_s": job.attained_gpu_s + jp.gpus * dt,
            "pinned": bool(jp.placement) and rng.random() < 0.08,
        }
        roll = rng.random()
        if roll < 0.05:
            changes["model"] = toy(rng)  # refitted: a new model object
        elif roll < 0.07:
            changes["global_batch_size"] = rng.choice((32, 64, 128, 256))
        elif roll < 0.08 and not jp.placement:
            changes["requested_gpus"] = rng.choice(SIZES)
        jobs.append(replace(job, **changes))  # type: ignore[arg-type]
    now = snap.now_s + dt
    start = int(snap.jobs[-1].id[1:]) + 1 if snap.jobs else 0
    jobs += [new_job(rng, start + k, now, shared) for k in range(rng.choice((0, 1, 1, 3, 8)))]
    return replace(snap, jobs=tuple(jobs), now_s=now)


POLICIES: dict[str, Callable[[], Policy]] = {
    "gandiva": lambda: GandivaPolicy(frequency_mhz=1410),
    "gandiva-3": lambda: GandivaPolicy(max_jobs_per_gpu=3),
    "gandiva-grow": lambda: GandivaPolicy(grow_shrink=True),
    "tiresias": lambda: TiresiasPolicy(frequency_mhz=1305, queue_thresholds_gpu_s=(600.0, 3600.0)),
    "tiresias-nopromote": lambda: TiresiasPolicy(promote_knob=None),
    "afs": lambda: AfsPolicy(frequency_mhz=1410),
    "gandiva+zeus": lambda: ZeusPolicy(GandivaPolicy(frequency_mhz=1410)),
    "tiresias+zeus": lambda: ZeusPolicy(TiresiasPolicy(), eta_knob=0.3),
    "gandiva+zeus-clock": lambda: ZeusPolicy(GandivaPolicy(), knob="clock"),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warm_plans_equal_cold_plans(name: str, seed: int) -> None:
    rng = random.Random(seed)
    shared = [toy(rng) for _ in range(4)]
    cluster = tuple(Node(f"n{i:02d}", 8, A100) for i in range(rng.choice((2, 4, 8))))
    budget = rng.choice((Budget(eta=0.8), Budget(limit_w=20_000.0), Budget()))
    snap = Snapshot(cluster, tuple(new_job(rng, i, 0.0, shared) for i in range(12)), budget, 0.0)
    warm = POLICIES[name]()
    busy = 0
    for _ in range(60):
        expected = POLICIES[name]().plan(snap)  # a fresh object: empty memos
        got = warm.plan(snap)
        assert got == expected
        busy += any(jp.gpus for jp in got.jobs)
        snap = advance(rng, snap, got, shared)
        if not snap.jobs:
            snap = replace(snap, jobs=(new_job(rng, 9000, snap.now_s, shared),))
    assert busy > 30  # the sequence did exercise placements


def test_gandiva_time_slices_in_the_sequences() -> None:
    """The partner search (the replaced algorithm) is reached, warm and cold alike."""
    rng = random.Random(5)
    shared = [toy(rng) for _ in range(4)]
    cluster = tuple(Node(f"n{i}", 8, A100) for i in range(2))
    snap = Snapshot(cluster, tuple(new_job(rng, i, 0.0, shared) for i in range(40)), Budget(), 0.0)
    warm = GandivaPolicy()
    shared_sets = 0
    for _ in range(30):
        got = warm.plan(snap)
        assert got == GandivaPolicy().plan(snap)
        placements = [jp.placement for jp in got.jobs if jp.gpus]
        shared_sets += len(placements) - len(set(placements))
        snap = advance(rng, snap, got, shared)
    assert shared_sets > 0


def random_ladders(rng: random.Random, count: int) -> list[afs.Ladder]:
    """Ladders with the shapes afs_l meets: power-of-two counts, many exact ties."""
    out = []
    for _ in range(count):
        lo = rng.choice((1, 1, 2, 4))
        counts = tuple(lo << k for k in range(rng.randint(0, 5)))
        base = rng.choice((100.0, 250.0, 1000.0, rng.uniform(10.0, 5000.0)))
        times, t = [], base
        for _ in counts:
            times.append(t)
            t *= rng.choice((0.5, 0.6, 0.75, 0.9))
        out.append(afs.Ladder(counts, tuple(times)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_afs_l_matches_the_literal_tournament_on_tied_ladders(seed: int) -> None:
    """Up to 120 jobs, many exact ties: the compiled rounds give the literal rule's counts."""
    rng = random.Random(seed)
    ladders = random_ladders(rng, rng.randint(1, 120))
    for free in (rng.randint(0, 16), rng.randint(16, 64), rng.randint(64, 512)):
        assert afs.afs_l(ladders, free) == reference_afs_l(ladders, free)


def play(policy: Policy, seed: int, *, nodes: int, jobs: int, steps: int) -> None:
    """``policy`` plans a seeded sequence: ``jobs`` new jobs on ``nodes`` nodes of 8
    GPUs, then ``steps`` decisions, each advanced by ``advance`` (what a test checks
    is patched into the policy)."""
    rng = random.Random(seed)
    shared = [toy(rng) for _ in range(4)]
    cluster = tuple(Node(f"n{i}", 8, A100) for i in range(nodes))
    snap = Snapshot(
        cluster, tuple(new_job(rng, i, 0.0, shared) for i in range(jobs)), Budget(), 0.0
    )
    for _ in range(steps):
        snap = advance(rng, snap, policy.plan(snap), shared)


def test_gandiva_kept_affinity_is_what_the_sets_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node affinity a Gandiva round answers, kept or not, is the one its GPU
    sets give at that moment (nodes running a job of the size asked), over seeded
    sequences that start, move, defragment and grow jobs."""
    asked = kept = 0
    answer = gandiva._Round._affinity

    def checked(self: gandiva._Round, size: int) -> dict[str, bool]:
        nonlocal asked, kept
        kept += size in self.marks
        got = answer(self, size)
        fresh = {
            node
            for key, ids in self.users.items()
            if any(self.by_id[i].requested_gpus == size for i in ids)
            for node, _ in key
        }
        assert set(got) == fresh and all(got.values())
        asked += 1
        return got

    monkeypatch.setattr(gandiva._Round, "_affinity", checked)
    for seed, policy in enumerate((GandivaPolicy(), GandivaPolicy(grow_shrink=True)) * 2):
        play(policy, seed, nodes=4, jobs=30, steps=60)
    assert asked > 50 and kept > 10  # 70 and 35


def test_gandiva_affinity_forgets_a_node_a_job_leaves() -> None:
    """A kept affinity is dropped when a job leaves its GPUs (``_relocate``): its old
    node no longer runs a job of its size."""
    cluster = (Node("n0", 8, A100), Node("n1", 8, A100))
    job = Job(
        id="a",
        model=Toy(1.0, 0.1, 1.5, 0.2, 200.0),
        remaining_iterations=10.0,
        global_batch_size=64,
        requested_gpus=1,
        arrival_s=0.0,
        placement=(("n0", 0),),
    )
    round_ = gandiva._Round(Snapshot(cluster, (job,), Budget(), 0.0), 3)
    assert round_._affinity(1) == {"n0": True}
    round_._relocate(job, (("n1", 0),))
    assert round_._affinity(1) == {"n1": True}


def test_gandiva_open_sets_are_what_newest_sharer_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sets open to time-slicing that a round's first partner search collects
    (one-job sets read inline) are those ``_newest_sharer`` admits, with its latest
    arrival, over seeded sequences with pinned jobs, shared sets and no sharing."""
    built = 0
    partner = gandiva._Round._partner

    def checked(self: gandiva._Round, job: Job) -> tuple[tuple[str, int], ...] | None:
        nonlocal built
        first = self.sharable is None
        got = partner(self, job)
        if first:
            asked = {left.requested_gpus for left in self.left} | {job.requested_gpus}
            expected: dict[int, dict[tuple[tuple[str, int], ...], float]] = {}
            for key, ids in self.users.items():
                newest = self._newest_sharer(key, ids, len(key))
                if len(key) in asked and newest is not None:
                    expected.setdefault(len(key), {})[key] = newest
            assert self.sharable == expected
            built += bool(expected)
        return got

    monkeypatch.setattr(gandiva._Round, "_partner", checked)
    # seeds 5 and 7 meet pinned jobs alone on a set of a size asked for
    runs = [(seed, GandivaPolicy()) for seed in range(8)]
    for seed, policy in [*runs, (0, GandivaPolicy(max_jobs_per_gpu=1))]:
        play(policy, seed, nodes=2, jobs=40, steps=30)
    assert built > 20
