"""FleetPolicy: one plan for A100 and H100 pools (and two node sizes) under one budget."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from policy_cases import ZOO, job, snapshots

from powerflow.core.errors import SnapshotError
from powerflow.core.gpus import A100, gpu_spec
from powerflow.core.policy.budget import resolve_limit_w
from powerflow.core.policy.fleet import FleetPolicy, energy_delay, fleet_limit_w, fleet_pools
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot
from powerflow.lab.groundtruth import ground_truth

H100 = gpu_spec("H100-SXM")


def mixed(a100: int = 2, h100: int = 1, per_node: int = 4) -> tuple[Node, ...]:
    return (
        *(Node(f"a{i}", per_node, A100) for i in range(a100)),
        *(Node(f"h{i}", per_node, H100) for i in range(h100)),
    )


def truth_job(name: str, model: str = "resnet50", **kw: object) -> Job:
    """A job with the ground truth's model of ``model`` on both types."""
    on_a100, on_h100 = ground_truth(model), ground_truth(model, H100)
    return job(
        name,
        model=on_a100,
        models_by_gpu=(("A100", on_a100), ("H100-SXM", on_h100)),
        remaining_iterations=50_000.0,
        **kw,
    )


def pools_of(plan_jobs: object, cluster: tuple[Node, ...]) -> dict[str, set[str]]:
    kinds = {n.name: n.gpu.name for n in cluster}
    return {
        jp.job_id: {kinds[node] for node, _ in jp.placement}
        for jp in plan_jobs  # type: ignore[attr-defined]
        if jp.gpus
    }


@settings(max_examples=40, deadline=None)
@given(snapshots())
def test_one_pool_plans_exactly_as_the_single_pool_policy(snapshot: Snapshot) -> None:
    assert FleetPolicy(PowerFlowPolicy).plan(snapshot) == PowerFlowPolicy().plan(snapshot)


def test_pools_split_by_type_and_node_size_in_a_fixed_order() -> None:
    cluster = (*mixed(2, 3), Node("b0", 8, A100))
    found = fleet_pools(cluster)
    assert [p.key for p in found] == [("H100-SXM", 4), ("A100", 8), ("A100", 4)]
    assert fleet_pools(tuple(reversed(cluster))) == tuple(
        replace(p, nodes=tuple(reversed(p.nodes))) for p in found
    )


def test_the_limit_sums_each_types_g_times_p_max() -> None:
    pools = fleet_pools(mixed(2, 1))
    limit, shares = fleet_limit_w(Budget(eta=0.5), pools)
    assert limit == pytest.approx(0.5 * (8 * A100.p_max_w + 4 * H100.p_max_w))
    assert sum(shares) == pytest.approx(limit)
    assert H100.p_max_w > A100.p_max_w
    fixed, parts = fleet_limit_w(Budget(limit_w=3000.0), pools)
    assert fixed == 3000.0 and sum(parts) == pytest.approx(3000.0)
    # Each part is what the same eta gives that pool alone.
    assert shares[-1] == pytest.approx(resolve_limit_w(Budget(eta=0.5), 4, H100.p_max_w))


def test_a_waiting_job_starts_on_the_type_with_the_lower_energy_delay_product() -> None:
    cluster = mixed(1, 1)
    j = truth_job("a", max_gpus=1)
    pools = fleet_pools(cluster)
    a100 = next(p for p in pools if p.gpu is A100)
    h100 = next(p for p in pools if p.gpu is H100)
    # The synthetic H100 is faster at a little more energy per iteration: it wins.
    assert energy_delay(j, h100) < energy_delay(j, a100)
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, (j,), Budget(eta=1.0), now_s=0.0))
    assert pools_of(plan.jobs, cluster) == {"a": {"H100-SXM"}}
    assert plan.job("a").frequency_mhz in H100.clocks_mhz


def test_jobs_the_best_pool_cannot_hold_start_in_the_next() -> None:
    cluster = mixed(1, 1)
    jobs = tuple(truth_job(f"j{i}", min_gpus=4, max_gpus=4) for i in range(2))
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, jobs, Budget(eta=1.0), now_s=0.0))
    assert sorted(tuple(sorted(v)) for v in pools_of(plan.jobs, cluster).values()) == [
        ("A100",),
        ("H100-SXM",),
    ]
    for jp in plan.jobs:
        gpu = H100 if jp.placement[0][0].startswith("h") else A100
        assert jp.frequency_mhz in gpu.clocks_mhz


def test_a_running_job_stays_in_its_pool() -> None:
    cluster = mixed(1, 1)
    j = truth_job("a", max_gpus=4, placement=(("a0", 0),), frequency_mhz=1410)
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, (j,), Budget(eta=1.0), now_s=0.0))
    assert pools_of(plan.jobs, cluster) == {"a": {"A100"}}


