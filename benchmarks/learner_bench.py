"""Accuracy and cost of the simulator's online learner (``FittedLearner``).

Per ground-truth model (A100), each of its global batch sizes and seeds 0-2:
the 4-minute 1-GPU pre-run (``initial``), then a 21-clock profile at 2, 4, 8
and 16 GPUs (one node up to 8, ``bs = global/n``, 3% noise) after each of
which the learner may refit (``update``); one row per clock (the simulator
now reports two, one per full 5 s agent window of each 11.4 s slice: the
figures in docs/models.md were measured with one). Scored against the ground truth at
1-32 GPUs, every clock, ``bs = global/n``: after the pre-run and at the end.
``--prior generic`` gives every job the other five models' generic prior (a
DNN the system has no prior for). CPU time per ``initial`` and ``update``
call in a child process pinned to one CPU with one BLAS thread.

    python -m benchmarks learner       (or: python -m benchmarks.learner_bench [--prior generic])
"""

from __future__ import annotations

import sys
import time

from benchmarks import pinned_child


def _bench(generic: bool) -> None:
    import numpy as np

    from powerflow.core.gpus import A100
    from powerflow.core.learning import FittedLearner
    from powerflow.core.models.params import ModelParams
    from powerflow.core.models.priors import generic_prior, load_prior
    from powerflow.core.models.protocol import PerfModel
    from powerflow.core.models.samples import Samples
    from powerflow.core.profiling import PAPER_SWEEP
    from powerflow.lab import groundtruth as gt

    def prior(name: str | None) -> ModelParams:
        return generic_prior(exclude=name) if generic else load_prior(name)

    learner = FittedLearner(A100, prior=prior)
    clocks = np.asarray(PAPER_SWEEP.clocks_mhz(A100), dtype=np.float64)
    every = np.asarray(A100.clocks_mhz, dtype=np.float64)

    def error(model: PerfModel, truth: gt.GroundTruth, gbs: float) -> tuple[float, float]:
        n = np.repeat([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], len(every))
        r, bs, f = np.minimum(n, 8.0), gbs / n, np.tile(every, 6)
        t = np.mean(np.abs(model.step_time_s(n, r, bs, f) / truth.step_time_s(n, r, bs, f) - 1))
        e = model.energy_per_iter_j(n, r, bs, f) / truth.energy_per_iter_j(n, r, bs, f)
        return float(t), float(np.mean(np.abs(e - 1)))

    first, last = [], []
    cpu_initial = cpu_update = 0.0
    updates = refits = 0
    for name in gt.MODEL_NAMES:
        truth = gt.ground_truth(name)
        for gbs in truth.global_batch_sizes:
            for seed in range(3):
                rng = np.random.default_rng(seed)
                samples = [gt.one_gpu_sweep(truth, float(gbs), rng=rng)]
                start = time.process_time()
                known = learner.initial(name, truth, Samples.concat(samples))
                cpu_initial += time.process_time() - start
                first.append(error(known.model, truth, gbs))
                for n in (2, 4, 8, 16):
                    full = np.full_like(clocks, n)
                    samples.append(
                        gt.measure(
                            truth,
                            full,
                            np.minimum(full, 8),
                            gbs / full,
                            clocks,
                            rng=rng,
                            noise=0.03,
                        )
                    )
                    start = time.process_time()
                    known = learner.update(name, truth, known, Samples.concat(samples))
                    cpu_update += time.process_time() - start
                    updates += 1
                refits += known.fits - 1
                last.append(error(known.model, truth, gbs))
    a, b = np.array(first), np.array(last)
    print(f"prior: {'generic (other five models)' if generic else 'the model own'}; jobs: {len(a)}")
    t0, e0 = 100 * a.mean(axis=0)
    t1, e1 = 100 * b.mean(axis=0)
    tw, ew = 100 * b.max(axis=0)
    print(f"after the pre-run: step time {t0:.2f}%, energy {e0:.2f}%")
    print(f"after profiles at 2-16 GPUs: step time {t1:.2f}%, energy {e1:.2f}%", end=" ")
    print(f"(worst job {tw:.1f}%, {ew:.1f}%)")
    print(
        f"CPU: initial {1000 * cpu_initial / len(a):.2f} ms per call, update "
        f"{1000 * cpu_update / updates:.2f} ms per call ({refits} refits in {updates} updates)"
    )


def main() -> None:
    generic = "generic" in sys.argv[1:]
    if pinned_child("benchmarks.learner_bench"):
        _bench(generic)


if __name__ == "__main__":
    main()
