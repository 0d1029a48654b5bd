"""What the operator computes, with the image's runtime only: fit a job's model
to measurements and plan a queue with it. scripts/smoke-image.sh runs this in
the image with NUMBA_DEBUG_CACHE=1 to show that every kernel the services use
was compiled at build time (loaded from the cache, none compiled).

Runs with numpy and PowerFlow's core alone (no simulator, no scipy).
"""

import numpy as np

from powerflow.core.gpus import A100
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.fitting import refit_online
from powerflow.core.models.priors import load_prior
from powerflow.core.models.samples import Samples
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Budget, Job, Node, Snapshot

prior = load_prior("resnet50")
truth = FittedModel(prior)
rng = np.random.default_rng(0)
n = np.array([1.0, 2, 4, 8] * 6)
r = np.minimum(n, 8.0)
bs = np.full_like(n, 64.0)
f = np.repeat([1410.0, 1200, 1000, 900, 800, 700], 4)
step, energy = truth.predict(n, r, bs, f)
noise = rng.normal(1.0, 0.02, size=(2, n.size))
samples = Samples(n=n, r=r, bs=bs, f=f, step_time_s=step * noise[0], energy_j=energy * noise[1])
fitted = FittedModel(refit_online(prior, samples, A100, current=prior))

nodes = tuple(Node(f"node-{i}", 8, A100) for i in range(4))
jobs = tuple(
    Job(
        id=f"job-{i}",
        model=fitted,
        remaining_iterations=10_000.0,
        global_batch_size=256,
        requested_gpus=4,
        arrival_s=float(i),
    )
    for i in range(6)
)
plan = PowerFlowPolicy().plan(Snapshot(nodes=nodes, jobs=jobs, budget=Budget(eta=0.6), now_s=10.0))
print(f"planned {sum(p.gpus for p in plan.jobs)} GPUs for {len(plan.jobs)} jobs")
