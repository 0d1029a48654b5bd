"""The clock phase: its sorted fast path makes exactly the heap loop's choices."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.policy.frequency import _heap_order, _sorted_order, raise_clocks


def _problem(rng: np.random.Generator, rows: int, width: int, bumpy: bool) -> tuple:
    # Time falls and energy rises with the clock, with diminishing returns
    # unless ``bumpy`` adds noise that breaks the monotone order of the keys.
    jct = 1000.0 + np.cumsum(rng.uniform(1.0, 20.0, (rows, width))[:, ::-1], axis=1)[:, ::-1]
    gains = np.sort(rng.uniform(0.1, 5.0, (rows, width)), axis=1)
    energy = np.cumsum(gains, axis=1)
    if bumpy:
        energy += rng.uniform(0.0, 3.0, (rows, width))
    power = 100.0 + np.cumsum(rng.uniform(0.5, 4.0, (rows, width)), axis=1)
    start = rng.integers(0, width, rows).tolist()
    order = [(float(rng.integers(0, 3)), f"j{i:03d}") for i in range(rows)]
    total = float(power[np.arange(rows), start].sum())
    limit = total + float(rng.uniform(0.0, 1.2)) * float((power[:, -1] - power[:, 0]).sum())
    return jct, energy, power, start, order, total, limit


def _keys(jct, energy, power, step):  # the same preparation as raise_clocks
    width = jct.shape[1]
    nxt = np.minimum(np.arange(width) + step, width - 1)
    d_jct = jct - jct[:, nxt]
    d_energy = energy[:, nxt] - energy
    free = d_energy <= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(free, -d_jct, -d_jct / np.where(free, 1.0, d_energy))
    cls = np.where(free, 1, 2)
    cls = np.where((d_jct > 0) & (np.arange(width) < width - 1), cls, 3)
    return cls, value, power[:, nxt] - power, nxt


@pytest.mark.parametrize("step", [1, 3])
def test_fast_path_equals_the_heap_loop(step: int) -> None:
    rng = np.random.default_rng(11)
    fast_cases = slow_cases = 0
    for trial in range(300):
        jct, energy, power, start, order, total, limit = _problem(
            rng, int(rng.integers(1, 12)), int(rng.integers(2, 10)), bumpy=trial % 3 == 0
        )
        cls, value, d_power, nxt = _keys(jct, energy, power, step)
        heap = _heap_order(cls, value, d_power, nxt, start, order, total, limit)
        fast = _sorted_order(cls, value, d_power, nxt, start, order, total, limit, step)
        if fast is None:
            slow_cases += 1
            continue
        fast_cases += 1
        assert fast == heap
        assert heap.power_w <= max(limit, total)
    assert fast_cases > 50 and slow_cases > 10


def test_a_raise_that_would_pass_the_limit_is_refused_and_others_go_on() -> None:
    jct = np.array([[10.0, 5.0, 4.0], [10.0, 9.0, 8.5]])
    energy = np.array([[1.0, 2.0, 3.0], [1.0, 1.5, 2.0]])
    power = np.array([[100.0, 200.0, 300.0], [100.0, 110.0, 120.0]])
    # Job 0's first raise is the better one but costs 100 W; only 25 W are left.
    out = raise_clocks(
        jct,
        energy,
        power,
        [0, 0],
        [(0.0, "a"), (0.0, "b")],
        200.0,
        225.0,
        step=1,
        energy_aware=True,
    )
    assert out.columns == (0, 2)
    assert out.power_w == 220.0
    assert out.raises == ((1, 0), (1, 1))
