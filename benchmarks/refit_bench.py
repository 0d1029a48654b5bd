"""Cost of the operator's online refit (``operator.learning.SampleStore``).

One 8-GPU resnet50 job on two nodes (3% noise, seed 0), from the generic prior
of the other five models: the ingest's ``add`` per sample; then one allocation
pass's ``refresh`` (sync, thin, learner call, fit error) with the first fit
(42 windows: the profile's 21 clocks on 2 nodes), with a warm-started refit
(42 more on a new placement, 8 GPUs on one node), with no new evidence (a
pass's usual case), and with a first fit of 1,000 rows. CPU time in a child
process pinned to one CPU with one BLAS thread, after an untimed warm-up (a
cold numba cache compiles the kernels once per machine, seconds).

    python -m benchmarks refit
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import pinned_child


def _bench() -> None:
    import numpy as np
    from powerflow.operator.learning import SampleStore
    from prometheus_client import CollectorRegistry

    from powerflow.core.gpus import A100
    from powerflow.core.models.priors import generic_prior
    from powerflow.core.profiling import PAPER_SWEEP
    from powerflow.core.telemetry import WindowSample
    from powerflow.lab import groundtruth as gt

    truth = gt.ground_truth("resnet50")
    n, bs = 8, 32.0
    clocks = PAPER_SWEEP.clocks_mhz(A100)
    body: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ml", "uid": "u"},
        "spec": {"model": "resnet50"},
    }

    def windows(rng: np.random.Generator, count: int, r: int = 4) -> list[WindowSample]:
        """Windows of the job's nodes (``r`` GPUs each: 4 on two nodes, or 8 on one)."""
        out = []
        for i in range(count):
            f = clocks[(i // 2) % len(clocks)]
            s = gt.measure(truth, n, r, bs, f, rng=rng, noise=0.03)
            step, energy = float(s.step_time_s[0]), float(s.energy_j[0]) * r / n
            out.append(WindowSample("ml", "job", 1, n, r, bs, f, r, 10, step, energy, 1.0))
        return out

    prior = generic_prior(exclude="resnet50")

    def store() -> SampleStore:
        s = SampleStore(prior=lambda _: prior, registry=CollectorRegistry())
        s.refresh([body])
        return s

    def timed(fn: Any, repeat: int = 1) -> float:
        start = time.process_time()
        for _ in range(repeat):
            fn()
        return 1000 * (time.process_time() - start) / repeat

    rng = np.random.default_rng(0)
    warm = store()
    for batch in (windows(rng, 42), windows(rng, 42, r=8), windows(rng, 84)):
        warm.add("n0", batch, 0.0)
        warm.refresh([body])  # compiles, or loads the numba cache

    samples = windows(rng, 2000)
    s = store()
    add_ms = timed(lambda: [s.add("n0", [w], 0.0) for w in samples[:1000]]) / 1000
    s = store()
    s.add("n0", samples[:42], 0.0)
    first = timed(lambda: s.refresh([body]))
    fits = s.status_fields()["ml/job"]["fits"]
    s.add("n0", windows(rng, 42, r=8), 0.0)
    refit = timed(lambda: s.refresh([body]))
    refits = s.status_fields()["ml/job"]["fits"] - fits
    idle = timed(lambda: s.refresh([body]), repeat=200)
    full = store()
    full.add("n0", samples[:1000], 0.0)
    full_ms = timed(lambda: full.refresh([body]))
    print(f"add: {1000 * add_ms:.1f} us per sample")
    print(f"refresh with the first fit (42 rows): {first:.2f} ms")
    print(f"refresh with a new placement (+42 rows on one node; {refits} refit): {refit:.2f} ms")
    print(f"refresh with nothing new: {idle:.3f} ms")
    print(f"refresh with the first fit of 1,000 rows: {full_ms:.2f} ms")


def main() -> None:
    if pinned_child("benchmarks.refit_bench"):
        _bench()


if __name__ == "__main__":
    main()
