"""Time one ``plan`` call of every baseline on a busy cluster.

The simulator calls a policy at every event of a 1,901-job trace, so a call
should take milliseconds. The state is the steady one the simulator sees:
jobs already placed by the policy's previous call, a few new arrivals, and
one model object per job (as after online fitting, the expensive case: no
two jobs share a model, so no model call is shared).

    python benchmarks/baselines_bench.py [--gpus 128] [--jobs 100]

``--events N`` times instead a run of N events, each the previous plan
applied with 600 s of progress, a few arrivals and departures (the per-job
memos hit and miss as in the simulator), in CPU seconds (``process_time``:
the machine is shared), planned warm (one policy object for the run, its
memos kept; the first event, where every job is new, untimed) and cold (a
fresh object per event, nothing remembered), and checks that both plan the
same (the memos never change a decision):

    python benchmarks/baselines_bench.py --events 200
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from powerflow.core.gpus import A100
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.priors import load_prior
from powerflow.core.policy.snapshot import Budget, Job, Node, Plan, Policy, Snapshot
from powerflow.lab.baselines import AfsPolicy, GandivaPolicy, TiresiasPolicy, ZeusPolicy

MODELS = ("bert", "deepspeech2", "gpt2", "inception3", "resnet50", "vgg16")
SIZES = (1,) * 28 + (2, 4, 8, 16)  # about the ITP trace's mix


def snapshot(gpus: int, jobs: int, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i:02d}", 8, A100) for i in range(gpus // 8))
    priors = {name: load_prior(name) for name in MODELS}
    out = []
    for i in range(jobs):
        name = rng.choice(MODELS)
        out.append(
            Job(
                id=f"job{i:03d}",
                model=FittedModel(priors[name]),  # one object per job
                remaining_iterations=float(rng.randint(10**3, 10**5)),
                global_batch_size=rng.choice((64, 128, 256)),
                requested_gpus=rng.choice(SIZES),
                arrival_s=float(i * 40),
                attained_gpu_s=float(rng.choice((0, 1000, 10000))),
                model_name=name,
            )
        )
    return Snapshot(nodes, tuple(out), Budget(eta=0.7), now_s=jobs * 40.0)


def steady(policy: Policy, snap: Snapshot) -> Snapshot:
    """Apply one plan, as the simulator would, and add time."""
    plan = policy.plan(snap)
    jobs = tuple(
        replace(j, placement=plan.job(j.id).placement, attained_gpu_s=j.attained_gpu_s + 600)
        for j in snap.jobs
    )
    return replace(snap, jobs=jobs, now_s=snap.now_s + 600)


def policies() -> dict[str, Policy]:
    """The simulator's five baseline runs, fresh (each with an empty memo)."""
    return {
        "gandiva": GandivaPolicy(frequency_mhz=1410),
        "tiresias": TiresiasPolicy(frequency_mhz=1410),
        "afs": AfsPolicy(frequency_mhz=1410),
        "gandiva+zeus": ZeusPolicy(GandivaPolicy(frequency_mhz=1410)),
        "tiresias+zeus": ZeusPolicy(TiresiasPolicy(frequency_mhz=1410)),
    }


def events(policy: Policy, snap: Snapshot, count: int, seed: int = 1) -> list[Snapshot]:
    """``count`` snapshots, each the last plan applied plus arrivals and departures."""
    rng = random.Random(seed)
    fresh = snapshot(8, count * 2, seed=seed + 1).jobs  # a pool of new arrivals
    out = [snap]
    for k in range(count - 1):
        nxt = steady(policy, out[-1])
        kept = tuple(j for j in nxt.jobs if rng.random() > 0.02)
        arrivals = tuple(
            replace(j, id=f"new{k:04d}-{i}", arrival_s=nxt.now_s)
            for i, j in enumerate(rng.sample(fresh, rng.choice((0, 1, 2))))
        )
        out.append(replace(nxt, jobs=kept + arrivals))
    return out


def compare(args: argparse.Namespace) -> None:
    print(f"{args.gpus} GPUs, about {args.jobs} active jobs, {args.events} events, CPU seconds")
    print(f"{'policy':<15}{'cold s':>9}{'warm s':>9}{'speed-up':>10}  same plans")
    for name, policy in policies().items():
        seq = events(policy, snapshot(args.gpus, args.jobs), args.events)
        best: dict[str, float] = {}
        plans: dict[str, list[Plan]] = {}
        for _ in range(args.repeat):
            warm = policies()[name]
            first = warm.plan(seq[0])  # every job new to the memos: model calls
            t0 = time.process_time()
            plans["warm"] = [first] + [warm.plan(s) for s in seq[1:]]
            best["warm"] = min(best.get("warm", float("inf")), time.process_time() - t0)
            first = policies()[name].plan(seq[0])
            t0 = time.process_time()
            plans["cold"] = [first] + [policies()[name].plan(s) for s in seq[1:]]
            best["cold"] = min(best.get("cold", float("inf")), time.process_time() - t0)
        same = plans["cold"] == plans["warm"]
        print(
            f"{name:<15}{best['cold']:>9.3f}{best['warm']:>9.3f}"
            f"{best['cold'] / best['warm']:>9.2f}x  {same}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--events", type=int, default=0, help="time a run of events instead")
    args = ap.parse_args()
    if args.events:
        args.repeat = min(args.repeat, 3)
        compare(args)
        return
    print(f"{args.gpus} GPUs, {args.jobs} active jobs, one fitted model object per job")
    print(f"{'policy':<15}{'first call ms':>15}{'steady median ms':>18}{'steady best ms':>16}")
    for name, policy in policies().items():
        snap = snapshot(args.gpus, args.jobs)
        t0 = time.perf_counter()
        snap = steady(policy, snap)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            policy.plan(snap)
            times.append(time.perf_counter() - t0)
        times.sort()
        median, best = times[len(times) // 2], times[0]
        print(f"{name:<15}{first * 1e3:>15.2f}{median * 1e3:>18.2f}{best * 1e3:>16.2f}")


if __name__ == "__main__":
    main()
