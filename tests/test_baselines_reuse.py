"""What the baselines reuse from one decision to the next never changes a result.

Each reuse (AFS's placement, Zeus's capped plans, the watts of an unchanged
plan, the pool's count of whole free nodes) is driven here through the path
that takes it, and its answer compared with the one computed afresh. The
last test pins the five baselines' figures on a small window of the default
trace to those they had before these shortcuts existed; a change meant to
change a baseline's results updates them.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from test_baselines_equivalence import Toy, advance, new_job, toy

import powerflow.lab.baselines.afs as afs
import powerflow.lab.baselines.gandiva as gandiva
from powerflow.cli import main
from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import A100
from powerflow.core.policy.budget import limit_w
from powerflow.core.policy.placement import PlacementRequest, PlacementResult
from powerflow.core.policy.snapshot import Budget, Job, Node, Plan, Policy, Snapshot
from powerflow.lab.baselines import AfsPolicy, GandivaPolicy, TiresiasPolicy, ZeusPolicy
from powerflow.lab.baselines.common import (
    ARRIVAL_KEY,
    Decision,
    ModelMemo,
    Pool,
    arrival_order,
    budget_limit_w,
    node_count,
    predicted_w,
)


def _start(seed: int, nodes: int = 4, jobs: int = 12) -> tuple[random.Random, list[Toy], Snapshot]:
    rng = random.Random(seed)
    shared = [toy(rng) for _ in range(4)]
    cluster = tuple(Node(f"n{i:02d}", 8, A100) for i in range(nodes))
    snap = Snapshot(
        cluster, tuple(new_job(rng, i, 0.0, shared) for i in range(jobs)), Budget(), 0.0
    )
    return rng, shared, snap


def test_afs_reuses_a_placement_only_for_the_very_same_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    place = afs.place

    def counted(nodes: tuple[Node, ...], requests: list[PlacementRequest]) -> PlacementResult:
        calls.append(len(requests))
        return place(nodes, requests)

    monkeypatch.setattr(afs, "place", counted)
    rng, shared, snap = _start(3)
    warm = AfsPolicy(frequency_mhz=1410)
    first = warm.plan(snap)
    again = warm.plan(replace(snap))  # a new snapshot of the same jobs
    assert again == first and len(calls) == 1  # placed once
    # Other nodes (same names and sizes, another tuple): placed afresh.
    warm.plan(replace(snap, nodes=tuple(replace(node) for node in snap.nodes)))
    assert len(calls) == 2
    reused = 0
    for step in range(40):
        before = len(calls)
        got = warm.plan(snap)
        reused += len(calls) == before
        assert got == AfsPolicy(frequency_mhz=1410).plan(snap)
        if step % 4 == 0:
            snap = advance(rng, snap, got, shared)
        else:  # a quiet event: the jobs progress where the plan put them
            jobs = []
            for job in snap.jobs:
                jp = got.job(job.id)
                left = job.remaining_iterations * (0.99 if jp.gpus else 1.0)
                jobs.append(replace(job, placement=jp.placement, remaining_iterations=left))
            snap = replace(snap, jobs=tuple(jobs), now_s=snap.now_s + 30.0)
    assert reused > 0


def test_zeus_hands_back_last_events_plans_while_nothing_changed() -> None:
    for inner in (GandivaPolicy(frequency_mhz=1410), TiresiasPolicy()):
        rng, shared, snap = _start(4)
        warm = ZeusPolicy(inner)
        for _ in range(20):
            got = warm.plan(snap)
            assert got == ZeusPolicy(replace(inner)).plan(snap)
            same = warm.plan(replace(snap))
            assert same == got
            assert all(a is b for a, b in zip(same.jobs, got.jobs, strict=True))
            snap = advance(rng, snap, got, shared)


def test_predicted_w_follow_a_new_model_of_an_unchanged_plan() -> None:
    rng, _, snap = _start(5)
    warm = GandivaPolicy(frequency_mhz=1410)
    warm.plan(snap)
    refit = replace(snap, jobs=tuple(replace(job, model=toy(rng)) for job in snap.jobs))
    got = warm.plan(refit)
    assert got.predicted_w == GandivaPolicy(frequency_mhz=1410).plan(refit).predicted_w
    assert got.predicted_w != warm.plan(snap).predicted_w


def _whole_afresh(pool: Pool) -> int:
    return sum(pool.size[m] for m, idx in pool.free.items() if len(idx) == pool.size[m])


@pytest.mark.parametrize("seed", range(5))
def test_pool_free_counts_are_the_counts_afresh(seed: int) -> None:
    rng = random.Random(seed)
    pool = Pool(tuple(Node(f"n{i}", 8, A100) for i in range(6)))
    held: list[tuple[tuple[str, int], ...]] = []
    for _ in range(300):
        assert pool.whole_free_gpus() == _whole_afresh(pool)
        assert pool.most_free() == max(map(len, pool.free.values()))
        roll = rng.random()
        if roll < 0.3:
            got = pool.take_consolidated(rng.choice((1, 2, 4, 8, 16)))
        elif roll < 0.45:
            got = pool.take_spread(rng.choice((1, 3, 5)))
        elif roll < 0.6 and pool.free_count:
            name = rng.choice([m for m, idx in pool.free.items() if idx])
            got = ((name, pool.free[name][0]),)
            pool.take(got)
        elif roll < 0.7:
            pool = pool.copy()
            got = None
        else:
            if held:
                pool.release(held.pop(rng.randrange(len(held))))
            got = None
        if got:
            held.append(got)


SMALL = {
    "gandiva --frequency 1410": (
        31794.253990621553,
        390446.96202803904,
        2489871880.570979,
        42,
        917,
    ),
    "tiresias --frequency 1410": (
        25548.525360108102,
        411975.9396877418,
        2578006926.1706057,
        4,
        941,
    ),
    "afs --frequency 1410": (20117.11593158395, 391768.5405165421, 3228899158.205368, 207, 1039),
    "gandiva+zeus": (34185.21804192994, 400435.3241772377, 2184206750.847487, 45, 985),
    "tiresias+zeus": (27077.2844639248, 426952.91285998235, 2268468093.3759923, 3, 1008),
}
"""(mean JCT, makespan, energy, migrations, events) of each baseline on the
first 2 hours of the default trace on 8 nodes, as they were before the shortcuts."""


@pytest.mark.parametrize("command", sorted(SMALL))
def test_small_runs_keep_their_figures(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scheduler", *command.split(), "--hours", "2", "--nodes", "8", "--json"]
    assert main(args) in (0, None)
    row = json.loads(capsys.readouterr().out)
    got = (row["avg_jct_s"], row["makespan_s"], row["total_energy_j"])
    assert got == pytest.approx(SMALL[command][:3], rel=1e-12)
    assert (row["migrations"], row["events"]) == SMALL[command][3:]


@pytest.mark.parametrize("seed", range(20))
def test_arrival_order_keeps_an_ordered_list_only_where_sorting_would(seed: int) -> None:
    """Ordered lists (the engine's), ties by id, out-of-order ones, NaN arrivals."""
    rng = random.Random(seed)
    _, _, snap = _start(seed, jobs=1)
    base = snap.jobs[0]
    for _ in range(50):
        times = [float(rng.choice((0, 1, 2, 3, 5))) for _ in range(rng.randrange(8))]
        if rng.random() < 0.1 and times:
            times[rng.randrange(len(times))] = float("nan")
        ids = rng.sample([f"j{k}" for k in range(20)], len(times))
        jobs = [replace(base, id=i, arrival_s=t) for i, t in zip(ids, times, strict=True)]
        if rng.random() < 0.7:
            jobs.sort(key=ARRIVAL_KEY)
            if rng.random() < 0.3 and len(jobs) > 1:  # one neighbour pair swapped
                k = rng.randrange(len(jobs) - 1)
                jobs[k], jobs[k + 1] = jobs[k + 1], jobs[k]
        got = arrival_order(tuple(jobs))
        want = sorted(jobs, key=ARRIVAL_KEY)
        assert list(map(id, got)) == list(map(id, want))


@pytest.mark.parametrize("seed", range(5))
def test_block_after_release_is_what_releasing_finds(seed: int) -> None:
    """The count Gandiva and Tiresias check before releasing a spread job's GPUs."""
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i}", rng.choice((4, 8, 8)), A100) for i in range(6))
    for _ in range(100):
        pool = Pool(nodes)
        held = [got for n in rng.choices((1, 2, 3, 4, 6, 8), k=12) if (got := pool.take_spread(n))]
        own = rng.choice(held)
        n = rng.choice((len(own), 2, 4, 8, 12, 16))
        said = pool.block_after_release(n, own)
        pool.release(own)
        assert said == (pool.take_consolidated(n) is not None)


