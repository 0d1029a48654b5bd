"""Allocation's compiled greedy makes exactly the choices of Algorithm 1's heap loop."""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from powerflow.core.policy.allocation import Allocation, PowerModel, allocate
from powerflow.core.policy.curves import Curves, tie_ranks
from powerflow.core.policy.tables import Tables


def _curves(rng: np.random.Generator, jobs: int) -> tuple[Curves, list[float], list[str]]:
    """Random jobs: 0-5 rows each (power-of-two counts), stray rows between them, JCTs that
    mostly fall with the count, energy that rises or falls (free wins), ties in arrival."""
    start, sizes, counts = [], [], []
    for _ in range(jobs):
        start.append(len(counts))
        sizes.append(int(rng.integers(0, 6)))
        first = 2 ** int(rng.integers(0, 3))
        counts += [first * 2**k for k in range(sizes[-1])]
        counts += [1] * int(rng.integers(0, 2))  # a row of no job (P_max) may follow
    rows = len(counts)
    age = rng.uniform(0.0, 100.0, jobs)
    jct = 100.0 + np.cumsum(rng.uniform(-5.0, 40.0, rows)[::-1])[::-1]
    energy = rng.uniform(1e3, 5e3, rows)
    power = rng.uniform(100.0, 300.0, rows) * np.asarray(counts)
    arrival = rng.integers(0, 4, jobs).astype(np.float64)
    ids = [f"j{k:02d}" for k in rng.permutation(jobs)]
    ints = np.asarray(counts, dtype=np.int64)
    tables = Tables(
        start=np.asarray(start, dtype=np.int64),
        sizes=np.asarray(sizes, dtype=np.int64),
        row_job=np.zeros(rows, dtype=np.int64),
        counts=ints,
        gpus_per_node=ints,
        local_batch=ints,
        efficient=np.zeros(rows, dtype=np.int64),
        efficient_step_time_s=np.ones(rows),
        efficient_energy_j=np.ones(rows),
        peak_w=power,
        job_rows=(),
        width=1,
    )
    curves = Curves(
        tables=tables,
        tie_rank=tie_ranks(list(zip(arrival.tolist(), ids, strict=True))),
        age_s=age,
        row_age_s=np.zeros(rows),
        row_remaining=np.ones(rows),
        efficient=tables.efficient,
        jct_s=jct,
        energy_j=energy,
        power_w=power,
    )
    return curves, arrival.tolist(), ids


def _reference(
    curves: Curves,
    arrival: list[float],
    ids: list[str],
    candidates: list[int],
    power: PowerModel,
    energy_aware: bool,
    elastic: bool,
    strict: bool,
) -> Allocation:
    """Algorithm 1's loop as written, with Python's heapq and tuple keys."""
    jct, energy, eff_power = curves.jct_s, curves.energy_j, curves.power_w.tolist()
    d_jct, d_energy = np.zeros(jct.size), np.zeros(jct.size)
    d_jct[1:], d_energy[1:] = jct[:-1] - jct[1:], energy[1:] - energy[:-1]
    if energy_aware:
        free = d_energy <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(free, -d_jct, -d_jct / np.where(free, 1.0, d_energy))
        cls = np.where(free, 1, 2)
    else:
        value, cls = -d_jct, np.full(jct.size, 2)
    cls = np.where(d_jct > 0, cls, 3).tolist()
    value = value.tolist()
    start, sizes = curves.tables.start.tolist(), curves.tables.sizes.tolist()
    counts = curves.tables.counts.tolist()
    heap = []
    for j in candidates:
        first = start[j]
        if sizes[j]:
            service = counts[first] * (jct[first] - curves.age_s[j]) if elastic else 0.0
            heap.append((0, float(service), arrival[j], ids[j], first, j))
    heapq.heapify(heap)
    rows: dict[int, int] = {}
    allocated, free_gpus, jobs_w = power.base_gpus, power.free_gpus, power.base_power_w
    while heap and free_gpus > 0:
        *_, to, j = heapq.heappop(heap)
        frm = rows.get(j, -1)
        cost = counts[to] - (counts[frm] if frm >= 0 else 0)
        if cost > free_gpus:
            continue
        new_w = jobs_w + eff_power[to] - (eff_power[frm] if frm >= 0 else 0.0)
        new_allocated = allocated + cost
        if (strict or power.nodes_on(new_allocated) > power.nodes_on(allocated)) and (
            power.total_w(new_w, new_allocated) > power.limit_w
        ):
            continue
        rows[j], allocated, free_gpus, jobs_w = to, new_allocated, free_gpus - cost, new_w
        nxt = to + 1
        if elastic and nxt < start[j] + sizes[j] and cls[nxt] < 3:
            heapq.heappush(heap, (cls[nxt], value[nxt], arrival[j], ids[j], nxt, j))
    return Allocation(
        jobs=np.array(list(rows), dtype=np.int64),
        job_rows=np.array(list(rows.values()), dtype=np.int64),
        power_w=power.total_w(jobs_w, allocated),
        gpus=allocated,
    )


