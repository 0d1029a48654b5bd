"""The clock phase: the compiled loop makes exactly the choices of Algorithm 1's heap loop."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from powerflow.core.policy.frequency import ClockRules, Clocks, raise_clocks
from powerflow.core.policy.greedy_kernels import Matrices


def _problem(rng: np.random.Generator, rows: int, width: int, bumpy: bool) -> tuple:
    # Time falls and energy rises with the clock, with diminishing returns
    # unless ``bumpy`` adds noise that breaks the monotone order of the keys.
    jct = 1000.0 + np.cumsum(rng.uniform(1.0, 20.0, (rows, width))[:, ::-1], axis=1)[:, ::-1]
    gains = np.sort(rng.uniform(0.1, 5.0, (rows, width)), axis=1)
    energy = np.cumsum(gains, axis=1)
    if bumpy:
        energy += rng.uniform(0.0, 3.0, (rows, width))
        jct += rng.uniform(0.0, 15.0, (rows, width))  # some raises do not pay
    power = 100.0 + np.cumsum(rng.uniform(0.5, 4.0, (rows, width)), axis=1)
    start = rng.integers(0, width, rows).tolist()
    # Few arrival times, so the (arrival, id) tie-break decides often; ids
    # not in row order.
    ids = rng.permutation(rows)
    order = [(float(rng.integers(0, 3)), f"j{ids[i]:03d}") for i in range(rows)]
    total = float(power[np.arange(rows), start].sum())
    limit = total + float(rng.uniform(0.0, 1.2)) * float((power[:, -1] - power[:, 0]).sum())
    return jct, energy, power, start, order, total, limit


def _reference(
    jct: np.ndarray,
    energy: np.ndarray,
    power: np.ndarray,
    start: list[int],
    order: list[tuple[float, str]],
    total_w: float,
    limit_w: float,
    step: int,
    energy_aware: bool,
) -> Clocks:
    """Algorithm 1's loop as written, with Python's heapq and tuple keys."""
    width = jct.shape[1]
    nxt = np.minimum(np.arange(width) + step, width - 1)
    d_jct = jct - jct[:, nxt]
    d_energy = energy[:, nxt] - energy
    if energy_aware:
        free = d_energy <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(free, -d_jct, -d_jct / np.where(free, 1.0, d_energy))
        cls = np.where(free, 1, 2)
    else:
        value, cls = -d_jct, np.full(d_jct.shape, 2)
    cls = np.where((d_jct > 0) & (np.arange(width) < width - 1), cls, 3).tolist()
    value, d_power = value.tolist(), (power[:, nxt] - power).tolist()
    columns = list(start)
    heap = [(cls[i][c], value[i][c], *order[i], i) for i, c in enumerate(columns) if cls[i][c] < 3]
    heapq.heapify(heap)
    raised_rows: list[int] = []
    raised_from: list[int] = []
    while heap:
        i = heapq.heappop(heap)[-1]
        col = columns[i]
        if total_w + d_power[i][col] > limit_w:
            continue
        total_w += d_power[i][col]
        columns[i] = up = int(nxt[col])
        raised_rows.append(i)
        raised_from.append(col)
        if cls[i][up] < 3:
            heapq.heappush(heap, (cls[i][up], value[i][up], *order[i], i))
    return Clocks(tuple(columns), total_w, tuple(raised_rows), tuple(raised_from))


@pytest.mark.parametrize("energy_aware", [True, False])
@pytest.mark.parametrize("step", [1, 3])
def test_the_compiled_loop_equals_the_heap_loop(step: int, energy_aware: bool) -> None:
    rng = np.random.default_rng(11 + step)
    raised = near_limit = 0
    for trial in range(300):
        problem = _problem(
            rng, int(rng.integers(1, 12)), int(rng.integers(2, 10)), bumpy=trial % 3 == 0
        )
        want = _reference(*problem, step, energy_aware)
        got = raise_clocks(
            Matrices(*problem[:3]), *problem[3:], rules=ClockRules(step, energy_aware)
        )
        assert got == want
        assert got.power_w <= max(problem[-1], problem[-2])
        raised += len(got.raised_rows) > 0
        near_limit += got.power_w + 4.0 * step > problem[-1]
    assert raised > 200 and near_limit > 50


def test_ranks_among_more_jobs_choose_as_the_rows_own_order() -> None:
    """The policy hands the running jobs' ranks among all its jobs (``ranks``) instead
    of their (arrival, id) keys: the same raises, whatever other jobs lie between."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        jct, energy, power, start, order, total, limit = _problem(
            rng, int(rng.integers(1, 12)), int(rng.integers(2, 8)), bumpy=trial % 2 == 0
        )
        others = [(float(rng.integers(0, 3)), f"x{k:03d}") for k in range(int(rng.integers(0, 9)))]
        everyone = sorted(set(order + others))
        ranks = np.asarray([everyone.index(key) for key in order], dtype=np.int64)
        kw = {"rules": ClockRules(int(rng.integers(1, 3)), bool(trial % 3))}
        want = raise_clocks(Matrices(jct, energy, power), start, order, total, limit, **kw)
        got = raise_clocks(
            Matrices(jct, energy, power), start, None, total, limit, ranks=ranks, **kw
        )
        assert got == want