def test_pool_layout_is_reused_only_for_the_very_same_node_tuple() -> None:
    nodes = tuple(Node(f"n{i}", 8 if i % 3 else 4, A100, powered_on=i % 4 != 1) for i in range(9))
    first = Pool(nodes)
    first.take_consolidated(8)
    again = Pool(nodes)  # the same tuple: the layout is shared, the free lists are new
    assert again.order is first.order and again.rank is first.rank
    fresh = Pool(list(nodes))  # a list is never remembered
    assert fresh.order is not first.order
    assert (fresh.order, fresh.rank, fresh.size, fresh.biggest) == (
        again.order,
        again.rank,
        again.size,
        again.biggest,
    )
    assert again.free == fresh.free == {n.name: list(range(n.gpus)) for n in nodes}
    assert again.free_count == fresh.free_count == sum(n.gpus for n in nodes)
    # Another tuple of the same names, one node switched on: laid out afresh.
    switched = tuple(replace(n, powered_on=True) for n in nodes)
    assert Pool(switched).order == [n.name for n in nodes] != again.order


def _gandiva_sequence(seed: int, steps: int = 80, policy: Policy | None = None) -> list[Snapshot]:
    """Snapshots of a small, crowded cluster (nodes of 4 GPUs, jobs of sizes that
    fragment it): jobs time-slice, start spread and are consolidated, and the
    cluster is often full (``policy``: what plans them, Gandiva by default)."""
    rng = random.Random(seed)
    shared = [toy(rng) for _ in range(3)]
    cluster = tuple(Node(f"n{i}", 4, A100) for i in range(4))

    def arrive(i: int, now: float) -> Job:
        return replace(new_job(rng, i, now, shared), requested_gpus=rng.choice((1, 2, 3, 3, 5, 6)))

    snap = Snapshot(cluster, tuple(arrive(i, 0.0) for i in range(10)), Budget(), 0.0)
    policy = policy or GandivaPolicy(frequency_mhz=1410)
    out = []
    for _ in range(steps):
        out.append(snap)
        snap = advance(rng, snap, policy.plan(snap), shared)
        # a tenth of the jobs end, and at most 12 wait or run: blocks free up
        kept = [job for job in snap.jobs if rng.random() > 0.1][:12]
        snap = replace(snap, jobs=tuple(kept))
        if len(snap.jobs) < 8:
            start = int(snap.jobs[-1].id[1:]) + 1 if snap.jobs else 0
            more = tuple(arrive(start + k, snap.now_s) for k in range(rng.choice((1, 3, 6))))
            snap = replace(snap, jobs=snap.jobs + more)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_gandiva_skips_unsharing_only_when_no_job_can_move(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snaps = _gandiva_sequence(seed)
    fast = [GandivaPolicy(frequency_mhz=1410).plan(s) for s in snaps]
    full = [
        Pool(s.nodes).free_count - sum(len(set(j.placement)) for j in s.jobs if j.placement)
        for s in snaps
    ]
    # Without the shortcut (no job looks GPU-less to its check): every pass runs.
    monkeypatch.setattr(gandiva, "_REQUESTED", lambda job: 0)
    slow = [GandivaPolicy(frequency_mhz=1410).plan(s) for s in snaps]
    assert fast == slow
    assert sum(free <= 0 for free in full) > 5  # the cluster was full at many events


def _consolidate_every_job(self: gandiva._Round) -> None:
    """``_Round._consolidate`` as a pass over every job in arrival order."""
    for job in self.jobs:
        key = self.where.get(job.id)
        if key is None or node_count(key) <= 1 or job.pinned or len(self.users[key]) != 1:
            continue
        if node_count(key) <= self.pool.min_nodes(len(key)):
            continue
        if not self.pool.block_after_release(len(key), key):
            continue
        self.pool.release(key)
        target = self.pool.take_consolidated(len(key))
        if target is None or node_count(target) >= node_count(key):
            if target is not None:
                self.pool.release(target)
            self.pool.take(key)
            continue
        self._relocate(job, target)


def test_gandiva_consolidates_the_jobs_a_pass_over_every_job_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snaps = [s for seed in range(4) for s in _gandiva_sequence(seed, steps=150)]
    fast = [GandivaPolicy(frequency_mhz=1410).plan(s) for s in snaps]
    monkeypatch.setattr(gandiva._Round, "_consolidate", _consolidate_every_job)
    slow = [GandivaPolicy(frequency_mhz=1410).plan(s) for s in snaps]
    assert fast == slow
    moved = sum(node_count(m.target) < node_count(m.source) for p in fast for m in p.migrations)
    assert moved >= 3  # the sequences did consolidate spread jobs


@pytest.mark.parametrize("name", ["gandiva", "tiresias", "afs"])
def test_plans_priced_while_built_are_priced_as_predicted_w_prices_them(name: str) -> None:
    """``job_plans`` gathers the running plans' watts as it builds them (``PlanWatts``);
    the total is ``predicted_w`` of the finished plan, on a fresh memo."""
    rng, shared, snap = _start(6, nodes=3, jobs=14)
    policy = {
        "gandiva": GandivaPolicy(frequency_mhz=1410),
        "tiresias": TiresiasPolicy(frequency_mhz=1305),
        "afs": AfsPolicy(frequency_mhz=1410),
    }[name]
    shared_gpus = 0
    for _ in range(40):
        got = policy.plan(snap)
        models = [job.model for job in snap.jobs]
        assert [jp.job_id for jp in got.jobs] == [job.id for job in snap.jobs]
        want = predicted_w(snap, got.jobs, A100, models, ModelMemo())
        assert got.predicted_w == want
        slots = [slot for jp in got.jobs for slot in jp.placement]
        shared_gpus += len(slots) - len(set(slots))
        snap = advance(rng, snap, got, shared)
    assert name != "gandiva" or shared_gpus > 0  # Gandiva's time slices were priced too


@dataclass(frozen=True)
class _PlansOnly:
    """``inner`` without its ``decide``: Zeus matches its plans to jobs by id."""

    inner: Policy

    def plan(self, snapshot: Snapshot) -> Plan:
        return self.inner.plan(snapshot)


@pytest.mark.parametrize("inner", ["gandiva", "tiresias"])
def test_zeus_reads_a_decisions_jobs_as_the_snapshots(inner: str) -> None:
    """Zeus takes a decision's plans to be in the snapshot's job order (``Decision``):
    the decisions are, and its plans are those of its inner plans matched by id."""
    make = {"gandiva": GandivaPolicy, "tiresias": TiresiasPolicy}[inner]
    snaps = [
        s
        for seed in range(2)
        for s in _gandiva_sequence(seed, steps=60, policy=make(frequency_mhz=1410))
    ]
    for snap in snaps:
        decided = make(frequency_mhz=1410).decide(snap)
        assert [jp.job_id for jp in decided.jobs] == [job.id for job in snap.jobs]
    fast = ZeusPolicy(make(frequency_mhz=1410))
    slow = ZeusPolicy(_PlansOnly(make(frequency_mhz=1410)))
    assert [fast.plan(s) for s in snaps] == [slow.plan(s) for s in snaps]


@dataclass
class _Reversed:
    """``inner`` whose decisions list their plans last job first: not the snapshot's
    order, which Zeus must notice."""

    inner: GandivaPolicy

    def decide(self, snapshot: Snapshot) -> Decision:
        decided = self.inner.decide(snapshot)
        return Decision(tuple(reversed(decided.jobs)), decided.migrations)

    def plan(self, snapshot: Snapshot) -> Plan:
        return self.inner.plan(snapshot)


def test_zeus_pairs_a_decision_in_another_order_by_id() -> None:
    """A decision whose plans are not in the snapshot's order gets each plan's own
    job (by id), as a plain plan does: the same plans, reversed."""
    snaps = [
        s
        for seed in range(2)
        for s in _gandiva_sequence(seed, steps=60, policy=GandivaPolicy(frequency_mhz=1410))
    ]
    assert any(len(s.jobs) > 1 for s in snaps)
    reordered = ZeusPolicy(_Reversed(GandivaPolicy(frequency_mhz=1410)))
    plain = ZeusPolicy(_PlansOnly(GandivaPolicy(frequency_mhz=1410)))
    for s in snaps:
        got, want = reordered.plan(s), plain.plan(s)
        assert sorted(got.jobs, key=lambda jp: jp.job_id) == sorted(
            want.jobs, key=lambda jp: jp.job_id
        )


@pytest.mark.parametrize("seed", range(5))
def test_pool_of_held_gpus_is_the_pool_that_takes_them(seed: int) -> None:
    """Set-built free lists (most GPUs held) against taking them one by one, errors too;
    slots given as lists (as JSON reads them) too."""
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i}", rng.choice((4, 8, 8)), A100) for i in range(6))
    every = [(n.name, i) for n in nodes for i in range(n.gpus)]
    for _ in range(60):
        held = rng.sample(every, rng.randrange(len(every) + 1))
        roll = rng.random()
        if roll < 0.15 and held:
            held.append(rng.choice(held))  # one GPU twice
        elif roll < 0.3:
            held.append(("n9", 0))  # no such node
        elif roll < 0.4:
            held.append((nodes[0].name, 8))  # no such GPU
        rng.shuffle(held)
        taken = Pool(nodes)
        try:
            taken.take(held)
        except SnapshotError as err:
            with pytest.raises(SnapshotError, match=str(err)):
                Pool(nodes, iter(held))
            with pytest.raises(SnapshotError):  # as lists: refused too (named as lists)
                Pool(nodes, [list(s) for s in held])
            continue
        for got in (Pool(nodes, iter(held)), Pool(nodes, [list(s) for s in held])):
            assert got.free == taken.free and list(got.free) == list(taken.free)
            assert got.free_count == taken.free_count
            assert got.whole_free_gpus() == taken.whole_free_gpus()


