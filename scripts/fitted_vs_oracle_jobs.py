"""Where a fitted run loses to its oracle: the same run with the ground truth, job by job.

Runs one scheduler at one eta twice on the same trace and seed, with fitted
models (profiling, online refit) and with the ground truth (``--oracle``), and
groups the jobs by (model, requested GPUs): each group's summed JCT difference
(fitted minus oracle) and energy difference, the GPU-hours each got, and how
often it was rescaled. The groups that lose most JCT come first, then the
groups that spend most extra energy; ``--jobs N`` lists the N jobs that lose
most JCT, each on its own row. docs/policy.md ("What the fitted runs
lose") summarises its output.

    .venv/bin/python scripts/fitted_vs_oracle_jobs.py --eta 0.7 [--scheduler powerflow+] \\
        [--hours H] [--jobs N]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass

from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.result import JobRecord
from powerflow.lab.sim.runner import RunSpec, TraceSpec, simulate


@dataclass
class Group:
    """Sums over one (model, requested GPUs) group of jobs."""

    jobs: int = 0
    jct_fitted_s: float = 0.0
    jct_oracle_s: float = 0.0
    energy_fitted_j: float = 0.0
    energy_oracle_j: float = 0.0
    gpu_s_fitted: float = 0.0
    gpu_s_oracle: float = 0.0
    rescales_fitted: int = 0
    rescales_oracle: int = 0

    def add(self, fitted: JobRecord, oracle: JobRecord) -> None:
        self.jobs += 1
        self.jct_fitted_s += fitted.finish_s - fitted.submit_s
        self.jct_oracle_s += oracle.finish_s - oracle.submit_s
        self.energy_fitted_j += fitted.energy_j
        self.energy_oracle_j += oracle.energy_j
        self.gpu_s_fitted += fitted.attained_gpu_s
        self.gpu_s_oracle += oracle.attained_gpu_s
        self.rescales_fitted += fitted.rescales
        self.rescales_oracle += oracle.rescales

    @property
    def d_jct_h(self) -> float:
        return (self.jct_fitted_s - self.jct_oracle_s) / 3600.0

    @property
    def d_energy_gj(self) -> float:
        return (self.energy_fitted_j - self.energy_oracle_j) / 1e9

    def line(self, name: str) -> str:
        return (
            f"| {name} | {self.jobs} | {self.d_jct_h:+.1f} | "
            f"{self.jct_fitted_s / self.jct_oracle_s:.3f} | {self.d_energy_gj:+.3f} | "
            f"{self.energy_fitted_j / self.energy_oracle_j:.3f} | "
            f"{self.gpu_s_fitted / 3600.0:,.0f} / {self.gpu_s_oracle / 3600.0:,.0f} | "
            f"{self.rescales_fitted / self.jobs:.1f} / {self.rescales_oracle / self.jobs:.1f} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduler", default="powerflow+", choices=("powerflow", "powerflow+"))
    parser.add_argument("--eta", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=8, help="groups per table")
    parser.add_argument("--hours", type=float, help="only the jobs of the trace's first H hours")
    parser.add_argument("--jobs", type=int, default=0, help="also list the N jobs that lose most")
    args = parser.parse_args(argv)
    runs = {}
    for oracle in (False, True):
        config = SimConfig(seed=args.seed)
        trace = TraceSpec(hours=args.hours, seed=args.seed)
        spec = RunSpec(args.scheduler, args.eta, trace=trace, config=config, oracle=oracle)
        runs[oracle] = {j.job_id: j for j in simulate(spec).jobs}
    fitted, oracle = runs[False], runs[True]
    groups: dict[str, Group] = defaultdict(Group)
    total = Group()
    for job_id, f in fitted.items():
        groups[f"{f.model_name} x{f.requested_gpus}"].add(f, oracle[job_id])
        total.add(f, oracle[job_id])
    head = (
        "| jobs (model x requested GPUs) | jobs | JCT fitted - oracle (h, sum) | JCT ratio "
        "| energy fitted - oracle (GJ) | energy ratio | GPU-hours fitted / oracle "
        "| rescales per job fitted / oracle |\n|---|---|---|---|---|---|---|---|"
    )
    print(f"{args.scheduler}, eta {args.eta:g}, seed {args.seed}: fitted against oracle")
    print(head)
    print(total.line("all"))
    by_jct = sorted(groups.items(), key=lambda kv: -kv[1].d_jct_h)
    for name, g in by_jct[: args.top]:
        print(g.line(name))
    print("\nmost extra energy:\n" + head)
    by_energy = sorted(groups.items(), key=lambda kv: -kv[1].d_energy_gj)
    for name, g in by_energy[: args.top]:
        print(g.line(name))
    if args.jobs:
        print(f"\nthe {args.jobs} jobs that lose most JCT:\n{head}")
        losses = sorted(fitted, key=lambda j: -_jct_s(fitted[j]) + _jct_s(oracle[j]))
        for job_id in losses[: args.jobs]:
            one = Group()
            one.add(fitted[job_id], oracle[job_id])
            f = fitted[job_id]
            print(one.line(f"{f.model_name} x{f.requested_gpus} {job_id[:8]}"))


def _jct_s(job: JobRecord) -> float:
    return job.finish_s - job.submit_s


if __name__ == "__main__":
    main()
