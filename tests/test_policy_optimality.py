"""The greedy against exhaustive search on small instances (a bound, not optimality)."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.lab.exhaustive import optimal_average_jct, plan_average_jct
from powerflow.lab.scenarios import small_instance


def test_greedy_average_jct_is_close_to_the_exhaustive_optimum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = np.random.default_rng(2024)
    policy = PowerFlowPolicy()
    ratios = []
    for _ in range(60):
        snapshot = small_instance(rng)
        plan = policy.plan(snapshot)
        # The optimum may use as much power as the greedy did (the greedy may
        # exceed the limit by its stated slack), so the ratio is never below 1.
        cap = max(plan.limit_w, plan.predicted_w)
        ratios.append(plan_average_jct(snapshot, plan) / optimal_average_jct(snapshot, cap))
    r = np.asarray(ratios)
    summary = (
        f"greedy/optimal average JCT over {r.size} instances: mean {r.mean():.3f}, "
        f"p50 {np.median(r):.3f}, p90 {np.quantile(r, 0.9):.3f}, max {r.max():.3f}, "
        f"optimal in {np.mean(r < 1 + 1e-9):.0%}"
    )
    with capsys.disabled():
        print("\n" + summary)
    assert np.all(r >= 1 - 1e-9), summary
    assert r.mean() <= 1.3, summary