def test_a_pool_refuses_bad_slots_given_as_lists_as_it_refuses_tuples() -> None:
    """As many slots as the cluster has GPUs, one repeated and one off the cluster:
    lists cannot take the set difference's shortcut, and are refused one by one."""
    nodes = (Node("n0", 4, A100), Node("n1", 4, A100))
    held = [("n0", 0)] * 7 + [("n9", 5)]
    with pytest.raises(SnapshotError, match="used twice or does not exist"):
        Pool(nodes, held)
    with pytest.raises(SnapshotError, match="used twice or does not exist"):
        Pool(nodes, [list(slot) for slot in held])


def test_plan_limit_is_limit_w_for_the_very_same_nodes_and_budget() -> None:
    nodes = tuple(Node(f"n{i}", 8, A100) for i in range(4))
    snap = Snapshot(nodes, (), Budget(eta=0.5), 0.0)
    assert budget_limit_w(snap) == limit_w(snap)
    for other in (
        replace(snap, budget=Budget(eta=0.7)),
        replace(snap, nodes=nodes[:2]),
        replace(snap, nodes=list(nodes[:3])),  # type: ignore[arg-type]
        replace(snap, budget=Budget(limit_w=1234.0)),
    ):
        assert budget_limit_w(other) == limit_w(other) != limit_w(snap)
        assert budget_limit_w(snap) == limit_w(snap)