def test_a_raise_that_would_pass_the_limit_is_refused_and_others_go_on() -> None:
    jct = np.array([[10.0, 5.0, 4.0], [10.0, 9.0, 8.5]])
    energy = np.array([[1.0, 2.0, 3.0], [1.0, 1.5, 2.0]])
    power = np.array([[100.0, 200.0, 300.0], [100.0, 110.0, 120.0]])
    # Job 0's first raise is the better one but costs 100 W; only 25 W are left.
    out = raise_clocks(
        Matrices(jct, energy, power),
        [0, 0],
        [(0.0, "a"), (0.0, "b")],
        200.0,
        225.0,
        rules=ClockRules(1, True),
    )
    assert out.columns == (0, 2)
    assert out.power_w == 220.0
    assert out.raises == ((1, 0), (1, 1))


def test_equal_keys_go_by_arrival_then_id() -> None:
    # Two identical jobs and 10 W of head room: only one raise fits.
    jct = np.array([[10.0, 5.0], [10.0, 5.0]])
    energy = np.array([[1.0, 2.0], [1.0, 2.0]])
    power = np.array([[100.0, 110.0], [100.0, 110.0]])
    kw = {"rules": ClockRules(1, True)}
    assert raise_clocks(
        Matrices(jct, energy, power), [0, 0], [(1.0, "a"), (0.0, "b")], 200.0, 210.0, **kw
    ).columns == (0, 1)
    assert raise_clocks(
        Matrices(jct, energy, power), [0, 0], [(0.0, "b"), (0.0, "a")], 200.0, 210.0, **kw
    ).columns == (0, 1)
    assert raise_clocks(
        Matrices(jct, energy, power), [0, 0], [(0.0, "a"), (0.0, "b")], 200.0, 210.0, **kw
    ).columns == (1, 0)


def test_inconsistent_input_is_refused_before_the_unchecked_loop() -> None:
    m = np.array([[10.0, 5.0], [10.0, 5.0]])
    kw = {"rules": ClockRules(1, True)}
    with pytest.raises(ValueError):
        raise_clocks(Matrices(m, m, m), [0, 0], [(0.0, "a")], 200.0, 210.0, **kw)
    with pytest.raises(ValueError):
        raise_clocks(Matrices(m, m, m), [0, 2], [(0.0, "a"), (0.0, "b")], 200.0, 210.0, **kw)
    with pytest.raises(ValueError):
        raise_clocks(Matrices(m, m[:, :1], m), [0, 0], [(0.0, "a"), (0.0, "b")], 200.0, 210.0, **kw)
