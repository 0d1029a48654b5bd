"""Ground-truth step time and power per configuration, cached.

The simulator asks for the same (model, n, r, bs, f) over and over (every
job of a model at its usual GPU count); the ground truth is vectorised numpy,
so one scalar call costs far more than a dict lookup, and one call for every
supported clock costs about what one clock does: a miss at a supported clock
fills the cache for all of them (the ground truth evaluates each row of an
array exactly as it evaluates that row alone; tests/test_sim_fastpaths.py
checks it).

A GPU with a power cap runs at the clock ``powerflow.core.devices.capped_clock_mhz``
gives (the node agent's simulated GPUs follow the same rule): ``capped``
answers it per configuration, cached.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import numpy as np

from powerflow.core.errors import SimulationError
from powerflow.core.models.protocol import PerfModel

Key = tuple[str, int, int, float, float]


class TruthRates:
    """``(step_time_s, power_w)`` of the "real GPUs" for one configuration.

    ``power_w`` is the energy per iteration over the step time: the draw of
    all ``n`` GPUs together while the job computes.
    """

    def __init__(self, truth: Callable[[str], PerfModel], clocks_mhz: Sequence[int] = ()) -> None:
        self._truth = truth
        self._clocks = frozenset(clocks_mhz)
        self._clock_array = np.array(sorted(self._clocks), dtype=np.float64)
        self._models: dict[str, PerfModel] = {}
        self._cache: dict[Key, tuple[float, float]] = {}
        self._clean: dict[Key, tuple[float, float]] = {}  # (step time, energy) per key
        self._sweeps: dict[tuple[str, int, int, float, tuple[int, ...]], tuple[float, float]] = {}
        self._peaks: dict[tuple[str, int, int, float, tuple[int, ...]], float] = {}
        self._clock_list = [int(c) for c in sorted(self._clocks)]
        self._powers: dict[tuple[str, int, int, float], PowerRow] = {}
        self._clock_index = {c: k for k, c in enumerate(self._clock_list)}

    def model(self, name: str) -> PerfModel:
        found = self._models.get(name)
        if found is None:
            found = self._models[name] = self._truth(name)
        return found

    def rate(self, name: str, n: int, r: int, bs: float, f: float) -> tuple[float, float]:
        key = (name, n, r, bs, f)
        hit = self._cache.get(key)
        if hit is None:
            if f in self._clocks:
                self._fill(name, n, r, bs)
                hit = self._cache.get(key)
            if hit is None:
                truth = self.model(name)
                t = float(truth.step_time_s(n, r, bs, f))
                e = float(truth.energy_per_iter_j(n, r, bs, f))
                if not (t > 0 and e > 0 and np.isfinite(t) and np.isfinite(e)):
                    raise SimulationError(f"ground truth of {name} gives t={t}, e={e} at {key}")
                hit = self._cache[key] = (t, e / t)
                self._clean[key] = (t, e)
        return hit

    def clean(self, name: str, n: int, r: int, bs: float, f: float) -> tuple[float, float]:
        """The true step time and energy per iteration that ``rate`` divided: what a
        measurement there draws its noise around (``measure.noisy_power_w``)."""
        key = (name, n, r, bs, f)
        hit = self._clean.get(key)
        if hit is None:
            self.rate(name, n, r, bs, f)
            hit = self._clean[key]
        return hit

    def _fill(self, name: str, n: int, r: int, bs: float) -> None:
        """Cache every supported clock's valid rates at (n, r, bs) in one call
        (an invalid one is left to ``rate``'s own evaluation, which reports it)."""
        truth = self.model(name)
        f = self._clock_array
        times = np.asarray(truth.step_time_s(n, r, bs, f), dtype=np.float64).tolist()
        energies = np.asarray(truth.energy_per_iter_j(n, r, bs, f), dtype=np.float64).tolist()
        cache = self._cache
        clean = self._clean
        for clock, t, e in zip(f.tolist(), times, energies, strict=True):
            if t > 0 and e > 0 and math.isfinite(t) and math.isfinite(e):
                cache[name, n, r, bs, clock] = (t, e / t)
                clean[name, n, r, bs, clock] = (t, e)

    def sweep(
        self, name: str, n: int, r: int, bs: float, clocks: Sequence[int]
    ) -> tuple[float, float]:
        """Effective step time and mean power over equal time slices per clock.

        Equal slices make progress ``slice * sum(1/t_k)``, so the effective
        step time is the harmonic mean of the per-clock step times.
        """
        key = (name, n, r, bs, tuple(clocks))
        hit = self._sweeps.get(key)
        if hit is None:
            t, e = self._sweep_rows(name, n, r, bs, key[4])
            hit = self._sweeps[key] = (float(1.0 / np.mean(1.0 / t)), float(np.mean(e / t)))
        return hit

    def _sweep_rows(
        self, name: str, n: int, r: int, bs: float, clocks: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The true step times and energies of a sweep's clocks, as one evaluation
        of the ground truth at all of them gives them. Caps make many sweeps (657
        distinct ones in a fitted run of the default trace), nearly all of
        supported clocks, whose values ``_fill`` has already: read from there (the
        truth evaluates each row of an array as it evaluates that row alone)
        rather than evaluated again: ``sweep`` takes 0.035-0.040 s of that run's CPU
        against 0.110-0.116 s (``sweep`` timed inside ``run_one``, 3 runs each)."""
        clean = self._clean
        rows = [clean.get((name, n, r, bs, c)) for c in clocks]
        if None in rows and self._clocks.issuperset(clocks):
            self._fill(name, n, r, bs)
            rows = [clean.get((name, n, r, bs, c)) for c in clocks]
        if None in rows:  # a clock not supported, or a rate the truth refuses
            truth = self.model(name)
            f = np.asarray(clocks, dtype=np.float64)
            t = np.asarray(truth.step_time_s(n, r, bs, f), dtype=np.float64)
            e = np.asarray(truth.energy_per_iter_j(n, r, bs, f), dtype=np.float64)
            return t, e
        t = np.array([row[0] for row in rows if row is not None], dtype=np.float64)
        e = np.array([row[1] for row in rows if row is not None], dtype=np.float64)
        return t, e

    def peak(self, name: str, n: int, r: int, bs: float, clocks: Sequence[int]) -> float:
        """The highest power of the job's GPUs over ``clocks``: a sweep's hungriest slice."""
        key = (name, n, r, bs, tuple(clocks))
        hit = self._peaks.get(key)
        if hit is None:
            hit = self._peaks[key] = max(self.rate(name, n, r, bs, c)[1] for c in set(clocks))
        return hit

    def capped(self, name: str, n: int, r: int, bs: float, f: int, cap_w: float | None) -> int:
        """The clock the job's GPUs run at when locked at ``f`` under a per-GPU ``cap_w``.

        ``powerflow.core.devices.capped_clock_mhz`` on the ground truth: the highest
        supported clock at or below ``f`` whose power per GPU fits the cap (the
        lowest clock when none does). Caps move with every plan, so the answer
        is not kept per cap: the configuration's per-GPU power at every clock
        is (``_per_gpu_w``), and each question is one pass over it
        (``capped_each``; ``tests/test_sim_fastpaths.py`` checks both against
        ``capped_clock_mhz``).
        """
        if cap_w is None:
            return f
        # capped_each's one-clock scan without its tuples (37k calls a fitted run);
        # with _set_rates writing the arrays directly, _set_rates takes 0.311 s of a
        # fitted run of the default trace against 0.351 s (best of 6, as _refresh)
        row = self._per_gpu_w(name, n, r, bs)
        supported, power = row.clocks, row.power
        k = bisect.bisect_right(supported, f) - 1
        while k > 0 and not power[k] <= cap_w:
            k -= 1
        return supported[max(k, 0)]

    def capped_each(
        self, name: str, n: int, r: int, bs: float, clocks: Sequence[int], cap_w: float
    ) -> tuple[int, ...]:
        """``capped`` for each of ``clocks`` under one cap, in one pass over the row.

        A profiling sweep asks this for every slice's clock at each of its
        events (178k of a fitted run's 206k questions, in 8k calls): a
        bisection of the row's running maximum finds the first clock that does
        not fit, below which all do, and above it only the row's few dips can
        fit (``PowerRow``), so the answers take one pass over the asked clocks,
        not over the row (index 0, the lowest clock, where none fits): 1.6 us
        against 4.1 us for 21 clocks on the 81-clock A100 row (``timeit``, best
        of 5), and ``capped_each`` 0.075-0.081 s of a fitted run of the default
        trace against 0.094-0.112 s (timed inside ``run_one``, 3 runs each;
        tests/test_sim_fastpaths.py checks it against the plain pass at caps
        at each power of rows with dips). A running job asks for its one
        clock at every plan that changes it (37k times in a fitted run of the
        default trace): a scan down the power list from that clock answers it
        in 0.9 us against 3.7 us for numpy's running maximum on the 81-clock
        A100 row (``timeit``, best of 7), about 0.1 s of that run's CPU.
        """
        row = self._per_gpu_w(name, n, r, bs)
        supported, power = row.clocks, row.power
        if len(clocks) == 1:
            # One clock (a running job): scan down from it to the first that fits;
            # the same answer as the running maximum, without building one.
            k = bisect.bisect_right(supported, clocks[0]) - 1
            while k > 0 and not power[k] <= cap_w:
                k -= 1
            return (supported[max(k, 0)],)
        if row.dips is None or cap_w != cap_w:  # a NaN power or cap: the plain pass
            best = []
            top = 0
            for k, w in enumerate(power):
                if w <= cap_w:
                    top = k
                best.append(top)
            out = []
            for f in clocks:
                k = bisect.bisect_right(supported, f)
                out.append(supported[best[k - 1]] if k else supported[0])
            return tuple(out)
        # Every clock below ``first`` fits and ``first`` does not (the running
        # maximum of the powers passes the cap there); above it only a dip can fit.
        first = bisect.bisect_right(row.running_max, cap_w)
        above = [k for k, w in row.dips if k > first and w <= cap_w]
        index = row.index
        out = []
        for f in clocks:
            at = index.get(f)
            k = bisect.bisect_right(supported, f) - 1 if at is None else at
            if k >= first:
                fit = first - 1
                for j in above:
                    if j <= k:
                        fit = j
                k = fit
            out.append(supported[k] if k > 0 else supported[0])
        return tuple(out)

    def _per_gpu_w(self, name: str, n: int, r: int, bs: float) -> PowerRow:
        """The configuration's per-GPU power at every supported clock, as
        ``capped_clock_mhz`` computes it (elementwise, so one call for all clocks
        gives each clock's value exactly)."""
        key = (name, n, r, bs)
        hit = self._powers.get(key)
        if hit is None:
            truth = self.model(name)
            f = self._clock_array
            step = truth.step_time_s(n, r, bs, f)
            energy = truth.energy_per_iter_j(n, r, bs, f)
            power = np.asarray(energy / (n * step), dtype=np.float64).tolist()
            hit = self._powers[key] = PowerRow(self._clock_list, self._clock_index, power)
        return hit


class PowerRow:
    """One configuration's per-GPU power at each supported clock, as lists (each
    question reads a few entries, which a list gives faster than an array).

    ``running_max[k]`` is the highest power of clocks ``0..k``: a cap that is
    not below it fits every one of them, and the first clock where it passes
    the cap is the first that does not fit (``bisect``). The power rises with
    the clock but for a few dips, ``dips`` (index, power): the clocks below
    their running maximum, the only ones above that first clock that a cap can
    fit (None when a power is NaN).
    """

    __slots__ = ("clocks", "dips", "index", "power", "running_max")

    def __init__(self, clocks: list[int], index: dict[int, int], power: list[float]) -> None:
        self.clocks = clocks  # ascending
        self.index = index  # of each clock in ``clocks``
        self.power = power
        running = []
        top = -math.inf
        for w in power:
            top = max(top, w)
            running.append(top)
        self.running_max = running
        self.dips: list[tuple[int, float]] | None = [
            (k, w) for k, (w, m) in enumerate(zip(power, running, strict=True)) if w < m
        ]
        if any(math.isnan(w) for w in power):
            self.dips = None  # a NaN fits no cap: ``capped_each`` takes its plain pass