@pytest.mark.parametrize("seed", range(3))
def test_gandiva_keeps_a_sorted_key_only_for_the_very_same_placement(seed: int) -> None:
    """Placements given unsorted, the same tuple object while a job keeps its GPUs:
    a policy that keeps their sorted keys from event to event plans as a fresh one."""
    reversed_of: dict[int, tuple[tuple[str, int], ...]] = {}
    held = []  # the originals, so that no id above is reused
    snaps = []
    for snap in _gandiva_sequence(seed, steps=120):
        jobs = []
        for job in snap.jobs:
            if len(job.placement) > 1:
                held.append(job.placement)
                flipped = reversed_of.setdefault(id(job.placement), job.placement[::-1])
                job = replace(job, placement=flipped)
            jobs.append(job)
        snaps.append(replace(snap, jobs=tuple(jobs)))
    warm = GandivaPolicy(frequency_mhz=1410)
    got = [warm.plan(s) for s in snaps]
    assert got == [GandivaPolicy(frequency_mhz=1410).plan(s) for s in snaps]
    assert len(warm.memo.last("gandiva-keys")) >= 5  # keys were kept


@pytest.mark.parametrize("seed", range(3))
def test_gandiva_sharing_is_what_counting_every_gpu_finds(seed: int) -> None:
    """``Sharing`` (read by ``PlanWatts.total``) against the plans' GPUs counted."""
    policy = GandivaPolicy(frequency_mhz=1410)
    shared = 0
    for snap in _gandiva_sequence(seed, steps=100):
        decided = policy.decide(snap)
        assert decided.sharing is not None
        running = [jp for jp in decided.jobs if jp.gpus > 0]
        slots = Counter(slot for jp in running for slot in jp.placement)
        sharers = {jp.job_id: slots[jp.placement[0]] for jp in running}
        assert decided.sharing.used == len(slots)
        assert decided.sharing.sharers == {i: k for i, k in sharers.items() if k > 1}
        shared += len(decided.sharing.sharers)
    assert shared > 0  # the sequences time-slice