def test_a_job_committed_to_a_type_without_known_gpus_stays_in_its_pools() -> None:
    """It would start on the H100 (its best pool, as above); committed to the A100 it
    is planned there, at an A100 clock, even when the H100 pool is idle. A type the
    cluster lacks commits it to nothing."""
    cluster = mixed(1, 1)
    for committed, kind in (("A100", "A100"), ("H100-SXM", "H100-SXM"), ("V100", "H100-SXM")):
        j = truth_job("a", max_gpus=1, committed_gpu=committed)
        budget = Budget(eta=1.0)
        plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, (j,), budget, now_s=0.0))
        assert pools_of(plan.jobs, cluster) == {"a": {kind}}, committed
        gpu = A100 if kind == "A100" else H100
        assert plan.job("a").frequency_mhz in gpu.clocks_mhz, committed


def test_a_committed_job_that_no_pool_of_its_type_can_hold_is_planned_as_any_other() -> None:
    """8 GPUs do not fit the A100 pool of 4: committed to the A100 (its nodes gone but
    one), the job is planned where it fits, the H100 pool, as if uncommitted; the pass
    is not refused for it (a pool's policy refuses a job larger than the pool)."""
    cluster = mixed(1, 2)
    j = truth_job("a", min_gpus=8, max_gpus=8, committed_gpu="A100")
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, (j,), Budget(eta=1.0), now_s=0.0))
    assert pools_of(plan.jobs, cluster) == {"a": {"H100-SXM"}}


def test_an_idle_pools_watts_go_to_the_busy_one_and_the_sum_stays_under_the_limit() -> None:
    cluster = mixed(1, 1)
    # Four jobs running on the H100 node, none for the A100 one: its node goes down.
    jobs = tuple(
        truth_job(f"j{i}", max_gpus=1, placement=(("h0", i),), frequency_mhz=H100.min_clock_mhz)
        for i in range(4)
    )
    budget = Budget(eta=0.3)
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, jobs, budget, now_s=0.0))
    pools = fleet_pools(cluster)
    limit, shares = fleet_limit_w(budget, pools)
    h100_share = shares[[p.gpu for p in pools].index(H100)]
    assert plan.limit_w == pytest.approx(limit)
    assert plan.powered_down_nodes == ("a0",)
    assert h100_share < plan.predicted_w <= limit + 1e-6
    # Planned alone with its share, the H100 pool would run its jobs slower.
    alone = PowerFlowPolicy().plan(
        Snapshot(
            cluster[1:],
            tuple(replace(j, model=j.models_by_gpu[1][1]) for j in jobs),
            Budget(limit_w=h100_share),
            now_s=0.0,
        )
    )
    assert sum(jp.frequency_mhz for jp in plan.jobs) > sum(jp.frequency_mhz for jp in alone.jobs)


def test_a_job_on_two_pools_and_one_on_an_unknown_node_are_refused() -> None:
    cluster = mixed(1, 1)
    policy = FleetPolicy(PowerFlowPolicy)
    split = job("a", placement=(("a0", 0), ("h0", 0)), frequency_mhz=1410)
    with pytest.raises(SnapshotError, match="more than one pool"):
        policy.plan(Snapshot(cluster, (split,), Budget(eta=1.0), now_s=0.0))
    lost = job("b", placement=(("x9", 0),), frequency_mhz=1410)
    with pytest.raises(SnapshotError, match="lacks"):
        policy.plan(Snapshot(cluster, (lost,), Budget(eta=1.0), now_s=0.0))


def test_every_job_is_planned_once_and_within_one_pool() -> None:
    cluster = (*mixed(2, 2), Node("b0", 8, A100))
    names = ["resnet50", "vgg16", "bert", "gpt2", "inception3", "deepspeech2"]
    jobs = (
        *(truth_job(f"j{i}", model=name, max_gpus=8) for i, name in enumerate(names)),
        job("z", model=ZOO[1]),  # one model on every type
    )
    plan = FleetPolicy(PowerFlowPolicy).plan(Snapshot(cluster, jobs, Budget(eta=0.6), now_s=0.0))
    assert sorted(jp.job_id for jp in plan.jobs) == sorted(j.id for j in jobs)
    sizes = {n.name: (n.gpu.name, n.gpus) for n in cluster}
    for jp in plan.jobs:
        assert len({sizes[node] for node, _ in jp.placement}) <= 1
    slots = [slot for jp in plan.jobs for slot in jp.placement]
    assert len(slots) == len(set(slots))
    assert plan.predicted_w <= plan.limit_w + 1e-6


def test_the_watts_handed_out_are_counted_as_the_pools_plan_them_under_a_power_ratio() -> None:
    """Each pool plans against its limit over the snapshot's ``power_ratio`` (true over
    planned power): the watts one pool leaves are handed to another at the same ratio,
    so the pools' planned power stays within the limit over the ratio, and their true
    power (planned x ratio) within the limit."""
    cluster = mixed(1, 1)
    names = ["resnet50", "vgg16", "bert", "gpt2", "inception3", "deepspeech2"]
    jobs = tuple(truth_job(f"j{i}", model=name, max_gpus=4) for i, name in enumerate(names))
    for ratio in (1.0, 1.25):
        snapshot = Snapshot(cluster, jobs, Budget(eta=0.6), now_s=0.0, power_ratio=ratio)
        plan = FleetPolicy(PowerFlowPolicy).plan(snapshot)
        assert plan.predicted_w * ratio <= plan.limit_w + 1e-6
        assert plan.predicted_w * ratio > 0.9 * plan.limit_w  # the watts are used