@pytest.mark.parametrize(
    "energy_aware,elastic,strict", list(itertools.product([True, False], repeat=3))
)
def test_the_compiled_greedy_equals_the_heap_loop(
    energy_aware: bool, elastic: bool, strict: bool
) -> None:
    rng = np.random.default_rng([int(energy_aware), int(elastic), int(strict)])
    waiting = doubled = 0
    for _ in range(150):
        jobs = int(rng.integers(1, 25))
        curves, arrival, ids = _curves(rng, jobs)
        candidates = sorted(rng.choice(jobs, int(rng.integers(0, jobs + 1)), replace=False))
        gpn = int(rng.choice([1, 2, 4, 8]))
        base_nodes = int(rng.integers(0, 3))
        base_gpus = int(rng.integers(0, base_nodes * gpn + 1))
        base_w = float(rng.uniform(0.0, 300.0)) * base_gpus if base_gpus else 0
        idle_w = float(rng.uniform(20.0, 60.0))
        power = PowerModel(
            gpus_per_node=gpn,
            idle_w=idle_w,
            limit_w=base_w + float(rng.uniform(0.0, 250.0)) * int(rng.integers(1, 64)),
            free_gpus=int(rng.integers(0, 64)),
            base_gpus=base_gpus,
            base_nodes=base_nodes,
            base_power_w=base_w,
        )
        flags = {"energy_aware": energy_aware, "elastic": elastic, "strict": strict}
        want = _reference(curves, arrival, ids, candidates, power, **flags)
        got = allocate(curves, candidates, power, **flags)
        assert (got.power_w, got.gpus, got.rows) == (want.power_w, want.gpus, want.rows)
        assert list(got.rows) == list(want.rows)  # the same order of first steps
        waiting += len(got.rows) < sum(curves.tables.sizes[j] > 0 for j in candidates)
        doubled += any(r > curves.tables.start[j] for j, r in got.rows.items())
    assert waiting > 30 and (doubled > 30 or not elastic)


def test_a_candidate_outside_the_tables_is_refused_before_the_unchecked_loop() -> None:
    curves, _, _ = _curves(np.random.default_rng(3), 4)
    power = PowerModel(gpus_per_node=8, idle_w=50.0, limit_w=1e6, free_gpus=64)
    for bad in ([4], [-1], [0, 7]):
        with pytest.raises(ValueError):
            allocate(curves, bad, power, energy_aware=True, elastic=True)


def test_tie_ranks_order_by_arrival_then_id_in_any_input_order() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        arrival = rng.integers(0, 5, n).astype(np.float64).tolist()
        ids = [f"j{k}" for k in rng.integers(0, 40, n)]  # repeats: equal keys share a rank
        keys = list(zip(arrival, ids, strict=True))
        distinct = sorted(set(keys))
        want = [distinct.index(k) for k in keys]
        assert tie_ranks(keys).tolist() == want
        in_order = sorted(keys)  # the snapshot's usual order
        assert tie_ranks(in_order).tolist() == sorted(want)


def _tie_ranks_by_sorting(keys: list[tuple[float, str]]) -> list[int]:
    """The specification: each key's index in the sorted list of distinct keys."""
    index = {key: rank for rank, key in enumerate(sorted(set(keys)))}
    return [index[key] for key in keys]


_ARRIVALS = st.one_of(
    st.floats(allow_nan=False),
    st.sampled_from([0.0, -0.0, 1.0, 1e300, float("inf"), -float("inf"), 5e-324]),
    st.floats(0.0, 1e6),
)


@given(st.lists(st.tuples(_ARRIVALS, st.sampled_from(["a", "b", "b\x00", "ä", "job-1"]))))
@example([(1.0, "b"), (0.0, "a")])
@example([(0.0, "b"), (-0.0, "a")])
@example([(2.0, "a"), (1.0, "b"), (1.0, "a")])
@example([(float("inf"), "a"), (-float("inf"), "a"), (1.0, "a")])
def test_tie_ranks_equal_the_ranks_of_the_sorted_distinct_keys(
    keys: list[tuple[float, str]],
) -> None:
    assert tie_ranks(keys).tolist() == _tie_ranks_by_sorting(keys)


def test_tie_ranks_of_many_shuffled_keys_with_and_without_ties() -> None:
    rng = np.random.default_rng(11)
    for n in (2, 3, 50, 3000):
        for ties in (False, True):
            arrival = (rng.integers(0, n // 2 + 1, n) if ties else rng.permutation(n) * 0.5) * 1.0
            keys = [
                (float(a), f"job-{k:05d}") for a, k in zip(arrival, rng.permutation(n), strict=True)
            ]
            assert tie_ranks(keys).tolist() == _tie_ranks_by_sorting(keys)
    ints: list[tuple[float, str]] = [(3, "a"), (2**60 + 1, "b"), (2**60, "c")]
    assert tie_ranks(ints).tolist() == _tie_ranks_by_sorting(ints)
    nan = float("nan")
    with_nan = [(2.0, "a"), (nan, "b"), (1.0, "c")]
    assert tie_ranks(with_nan).tolist() == _tie_ranks_by_sorting(with_nan)
